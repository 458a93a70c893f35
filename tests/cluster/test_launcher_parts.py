"""The launcher's pure parts, without root or Go (they run in the main stage): what the
stand-in kubelet hands out, what the namespace's hosts file says, how the load is read
(a malformed or hostile load file is no load, never a crash), and the model trajectory
the comparison stands on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cluster import dns, dra, nodes, seed, volumes
from cluster.__main__ import load as load_command
from cluster.compare import Step, model_trajectory
from cluster.engines import Gateway, read_load, shares
from cluster.kubelet import NodeDevices
from cluster.layout import Layout
from gpuscale.attribution.dra import parse_slice
from gpuscale.telemetry.scenario import gpu_uuid


def _pod(uid: str, gpus: int, phase: str = "Running") -> dict[str, object]:
    return {"metadata": {"uid": uid, "namespace": "llm", "name": f"p-{uid}"},
            "spec": {"containers": [{"name": "vllm", "resources": {
                "limits": {"nvidia.com/gpu": str(gpus), "cpu": "500m"}}}]},
            "status": {"phase": phase}}


def test_nodes_advertise_their_simulated_gpus_as_a_device_plugin_names_them() -> None:
    by_name = {s.name: s for s in nodes.DEFAULT_NODES}
    ts = nodes.devices(by_name["kwok-ts-0"])["nvidia.com/gpu"]
    assert len(ts) == 16
    assert ts[0].endswith("::0")
    assert ts[3].endswith("::3")
    mig = nodes.devices(by_name["kwok-mig-0"])
    assert {k: len(v) for k, v in mig.items()} == {"nvidia.com/mig-3g.40gb": 4,
                                                   "nvidia.com/mig-1g.10gb": 14}
    where = nodes.locations(by_name["kwok-mig-0"])
    assert sorted(set(where.values()))[:3] == [(0, 0), (0, 1), (1, 0)]
    layout = Layout(Path("/x"), 1)
    node = nodes.node_object(layout, 1, by_name["kwok-gpu-0"])
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert node["spec"]["podCIDR"] == "198.19.65.0/24"
    with pytest.raises(ValueError, match="out of"):
        layout.pod_cidr(62)  # the host programs' /24
    with pytest.raises(ValueError, match=r"0\.\.3"):
        Layout(Path("/x"), 4)


def test_the_stand_in_kubelet_hands_out_free_devices_and_takes_them_back(
        tmp_path: Path) -> None:
    node = NodeDevices("n", {"nvidia.com/gpu": ["GPU-a", "GPU-b", "GPU-c"]},
                       tmp_path / "kubelet.sock")
    node.sync([_pod("1", 2), _pod("2", 2)])
    assert node.holds("1") == {"vllm": {"nvidia.com/gpu": ["GPU-a", "GPU-b"]}}
    assert node.holds("2") == {"vllm": {"nvidia.com/gpu": ["GPU-c"]}}  # what was left
    node.sync([_pod("2", 2), _pod("1", 2, phase="Succeeded")])
    assert node.holds("1") == {}
    node.sync([_pod("2", 2), _pod("3", 1)])
    assert node.holds("3") == {"vllm": {"nvidia.com/gpu": ["GPU-a"]}}
    assert [p.name for p in node.peer.pods] == ["p-2", "p-3"]


@pytest.mark.parametrize("text", [
    "", "not json", "[1, 2]", '{"llm/a": "40"}', '{"llm/a": true}', '{"llm/a": -5}',
    '{"llm/a": 1e300}', '{"llm/a": NaN}', '{"llm/a": -Infinity}'])
def test_a_malformed_or_hostile_load_file_is_no_load_never_a_crash(
        tmp_path: Path, text: str) -> None:
    (tmp_path / "load.json").write_text(text)
    load = read_load(tmp_path / "load.json")
    assert all(0 <= v <= 1_000_000 for v in load.values())


def test_an_oversized_load_file_is_refused_whole(tmp_path: Path) -> None:
    (tmp_path / "load.json").write_text('{"llm/a": 1, "pad": "' + "x" * (1 << 20) + '"}')
    assert read_load(tmp_path / "load.json") == {}


def test_load_spreads_over_ready_pods_and_waits_at_the_gateway_without_one() -> None:
    assert shares(10, ["b", "a", "c"]) == {"a": 4, "b": 3, "c": 3}
    assert shares(10, []) == {}
    gw = Gateway()
    gw.pending = {"llm/a": 7, "llm/b": 0}
    assert 'gateway_pending_requests{workload="llm/a"} 7' in gw.render()


def test_the_load_command_refuses_what_it_cannot_use(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    layout = Layout(tmp_path, 1)
    assert load_command(layout, "nonamespace", "3") == 2
    assert load_command(layout, "llm/a", "-1") == 2
    assert load_command(layout, "llm/a", "many") == 2
    assert "NAMESPACE/APP IN_FLIGHT" in capsys.readouterr().err
    assert load_command(layout, "llm/a", "12") == 0
    assert json.loads((tmp_path / "load.json").read_text()) == {"llm/a": 12}


def test_hosts_name_every_ready_endpoint_of_a_service() -> None:
    slices = [{"metadata": {"namespace": "gpuscale",
                            "labels": {"kubernetes.io/service-name": "gpuscale-scaler"}},
               "endpoints": [{"addresses": ["198.19.0.1"], "conditions": {"ready": True}},
                             {"addresses": ["198.19.0.2"], "conditions": {"ready": False}}]}]
    text = dns.render(slices)
    assert "198.19.0.1 gpuscale-scaler.gpuscale.svc" in text
    assert "198.19.0.2" not in text


def test_mounted_paths_in_arguments_point_at_the_local_copy() -> None:
    mounts = {"/tls": Path("/v/1/tls"), "/tls/ca": Path("/v/1/ca")}
    assert volumes.rewrite(["--cert=/tls/tls.crt", "--ca=/tls/ca/ca.crt", "--x=/tlsx/y"],
                           mounts) == ["--cert=/v/1/tls/tls.crt", "--ca=/v/1/ca/ca.crt",
                                       "--x=/tlsx/y"]


def test_prometheus_targets_carry_prometheus_operators_target_labels() -> None:
    slices = [{"ports": [{"name": "metrics", "port": 9400}, {"name": "telemetry", "port": 9401}],
               "endpoints": [{"addresses": ["198.19.0.3"],
                              "targetRef": {"kind": "Pod", "namespace": "gpuscale",
                                            "name": "gpuscale-agent-x"}}]}]
    assert seed.targets(slices) == [{"targets": ["198.19.0.3:9400"], "labels": {
        "namespace": "gpuscale", "pod": "gpuscale-agent-x"}}]


def test_the_model_without_behavior_doubles_at_most_per_sync() -> None:
    """What the real HPA does with no behavior (tests/cluster/test_model_vs_real.py)."""
    spec = {"minReplicaCount": 1, "maxReplicaCount": 8, "pollingInterval": 5}
    levels = model_trajectory(spec, 8.0, (Step(0, 40),), 100)
    assert sorted(set(levels)) == [1, 4, 5]
    assert levels[-1] == 5


def _dra_pod(uid: str, claim: str | None) -> dict[str, object]:
    return {"metadata": {"uid": uid, "namespace": "llm", "name": f"d-{uid}"},
            "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one"}],
                     "containers": [{"name": "vllm", "resources": {"claims": [{"name": "gpu"}]}},
                                    {"name": "sidecar"}]},
            "status": {"phase": "Running", "resourceClaimStatuses": (
                [{"name": "gpu", "resourceClaimName": claim}] if claim else [])}}


def _claim(name: str, *devices: str) -> dict[str, object]:
    results = [{"request": "gpu", "driver": dra.DRIVER, "pool": "kwok-dra-0", "device": d}
               for d in devices]
    return {"metadata": {"namespace": "llm", "name": name},
            "status": {"allocation": {"devices": {"results": results}}} if results else {}}


def test_the_fake_dra_driver_publishes_what_the_agent_reads() -> None:
    shape = {s.name: s for s in nodes.DEFAULT_NODES}["kwok-dra-0"]
    assert nodes.devices(shape) == {}  # no device plugin: nothing but the slice
    assert "nvidia.com/gpu" not in nodes.node_object(Layout(Path("/x"), 1), 6,
                                                     shape)["status"]["allocatable"]
    objects = dra.driver_objects(nodes.DEFAULT_NODES)
    assert [o["kind"] for o in objects] == ["DeviceClass", "ResourceSlice"]
    read = parse_slice(objects[1])  # the agent's own reading of it
    assert (read.error, read.driver, read.pool) == ("", dra.DRIVER, "kwok-dra-0")
    assert [(d.name, d.ref.uuid if d.ref else None) for d in read.devices] == [
        (f"gpu-{i}", gpu_uuid("kwok-dra-0", i)) for i in range(8)]
    assert dra.gpu_index(dra.DRIVER, "kwok-dra-0", "gpu-7", "kwok-dra-0") == 7
    assert dra.gpu_index(dra.DRIVER, "other-pool", "gpu-7", "kwok-dra-0") is None
    assert dra.gpu_index("gpu.amd.com", "kwok-dra-0", "gpu-7", "kwok-dra-0") is None


def test_the_stand_in_kubelet_lists_the_claims_the_scheduler_allocated(
        tmp_path: Path) -> None:
    node = NodeDevices("kwok-dra-0", {}, tmp_path / "kubelet.sock")
    claims = dra.index_claims([_claim("d-1-gpu-x", "gpu-3"), _claim("d-2-gpu-y")])
    # d-2's claim is not allocated yet, d-3's not even made: not started, not listed
    node.sync([_dra_pod("1", "d-1-gpu-x"), _dra_pod("2", "d-2-gpu-y"), _dra_pod("3", None)],
              claims)
    (listed,) = node.peer.pods
    assert [c.name for c in listed.containers] == ["vllm"]
    (dr,) = listed.containers[0].dynamic_resources
    assert (dr.claim_name, dr.claim_namespace) == ("d-1-gpu-x", "llm")
    assert [(r.driver_name, r.pool_name, r.device_name) for r in dr.claim_resources] == [
        (dra.DRIVER, "kwok-dra-0", "gpu-3")]
    claims = dra.index_claims([_claim("d-1-gpu-x", "gpu-3"), _claim("d-2-gpu-y", "gpu-0")])
    node.sync([_dra_pod("2", "d-2-gpu-y")], claims)  # d-1 gone, d-2 allocated
    assert [p.name for p in node.peer.pods] == ["d-2"]
    assert node.claims["2"]["vllm"][0].devices == ((dra.DRIVER, "kwok-dra-0", "gpu-0"),)
    assert "1" not in node.claims
