"""Scenario and trace parsing: table cases for each error, properties for arbitrary input."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuscale.telemetry.scenario import (
    MAX_SCENARIO_BYTES,
    Scenario,
    ScenarioError,
    builtin_scenarios,
    load_scenario,
    parse_scenario,
)
from gpuscale.traffic.trace import TraceError, read_trace
from tests.support.repo import AZURE_CONV

TRACE = AZURE_CONV


def node(**kw: Any) -> dict[str, Any]:
    return {"nodes": [{"name": "n", "gpus": [{"model": "L4"}], **kw}]}


@pytest.mark.parametrize("name", sorted(builtin_scenarios()))
def test_shipped_scenarios_load(name: str) -> None:
    scenario = load_scenario(name)
    assert scenario.description
    assert scenario.nodes[0].gpus


@pytest.mark.parametrize(("doc", "message"), [
    ([], "scenario: expected a mapping"),
    ({}, "scenario: missing key(s) ['nodes']"),
    ({"nodes": [], "x": 1}, "scenario: unknown key(s) ['x']"),
    ({"nodes": []}, "nodes: expected 1 to 1000 entries, got 0"),
    ({"nodes": [{"name": "n", "gpus": [{"model": "Z9"}]}]},
     "nodes[0].gpus[0].model: unknown GPU model 'Z9'"),
    ({"nodes": [{"name": "n", "gpus": [{"model": "L4", "sharing": "mig", "mig": ["1g.5gb"]}]}]},
     "nodes[0].gpus[0].sharing: L4 does not support MIG"),
    ({"nodes": [{"name": "n", "gpus": [{"model": "H100-SXM5-80GB", "sharing": "mig",
                                        "mig": ["7g.80gb", "1g.10gb"]}]}]},
     "nodes[0].gpus[0].mig: the instances need more than 7 slices"),
    ({"nodes": [{"name": "n", "gpus": [{"model": "H100-SXM5-80GB", "sharing": "mig",
                                        "mig": ["5g.50gb"]}]}]},
     "nodes[0].gpus[0].mig[0]: '5g.50gb' is not a MIG profile"),
    ({"nodes": [{"name": "n", "gpus": [{"model": "L4", "mig": ["1g.5gb"]}]}]},
     "nodes[0].gpus[0].mig: only allowed with sharing: mig"),
    ({"nodes": [{"name": "n", "gpus": [{"model": "L4", "count": 0}]}]},
     "nodes[0].gpus[0].count: 0 is outside 1..64"),
    ({"nodes": [{"name": "n", "gpus": [{"model": "L4", "sharing": "shared"}]}]},
     "nodes[0].gpus[0].sharing: 'shared' is not one of"),
    (node(processes=[{"gpu": 1, "load": {"constant": 1}}]),
     "nodes[0].processes[0].gpu: GPU 1 does not exist (node has 1)"),
    (node(processes=[{"gpu": 0, "load": {"constant": 101}}]),
     "nodes[0].processes[0].load.constant: 101 is outside 0.0..100.0"),
    (node(processes=[{"gpu": 0, "load": {"constant": float("nan")}}]),
     "nodes[0].processes[0].load.constant: nan is outside"),
    (node(processes=[{"gpu": 0, "load": {"constant": True}}]),
     "nodes[0].processes[0].load.constant: expected a number, got bool"),
    (node(processes=[{"gpu": 0, "load": {}}]),
     "nodes[0].processes[0].load: give exactly one of"),
    (node(processes=[{"gpu": 0, "load": {"constant": 1, "sine": {}}}]),
     "nodes[0].processes[0].load: give exactly one of"),
    (node(processes=[{"gpu": 0, "load": {"steps": [[5, 1], [2, 3]]}}]),
     "nodes[0].processes[0].load.steps[1][0]: step times must increase"),
    (node(processes=[{"gpu": 0, "load": {"constant": 1}, "memory": 0.5, "memory_mib": 5}]),
     "nodes[0].processes[0]: give memory (fraction) or memory_mib, not both"),
    (node(processes=[{"gpu": 0, "load": {"constant": 1}, "memory_mib": 10**9}]),
     "nodes[0].processes[0].memory_mib: 1000000000 is outside"),
    (node(processes=[{"gpu": 0, "pid": 7, "load": {"constant": 1}},
                     {"gpu": 0, "pid": 7, "load": {"constant": 1}}]),
     "nodes[0].processes: duplicate pids"),
    (node(processes=[{"gpu": 0, "load": {"trace": {"path": "/nonexistent.csv",
                                                    "capacity_tokens_per_s": 1}}}]),
     "nodes[0].processes[0].load.trace.path: /nonexistent.csv: No such file"),
    ({"nodes": [{"name": "a", "gpus": []}, {"name": "a", "gpus": []}]},
     "nodes: duplicate node names ['a']"),
    ({"nodes": [{"name": "a" * 2000, "gpus": []}]}, "nodes[0].name: expected a non-empty"),
    ({1: 2}, "scenario: keys must be strings"),
])
def test_bad_scenarios_name_the_key(doc: object, message: str) -> None:
    with pytest.raises(ScenarioError) as err:
        parse_scenario(doc)
    assert message in str(err.value)


def test_mig_process_must_name_its_instance() -> None:
    doc = {"nodes": [{"name": "n", "gpus": [{"model": "A100-SXM4-40GB", "sharing": "mig",
                                             "mig": ["3g.20gb"]}],
                      "processes": [{"gpu": 0, "load": {"constant": 1}}]}]}
    with pytest.raises(ScenarioError, match=r"processes\[0\].mig: GPU 0 is in MIG mode"):
        parse_scenario(doc)


def test_files_that_are_not_scenarios(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes: [unclosed\n")
    with pytest.raises(ScenarioError, match="not valid YAML"):
        load_scenario(bad)
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (MAX_SCENARIO_BYTES + 1))
    with pytest.raises(ScenarioError, match="larger than"):
        load_scenario(big)
    with pytest.raises(ScenarioError, match="shipped scenarios: h100-vllm"):
        load_scenario(tmp_path / "missing.yaml")
    # A YAML bomb of aliases is bounded by the size limit and safe_load (no objects).
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("a: &a [1]\n" + "".join(f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)},"
                                            f" *{chr(97 + i)}]\n" for i in range(8)))
    with pytest.raises(ScenarioError):
        load_scenario(bomb)
    tag = tmp_path / "tag.yaml"
    tag.write_text("!!python/object/apply:os.system ['true']\n")
    with pytest.raises(ScenarioError, match="not valid YAML"):
        load_scenario(tag)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 10**6) | st.floats(allow_nan=True)
    | st.text(max_size=8) | st.sampled_from(["L4", "H100-SXM5-80GB", "mig", "3g.40gb"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["nodes", "name", "gpus", "model", "count", "sharing", "mig",
                         "processes", "gpu", "load", "constant", "sine", "steps", "pid",
                         "memory", "base", "amplitude", "period_s", "x"]), inner, max_size=5),
    max_leaves=30)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_arbitrary_documents_either_parse_or_raise_scenario_error(doc: object) -> None:
    result = _outcome(doc)  # anything else than ScenarioError propagates and fails
    if isinstance(result, ScenarioError):
        assert str(result)
    else:
        assert result.nodes


def _outcome(doc: object) -> Scenario | ScenarioError:
    try:
        return parse_scenario(doc)
    except ScenarioError as exc:
        return exc


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=300))
def test_arbitrary_text_either_parses_or_raises_scenario_error(text: str) -> None:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        return
    _outcome(doc)


def test_real_trace_drives_load() -> None:
    requests = read_trace(TRACE)
    assert len(requests) > 19_000
    assert requests[0].arrival_s == 0.0
    assert 3500 < requests[-1].arrival_s < 3600  # one hour
    doc = node(processes=[{"gpu": 0, "load": {"trace": {
        "path": str(TRACE), "capacity_tokens_per_s": 10_000, "window_s": 30}}}])
    load = parse_scenario(doc).nodes[0].processes[0].load
    values = [load.at(t) for t in range(0, 3600, 60)]
    assert all(0 <= v <= 100 for v in values)
    assert max(values) > 2 * min(values)  # real traffic varies


@pytest.mark.parametrize(("content", "message"), [
    ("", "empty file"),
    ("a,b\n1,2\n", "header must contain"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n", "no requests"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,2\n",
     ":2: TIMESTAMP must be a number"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n1.0,x,2\n", ":2: ContextTokens must be a number"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n1.0,-1,2\n",
     ":2: ContextTokens must be a whole number"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n1.0,1\n", ":2: 2 fields, the header has 3"),
])
def test_bad_traces(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "t.csv"
    path.write_text(content)
    with pytest.raises(TraceError, match=message):
        read_trace(path)


def test_binary_trace(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(TraceError, match="not UTF-8"):
        read_trace(path)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1e6), st.integers(0, 10**6), st.integers(0, 10**6)),
                min_size=1, max_size=50))
def test_trace_rows_round_trip_sorted(rows: list[tuple[float, int, int]]) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "t.csv"
        path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" +
                        "".join(f"{t!r},{i},{o}\n" for t, i, o in rows))
        got = read_trace(path)
    assert len(got) == len(rows)
    assert all(a.arrival_s <= b.arrival_s for a, b in itertools.pairwise(got))
    assert sum(r.input_tokens for r in got) == sum(r[1] for r in rows)
