"""CPU of line selection (engines/select.py) and of the parse it feeds, per body.

One real-size vLLM /metrics body (engines/vllm_body.py, ~70 KiB): ``select_lines`` alone,
``samples`` with selection (what a scrape pays: select + prometheus_client on the kept
lines), ``samples`` of the whole body, and ``engine_signals``. Each figure is the median of
``--repeat`` timings, each the CPU (process_time) of ``--number`` calls divided by
``--number``, after one warm-up call.

Usage: PYTHONPATH=src:. .venv/bin/python bench/bench_select.py [--repeat 200] [--number 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

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
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
