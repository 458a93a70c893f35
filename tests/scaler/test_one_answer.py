"""One answer: what KEDA gets (GetMetrics and IsActive over gRPC), what ``gpuscale explain
--json`` shows (the command, against the scaler's Inspect service), what the custom metrics
API serves (over HTTPS, in local mode), and what the simulator's adapter (sim.scaler_adapter)
reads are the same number, the same activity, or the same UNAVAILABLE reason, at the same
instant - all through scaler.answers (its value and its one activity rule).

The cases include the three where they once disagreed (issue 39): a pod whose
vllm-requests is lost (IsActive was UNAVAILABLE while explain said active), a demand source
that cannot tell (explain said "stays at 0: nothing is active"), and a summed utilization
under the activation threshold (the simulator said active). The fleet view's staleness
bound is an hour here, so no reading ages out between the places' reads, however slow the
machine: the instant is the data's, not the clock's.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest

from gpuscale.cli import main as cli_main
from gpuscale.common.errors import DataUnavailable, Unavailable
from gpuscale.metrics_api.answers import MetricAnswers
from gpuscale.metrics_api.local import LocalAccess
from gpuscale.metrics_api.quantity import parse_quantity
from gpuscale.metrics_api.server import MetricsApiServer
from gpuscale.proto import externalscaler_pb2 as pb
from gpuscale.proto import externalscaler_pb2_grpc as pb_grpc
from gpuscale.proto import inspect_pb2 as ipb
from gpuscale.proto import inspect_pb2_grpc as ipb_grpc
from gpuscale.scaler.config import ScalerConfig
from gpuscale.scaler.core.selector import Selector, parse_selector
from gpuscale.scaler.core.trigger import parse_metadata
from gpuscale.scaler.root import Scaler
from gpuscale.scaler.sources.demand import parse_config as parse_demand
from gpuscale.sim.scaler_adapter import SimScaler
from gpuscale.stream.records import PodRecord
from gpuscale.telemetry.model import Absent, Reading
from tests.support.polling import until
from tests.support.ports import free_port

UTILIZATION = {"podSelector": "app=vllm", "profile": "gpu-utilization"}
PLANNED = {"podSelector": "app=vllm", "profile": "vllm-planner"}
INFERENCE = {"podSelector": "app=vllm", "profile": "vllm-inference"}
QUEUE = "queue"  # a demand source that cannot tell: nothing listens at its address
WAKING = {**UTILIZATION, "demandSource": QUEUE}
API = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/llm/deployments.apps/vllm"


class Deployments:
    """The metrics API's view of the workloads: Deployment vllm selects app=vllm."""

    def target(self, namespace: str, kind: str, name: str) -> Selector | Unavailable | None:
        return parse_selector("app=vllm") if (kind, name) == ("Deployment", "vllm") else None


@dataclass(frozen=True)
class Seen:
    """One place's answer: per target its value or UNAVAILABLE reason, and the activity
    (True, False, or the UNAVAILABLE reason); None where that place does not say."""

    values: tuple[float | str | None, ...]
    active: bool | str | None


