"""Command line: ``gpuscale agent | gpus | scaler | demo | simulate | profiles | generate |
explain | top | idle``.

One module per subcommand group; each adds its parser (``add_parser``) and runs it
(``run``, set as the parser's default). Nothing below the CLI imports from it.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from gpuscale import __version__
from gpuscale.cli import (
    agent,
    demo,
    explain,
    generate,
    gpus,
    idle,
    profiles,
    scaler,
    simulate,
    top,
)


def build_parser(prog: str = "gpuscale") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version", version=f"gpuscale {__version__}")
    parser.add_argument("--log-level", default="INFO",
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = parser.add_subparsers(dest="command", required=True)
    for module in (agent, demo, scaler, simulate, profiles, gpus, generate, explain, top,
                   idle):
        module.add_parser(sub)
    return parser


#: Options whose value may be a negative duration ("--at -5m"): argparse would take it
#: for an option, so such a value is joined to its option ("--at=-5m") before parsing.
DASHED_VALUES = ("--at",)


def join_dashed(argv: Sequence[str]) -> list[str]:
    """``argv`` with each ``--at -5m`` (a value of a DASHED_VALUES option that starts with
    "-" and a digit) written as ``--at=-5m``; everything else as it is."""
    out = list(argv)
    i = 0
    while i < len(out) - 1:
        value = out[i + 1]
        if out[i] in DASHED_VALUES and value[:1] == "-" and value[1:2].isdigit():
            out[i:i + 2] = [f"{out[i]}={value}"]
        i += 1
    return out


def main(argv: Sequence[str] | None = None) -> int:
    # Run by kubectl as its plugin (the kubectl-gpuscale script): say "kubectl gpuscale".
    prog = ("kubectl gpuscale" if argv is None and sys.argv[0].endswith("kubectl-gpuscale")
            else "gpuscale")
    args = build_parser(prog).parse_args(
        join_dashed(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # httpx2 logs every request at INFO: 56 lines a second on an agent scraping 56 engines.
    logging.getLogger("httpx2").setLevel(max(logging.WARNING, logging.getLogger().level))
    code: int = args.run(args)
    return code
