"""Waiting for the state a test expects by polling for it (``until``, ``until_sync``),
never by sleeping a guessed time."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any


async def until(cond: Callable[[], Any], within: float = 10.0, what: str = "condition",
                every: float = 0.02, tolerate: tuple[type[BaseException], ...] = ()) -> Any:
    """Poll ``cond`` until it returns something truthy and return that; AssertionError
    naming ``what`` and the last value when ``within`` seconds pass first. ``cond`` may
    return an awaitable (an RPC, an attribution tick): its result is what counts.
    Exceptions of the ``tolerate`` types count as "not yet" (a server still starting)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    last: Any = None
    while True:
        try:
            last = cond()
            if inspect.isawaitable(last):
                last = await last
        except tolerate as exc:
            last = exc
        else:
            if last:
                return last
        if loop.time() > deadline:
            raise AssertionError(f"{what} not met in {within:g}s; last {last!r}")
        await asyncio.sleep(every)


def until_sync(cond: Callable[[], Any], within: float = 15.0, what: str = "condition",
               every: float = 0.1, tolerate: tuple[type[BaseException], ...] = ()) -> Any:
    """``until`` for synchronous tests (processes driven from the test thread), with the
    same semantics and message; ``cond`` is a plain callable here."""
    deadline = time.monotonic() + within
    last: Any = None
    while True:
        try:
            last = cond()
        except tolerate as exc:
            last = exc
        else:
            if last:
                return last
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met in {within:g}s; last {last!r}")
        time.sleep(every)
