"""``gpuscale idle``: GPU-hours allocated versus used per namespace and workload, the GPUs
idle now, and their cost, from the scaler's recent history or from Prometheus."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

from gpuscale.cli.common import add_scaler_args, fail, scaler_target

MAX_PRICES_FILE = 1024 * 1024
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("idle", help="GPU-hours allocated versus used per namespace and "
                                    "workload, GPUs idle now, and their cost")
    add_scaler_args(p)
    p.add_argument("--prometheus", metavar="URL", default=None,
                   help="read the agents' series from this Prometheus instead of the scaler "
                        "(any window it keeps)")
    p.add_argument("--window", default="1h", help="how far back (90s, 30m, 1h, 7d; 1h)")
    p.add_argument("--namespace", default="", help="only this namespace")
    p.add_argument("--threshold", type=float, default=10.0,
                   help="utilization percent under which a GPU is idle (10)")
    p.add_argument("--idle-for", default="10m",
                   help="how long under the threshold makes a GPU idle now (10m)")
    prices = p.add_mutually_exclusive_group()
    prices.add_argument("--price", default=None, metavar="MODEL=PRICE,...",
                        help="price per GPU-hour by GPU model, as the report names them "
                             "('NVIDIA H100 80GB HBM3=2.50,NVIDIA L4=0.70'); a MIG "
                             "instance costs its fraction")
    prices.add_argument("--prices", type=Path, default=None, metavar="FILE.yaml",
                        help="the same as a YAML mapping of model to price")
    p.add_argument("--format", choices=("table", "csv", "json"), default="table")
    p.add_argument("--json", action="store_true", help="the same as --format json")
    p.add_argument("--plot", type=Path, default=None, metavar="FILE.png",
                   help="also draw GPUs allocated and used over time (needs matplotlib: "
                        "the plot extra; checked before the report is read)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from gpuscale.common.errors import ConfigError, GpuscaleError
    from gpuscale.tools.idle import Options
    from gpuscale.tools.idle_options import parse_duration

    try:
        window = parse_duration(args.window, "--window")
        idle_for = parse_duration(args.idle_for, "--idle-for")
        if not 0 <= args.threshold <= 100:
            raise ConfigError("--threshold: a utilization percent, 0 to 100")
        if args.namespace and not _NAMESPACE.fullmatch(args.namespace):
            raise ConfigError(f"--namespace: {args.namespace[:64]!r} is not a Kubernetes "
                              f"namespace name")
        options = Options(window, args.threshold, idle_for, args.namespace, _prices(args))
        if args.plot is not None:  # before the report is read and printed, not after
            from gpuscale.common.plotting import check_plot

            check_plot(args.plot)
    except GpuscaleError as exc:  # a ConfigError, or PlotUnavailable
        return fail(exc)
    try:
        if args.prometheus is not None:
            report, source = _from_prometheus(args, options)
        else:
            report, source = _from_scaler(args, options)
    except ValueError as exc:  # a partial set of TLS files
        return fail(str(exc), 2)
    except GpuscaleError as exc:
        return fail(exc)
    return _output(args, report, source)


def _prices(args: argparse.Namespace) -> dict[str, float]:
    from gpuscale.common.errors import ConfigError
    from gpuscale.tools.idle_options import parse_prices, prices_from_mapping

    if args.price is not None:
        return parse_prices(args.price)
    if args.prices is None:
        return {}
    import yaml

    try:
        with args.prices.open(encoding="utf-8") as f:
            raw = f.read(MAX_PRICES_FILE + 1)
        if len(raw) > MAX_PRICES_FILE:
            raise ConfigError(f"{args.prices}: larger than {MAX_PRICES_FILE} bytes")
        return prices_from_mapping(yaml.safe_load(raw), str(args.prices))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--prices: cannot read {args.prices}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{args.prices}: not YAML ({str(exc)[:200]})") from None


def _from_scaler(args: argparse.Namespace, options: Any) -> tuple[Any, str]:
    from dataclasses import replace

    from gpuscale.tools.client import InspectClient
    from gpuscale.tools.idle import build_report
    from gpuscale.tools.idle_sources import advisory_from_usage, devices_from_usage

    target = scaler_target(args)
    with InspectClient(target) as client:
        reply = client.usage(max(options.window_s, options.idle_for_s), options.namespace)
    if reply.kept and options.window_s > reply.kept:
        _note(f"the scaler keeps {reply.kept / 60:g} minutes of history: the report covers "
              f"those (pass --prometheus URL for longer windows)")
        options = replace(options, window_s=reply.kept)
    if options.idle_for_s > reply.kept > 0:
        _note(f"--idle-for is longer than the {reply.kept / 60:g} minutes the scaler keeps: "
              f"no GPU can show as idle now")
    devices = devices_from_usage(reply)
    if reply.untracked:
        _note(f"the scaler keeps the history of at most its first devices: {reply.untracked} "
              f"more are not in this report (use --prometheus for the whole fleet)")
    if not devices:
        _note(f"the scaler at {args.scaler} has no GPU data for this window yet (it samples "
              f"its agents every 15 s; are any connected? gpuscale top shows them)")
    report = replace(build_report(devices, reply.now, options),
                     advisory=advisory_from_usage(reply))
    return report, f"the scaler at {args.scaler}"


def _from_prometheus(args: argparse.Namespace, options: Any) -> tuple[Any, str]:
    import asyncio

    from gpuscale.tools.idle import build_report
    from gpuscale.tools.promql import Prometheus, read_devices

    prom = Prometheus(args.prometheus)
    now = time.time()
    devices = asyncio.run(read_devices(prom, now, max(options.window_s, options.idle_for_s)))
    if not devices:
        _note(f"Prometheus at {prom.url} has no DCGM_FI_DEV_FB_USED series in this window: "
              f"does it scrape the gpuscale agents (or dcgm-exporter)?")
    return build_report(devices, now, options), f"Prometheus at {prom.url}"


def _output(args: argparse.Namespace, report: Any, source: str) -> int:
    from gpuscale.common.errors import GpuscaleError
    from gpuscale.tools.idle_format import table, to_csv, to_json

    fmt = "json" if args.json else args.format
    if fmt == "json":
        print(json.dumps(to_json(report, source), indent=2))
    elif fmt == "csv":
        print(to_csv(report), end="")
    else:
        print(table(report, source), end="")
    if args.plot is not None:
        from gpuscale.tools.idle_plot import plot_report

        try:
            plot_report(report, source, args.plot)
        except GpuscaleError as exc:
            return fail(exc)
        except OSError as exc:
            return fail(f"--plot: cannot write {args.plot}: {exc.strerror or exc}", 1)
    return 0


def _note(text: str) -> None:
    print(f"gpuscale: {text}", file=sys.stderr)
