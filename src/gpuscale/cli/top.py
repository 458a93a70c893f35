"""``gpuscale top``: a live view of the fleet from a running scaler's Inspect service."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpuscale.cli.common import add_scaler_args, fail, scaler_target

if TYPE_CHECKING:
    from gpuscale.proto import inspect_pb2 as pb
    from gpuscale.tools.client import Target

POLL_TIMEOUT_S = 5.0  # one poll of the live view; a hung scaler shows within this


def add_parser(sub: Any) -> None:
    from gpuscale.tools.top import SORTS

    t = sub.add_parser("top", help="a live view of the fleet: nodes, GPUs and MIG instances, "
                                   "pods and their engine queues, workloads and their plans")
    add_scaler_args(t)
    t.add_argument("--namespace", default="", help="only pods and workloads of this namespace "
                                                   "(live: n cycles namespaces)")
    t.add_argument("--node", default="", help="only this node and its pods (live: N cycles)")
    t.add_argument("--sort", choices=SORTS, default="util",
                   help="order pods (and GPUs) by this, largest first (live: s cycles)")
    t.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes")
    out = t.add_mutually_exclusive_group()
    out.add_argument("--once", action="store_true",
                     help="print the tables once and exit (the default when not on a terminal)")
    out.add_argument("--json", action="store_true",
                     help="print the scaler's Fleet reply as JSON and exit")
    t.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from gpuscale.tools.client import InspectClient, ToolError

    if not (math.isfinite(args.interval) and 0.2 <= args.interval <= 3600):
        return fail("--interval must be 0.2 to 3600 seconds", 2)
    try:
        target = scaler_target(args)
    except ValueError as exc:
        return fail(str(exc), 2)
    live = not (args.once or args.json) and sys.stdout.isatty()
    try:
        with InspectClient(target) as client:
            # The live view filters what it holds (n and N cycle through it): read it all.
            reply = client.fleet() if live else client.fleet(args.namespace, args.node)
    except ToolError as exc:
        return fail(exc)
    if args.json:
        from google.protobuf import json_format

        print(json_format.MessageToJson(reply, preserving_proto_field_name=True,
                                        always_print_fields_with_no_presence=True))
        return 0
    if not live:
        import shutil

        from gpuscale.tools.top import build
        from gpuscale.tools.top_render import once_text

        view = build(reply, args.sort, args.namespace, args.node)
        # A terminal: fitted to its width (a cut cell ends in "…", its whole text below
        # the table); a pipe or a file: every value whole, for reading and grep.
        tty = sys.stdout.isatty()
        print(once_text(view, shutil.get_terminal_size().columns if tty else None, tty),
              end="")
        return 0
    from gpuscale.tools.top_app import TopApp

    fetch, close = reconnecting(target)
    try:
        TopApp(fetch, args.scaler, args.interval, args.sort, args.namespace, args.node,
               first=reply).run()
    finally:
        close()
    return 0


def reconnecting(target: Target) -> tuple[Callable[[], pb.FleetReply], Callable[[], None]]:
    """A fetch of the whole fleet that opens a fresh channel after a failure (so a scaler
    that comes back is read on the next poll, not after gRPC's reconnect backoff, and
    rotated TLS files are re-read), and the call that closes it."""
    from gpuscale.tools.client import InspectClient, ToolError

    held: list[InspectClient] = []

    def fetch() -> pb.FleetReply:
        if not held:
            held.append(InspectClient(target, POLL_TIMEOUT_S))
        try:
            return held[0].fleet()
        except ToolError:
            held.pop().close()
            raise

    def close() -> None:
        while held:
            held.pop().close()

    return fetch, close
