"""Trace readers: Azure LLM CSV (2023 and 2024), plain CSV, Mooncake-style JSONL."""

from __future__ import annotations

import json
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuscale.common.errors import ConfigError
from gpuscale.traffic.trace import (
    MAX_LINE_BYTES,
    MAX_TOKENS,
    TraceError,
    TraceRequest,
    read_trace,
)

# Arrivals in milliseconds (exact in every format), tokens within the accepted range.
rows = st.lists(st.tuples(st.integers(0, 10**9), st.integers(0, MAX_TOKENS),
                          st.integers(0, MAX_TOKENS)), min_size=1, max_size=40)


def expected(data: list[tuple[int, int, int]]) -> list[TraceRequest]:
    ordered = sorted(data, key=lambda r: r[0])  # stable, as the reader
    base = ordered[0][0]
    return [TraceRequest((t - base) / 1000.0, i, o) for t, i, o in ordered]


def read_text(text: str | bytes, suffix: str = ".csv") -> tuple[TraceRequest, ...]:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"trace{suffix}"
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text, encoding="utf-8", newline="")
        return read_trace(path)


def close(got: tuple[TraceRequest, ...], want: list[TraceRequest], tol: float) -> bool:
    return len(got) == len(want) and all(
        abs(g.arrival_s - w.arrival_s) <= tol and (g.input_tokens, g.output_tokens) ==
        (w.input_tokens, w.output_tokens) for g, w in zip(got, want, strict=True))


@settings(max_examples=60, deadline=None)
@given(rows, st.sampled_from(["\n", "\r\n"]), st.booleans())
def test_plain_csv_round_trips(data, newline, bom) -> None:
    text = newline.join(["arrival_s,input_tokens,output_tokens",
                         *(f"{t / 1000},{i},{o}" for t, i, o in data)]) + newline
    got = read_text(("\ufeff" if bom else "") + text)
    assert close(got, expected(data), 1e-6)


@settings(max_examples=60, deadline=None)
@given(rows, st.sampled_from(["input_length", "input_tokens", "prompt_tokens"]),
       st.sampled_from(["output_length", "output_tokens", "completion_tokens"]))
def test_jsonl_round_trips_with_each_key_variant(data, inp, out) -> None:
    lines = [json.dumps({"timestamp": 1_700_000_000_000 + t, inp: i, out: o,
                         "hash_ids": [1, 2]}) for t, i, o in data]
    assert close(read_text("\n".join(lines) + "\n", ".jsonl"), expected(data), 1e-6)


@settings(max_examples=60, deadline=None)
@given(rows, st.sampled_from(["2023", "2024"]), st.sampled_from(["\n", "\r\n"]))
def test_azure_csv_round_trips_in_both_years_formats(data, year, newline) -> None:
    start = datetime(2023, 11, 16, 18, 15, tzinfo=UTC).timestamp()

    def stamp(ms: int) -> str:
        when = datetime.fromtimestamp(start + ms / 1000, UTC)
        if year == "2023":  # naive, 7 fraction digits
            return when.strftime("%Y-%m-%d %H:%M:%S.%f") + "0"
        return when.isoformat(sep=" ")  # "+00:00", the fraction only when non-zero

    text = newline.join(["TIMESTAMP,ContextTokens,GeneratedTokens",
                         *(f"{stamp(t)},{i},{o}" for t, i, o in data)]) + newline
    assert close(read_text(text), expected(data), 1e-5)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400))
def test_garbage_is_a_trace_error_or_a_trace(data) -> None:
    for prefix in (b"", b"arrival_s,input_tokens,output_tokens\n", b"{"):
        got: tuple[TraceRequest, ...] | str
        try:
            got = read_text(prefix + data)
        except TraceError as exc:
            got = str(exc)
        if isinstance(got, str):
            assert "trace.csv" in got
        else:
            assert got[0].arrival_s == 0.0


@pytest.mark.parametrize(("text", "reason"), [
    ("", "empty file"),
    ("a,b\n1,2\n", "header must contain"),
    ("arrival_s,input_tokens,output_tokens\n", "no requests"),
    ("arrival_s,input_tokens,output_tokens\n1,2\n", ":2: 2 fields"),
    ("arrival_s,input_tokens,output_tokens\n1,-2,3\n", ":2: input_tokens must be a whole"),
    ("arrival_s,input_tokens,output_tokens\n1,2.5,3\n", ":2: input_tokens must be a whole"),
    ("arrival_s,input_tokens,output_tokens\n1,2,99999999999\n", ":2: output_tokens"),
    ("arrival_s,input_tokens,output_tokens\nnan,2,3\n", ":2: arrival_s must be finite"),
    ("arrival_s,input_tokens,output_tokens\n0,1,1\ninf,2,3\n", ":3: arrival_s must be"),
    ("arrival_s,input_tokens,output_tokens\n-1,2,3\n", ":2: timestamp out of range"),
    ("arrival_s,input_tokens,output_tokens\n1e300,2,3\n", ":2: timestamp out of range"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-13-45 00:00:00,1,1\n", ":2: bad TIMESTAMP"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,1\n", ":2: TIMESTAMP must be"),
    ('{"timestamp": 1, "input_length": 1}\n', ":1: none of output_length"),
    ('{"input_length": 1, "output_length": 1}\n', ":1: no 'timestamp'"),
    ('{"timestamp": true, "input_length": 1, "output_length": 1}\n', "must be a number"),
    ('{"timestamp": 1, "input_length": 1, "output_length": 1}\n[1]\n', ":2: not a JSON obj"),
    ('{"timestamp": 1, "input_length": NaN, "output_length": 1}\n', "must be finite"),
    ('{"timestamp": 1, "input_length": 1, "output_length": 1}\n{oops\n', ":2: not a JSON"),
])
def test_malformed_traces_name_the_file_and_line(text, reason) -> None:
    with pytest.raises(TraceError, match=reason) as info:
        read_text(text)
    assert isinstance(info.value, ConfigError)
    assert "trace.csv" in str(info.value)


def test_hostile_files() -> None:
    header = b"arrival_s,input_tokens,output_tokens\n"
    with pytest.raises(TraceError, match=r":2: line longer than"):
        read_text(header + b"1," + b"9" * (10 * MAX_LINE_BYTES) + b",1\n")
    with pytest.raises(TraceError, match="not UTF-8"):
        read_text(header + b"1,2,\xff\xfe\n")
    with pytest.raises(TraceError, match="NUL byte"):
        read_text(b"\x00\x01\x02\x03" * 100)


def test_rows_are_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("gpuscale.traffic.trace.MAX_TRACE_ROWS", 3)
    body = "".join(f"{t},1,1\n" for t in range(4))
    with pytest.raises(TraceError, match=":5: more than 3 requests"):
        read_text("arrival_s,input_tokens,output_tokens\n" + body)


def test_unsorted_arrivals_are_sorted_stably_and_start_at_zero() -> None:
    got = read_text("arrival_s,input_tokens,output_tokens\n5,1,1\n3,2,2\n5,3,3\n3,4,4\n")
    assert got == (TraceRequest(0.0, 2, 2), TraceRequest(0.0, 4, 4),
                   TraceRequest(2.0, 1, 1), TraceRequest(2.0, 3, 3))


def test_azure_timestamps_with_an_offset_are_utc() -> None:
    got = read_text("TIMESTAMP,ContextTokens,GeneratedTokens,Extra\n"
                    "2024-05-10 02:00:00+02:00,1,1,x\n"
                    "2024-05-10 00:00:01.5Z,2,2,y\n")
    assert [r.arrival_s for r in got] == [0.0, 1.5]
