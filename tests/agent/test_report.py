"""One tick -> the node's report (agent.report.tick), as table cases: complete reports
carry the pods and the devices; every way a tick's pods can be unknown gives an incomplete
report with its reason, and never an empty pod list."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import pytest

from gpuscale.agent.report import tick
from gpuscale.attribution.devices import parse_device_id
from gpuscale.attribution.model import (
    AttributionState,
    DeviceUsage,
    NodeAttribution,
    OwnerRef,
    PodInfo,
    PodUsage,
)
from gpuscale.common.errors import Unavailable
from gpuscale.engines.scrape import EngineReading
from gpuscale.stream.records import DeviceRecord, NodeReport, PodRecord
from gpuscale.telemetry.model import Absent, BackendState, GpuSample, NodeSnapshot

GIB = 2**30
G0 = "GPU-00000000-0000-0000-0000-000000000000"
G1 = "GPU-11111111-1111-1111-1111-111111111111"
OWNER = OwnerRef("Deployment", "vllm")
OK, PARTIAL, UNAVAILABLE = (AttributionState.OK, AttributionState.PARTIAL,
                            AttributionState.UNAVAILABLE)


def snapshot(state: BackendState = BackendState.OK, node: str = "node-a") -> NodeSnapshot:
    """Two GPUs: G0 40 % busy with 1 of 4 GiB used, G1 idle."""
    gpus = (GpuSample(0, G0, "NVIDIA L4", "0000:01:00.0", 0, utilization_percent=40.0,
                      memory_used_bytes=GIB, memory_total_bytes=4 * GIB),
            GpuSample(1, G1, "NVIDIA L4", "0000:02:00.0", 1, utilization_percent=0.0,
                      memory_used_bytes=0, memory_total_bytes=4 * GIB))
    return NodeSnapshot(node, "test", taken_at=1.7e9, monotonic=500.0, seq=7, state=state,
                        gpus=gpus if state is BackendState.OK else ())


def usage(pod: str, known: bool = True) -> PodUsage:
    """``pod`` holds G0 (its metadata known to the pod cache unless ``known`` is False)."""
    device = DeviceUsage(parse_device_id(G0), G0, 0, utilization_percent=40.0,
                         memory_used_bytes=GIB, memory_total_bytes=4 * GIB)
    info = PodInfo("llm", pod, f"uid-{pod}", labels=(("app", "vllm"),), owner=OWNER,
                   ready=True) if known else None
    return PodUsage("llm", pod, "engine", "nvidia.com/gpu", (device,), 40.0, GIB, 4 * GIB,
                    pod_info=info)


def attribution(state: AttributionState, *pods: PodUsage,
                reasons: tuple[str, ...] = ()) -> NodeAttribution:
    return NodeAttribution(state, reasons, tuple(pods))


def record(pod: str) -> PodRecord:
    """``pod``'s record from ``usage(pod)``, stamped with the snapshot's monotonic time."""
    return PodRecord("llm", pod, "node-a", {"app": "vllm"}, OWNER, True,
                     {"gpu-utilization": 40.0, "gpu-memory": 25.0, "gpu-memory-used": 1024.0},
                     500.0)


def devices(*holders: str) -> tuple[DeviceRecord, ...]:
    return (DeviceRecord(G0, 0, "NVIDIA L4", "", "exclusive", 40.0, 1024.0, 4096.0,
                         tuple(f"llm/{h}" for h in holders)),
            DeviceRecord(G1, 1, "NVIDIA L4", "", "exclusive", 0.0, 0.0, 4096.0))


def report_of(snap: NodeSnapshot, att: NodeAttribution | None,
              engines: Mapping[tuple[str, str], EngineReading] | None = None,
              node: str = "host-a") -> NodeReport:
    return tick(snap, att, engines or {}, now=100.0, interval=1.0, node=node)


@pytest.mark.parametrize(("att", "pods", "holders"), [
    (attribution(OK, usage("v-0")), (record("v-0"),), ("v-0",)),
    # Some source failed, but every pod holding a GPU is known: complete.
    (attribution(PARTIAL, usage("v-0"), reasons=("1 process without a pod",)),
     (record("v-0"),), ("v-0",)),
    # No pod holds a GPU here: complete, with no pods (not "not known").
    (attribution(OK), (), ()),
], ids=["one pod", "partial attribution, pods known", "no GPU pods"])
def test_a_complete_report_carries_the_pods_and_the_devices(
        att: NodeAttribution, pods: tuple[PodRecord, ...], holders: tuple[str, ...]) -> None:
    got = report_of(snapshot(), att)
    assert got == NodeReport("node-a", 7, 500.0, 1.0, pods, devices(*holders))
    assert got.complete
    assert got.reason == ""


@pytest.mark.parametrize(("state", "att", "reason"), [
    (BackendState.UNAVAILABLE, attribution(OK, usage("v-0")), "GPU backend unavailable"),
    (BackendState.OK, None, "no attribution yet"),
    (BackendState.OK, attribution(UNAVAILABLE, reasons=("kubelet: connection refused",
                                                        "no allocations")),
     "kubelet: connection refused; no allocations"),
    (BackendState.OK, attribution(UNAVAILABLE), "attribution unavailable"),
    (BackendState.OK, attribution(UNAVAILABLE, reasons=("x" * 300,)), "x" * 200),
    (BackendState.OK, attribution(PARTIAL, usage("v-1", known=False), usage("v-0"),
                                  reasons=("1 pod(s) not in the API cache yet: llm/v-1",)),
     "pod metadata not known yet for llm/v-1 "
     "(1 pod(s) not in the API cache yet: llm/v-1)"),
    (BackendState.OK, attribution(PARTIAL, *(usage(f"v-{i}", known=False) for i in range(5)),
                                  reasons=("pod metadata unavailable",)),
     "pod metadata not known yet for llm/v-0, llm/v-1, llm/v-2 and 2 more "
     "(pod metadata unavailable)"),
], ids=["backend unavailable", "no attribution yet", "attribution unavailable",
        "unavailable without a reason", "long reason cut", "a pod not in the cache",
        "many pods not in the cache"])
def test_pods_not_known_make_an_incomplete_report_with_the_reason(
        state: BackendState, att: NodeAttribution | None, reason: str) -> None:
    got = report_of(snapshot(state), att)
    assert got == NodeReport("node-a", 7, 500.0, 1.0, Unavailable(reason))
    assert not got.complete
    assert got.reason == reason
    assert got.devices is None  # no device news either: the last ones stand


def test_the_report_names_the_agent_s_node_when_the_snapshot_has_none() -> None:
    assert report_of(snapshot(node=""), attribution(OK)).node == "host-a"
    assert report_of(snapshot(node=""), None).node == "host-a"
    assert report_of(snapshot(), attribution(OK)).node == "node-a"


U = Absent.UNAVAILABLE


@pytest.mark.parametrize(("reading", "signals", "reasons"), [
    (EngineReading({"vllm-waiting": 3.0}, scraped_at=99.5), {"vllm-waiting": 3.0}, {}),
    (EngineReading({"vllm-waiting": 3.0, "vllm-kv-cache": U}, scraped_at=99.5,
                   error="vllm:gpu_cache_usage_perc is 1.5"),
     {"vllm-waiting": 3.0, "vllm-kv-cache": U},
     {"vllm-kv-cache": "vllm:gpu_cache_usage_perc is 1.5"}),
    # Older than the staleness bound (3 ticks of 1 s): unusable, and why.
    (EngineReading({"vllm-waiting": 3.0}, scraped_at=90.0, error="timed out"),
     {"vllm-waiting": U}, {"vllm-waiting": "last engine scrape 10.0s ago (timed out)"}),
    (EngineReading({"vllm-waiting": 3.0}, scraped_at=90.0),
     {"vllm-waiting": U}, {"vllm-waiting": "last engine scrape 10.0s ago (no answer since)"}),
], ids=["fresh", "fresh with an unusable value", "stale after an error", "stale"])
def test_engine_readings_join_the_pod_s_record(
        reading: EngineReading, signals: dict[str, float | Absent],
        reasons: dict[str, str]) -> None:
    engines = {("llm", "v-0"): reading, ("llm", "cpu-only"): reading}
    got = report_of(snapshot(), attribution(OK, usage("v-0")), engines)
    assert isinstance(got.pods, tuple)
    [pod] = got.pods  # a pod that holds no GPU here gets no record
    assert dict(pod.signals) == {**record("v-0").signals, **signals}
    assert dict(pod.reasons) == reasons


def test_a_report_not_known_says_why_and_carries_nothing_else() -> None:
    with pytest.raises(ValueError, match="says why"):
        NodeReport("n", 1, 0.0, 1.0, Unavailable(""))
    with pytest.raises(ValueError, match="carries no devices"):
        NodeReport("n", 1, 0.0, 1.0, Unavailable("no attribution yet"), ())


def test_a_pod_holding_a_device_no_one_reads_has_no_gpu_signals_and_says_why() -> None:
    # Its matched device alone would make its memory-used a part of what it uses.
    u = usage("v-0")
    u = PodUsage(u.namespace, u.pod, u.container, "amd.com/cpx_nps1", u.devices,
                 Absent.NO_DATA, Absent.NO_DATA, Absent.NO_DATA, pod_info=u.pod_info,
                 unmatched=("amdgpu_xcp_99",))
    got = report_of(snapshot(), attribution(PARTIAL, u))
    assert isinstance(got.pods, tuple)
    (rec,) = got.pods
    assert set(rec.signals.values()) == {Absent.NO_DATA}
    assert rec.reasons["gpu-memory-used"] == (
        "allocated device amdgpu_xcp_99 is not one this node's agent reads")


def test_a_dra_device_no_slice_names_keeps_its_claim_and_why_in_the_reason() -> None:
    # The raw form of a DRA device carries its claim, then why; a claim name generated
    # from a template is ~60 characters, and the why was once cut off at 80.
    raw = ("claim llm/dra-chat-6dbdb55c69-cxd2f-gpu-t5xrd: gpu.nvidia.com/kwok-dra-0/gpu-0 "
           "(no ResourceSlice of this node lists it (yet))")
    u = usage("v-0")
    u = PodUsage(u.namespace, u.pod, u.container, "dra:x", u.devices, Absent.NO_DATA,
                 Absent.NO_DATA, Absent.NO_DATA, pod_info=u.pod_info, unmatched=(raw,))
    got = report_of(snapshot(), attribution(PARTIAL, u))
    assert isinstance(got.pods, tuple)
    (rec,) = got.pods
    assert rec.reasons["gpu-utilization"] == (
        f"allocated device {raw} is not one this node's agent reads")


def test_a_device_held_through_a_claim_lists_the_claim_beside_its_pod() -> None:
    """Time-sliced through a shared claim by one pod, through the device plugin by another:
    the claims sit beside the pods, one each ("" for the plugin's); without claims none."""
    plugin, claimed = usage("v-0"), usage("v-1")
    dra = replace(claimed.devices[0], device=replace(claimed.devices[0].device,
                                                     claim="llm/v-1-gpu-x7k2q"))
    claimed = replace(claimed, resource="dra:v-1-gpu-x7k2q", devices=(dra,))
    got = report_of(snapshot(), attribution(OK, plugin, claimed)).devices
    assert got is not None
    assert (got[0].pods, got[0].claims) == (("llm/v-0", "llm/v-1"), ("", "llm/v-1-gpu-x7k2q"))
    assert got[0].holders() == ["llm/v-0", "llm/v-1 (claim v-1-gpu-x7k2q)"]
    assert (got[1].pods, got[1].claims) == ((), ())
    only_plugin = report_of(snapshot(), attribution(OK, plugin)).devices
    assert only_plugin is not None
    assert only_plugin[0].claims == ()