@dataclass
class Peers:
    scaler: Scaler
    keda: pb_grpc.ExternalScalerStub
    inspect: ipb_grpc.InspectStub
    metrics_api: MetricAnswers
    https: str  # the metrics API's base URL
    access: LocalAccess
    pods: list[dict[str, Reading]]  # what was fed, for the simulator

    def feed(self, utilization: list[Reading], **more: Reading) -> None:
        self.feed_signals([{
            "gpu-utilization": u, "vllm-prompt-tps": 3000.0, "vllm-generation-tps": 1200.0,
            "vllm-finished-rate": 2.0, "vllm-waiting": 1.0, "vllm-running": 8.0,
            "vllm-requests": 9.0, "vllm-kv-cache": 30.0,
            **{k.replace("_", "-"): v for k, v in more.items() if i == 1}}
            for i, u in enumerate(utilization)])

    def feed_signals(self, pods: list[dict[str, Reading]]) -> None:
        now = self.scaler.fleet.now()
        self.pods = pods
        self.scaler.fleet.update_node("node-a", [
            PodRecord("llm", f"vllm-{i}", "node-a", {"app": "vllm"}, None, True, signals, now)
            for i, signals in enumerate(pods)])

    async def keda_value(self, metadata: dict[str, str], metric: str) -> float | str:
        """GetMetrics' value, or its UNAVAILABLE message."""
        try:
            got = await self.keda.GetMetrics(pb.GetMetricsRequest(
                scaledObjectRef=pb.ScaledObjectRef(namespace="llm", name="chat",
                                                   scalerMetadata=metadata),
                metricName=metric), timeout=5)
        except grpc.aio.AioRpcError as exc:
            if exc.code() is not grpc.StatusCode.UNAVAILABLE:
                raise
            return exc.details() or ""
        return float(got.metricValues[0].metricValueFloat)

    async def explained(self) -> ipb.ExplainReply:
        reply: ipb.ExplainReply = await self.inspect.Explain(
            ipb.ExplainRequest(namespace="llm", name="chat"), timeout=5)
        return reply

    # -- each place's answer, as its user gets it ------------------------------------------

    async def keda_sees(self, metadata: dict[str, str]) -> Seen:
        """KEDA: GetMetrics of each metric its GetMetricSpec names, then IsActive."""
        ref = pb.ScaledObjectRef(namespace="llm", name="chat", scalerMetadata=metadata)
        spec = await self.keda.GetMetricSpec(ref, timeout=5)
        values = [_unnamed(await self.keda_value(metadata, f"s0-{m.metricName}"))
                  for m in spec.metricSpecs]
        try:
            active: bool | str = (await self.keda.IsActive(ref, timeout=5)).result
        except grpc.aio.AioRpcError as exc:
            if exc.code() is not grpc.StatusCode.UNAVAILABLE:
                raise
            active = (exc.details() or "").removeprefix("llm/chat: ")
        return Seen(tuple(values), active)

    async def explain_sees(self, capsys: pytest.CaptureFixture[str]) -> tuple[Seen, Any]:
        """``gpuscale explain llm/chat --json``, the command itself; and its decision."""
        capsys.readouterr()
        code = await asyncio.to_thread(cli_main, [
            "explain", "llm/chat", "--scaler", f"127.0.0.1:{self.scaler.port}", "--json"])
        out = capsys.readouterr().out
        assert code == 0, out
        doc = json.loads(out)
        values = tuple(a["unavailable"] or a["value"] for a in doc["answers"])
        active = {"active": True, "inactive": False}.get(doc["activity"],
                                                         doc["activity_reason"])
        assert doc["decision"]["active"] == (active if isinstance(active, bool) else None)
        return Seen(values, active), doc["decision"]

    async def api_sees(self, metadata: dict[str, str]) -> Seen:
        """The custom metrics API over HTTPS: each target's signal as an Object metric of
        the Deployment (the HPA has no activation; with a demand source, its
        gpuscale_demand_pending stands for IsActive's demand part)."""
        values = []
        for t in parse_metadata(metadata).targets:
            values.append(await self._get(f"gpuscale_{t.signal.replace('-', '_')}"))
        active = None
        if "demandSource" in metadata:
            got = await self._get(f"gpuscale_demand_pending?metricLabelSelector="
                                  f"demandSource%3D{metadata['demandSource']}")
            active = got if isinstance(got, str) else got > 0
        return Seen(tuple(values), active)

    async def _get(self, path: str) -> float | str:
        ctx = ssl.create_default_context(cafile=str(self.access.ca))
        async with aiohttp.ClientSession() as s, s.get(
                f"{self.https}{API}/{path}", ssl=ctx,
                headers={"Authorization": f"Bearer {self.access.token}"}) as r:
            body = await r.json(content_type=None)
        if r.status == 503:
            return str(body["message"])
        assert r.status == 200, body
        return float(parse_quantity(body["items"][0]["value"]))

    def sim_sees(self, metadata: dict[str, str]) -> Seen:
        """The simulator's adapter over the same readings (its own pods' names: its
        reasons name them, so only values and activity are compared)."""
        own = {k: v for k, v in metadata.items() if k != "podSelector"}  # its pods' labels
        sim = SimScaler(own, demand=self.scaler.answers.demand)
        sim.report(0.0, [(True, dict(p)) for p in self.pods])
        values = tuple(m.value for m in sim.metrics(0.0))
        return Seen(values, sim.active(0.0))


def _unnamed(got: float | str) -> float | str:
    """KEDA's UNAVAILABLE message names the ScaledObject; the others do not."""
    return got.removeprefix("llm/chat: ") if isinstance(got, str) else got


def _known(seen: Seen) -> Seen:
    """What the simulator can be compared on: values or None, activity or None."""
    return Seen(tuple(None if isinstance(v, str) else v for v in seen.values),
                None if isinstance(seen.active, str) else seen.active)


@pytest.fixture
async def peers(tmp_path: Path) -> AsyncIterator[Peers]:
    demand = parse_demand({"demandSources": [{
        "name": QUEUE, "kind": "metrics", "url": f"http://127.0.0.1:{free_port()}/metrics",
        "metric": "pending"}], "interval_s": 0.2, "timeout_s": 0.5})
    scaler = Scaler(ScalerConfig(host="127.0.0.1", port=0, metrics_port=None,
                                 in_process=True, demand=demand, stale_after_s=3600.0))
    access = LocalAccess.create(tmp_path / "local")
    api = MetricsApiServer(MetricAnswers(scaler.answers, Deployments()), None, None,
                           access.cert, access.key, host="127.0.0.1", port=0, local=access)
    up, listening = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(scaler.run(lambda _: up.set()))
    served = asyncio.create_task(api.serve(lambda _: listening.set()))
    await asyncio.wait_for(asyncio.gather(up.wait(), listening.wait()), 10)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{scaler.port}") as channel:
        yield Peers(scaler, pb_grpc.ExternalScalerStub(channel), ipb_grpc.InspectStub(channel),
                    MetricAnswers(scaler.answers, Deployments()),
                    f"https://127.0.0.1:{api.port}", access, [])
    for t in (served, task):
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t


