"""Command line: ``gpuscale agent | gpus | scaler | demo | simulate | profiles | generate |
explain | top | idle | keda``.

One module per subcommand group; each adds its parser (``add_parser``) and runs it
(``run``, set as the parser's default). Nothing below the CLI imports from it.
"""

from __future__ import annotations

import argparse
import logging
import os
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
    keda,
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
                   idle, keda):
        module.add_parser(sub)
    return parser


def parse(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """``argv`` parsed; an argument no parser knows is refused with the usage of the
    subcommand it follows (argparse alone answers with the top-level usage), and exit 2."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        # ``gpuscale --bogus demo`` is the top level's to refuse; ``demo --bogus`` demo's.
        where = argv.index(args.command) if args.command in argv else len(argv)
        own = all(x not in argv[:where] for x in extra)
        subs = next(a for a in parser._actions
                    if isinstance(a, argparse._SubParsersAction))
        (subs.choices[args.command] if own else parser).error(
            f"unrecognized arguments: {' '.join(extra)}")
    return args


#: The exit code of a command whose reader went away (``gpuscale ... | head``): a shell's
#: for a process that SIGPIPE ended, as ``cat`` or ``grep`` would end there.
BROKEN_PIPE_EXIT = 141


def _only_broken_pipes(exc: BaseException) -> bool:
    """Whether ``exc`` is a BrokenPipeError, or a group (asyncio's TaskGroup) of only them."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_only_broken_pipes(e) for e in exc.exceptions)
    return isinstance(exc, BrokenPipeError)


def _reader_gone() -> int:
    """End quietly: stdout goes to /dev/null, so the interpreter's last flush of what is
    still buffered cannot raise again at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no file descriptor (a captured stdout): nothing to do
        pass
    finally:
        os.close(devnull)
    return BROKEN_PIPE_EXIT

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
    """Run one command; its exit code (2: unusable input, 1: a peer failed, 141: the
    reader of its output went away)."""
    # Run by kubectl as its plugin (the kubectl-gpuscale script): say "kubectl gpuscale".
    prog = ("kubectl gpuscale" if argv is None and sys.argv[0].endswith("kubectl-gpuscale")
            else "gpuscale")
    args = parse(build_parser(prog), join_dashed(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # httpx2 logs every request at INFO: 56 lines a second on an agent scraping 56 engines.
    logging.getLogger("httpx2").setLevel(max(logging.WARNING, logging.getLogger().level))
    try:
        code: int = args.run(args)
        sys.stdout.flush()  # here, not at exit, where a closed pipe would print a traceback
    except (BrokenPipeError, BaseExceptionGroup) as exc:
        if not _only_broken_pipes(exc):
            raise
        return _reader_gone()
    return code
