"""Runs the NVML backend under the fake library; one command per stdin line.

Commands: ``sample`` prints the snapshot as one JSON line; ``close`` shuts NVML down and
prints ``{}``; ``gpus`` prints ``gpuscale gpus`` output as {"table": ...}. Arguments:
``--pcie``, ``--interval S``. Logs go to stderr.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from gpuscale.cli import format_table, snapshot_to_json
from gpuscale.telemetry.nvml import NvmlBackend


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pcie", action="store_true")
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--mig-refresh", type=float, default=30.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    backend = NvmlBackend(pcie=args.pcie, interval=args.interval, node="test-node",
                          mig_refresh_s=args.mig_refresh)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "sample":
            out = snapshot_to_json(backend.sample())
        elif cmd == "gpus":
            out = {"table": format_table(backend.sample())}
        elif cmd == "close":
            backend.close()
            out = {}
        else:
            out = {"error": f"unknown command {cmd!r}"}
        print(json.dumps(out), flush=True)
    backend.close()


if __name__ == "__main__":
    main()