async def all_places(peers: Peers, metadata: dict[str, str],
                     capsys: pytest.CaptureFixture[str]) -> tuple[Seen, Any]:
    """Every place's answer for ``metadata`` at one instant of the data; they must agree.
    Returns KEDA's and explain's decision."""
    keda = await peers.keda_sees(metadata)
    explained, decision = await peers.explain_sees(capsys)
    api = await peers.api_sees(metadata)
    sim = peers.sim_sees(metadata)
    assert explained == keda
    assert api.values == keda.values
    if api.active is not None:
        assert api.active == keda.active
    assert sim == _known(keda)
    return keda, decision


async def test_a_lost_signal_of_one_target_another_active(
        peers: Peers, capsys: pytest.CaptureFixture[str]) -> None:
    """vllm-inference: vllm-requests lost on one pod, the KV cache in use on all. The
    workload is active (its KV-cache target says so); the requests target is UNAVAILABLE
    everywhere, with one reason."""
    peers.feed([40.0, 50.0], vllm_requests=Absent.LOST)
    keda, decision = await all_places(peers, INFERENCE, capsys)
    reason = "1 of 2 pods have no usable vllm-requests: llm/vllm-1 (lost)"
    assert keda == Seen((reason, 60.0), True)
    assert decision["active"] is True


async def test_below_the_activation_threshold_is_inactive(
        peers: Peers, capsys: pytest.CaptureFixture[str]) -> None:
    """gpu-utilization sums to 4.0 under its activation threshold 5: inactive, for the
    simulator too."""
    peers.feed([1.5, 2.5])
    keda, decision = await all_places(peers, UTILIZATION, capsys)
    assert keda == Seen((4.0,), False)
    assert decision["active"] is False


async def test_a_demand_source_that_cannot_tell(
        peers: Peers, capsys: pytest.CaptureFixture[str]) -> None:
    """At zero pods, a demand source that cannot tell: IsActive is UNAVAILABLE (not
    "inactive", which would leave the workload at zero while work waits), and explain
    says KEDA cannot tell."""
    peers.feed_signals([])
    check = peers.scaler.answers.demand
    assert check is not None

    def polled() -> bool:  # its first poll has failed: the reason no longer changes
        try:
            check(QUEUE)
        except DataUnavailable as exc:
            return "no answer yet" not in str(exc)
        return False

    await until(polled, what="the demand source's first failed poll")
    keda, decision = await all_places(peers, WAKING, capsys)
    assert keda.values == (0.0,)
    assert isinstance(keda.active, str)
    assert keda.active.startswith(f"demand source {QUEUE}: ")
    assert decision["active"] is None
    assert any("stays at 0: KEDA cannot tell" in r for r in decision["reasons"])


async def test_unavailable_everywhere_with_one_reason(
        peers: Peers, capsys: pytest.CaptureFixture[str]) -> None:
    peers.feed([40.0, Absent.LOST, 70.0])
    keda, decision = await all_places(peers, UTILIZATION, capsys)
    reason = "1 of 3 pods have no usable gpu-utilization: llm/vllm-1 (lost)"
    assert keda == Seen((reason,), reason)
    assert decision["active"] is None


async def test_keda_explain_and_the_metrics_api_give_one_value(peers: Peers) -> None:
    peers.feed([40.0, 55.5, 70.25])
    keda = await peers.keda_value(UTILIZATION, "s0-gpuscale-gpu-utilization")
    explained = (await peers.explained()).answers[0]
    served = peers.metrics_api.object("llm", "deployments.apps", "vllm",
                                      "gpuscale_gpu_utilization")
    assert keda == pytest.approx(165.75)  # the sum over the pods (AverageValue)
    assert (explained.value, explained.unavailable, explained.counted) == (keda, "", 3)
    assert served.value == keda


async def test_they_give_one_reason_when_a_pod_has_no_reading(peers: Peers) -> None:
    peers.feed([40.0, Absent.LOST, 70.0])
    keda = await peers.keda_value(UTILIZATION, "s0-gpuscale-gpu-utilization")
    explained = (await peers.explained()).answers[0]
    with pytest.raises(DataUnavailable) as served:
        peers.metrics_api.object("llm", "deployments.apps", "vllm", "gpuscale_gpu_utilization")
    reason = "1 of 3 pods have no usable gpu-utilization: llm/vllm-1 (lost)"
    assert keda == f"llm/chat: {reason}"  # KEDA's message names the ScaledObject
    assert explained.unavailable == str(served.value) == reason


async def test_the_planner_keda_asks_is_the_one_explain_reads(peers: Peers) -> None:
    peers.feed([50.0, 50.0])
    keda = await peers.keda_value(PLANNED, "s0-gpuscale-planned-replicas")
    reply = await peers.explained()
    assert isinstance(keda, float)
    assert keda >= 1
    assert reply.answers[0].value == keda
    assert reply.planned_replicas == keda
    assert reply.plan_terms  # the terms that made it
    assert len(peers.scaler.plans) == 1  # explain read it; it created no planner
