"""Graceful stop for the long-running commands."""

from __future__ import annotations

import asyncio
import signal


def cancel_on_signals() -> None:
    """SIGTERM and SIGINT cancel the current task, so its ``finally`` blocks stop things
    in order (servers drain, streams end, backends close)."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None, "call from inside a task"
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
