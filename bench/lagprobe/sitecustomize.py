"""Loaded by Python at start-up when this folder is on PYTHONPATH (bench_keda.py
``--lag-probe``): in a ``gpuscale scaler`` process, time every event-loop callback and
write the ones that held the loop longer than ``GPUSCALE_LAG_MS`` (default 4 ms), by the
coroutine that ran, to ``GPUSCALE_LAG_FILE`` every 5 s. Other processes are untouched."""

from __future__ import annotations

import asyncio.events
import collections
import os
import re
import sys
import threading
import time
from typing import Any

if "scaler" in sys.argv and os.environ.get("GPUSCALE_LAG_FILE"):
    _limit = float(os.environ.get("GPUSCALE_LAG_MS", "4")) / 1e3
    _slow: collections.Counter[str] = collections.Counter()
    _worst: dict[str, float] = {}
    _total: dict[str, float] = collections.defaultdict(float)
    _run = asyncio.events.Handle._run

    def _name(handle: Any) -> str:
        callback = getattr(handle, "_callback", None)
        task: Any = getattr(callback, "__self__", None)
        coro = task.get_coro() if hasattr(task, "get_coro") else None
        name = getattr(coro, "__qualname__", None) or repr(callback)
        return re.sub(r" at 0x[0-9a-f]+", "", name)[:120]

    def _timed(self: Any) -> None:
        t0 = time.perf_counter()
        _run(self)
        took = time.perf_counter() - t0
        if took > _limit:
            key = _name(self)
            _slow[key] += 1
            _total[key] += took
            _worst[key] = max(_worst.get(key, 0.0), took)

    asyncio.events.Handle._run = _timed  # type: ignore[method-assign]

    def _dump() -> None:
        path = os.environ["GPUSCALE_LAG_FILE"]
        while True:
            time.sleep(5)
            with open(path, "w") as out:
                for key, n in _slow.most_common(20):
                    out.write(f"{n}\t{_total[key] * 1e3:.0f}\t{_worst[key] * 1e3:.0f}\t"
                              f"{key}\n")

    threading.Thread(target=_dump, daemon=True, name="lag-probe").start()
