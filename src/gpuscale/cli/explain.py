"""``gpuscale explain NAMESPACE/NAME``: why a workload has the replicas it has."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
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
                                    "StatefulSet one scales or an HPA reads through the "
                                    "scaler's custom metrics API")
    e.add_argument("--at", default=None,
                   help="explain a past moment from the scaler's recent history: a "
                        "wall-clock time - epoch seconds, an ISO time, HH:MM[:SS] (UTC) - "
                        "or a duration ago (-90s, -5m, -1h); not the demo's simulated time")
    e.add_argument("--replicas", type=int, default=None,
                   help="the current replica count (default: the target's spec.replicas "
                        "when the scaler watches ScaledObjects, else its pods)")
    e.add_argument("--min-replicas", type=int, default=None, metavar="N",
                   help="the ScaledObject's minReplicaCount (default: as the scaler's "
                        "ScaledObject watch knows it; a scaler without one, as ./dev run's, "
                        "does not, and KEDA's default 0 is assumed and said); for a "
                        "workload a plain HPA reads, its minReplicas (default 1)")
    e.add_argument("--max-replicas", type=int, default=None, metavar="N",
                   help="its maxReplicaCount (the same; KEDA's default 100), or the HPA's "
                        "maxReplicas (default: none assumed, said)")
    e.add_argument("--json", action="store_true", help="the whole answer as JSON")
    add_scaler_args(e)
    e.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from gpuscale.tools.client import InspectClient, ToolError
    from gpuscale.tools.explain import as_json, decide, render
    from gpuscale.tools.explain_time import parse_time, refused_at

    namespace, _, name = args.workload.partition("/")
    if not namespace or not name:
        return fail(f"{args.workload!r}: give NAMESPACE/NAME", 2)
    for flag, count in (("--replicas", args.replicas), ("--min-replicas", args.min_replicas),
                        ("--max-replicas", args.max_replicas)):
        if count is not None and count < 0:
            return fail(f"{flag}: a count, 0 or more", 2)
    if None not in (args.min_replicas, args.max_replicas) \
            and args.min_replicas > args.max_replicas:
        return fail("--min-replicas: at most --max-replicas", 2)
    at = 0.0
    try:
        at = parse_time(args.at, time.time()) if args.at else 0.0
        target = scaler_target(args)
        with InspectClient(target) as client:
            reply = client.explain(namespace, name, at, HISTORY_S)
        decision = decide(reply, args.replicas, (args.min_replicas, args.max_replicas))
    except ValueError as exc:
        return fail(str(exc), 2)
    except ToolError as exc:
        return fail(refused_at(args.at, at, str(exc)) if exc.out_of_range else exc)
    except GpuscaleError as exc:
        return fail(exc)
    if args.json:
        print(json.dumps(as_json(reply, decision), indent=2, sort_keys=True))
    else:
        # 80 columns when piped (wrapped between values, none cut), a terminal's own width.
        width = shutil.get_terminal_size().columns if sys.stdout.isatty() else 80
        print(render(reply, decision, width=max(80, width)))
    return 0
