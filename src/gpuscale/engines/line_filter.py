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

Cost: Python per kept line, not per line. The names are found by one regular expression
over the text, and each run of lines between two kept ones is proven droppable by
another (``_PLAIN_LINES``, in C); a run it cannot prove (a line with more than
_FAST_LABELS labels, or one to refuse) is checked line by line as the definition above
says (``_plain``), which decides. No pattern can backtrack more than linearly in a line:
a digit or blank run is never given back, and a line once matched is not re-entered.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Iterator

#: The marker family a run of dropped lines becomes (a HELP line starts a new family).
MARKER = "# HELP gpuscale_lines_not_read"

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
# Possessive digits: giving one back never helps (no digit may follow), and a long number
# that fails would otherwise cost the square of its length.
_NUMBER = r"[+-]?(?:\d++\.?\d*+(?:[eE][+-]?\d++)?|\.\d++(?:[eE][+-]?\d++)?|Inf|NaN)"
_VALUE = r'"[^"\\{},=\n]*"'
_LABEL = rf"(?!__)[a-zA-Z_][a-zA-Z0-9_]*={_VALUE}"
_PLAIN_SAMPLE = re.compile(
    rf"{_NAME}(?:\{{(?:{_LABEL}(?:,{_LABEL})*)?\}})? {_NUMBER}(?: -?\d{{1,15}})?").fullmatch
# A family named only by a suffix ("# TYPE _total counter": the parser makes it the family
# "" and refuses it) is not plain: selection would drop it unbuilt and hide that error.
_FAMILY = rf"(?!(?:_total|_created|_count|_sum|_bucket|_info|_gcount|_gsum)(?![\w:])){_NAME}"
_PLAIN_COMMENT = (rf"# (?:HELP {_FAMILY}(?: [^\n]*)?|TYPE {_FAMILY} "
                  r"(?:counter|gauge|histogram|summary|untyped|unknown))")
_COMMENT = re.compile(_PLAIN_COMMENT).fullmatch
_LABEL_NAME = re.compile(r'[{,]([a-zA-Z_][a-zA-Z0-9_]*)="')  # after the sample's check

# The same lines, as one pattern over a run of them: [^\n] where a line allowed any
# character, [^\S\n] for what str.strip() removes (\s is str.isspace()), "(?:x|)" for
# "(?:x)?" (the same, and cheaper in re). It may miss a plain line (one with more than
# _FAST_LABELS labels), never admit another.
_FAST_LABELS = 8  # compared by back-reference; engines send ~5 at most


def _fast_labels() -> str:
    """``{...}`` of at most _FAST_LABELS plain labels, none twice (the parser refuses a
    line with a label twice): each compared with those before it."""
    def label(i: int) -> str:
        before = "|".join(f"(?P=n{j})=" for j in range(i))
        return (f"(?!{before})" if before else "") + (
            f"(?P<n{i}>(?!__)[a-zA-Z_][a-zA-Z0-9_]*)={_VALUE}")
    more = ""
    for i in reversed(range(1, _FAST_LABELS)):
        more = f"(?:,{label(i)}{more}|)"
    return rf"\{{(?:{label(0)}{more}|)\}}"


# A line committed once matched to its end, so a failing line never re-enters those
# before it; the run atomic as a whole, not with "*+", which CPython 3.11's re gets wrong
# around groups (python/cpython#101955).
_FAST_LINE = (rf"(?>[^\S\n]*+(?:{_NAME}(?:{_fast_labels()}|) {_NUMBER}(?: -?\d{{1,15}}|)|"
              rf"{_PLAIN_COMMENT}|)[^\S\n]*+(?![^\n]))")
_PLAIN_LINES = re.compile(rf"(?>(?:{_FAST_LINE}\n?)*)").fullmatch
_NOT_BLANK = re.compile(r"\S").search
_SAMPLE_LINE = re.compile(r"^[^\S\n]*+[^\s#]", re.MULTILINE).findall


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
def _finder(keep: frozenset[str]) -> Callable[[str], Iterator[re.Match[str]]]:
    # A line holds a name of ``keep`` iff it holds one that contains no other.
    least = sorted(n for n in keep if not any(o != n and o in n for o in keep))
    return re.compile("|".join(re.escape(n) for n in least)).finditer


def select_lines(text: str, keep: frozenset[str],
                 max_samples: int) -> list[tuple[int, str]] | None:
    """The lines of ``text`` (split on ``\\n`` only, as the parser's file is) that can
    yield a sample named in ``keep`` (from ``related``), each with its 1-based line number,
    and markers for the runs dropped between them; None when the whole text must be
    parsed (see above). ``max_samples``: more sample lines than this also give None."""
    if text.count("\n") >= max_samples and len(_SAMPLE_LINE(text)) > max_samples:
        return None
    out: list[tuple[int, str]] = []
    at = 0  # where the first line not yet looked at starts ...
    number = 1  # ... and its number
    for found in _finder(keep)(text):
        if found.start() < at:
            continue  # on a line already kept
        begin = text.rfind("\n", at, found.start()) + 1 or at
        end = text.find("\n", found.end())
        end = len(text) if end < 0 else end
        if begin > at and not _drop(text, at, begin - 1, number, out):
            return None
        number += text.count("\n", at, begin)
        line = text[begin:end]
        s = line.strip()
        if s[0] == "#" and not _COMMENT(s):
            return None
        out.append((number, line))
        at, number = end + 1, number + 1
    if at <= len(text) and not _drop(text, at, len(text), number, out):
        return None
    return out


def _drop(text: str, begin: int, end: int, number: int,
          out: list[tuple[int, str]]) -> bool:
    """Whether the lines in text[begin:end] (none holding a name kept; the first numbered
    ``number``) may all be dropped; if so, and one is not blank, a marker for them (with
    the number of the first that is not) goes to ``out``."""
    if _PLAIN_LINES(text, begin, end) is None and not all(
            _plain(line.strip()) for line in text[begin:end].split("\n")):
        return False
    first = _NOT_BLANK(text, begin, end)
    if first is not None:
        out.append((number + text.count("\n", begin, first.start()), MARKER))
    return True


def _plain(s: str) -> bool:
    """Whether stripped line ``s`` is blank, a plain comment, or a plain sample with no
    label twice (the definition; _PLAIN_LINES is its fast path)."""
    if not s:
        return True
    if s[0] == "#":
        return _COMMENT(s) is not None
    if _PLAIN_SAMPLE(s) is None:
        return False
    names = _LABEL_NAME.findall(s)
    return len(set(names)) == len(names)
