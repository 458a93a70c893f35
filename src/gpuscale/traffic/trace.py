"""Request traces: when each request arrived and its prompt and output token counts.

Formats, told apart by the first line (a ``{`` is JSONL, else a CSV header) - the file's
extension does not matter:

- Azure LLM inference CSV (AzurePublicDataset: the 2023 ``AzureLLMInferenceTrace_conv``
  and ``_code`` files and the 2024 week-long ``_1week`` ones): header with ``TIMESTAMP``,
  ``ContextTokens``, ``GeneratedTokens`` (other columns ignored). TIMESTAMP is
  ``YYYY-MM-DD HH:MM:SS`` with an optional fraction of any length and an optional UTC
  offset (``+00:00`` or ``Z``; none means UTC), or seconds as a number.
- Plain CSV: header ``arrival_s,input_tokens,output_tokens`` (seconds, any origin).
- JSONL, one object per line (Mooncake's trace format): ``timestamp`` in milliseconds;
  prompt tokens as ``input_length`` (or ``input_tokens``, ``prompt_tokens``); output
  tokens as ``output_length`` (or ``output_tokens``, ``completion_tokens``). Other keys
  (``hash_ids``...) are ignored; blank lines are skipped.

A UTF-8 byte-order mark and CRLF line ends are accepted. Arrivals are returned sorted
(stably: ties keep file order) and shifted so the first is at 0 - traces are often
merged from several logs, and a few out-of-order rows say nothing wrong about the rest.
Anything else raises TraceError naming the file and line: not UTF-8, a line over
MAX_LINE_BYTES, more than MAX_TRACE_ROWS requests, a missing or non-numeric field,
token counts that are negative, fractional or above MAX_TOKENS, timestamps that are
negative, not finite or above MAX_TIMESTAMP_S.
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import BinaryIO

from gpuscale.common.errors import ConfigError


@dataclass(frozen=True, slots=True)
class TraceRequest:
    arrival_s: float  # seconds from the trace's first request
    input_tokens: int
    output_tokens: int


class TraceError(ConfigError):
    """A request trace that cannot be read; the message names the file and line."""


MAX_TRACE_ROWS = 5_000_000
MAX_LINE_BYTES = 1 << 20  # Mooncake lines carry hash_ids; 1 MiB is far above any real one
MAX_TOKENS = 10_000_000  # per request: above any context window
MAX_TIMESTAMP_S = 1e11  # ~ year 5138 as Unix seconds: larger is an error, not a time

AZURE = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
PLAIN = ("arrival_s", "input_tokens", "output_tokens")
JSON_INPUT = ("input_length", "input_tokens", "prompt_tokens")
JSON_OUTPUT = ("output_length", "output_tokens", "completion_tokens")

_DATE = re.compile(r"(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(\.\d+)?(Z|[+-]\d{2}:?\d{2})?")


def read_trace(path: Path) -> tuple[TraceRequest, ...]:
    """The requests of a trace file in any of the module's formats, sorted, from 0."""
    raw: list[tuple[float, int, int]] = []
    try:
        with path.open("rb") as fh:
            lines = _lines(fh, path)
            first = next(lines, None)
            if first is None:
                raise TraceError(f"{path}: empty file")
            if first[1].lstrip().startswith("{"):
                _read_jsonl(path, first, lines, raw)
            else:
                _read_csv(path, first, lines, raw)
    except OSError as exc:
        raise TraceError(f"{path}: {exc.strerror or exc}") from exc
    if not raw:
        raise TraceError(f"{path}: no requests")
    raw.sort(key=lambda r: r[0])
    base = raw[0][0]
    return tuple(TraceRequest(t - base, i, o) for t, i, o in raw)


