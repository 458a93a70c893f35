"""``gpuscale explain NAMESPACE/NAME``: why a workload has the replicas it has."""

from __future__ import annotations

import argparse
import json
import shutil
import time
from typing import Any

from gpuscale.cli.common import add_scaler_args, fail, scaler_target
from gpuscale.common.errors import GpuscaleError

HISTORY_S = 3600.0  # earlier moments asked for (the longest stabilization window)


def add_parser(sub: Any) -> None:
    e = sub.add_parser("explain", help="what the scaler answers for a ScaledObject (or the "
                                       "Deployment it scales), why, and what KEDA and the "
                                       "HPA will do with it")
    e.add_argument("workload", help="NAMESPACE/NAME: a ScaledObject, or a Deployment or "
                                    "StatefulSet one scales")
    e.add_argument("--at", default=None,
                   help="explain a past moment from the scaler's recent history: epoch "
                        "seconds, an ISO time, HH:MM (UTC) or -5m")
    e.add_argument("--replicas", type=int, default=None,
                   help="the current replica count (default: the target's spec.replicas "
                        "when the scaler watches ScaledObjects, else its pods)")
    e.add_argument("--json", action="store_true", help="the whole answer as JSON")
    add_scaler_args(e)
    e.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from gpuscale.tools.client import InspectClient
    from gpuscale.tools.explain import as_json, decide, parse_time, render

    namespace, _, name = args.workload.partition("/")
    if not namespace or not name:
        return fail(f"{args.workload!r}: give NAMESPACE/NAME", 2)
    if args.replicas is not None and args.replicas < 0:
        return fail("--replicas: a count, 0 or more", 2)
    try:
        at = parse_time(args.at, time.time()) if args.at else 0.0
        target = scaler_target(args)
        with InspectClient(target) as client:
            reply = client.explain(namespace, name, at, HISTORY_S)
        decision = decide(reply, args.replicas)
    except ValueError as exc:
        return fail(str(exc), 2)
    except GpuscaleError as exc:
        return fail(exc)
    if args.json:
        print(json.dumps(as_json(reply, decision), indent=2, sort_keys=True))
    else:
        print(render(reply, decision, width=max(80, shutil.get_terminal_size().columns)))
    return 0
