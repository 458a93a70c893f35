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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpuscale", description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version", version=f"gpuscale {__version__}")
    parser.add_argument("--log-level", default="INFO",
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = parser.add_subparsers(dest="command", required=True)
    for module in (agent, demo, scaler, simulate, profiles, gpus, generate, explain, top,
                   idle):
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # httpx2 logs every request at INFO: 56 lines a second on an agent scraping 56 engines.
    logging.getLogger("httpx2").setLevel(max(logging.WARNING, logging.getLogger().level))
    code: int = args.run(args)
    return code
