"""Selecting the lines an engine's signals read changes nothing: over generated exposition
text (the names read, their relatives and look-alikes, quoted names, ``__name__``, names
in label values and HELP text, every TYPE, junk), ``samples`` of the selected lines equals
``samples`` of the whole text on the names read, error and line number included."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gpuscale.engines.line_filter import MARKER, related, select_lines
from gpuscale.engines.signals import BOUNDS, ENGINES, MAX_SERIES, READS, EngineParseError, samples
from gpuscale.engines.vllm_body import vllm_body

READ = {engine: {n for n in BOUNDS if n in READS[engine]} for engine in ENGINES}
BASES = ["vllm:num_requests_waiting", "vllm:prompt_tokens", "vllm:request_success",
         "vllm:kv_cache_usage_perc", "nv_inference_pending_request",
         "nv_inference_request_success", "nv_inference_queue_duration_us", "tgi_queue_size",
         "vllm:request_prompt_tokens", "vllm_num_requests_waiting", "other", "x"]
NAME = st.tuples(st.sampled_from(BASES),
                 st.sampled_from(["", "_total", "_count", "_sum", "_bucket", "_created",
                                  "_count_total"])).map("".join)
VALUE = st.sampled_from(["1", "0", "-3", "2.5", "1e3", "+Inf", "NaN", "1_0", "0x1", "",
                         "7 123", "7 " + "9" * 40, "1.", ".5"])
LABEL = st.one_of(
    st.tuples(st.sampled_from(["engine", "le", "a", "__name__", "model_name"]),
              st.one_of(NAME, st.sampled_from(["0", "m", "", 'q\\"', "a,b", "{", "="])))
    .map(lambda t: f'{t[0]}="{t[1]}"'),
    NAME.map(lambda n: f'"{n}"'),
    st.sampled_from(["", "junk", '"unclosed']))
LABELS = st.one_of(st.just(""), st.lists(LABEL, max_size=3).map(
    lambda ls: "{" + ",".join(ls) + "}"), st.sampled_from(["{", '{a="b"', "{}"]))
LINE = st.one_of(
    st.tuples(NAME, LABELS, st.sampled_from([" ", "\t", "  "]), VALUE).map("".join),
    st.tuples(LABELS, st.just(" "), VALUE).map("".join),
    st.tuples(st.sampled_from(["TYPE", "HELP"]), NAME,
              st.sampled_from(["counter", "gauge", "histogram", "summary", "untyped",
                               "info", "", "bogus", "doc vllm:num_requests_running",
                               'say "hi'])).map(lambda t: f"# {t[0]} {t[1]} {t[2]}"),
    st.sampled_from(["", "   ", "# a comment", "#", "# TYPE", "# HELP", "\r", "x 1\r",
                     "  x 1  ", MARKER]),
    st.text(max_size=20))
BODY = st.lists(LINE, max_size=25).map("\n".join)
# Regular text (what engines send), so most examples take the selecting path, with lines
# dropped and kept, rather than falling back to the whole body on an odd line.
PLAIN_LABELS = st.lists(st.tuples(st.sampled_from(["engine", "le", "model_name"]),
                                  st.one_of(NAME, st.sampled_from(["0", "m", ""]))),
                        max_size=2, unique_by=lambda t: t[0]).map(
    lambda ls: "{" + ",".join(f'{k}="{v}"' for k, v in ls) + "}" if ls else "")
PLAIN_LINE = st.one_of(
    st.tuples(NAME, PLAIN_LABELS, st.just(" "),
              st.sampled_from(["1", "0", "-3", "2.5", "1e3", "+Inf", "NaN"])).map("".join),
    st.tuples(st.sampled_from(["TYPE", "HELP"]), NAME,
              st.sampled_from(["counter", "gauge", "histogram", "summary", "untyped"])).map(
        lambda t: f"# {t[0]} {t[1]} {t[2]}"),
    st.just(""))
REGULAR = st.lists(PLAIN_LINE, max_size=25).map("\n".join)


def outcome(engine: str, text: str, only: bool) -> object:
    try:
        got = samples(text, READS[engine] if only else None)
    except EngineParseError as exc:
        return ("error", str(exc))
    # repr: NaN equals itself there
    return {name: repr(values) for name, values in got.items() if name in READ[engine]}


@settings(max_examples=1500, deadline=None)
@given(st.one_of(BODY, REGULAR))
@example("# TYPE vllm:prompt_tokens counter\n# TYPE other gauge\nvllm:prompt_tokens 5")
@example("# TYPE vllm:prompt_tokens counter\nother 1\nvllm:prompt_tokens 5")
@example("# TYPE vllm:prompt_tokens counter\n\nvllm:prompt_tokens 5")
@example("# TYPE nv_inference_pending_request summary\nnv_inference_pending_request_count 1\n"
         "# TYPE nv_inference_pending_request counter")
@example('other{a="vllm:num_requests_waiting"} 1\nvllm:num_requests_waiting{ 2')
@example("# TYPE _total counter\n_total 1\nvllm:num_requests_waiting 3\n")
@example("x{" + ",".join(f'l{i}="v"' for i in range(9)) + ',l3="w"} 1\ntgi_queue_size 1')
def test_selected_lines_parse_to_the_same_samples(text: str) -> None:
    for engine in ENGINES:
        assert outcome(engine, text, True) == outcome(engine, text, False), engine


def test_a_real_sized_vllm_body_is_cut_to_the_lines_read() -> None:
    text = vllm_body()
    selected = select_lines(text, READS["vllm"], MAX_SERIES)
    assert selected is not None
    assert len(selected) < 50 < text.count("\n")
    assert outcome("vllm", text, True) == outcome("vllm", text, False)
    got = outcome("vllm", text, True)
    assert isinstance(got, dict)
    assert set(got) == READ["vllm"] - {"vllm:gpu_cache_usage_perc"}


def test_odd_lines_and_too_many_samples_parse_the_whole_body() -> None:
    keep = READS["tgi"]
    assert select_lines("# just a comment\ntgi_queue_size 1", keep, 10) is None
    assert select_lines("x{a=\"1\",a=\"2\"} 1\ntgi_queue_size 1", keep, 10) is None
    assert select_lines("x 1\n" * 11, keep, 10) is None
    assert select_lines("x 1\n" * 10 + "tgi_queue_size 1", keep, 20) == [
        (1, MARKER), (11, "tgi_queue_size 1")]


def test_related_names() -> None:
    assert related(["a_b_total", "c_count"]) == {"a_b_total", "a_b", "c_count", "c"}


NINE = ",".join(f'l{i}="v"' for i in range(9))


@pytest.mark.parametrize(("line", "selected"), [
    # more labels than the fast pattern compares: decided line by line, as defined
    (f"x{{{NINE}}} 1", [(1, MARKER), (2, "tgi_queue_size 1")]),
    (f'x{{{NINE},l8="w"}} 1', None),
    (f'x{{{NINE},l0="w"}} 1', None),
    ('x{a="1",b="2",c="3",b="4"} 1', None),
])
def test_labels_twice_are_found_however_many(line: str, selected: object) -> None:
    assert select_lines(f"{line}\ntgi_queue_size 1", READS["tgi"], 10) == selected


LONG = 1_000_000  # its square is hours of backtracking: the suite's per-test timeout
#                  (pyproject.toml) fails a pattern that gives characters back, without
#                  a test timing anything; bench/bench_select.py measures the cost per MB


@pytest.mark.parametrize("line", [
    "x 1" + "1" * LONG + "z",  # a number that fails at its end
    "x 1." + "1" * LONG + "e" + "1" * LONG + "z",
    " " * LONG + "z",  # blanks before a line that fails
    "x 1" + " " * LONG + "z",
])
def test_a_long_line_that_fails_is_refused_in_one_pass(line: str) -> None:
    """A line that fails at its very end, after a run no pattern may give back: refused
    (None: the caller parses the whole body), in time linear in its length."""
    assert select_lines(f"{line}\ntgi_queue_size 1", READS["tgi"], 10) is None
