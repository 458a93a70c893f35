"""CPU of line selection (engines/select.py) and of the parse it feeds, per body.

One real-size vLLM /metrics body (engines/vllm_body.py, ~70 KiB): ``select_lines`` alone,
``samples`` with selection (what a scrape pays: select + prometheus_client on the kept
lines), ``samples`` of the whole body, and ``engine_signals``. Each figure is the median of
``--repeat`` timings, each the CPU (process_time) of ``--number`` calls divided by
``--number``, after one warm-up call.

Then hostile lines (``long_lines``): a line that fails only at its end, after a run of 0.1,
1 and 10 million digits or blanks (the shapes tests/engines/test_line_filter.py refuses),
``select_lines`` on it and, as the yardstick, one possessive pass of ``re`` over the same
characters (``[^\n]*+``): the cost must grow with the length (x10 per row), not its square
(x100), and stay a small multiple of the yardstick.

Usage: PYTHONPATH=src:. .venv/bin/python bench/bench_select.py [--repeat 200] [--number 20]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from collections.abc import Callable
from functools import partial

from gpuscale.engines.line_filter import select_lines
from gpuscale.engines.signals import MAX_SERIES, READS, engine_signals, samples
from gpuscale.engines.vllm_body import vllm_body


def per_call_ms(fn: Callable[[], object], repeat: int, number: int) -> float:
    fn()
    runs = []
    for _ in range(repeat):
        start = time.process_time()
        for _ in range(number):
            fn()
        runs.append((time.process_time() - start) / number * 1000)
    return statistics.median(runs)


LONG_SHAPES = {
    "number failing at its end": lambda n: "x 1" + "1" * n + "z",
    "mantissa and exponent": lambda n: "x 1." + "1" * n + "e" + "1" * n + "z",
    "blanks, then a failing line": lambda n: " " * n + "z",
    "blanks after a value": lambda n: "x 1" + " " * n + "z",
}
_ONE_PASS = re.compile(r"[^\n]*+").match  # the yardstick: re reading the characters once


def long_lines(repeat: int) -> dict[str, dict[str, float]]:
    keep = READS["tgi"]
    out = {}
    for name, shape in LONG_SHAPES.items():
        for n in (100_000, 1_000_000, 10_000_000):
            text = shape(n) + "\ntgi_queue_size 1"
            assert select_lines(text, keep, 10) is None
            out[f"{name}, {n:,}"] = {
                "select_lines_ms": per_call_ms(partial(select_lines, text, keep, 10), repeat, 1),
                "one_pass_ms": per_call_ms(partial(_ONE_PASS, text), repeat, 1)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--number", type=int, default=20)
    args = parser.parse_args()
    text = vllm_body()
    keep = READS["vllm"]
    selected = select_lines(text, keep, MAX_SERIES)
    assert selected is not None, "the body must take the selecting path"
    out = {
        "body": {"bytes": len(text.encode()), "lines": text.count("\n") + 1,
                 "kept": len(selected)},
        "select_lines_ms": per_call_ms(lambda: select_lines(text, keep, MAX_SERIES),
                                       args.repeat, args.number),
        "samples_selected_ms": per_call_ms(lambda: samples(text, keep), args.repeat,
                                           args.number),
        "engine_signals_ms": per_call_ms(lambda: engine_signals("vllm", text, 0.0),
                                         args.repeat, args.number),
        "samples_whole_ms": per_call_ms(lambda: samples(text), max(5, args.repeat // 20),
                                        2),
    }
    out["long_lines"] = long_lines(max(3, args.repeat // 40))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
