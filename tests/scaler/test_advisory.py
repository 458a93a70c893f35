"""Advisory plans: declared in the scaler's configuration, planned through the answer
function beside whatever scales the workload, exported with the GPU-hours the plan would
have saved; a second that is not known is left out, never counted as zero."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import grpc
import httpx2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuscale.common.errors import ConfigError
from gpuscale.proto import inspect_pb2 as ipb
from gpuscale.proto import inspect_pb2_grpc as ipb_grpc
from gpuscale.scaler.advisory import (
    ADVISORY,
    MAX_WORKLOADS,
    WINDOW_S,
    Advisor,
    AdvisoryWorkload,
    Ledger,
    parse_advisory,
)
from gpuscale.scaler.answers import Answers
from gpuscale.scaler.config import ScalerConfig, load_file
from gpuscale.scaler.edges.http import AdvisoryCollector
from gpuscale.scaler.root import Scaler
from gpuscale.scaler.state.fleet import FleetView
from gpuscale.stream.records import PodRecord
from gpuscale.telemetry.model import Absent, Reading
from tests.support.ports import free_port

ENTRY: dict[str, Any] = {"namespace": "llm", "name": "chat", "podSelector": "app=vllm",
                         "metadata": {"ttftSeconds": "2", "startupSeconds": "120"}}


def test_a_declared_workload_is_a_planner_trigger_of_its_own() -> None:
    (w,) = parse_advisory([{**ENTRY, "gpusPerReplica": 2}])
    assert (w.namespace, w.name, w.gpus_per_replica) == ("llm", "chat", 2.0)
    assert w.trigger.planner is not None
    assert w.trigger.planner.startup_s == 120.0
    assert w.trigger.selector is not None
    assert w.trigger.selector.text == "app=vllm"
    assert w.workload.source == ADVISORY  # kept apart from KEDA's planners
    assert parse_advisory(None) == ()
    assert parse_advisory([]) == ()


@pytest.mark.parametrize(("raw", "says"), [
    ({"namespace": "llm"}, "expected a list"),
    (["chat"], r"advisory\[0\]: expected a mapping"),
    ([{**ENTRY, "replicas": 3}], r"unknown key\(s\) \['replicas'\]"),
    ([{k: v for k, v in ENTRY.items() if k != "podSelector"}], "podSelector: required"),
    ([{**ENTRY, "namespace": "LLM!"}], "not a Kubernetes namespace"),
    ([{**ENTRY, "name": ""}], "name: required"),
    ([{**ENTRY, "podSelector": "app in ("}], "podSelector"),
    ([{**ENTRY, "metadata": {"ttftSeconds": 2}}], "quote numbers"),
    ([{**ENTRY, "metadata": ["ttftSeconds"]}], "metadata: a mapping"),
    ([{**ENTRY, "metadata": {"profile": "gpu-utilization"}}], "set by the advisory entry"),
    ([{**ENTRY, "metadata": {"utilization": "2"}}], "utilization: must be between"),
    ([{**ENTRY, "metadata": {"url": "http://x"}}], "url"),
    ([{**ENTRY, "gpusPerReplica": 0}], "gpusPerReplica"),
    ([{**ENTRY, "gpusPerReplica": True}], "gpusPerReplica"),
    ([{**ENTRY, "gpusPerReplica": float("nan")}], "gpusPerReplica"),
    ([{**ENTRY, "gpusPerReplica": "2"}], "gpusPerReplica"),
    ([ENTRY, ENTRY], r"advisory\[1\]: llm/chat is declared twice"),
    ([{**ENTRY, "name": f"w{i}"} for i in range(MAX_WORKLOADS + 1)], "at most 100"),
])
def test_bad_entries_are_one_clear_error(raw: object, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        parse_advisory(raw)


_JUNK = st.recursive(st.none() | st.booleans() | st.integers() | st.floats()
                     | st.text(max_size=20),
                     lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(st.text(max_size=12), inner, max_size=4),
                     max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(raw=_JUNK | st.lists(st.dictionaries(st.sampled_from(
    ["namespace", "name", "podSelector", "gpusPerReplica", "metadata"]), _JUNK), max_size=3))
def test_any_input_is_parsed_or_refused_with_a_config_error(raw: object) -> None:
    said = ""
    try:
        got = parse_advisory(raw)
    except ConfigError as exc:
        said = str(exc)
    else:
        assert all(isinstance(w, AdvisoryWorkload) and w.trigger.planner for w in got)
        return
    assert said  # one line that says where, and stays short
    assert "\n" not in said
    assert len(said) < 400


def test_the_configuration_file_holds_demand_sources_and_advisory_workloads(
        tmp_path: Path) -> None:
    good = tmp_path / "scaler.yaml"
    good.write_text("demandSources:\n"
                    "  - {name: gateway, kind: metrics, url: 'http://gw.svc:9090/metrics',"
                    " metric: pending}\n"
                    "advisory:\n"
                    "  - {namespace: llm, name: chat, podSelector: app=vllm}\n")
    demand, advisory = load_file(good)
    assert [s.name for s in demand.demand_sources] == ["gateway"]
    assert [w.name for w in advisory] == ["chat"]
    cases = {"bad.yaml": (b"advisory: [\n", "not valid YAML"),
             "binary.yaml": (b"\xff\xfe\x00junk", "not valid YAML"),
             "list.yaml": (b"- advisory\n", "expected a mapping"),
             "entry.yaml": (b"advisory:\n  - {namespace: llm}\n", r"advisory\[0\]: name"),
             "other.yaml": (b"advisories: []\n", "unknown key")}
    for name, (body, says) in cases.items():
        path = tmp_path / name
        path.write_bytes(body)
        with pytest.raises(ConfigError, match=says) as err:
            load_file(path)
        assert str(err.value).startswith(str(path))
    with pytest.raises(ConfigError, match="cannot read"):
        load_file(tmp_path / "absent.yaml")


def _pod(name: str, now: float, ready: bool = True, waiting: float = 0.0,
         override: dict[str, Reading] | None = None) -> PodRecord:
    """A vLLM pod serving 0.4 replica-seconds per second (prefill 6,000 tokens/s of
    30,000, decode 2,400 of 12,000)."""
    signals: dict[str, Reading] = {
        "vllm-prompt-tps": 6_000.0, "vllm-generation-tps": 2_400.0,
        "vllm-finished-rate": 2.0, "vllm-waiting": waiting, "vllm-running": 8.0,
        "vllm-kv-cache": 20.0, **(override or {})}
    return PodRecord("llm", name, "node-a", {"app": "vllm"}, None, ready,
                     signals if ready else {}, now)


class Roster:
    """The roster's contract (scaler.answers.Roster): the pods or agents it expected and
    has not heard from; here a node whose agent has not reported."""

    def __init__(self) -> None:
        self.silent: list[str] = []

    def problems(self, namespace: str, selector: object,
                 records: object) -> list[str]:
        return list(self.silent)


class World:
    def __init__(self, gpus: float = 1.0) -> None:
        self.now = 1_000.0
        self.fleet = FleetView(monotonic=lambda: self.now)
        self.roster = Roster()
        (w,) = parse_advisory([{**ENTRY, "gpusPerReplica": gpus}])
        self.advisor = Advisor(Answers(self.fleet, self.roster), [w], lambda: self.now)

    def run(self, seconds: int, pods: int, **kw: Any) -> None:
        for _ in range(seconds):
            self.fleet.update_node("node-a", [_pod(f"vllm-{i}", self.now, **kw)
                                              for i in range(pods)])
            self.advisor.answers.plans.tick(self.now)  # the scaler's plan loop
            self.advisor.tick()
            self.now += 1.0

    @property
    def ledger(self) -> Ledger:
        return self.advisor.ledgers[("llm", "chat")]


def test_planned_and_actual_replicas_and_the_gpu_hours_between_them() -> None:
    # Six pods carry 2.4 replica-seconds per second: the plan is 3 (2.4 with room, 2.79)
    # once the planner has seen a hold window (120 s); until then it keeps the six.
    world = World(gpus=2.0)
    world.run(600, pods=6)
    ledger = world.ledger
    assert (ledger.planned, ledger.actual, ledger.why) == (3, 6, "")
    known, planned, actual, unknown = ledger.totals()
    assert known == 599.0  # the first tick has no second before it
    assert unknown == 0.0
    assert actual == pytest.approx(6 * 2 * 599 / 3600)
    assert planned < actual
    assert planned == pytest.approx(2 * (6 * 120 + 3 * 479) / 3600, rel=0.02)


def test_a_second_without_data_is_left_out_not_counted_as_zero() -> None:
    world = World()
    world.run(200, pods=4)
    before = world.ledger.totals()
    # A Ready pod lost its engine metrics: no observation, so no plan after its 10 s of
    # staleness; the seconds are unknown, and the GPU-hours do not move.
    world.run(60, pods=4, override={"vllm-prompt-tps": Absent.NO_DATA})
    known, planned, actual, unknown = world.ledger.totals()
    assert world.ledger.planned is None
    assert "planner" in world.ledger.why
    assert world.ledger.actual == 4  # the pods are known; the plan is not
    assert known - before[0] == pytest.approx(10.0, abs=1.0)  # the last plan's 10 s
    assert unknown == pytest.approx(50.0, abs=1.0)
    assert actual - before[2] == pytest.approx(4 * (known - before[0]) / 3600)
    # And on /metrics: no planned replicas while unknown, never a 0.
    registry = CollectorRegistry()
    registry.register(AdvisoryCollector(world.advisor))
    families = {f.name: f for f in text_string_to_metric_families(
        generate_latest(registry).decode())}
    kinds = {s.labels["kind"]: s.value for s in families["gpuscale_advisory_replicas"].samples}
    assert kinds == {"actual": 4.0}
    saved = families["gpuscale_advisory_saved_gpu_hours"].samples[0].value
    assert saved == pytest.approx(actual - planned)


def test_pods_on_a_node_not_heard_from_make_the_actual_count_unknown() -> None:
    """The pods the fleet view has are not all the workload's while an agent is silent:
    counting them would understate what runs (and what the plan saves)."""
    world = World()
    world.run(200, pods=3)
    before = world.ledger.totals()
    world.roster.silent = ["node-b: its agent has not reported"]
    world.run(30, pods=3)
    assert (world.ledger.planned, world.ledger.actual) == (None, None)
    assert "node-b" in world.ledger.why
    known, planned, actual, unknown = world.ledger.totals()
    assert (known, planned, actual) == before[:3]  # nothing counted while not known
    assert unknown == pytest.approx(30.0)
    world.roster.silent = []
    world.run(5, pods=3)
    assert world.ledger.actual == 3


def test_the_ledger_forgets_what_is_older_than_a_day() -> None:
    ledger = Ledger()
    for minute in range(int(WINDOW_S // 60) + 30):
        ledger.add(minute * 60.0, 60.0, 1, 2, 1.0)
    known, planned, actual, _ = ledger.totals()
    assert known == pytest.approx(WINDOW_S, abs=60.0)
    assert actual - planned == pytest.approx(24.0, abs=0.1)  # one replica-hour an hour
    assert len(ledger.buckets) <= WINDOW_S / 60 + 1


async def test_the_scaler_exports_advisory_plans_on_its_metrics_endpoint() -> None:
    port = free_port()
    (w,) = parse_advisory([ENTRY])
    scaler = Scaler(ScalerConfig(host="127.0.0.1", port=0, metrics_port=port,
                                 in_process=True, advisory=(w,)))
    assert isinstance(w, AdvisoryWorkload)
    started = scaler.fleet.now()  # on the clock the ledger counts GPU-hours by
    up = asyncio.Event()
    task = asyncio.create_task(scaler.run(lambda _: up.set()))
    await asyncio.wait_for(up.wait(), 10)
    try:
        async with httpx2.AsyncClient() as client:
            for _ in range(40):
                now = scaler.fleet.now()
                scaler.fleet.update_node("node-a", [_pod(f"vllm-{i}", now) for i in range(2)])
                await asyncio.sleep(0.1)
            body = (await client.get(f"http://127.0.0.1:{port}/metrics", timeout=5)).text
        # gpuscale explain shows it as it shows a ScaledObject: planned beside its pods.
        async with grpc.aio.insecure_channel(f"127.0.0.1:{scaler.port}") as channel:
            explained = await ipb_grpc.InspectStub(channel).Explain(
                ipb.ExplainRequest(namespace="llm", name="chat"), timeout=5)
        # gpuscale idle reads them from the scaler (its Usage call), as a person runs it.
        idle = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gpuscale.cli", "idle", "--scaler",
            f"127.0.0.1:{scaler.port}", "--json", stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(idle.communicate(), 60)
        assert idle.returncode == 0, err.decode()
        ran_s = scaler.fleet.now() - started
        text = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gpuscale.cli", "idle", "--scaler",
            f"127.0.0.1:{scaler.port}", stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        table, _ = await asyncio.wait_for(text.communicate(), 60)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    families = {f.name: f for f in text_string_to_metric_families(body)}
    replicas = {s.labels["kind"]: s.value
                for s in families["gpuscale_advisory_replicas"].samples}
    assert replicas == {"planned": 2.0, "actual": 2.0}  # warming: keeps the pods there
    assert (explained.planned_replicas, explained.pod_count) == (2, 2)
    assert explained.metadata["profile"] == "vllm-planner"
    assert explained.selector == "app=vllm"
    assert "steady" in explained.plan_terms
    (plan,) = json.loads(out)["advisory"]
    assert (plan["namespace"], plan["name"], plan["planned_now"], plan["running_now"]) == (
        "llm", "chat", 2, 2)
    assert plan["known_seconds"] > 0
    assert plan["gpu_hours_saved"] == pytest.approx(plan["gpu_hours_run"]
                                                    - plan["gpu_hours_planned"])
    assert 0 < plan["gpu_hours_run"] <= 2 * ran_s / 3600  # two pods, at most while it ran
    lines = table.decode().splitlines()
    head = lines.index(next(line for line in lines if line.startswith("ADVISORY PLANS")))
    assert lines[head + 1].split()[:4] == ["NAMESPACE", "WORKLOAD", "PLANNED", "NOW"]
    assert lines[head + 2].split()[:4] == ["llm", "chat", "2", "2"]
    known = families["gpuscale_advisory_known_seconds"].samples[0]
    assert known.labels == {"namespace": "llm", "name": "chat"}
    assert known.value > 0


def test_an_advisory_workload_never_hides_a_scaledobject_of_the_same_name() -> None:
    from gpuscale.scaler.core.trigger import parse_metadata
    from gpuscale.scaler.state.history import TriggerHistory

    (w,) = parse_advisory([ENTRY])
    keda = parse_metadata({"podSelector": "app=vllm", "profile": "vllm-inference"})
    history = TriggerHistory()
    history.note("llm", "chat", w.metadata, w.trigger, 1.0, ADVISORY)
    seen = history.get("llm", "chat")
    assert seen is not None
    assert (seen.source, seen.config) == (ADVISORY, w.trigger)
    history.note("llm", "chat", {"profile": "vllm-inference"}, keda, 2.0)  # KEDA asks
    seen = history.get("llm", "chat")
    assert seen is not None
    assert (seen.source, seen.config) == ("keda", keda)
    history.note("llm", "chat", w.metadata, w.trigger, 3.0, ADVISORY)  # ignored now
    assert (seen.source, seen.config, seen.asked_at) == ("keda", keda, 2.0)