def _lines(fh: BinaryIO, path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text without its line end), refusing long lines and non-UTF-8."""
    n = 0
    while True:
        data = fh.readline(MAX_LINE_BYTES + 1)
        if not data:
            return
        n += 1
        if len(data) > MAX_LINE_BYTES:
            raise TraceError(f"{path}:{n}: line longer than {MAX_LINE_BYTES} bytes")
        if n == 1 and data.startswith(b"\xef\xbb\xbf"):
            data = data[3:]
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TraceError(f"{path}:{n}: not UTF-8 text ({exc.reason})") from None
        if "\x00" in text:
            raise TraceError(f"{path}:{n}: NUL byte: not a text trace")
        yield n, text.rstrip("\r\n")


def _add(raw: list[tuple[float, int, int]], path: Path, n: int, row: tuple[float, int, int]
         ) -> None:
    if len(raw) >= MAX_TRACE_ROWS:
        raise TraceError(f"{path}:{n}: more than {MAX_TRACE_ROWS} requests")
    raw.append(row)


def _read_csv(path: Path, first: tuple[int, str], lines: Iterator[tuple[int, str]],
              raw: list[tuple[float, int, int]]) -> None:
    header = [h.strip() for h in _csv_row(path, *first)]
    if set(AZURE) <= set(header):
        cols, azure = [header.index(c) for c in AZURE], True
    elif set(PLAIN) <= set(header):
        cols, azure = [header.index(c) for c in PLAIN], False
    else:
        raise TraceError(f"{path}: header must contain {list(AZURE)} (Azure LLM trace) or "
                         f"{list(PLAIN)}, got {header[:8]}")
    for n, text in lines:
        if not text.strip():
            continue
        row = _csv_row(path, n, text)
        if len(row) < len(header):
            raise TraceError(f"{path}:{n}: {len(row)} fields, the header has {len(header)}")
        t_text, i_text, o_text = (row[c].strip() for c in cols)
        ts = _azure_time(t_text, path, n) if azure else _number(t_text, path, n, PLAIN[0])
        _add(raw, path, n, (_seconds(ts, path, n), _tokens(i_text, path, n, header[cols[1]]),
                            _tokens(o_text, path, n, header[cols[2]])))


def _csv_row(path: Path, n: int, text: str) -> list[str]:
    try:
        return next(csv.reader([text]), [])
    except csv.Error as exc:
        raise TraceError(f"{path}:{n}: {exc}") from None


def _read_jsonl(path: Path, first: tuple[int, str], lines: Iterator[tuple[int, str]],
                raw: list[tuple[float, int, int]]) -> None:
    for n, text in _chain(first, lines):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise TraceError(f"{path}:{n}: not a JSON object ({str(exc)[:80]})") from None
        if not isinstance(obj, dict):
            raise TraceError(f"{path}:{n}: not a JSON object")
        if "timestamp" not in obj:
            raise TraceError(f"{path}:{n}: no 'timestamp' (milliseconds)")
        ms = _number(obj["timestamp"], path, n, "timestamp")
        inp = _key(obj, JSON_INPUT, path, n)
        out = _key(obj, JSON_OUTPUT, path, n)
        _add(raw, path, n, (_seconds(ms / 1000.0, path, n), inp, out))


def _chain(first: tuple[int, str], rest: Iterator[tuple[int, str]]
           ) -> Iterator[tuple[int, str]]:
    yield first
    yield from rest


def _key(obj: dict[str, object], names: tuple[str, ...], path: Path, n: int) -> int:
    for name in names:
        if name in obj:
            return _tokens(obj[name], path, n, name)
    raise TraceError(f"{path}:{n}: none of {', '.join(names)}")


def _number(value: object, path: Path, n: int, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TraceError(f"{path}:{n}: {name} must be a number")
    try:
        number = float(value)
    except (ValueError, OverflowError):
        raise TraceError(f"{path}:{n}: {name} must be a number, "
                         f"not {str(value)[:40]!r}") from None
    if not math.isfinite(number):
        raise TraceError(f"{path}:{n}: {name} must be finite")
    return number


def _tokens(value: object, path: Path, n: int, name: str) -> int:
    number = _number(value, path, n, name)
    if number < 0 or number != int(number) or number > MAX_TOKENS:
        raise TraceError(f"{path}:{n}: {name} must be a whole number of tokens in "
                         f"0..{MAX_TOKENS}, not {str(value)[:40]!r}")
    return int(number)


def _seconds(ts: float, path: Path, n: int) -> float:
    if not 0 <= ts <= MAX_TIMESTAMP_S:
        raise TraceError(f"{path}:{n}: timestamp out of range (0..{MAX_TIMESTAMP_S:g} s)")
    return ts


def _azure_time(text: str, path: Path, n: int) -> float:
    m = _DATE.fullmatch(text)
    if m is None:
        return _number(text, path, n, "TIMESTAMP")
    day, clock, frac, zone = m.groups()
    try:
        # fromisoformat takes at most 6 fraction digits; the 2023 trace has 7.
        when = datetime.fromisoformat(f"{day}T{clock}")
    except ValueError:
        raise TraceError(f"{path}:{n}: bad TIMESTAMP {text[:40]!r}") from None
    tz = UTC
    if zone and zone != "Z":
        sign = -1 if zone[0] == "-" else 1
        hh, mm = int(zone[1:3]), int(zone[-2:])
        if hh > 23 or mm > 59:
            raise TraceError(f"{path}:{n}: bad UTC offset in {text[:40]!r}")
        tz = timezone(sign * timedelta(hours=hh, minutes=mm))
    return when.replace(tzinfo=tz).timestamp() + (float(frac) if frac else 0.0)
