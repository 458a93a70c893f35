"""Loaded by Python at start-up when this folder is on PYTHONPATH (bench_keda.py
``--lag-probe``): in a ``gpuscale scaler`` process, time every event-loop callback and
write the ones that held the loop longer than ``GPUSCALE_LAG_MS`` (default 4 ms), by the
coroutine that ran, to ``GPUSCALE_LAG_FILE`` every second (all of them: the bench takes
the difference over its measured window); ``GPUSCALE_LAG_DEPTH`` (default 4) is how many
awaits of a grpcio handler's chain are named. With ``GPUSCALE_GC_FILE`` set, each of the
collector's runs is appended there too: its generation, the tracked objects it walks by
type (the ``GPUSCALE_GC_TOP`` most, default 6; counted before its clock starts) and its
time - what fills the young generation in a running scaler. Other processes are
untouched."""

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
    _depth = int(os.environ.get("GPUSCALE_LAG_DEPTH", "4"))
    _run = asyncio.events.Handle._run

    def _coro(handle: Any) -> Any:
        """The coroutine a handle's task steps (None: not a task's step)."""
        task: Any = getattr(getattr(handle, "_callback", None), "__self__", None)
        return task.get_coro() if hasattr(task, "get_coro") else None

    def _resumes(coro: Any) -> str:
        """Where a task's coroutine resumes: the chain of awaits it is suspended in
        (taken before the step runs). grpcio's handler wrapper is Cython and names no
        method, but its chain tells a new call ("start") from a unary handler or a
        stream resuming."""
        if getattr(coro, "__qualname__", "") != "_handle_exceptions":
            return ""
        chain: list[str] = []
        inner = getattr(coro, "cr_await", None)
        while inner is not None and len(chain) < _depth:
            chain.append(getattr(inner, "__qualname__", type(inner).__name__))
            inner = getattr(inner, "cr_await", None)
        return " > " + (" > ".join(chain[1:]) or "start")

    def _name(handle: Any, coro: Any, resumes: str) -> str:
        name = getattr(coro, "__qualname__", None) or repr(getattr(handle, "_callback", None))
        return re.sub(r" at 0x[0-9a-f]+", "", name + resumes)[:160]

    def _timed(self: Any) -> None:
        coro = _coro(self)
        resumes = _resumes(coro)
        t0 = time.perf_counter()
        _run(self)
        took = time.perf_counter() - t0
        if took > _limit:
            key = _name(self, coro, resumes)
            _slow[key] += 1
            _total[key] += took
            _worst[key] = max(_worst.get(key, 0.0), took)

    asyncio.events.Handle._run = _timed  # type: ignore[method-assign]

    def _dump() -> None:
        path = os.environ["GPUSCALE_LAG_FILE"]
        while True:
            time.sleep(1)
            with open(path + ".new", "w") as out:
                for key, n in _slow.most_common():
                    out.write(f"{n}\t{_total[key] * 1e3:.0f}\t{_worst[key] * 1e3:.0f}\t"
                              f"{key}\n")
            os.replace(path + ".new", path)  # a reader never sees half a file

    threading.Thread(target=_dump, daemon=True, name="lag-probe").start()

if "scaler" in sys.argv and os.environ.get("GPUSCALE_GC_FILE"):
    import gc

    _gc_start: list[float] = [0.0]
    _top = int(os.environ.get("GPUSCALE_GC_TOP", "6"))

    def _on_gc(phase: str, info: dict[str, int]) -> None:
        """Each collection: generation, tracked objects in it and its younger ones at the
        start (by type, the ``_top`` most), and how long it took."""
        if phase == "start":
            objects = [o for g in range(info["generation"] + 1)
                       for o in gc.get_objects(generation=g)]
            kinds = collections.Counter(type(o).__name__ for o in objects)
            line = (f"{info['generation']}\t{len(objects)}\t"
                    + ", ".join(f"{k} {v}" for k, v in kinds.most_common(_top)))
            del objects
            with open(os.environ["GPUSCALE_GC_FILE"], "a") as out:
                out.write(line)
            _gc_start[0] = time.perf_counter()
        else:
            took = time.perf_counter() - _gc_start[0]
            with open(os.environ["GPUSCALE_GC_FILE"], "a") as out:
                out.write(f"\t{took * 1e3:.1f} ms\t{info['collected']} freed\n")

    gc.callbacks.append(_on_gc)
