"""Only the lines of the metrics an engine's signals read, before prometheus_client parses
a body (pure; no I/O).

A real vLLM /metrics is 50-200 KiB, mostly histogram buckets and the process's other
families; prometheus_client's pure-Python parser takes ~30 ms of CPU for 70 KiB of it, and
the signals read seven sample names. ``select_lines`` hands the parser the lines that can
make those samples, so the parse costs what the signals need. The parser still parses:
nothing here reads a value.

Exact, not approximate: for every body, ``samples`` of the selected lines equals
``samples`` of the whole body on the names read (the same values in the same order, the
same EngineParseError with the same line number), which tests/engines/test_select.py
checks over generated exposition text. How:

- ``related(names)`` widens the names read to every name whose line can yield one of them:
  ``x`` for ``x_total`` (the parser renames the samples of a counter family ``x`` to
  ``x_total``) and ``x`` for ``x_count``, ``x_sum``, ``x_bucket`` (a family ``x`` of type
  summary or histogram holds those samples, and a later ``# TYPE x counter`` renames
  them). A line that contains one of these names anywhere (as its name, quoted, as
  ``__name__``, in a label value or a HELP text) is kept as it is.
- Every other line must be one the parser is known to accept and that can change only
  which family is current: a blank line (dropped), a ``# HELP`` or ``# TYPE`` line of a
  plain name with a known type, or a sample of a plain name with plain labels (no escapes,
  quotes, braces, commas or ``=`` in values, no name twice) and a plain number. Such a
  line never raises and never yields a sample read; a run of them is replaced by one
  ``# HELP`` line of a name outside the body's names, which leaves the parser, as the run
  did, in a family that none of the names read belongs to (so a kept sample is renamed,
  or grouped, exactly as in the whole body).
- Anything else - a plain comment, an unusual HELP or TYPE line, a line the parser might
  refuse - and a body with more than MAX_SERIES samples make ``select_lines`` return None:
  the caller parses the whole body, as before, and gets the same answer or the same error.
  Engines send regular text, so that is the slow path for odd bodies only.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable

#: The marker family a run of dropped lines becomes (a HELP line starts a new family).
MARKER = "# HELP gpuscale_lines_not_read"

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r'(?!__)[a-zA-Z_][a-zA-Z0-9_]*="[^"\\{},=]*"'
_NUMBER = r"[+-]?(?:\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|Inf|NaN)"
_PLAIN_SAMPLE = re.compile(
    rf"{_NAME}(?:\{{(?:{_LABEL}(?:,{_LABEL})*)?\}})? {_NUMBER}(?: -?\d{{1,15}})?")
_PLAIN_COMMENT = re.compile(
    rf"# (?:HELP {_NAME}(?: [^\n]*)?|TYPE {_NAME} "
    r"(?:counter|gauge|histogram|summary|untyped|unknown))")
# Names that are only a suffix: a counter "_total" becomes the family "", which the parser
# refuses; selection would drop the family unbuilt and hide that error.
_BARE_SUFFIXES = frozenset({"_total", "_created", "_count", "_sum", "_bucket", "_info",
                            "_gcount", "_gsum"})
_LABEL_NAME = re.compile(r'[{,]([a-zA-Z_][a-zA-Z0-9_]*)="')  # after the sample's check


def related(names: Iterable[str]) -> frozenset[str]:
    """``names`` and every name a line must contain to yield one of them (see above)."""
    out = set(names)
    todo = list(out)
    while todo:
        name = todo.pop()
        for suffix in ("_total", "_count", "_sum", "_bucket"):
            base = name.removesuffix(suffix)
            if base != name and base and base not in out:
                out.add(base)
                todo.append(base)
    return frozenset(out)


@functools.lru_cache(maxsize=8)  # one per engine
def _finder(keep: frozenset[str]) -> Callable[[str], re.Match[str] | None]:
    return re.compile("|".join(re.escape(n) for n in sorted(keep))).search


def select_lines(text: str, keep: frozenset[str],
                 max_samples: int) -> list[tuple[int, str]] | None:
    """The lines of ``text`` (split on ``\\n`` only, as the parser's file is) that can
    yield a sample named in ``keep`` (from ``related``), each with its 1-based line number,
    and markers for the runs dropped between them; None when the whole text must be
    parsed (see above). ``max_samples``: more sample lines than this also give None."""
    found = _finder(keep)
    plain_sample = _PLAIN_SAMPLE.fullmatch
    plain_comment = _PLAIN_COMMENT.fullmatch
    out: list[tuple[int, str]] = []
    dropped = False  # a run of dropped lines is open (its marker already in ``out``)
    samples = 0
    for number, line in enumerate(text.split("\n"), 1):
        s = line.strip()
        if not s:
            continue  # the parser skips blank lines
        if s[0] == "#":
            if not plain_comment(s):
                return None
            if s.split(" ", 3)[2] in _BARE_SUFFIXES:
                return None  # a family the parser names "" (an error it must raise)
        else:
            samples += 1
            if samples > max_samples:
                return None
        if found(s) is not None:
            out.append((number, line))
            dropped = False
            continue
        if s[0] != "#":
            if not plain_sample(s):
                return None
            if s.count('="') > 1:
                label_names = _LABEL_NAME.findall(s)
                if len(set(label_names)) != len(label_names):
                    return None  # a label twice: the parser refuses the line
        if not dropped:
            out.append((number, MARKER))
            dropped = True
    return out
