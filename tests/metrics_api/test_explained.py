"""A workload an HPA reads through the metrics API is one the operator tools know: its
reads are noted in the scaler's trigger history under "Kind/name" with the selector the API
resolved, so the recorder's moment reads the same pods and finds the same plan; end to end,
an HPA's read over HTTPS, then ``gpuscale explain`` and ``gpuscale top`` against the same
scaler show that workload with the value the HPA got."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuscale.kube.connect import connect
from gpuscale.metrics_api.answers import SOURCE, MetricAnswers, NotFound
from gpuscale.metrics_api.local import LocalAccess
from gpuscale.metrics_api.main import MetricsApi, MetricsApiOptions
from gpuscale.metrics_api.quantity import parse_quantity
from gpuscale.scaler.answers import Answers
from gpuscale.scaler.config import ScalerConfig
from gpuscale.scaler.core.selector import parse_selector
from gpuscale.scaler.recorder import Recorder
from gpuscale.scaler.root import Scaler
from gpuscale.scaler.state.fleet import FleetView
from gpuscale.scaler.state.history import TriggerHistory
from gpuscale.stream.records import PodRecord

PLANNED = "gpuscale_planned_replicas"


class Vllm:
    """The workload resolver's contract: Deployment llm/vllm selects app=vllm."""

    def target(self, namespace: str, kind: str, name: str) -> Any:
        return parse_selector("app=vllm") if (namespace, name) == ("llm", "vllm") else None


def vllm_pod(name: str, now: float) -> PodRecord:
    """A vLLM pod serving 0.4 replica-seconds per second, its GPU at 50 %."""
    return PodRecord("llm", name, "node-a", {"app": "vllm"}, None, True, {
        "gpu-utilization": 50.0, "vllm-prompt-tps": 6_000.0, "vllm-generation-tps": 2_400.0,
        "vllm-finished-rate": 2.0, "vllm-waiting": 0.0, "vllm-running": 8.0,
        "vllm-kv-cache": 20.0}, now)


def served(history: TriggerHistory) -> tuple[MetricAnswers, Recorder]:
    fleet = FleetView()
    fleet.update_node("node-a", [vllm_pod(f"vllm-{i}", fleet.now()) for i in range(2)])
    answers = Answers(fleet)  # no ScaledObject resolver: only the API's selector works
    return MetricAnswers(answers, Vllm(), history=history), Recorder(answers, history)


def test_reads_are_noted_under_the_kind_and_a_moment_finds_the_same_plan() -> None:
    history = TriggerHistory()
    api, recorder = served(history)
    item = api.object("llm", "deployments.apps", "vllm", PLANNED, "startupSeconds=100")
    (((ns, name), seen),) = history.items()
    assert (ns, name, seen.source) == ("llm", "Deployment/vllm", SOURCE)
    assert seen.metadata == {"profile": "vllm-planner", "startupSeconds": "100"}
    assert seen.selector is not None
    assert seen.selector.text == "app=vllm"
    moment, selection = recorder.moment(ns, name, seen)
    assert selection is not None
    assert len(selection.pods) == 2
    (answer,) = moment.answers
    assert (answer.unavailable, answer.value) == ("", item.value)
    assert moment.planned == item.value  # the API's plan, peeked, not a planner of its own
    assert dict(moment.terms)["startup"] == 100


def test_a_plain_metric_beside_the_planner_does_not_replace_it() -> None:
    history = TriggerHistory()
    api, _ = served(history)
    api.object("llm", "deployments.apps", "vllm", "gpuscale_gpu_utilization")
    seen = history.get("llm", "Deployment/vllm")
    assert seen is not None
    assert seen.metadata["signal"] == "gpu-utilization"
    api.object("llm", "deployments.apps", "vllm", PLANNED)
    api.object("llm", "deployments.apps", "vllm", "gpuscale_gpu_utilization")
    seen = history.get("llm", "Deployment/vllm")
    assert seen is not None
    assert seen.metadata == {"profile": "vllm-planner"}


def test_objects_that_do_not_exist_are_not_noted() -> None:
    history = TriggerHistory(max_triggers=3)
    api, _ = served(history)
    for i in range(10):  # a reader naming workloads at random fills nothing
        with pytest.raises(NotFound):
            api.object("llm", "deployments.apps", f"nope-{i}", PLANNED)
    assert history.items() == []


# -- end to end: an HPA's HTTPS reads, then explain and top as a person runs them --------


async def _tool(*args: str) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpuscale.cli", *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    doc: dict[str, Any] = json.loads(out)
    return doc


async def test_explain_and_top_show_the_workload_an_hpa_reads_with_its_value(
        tmp_path: Path) -> None:
    access = LocalAccess.create(tmp_path / "local")
    bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    scaler = Scaler(ScalerConfig(host="127.0.0.1", port=0, metrics_port=None,
                                 in_process=True),
                    components=[MetricsApi(MetricsApiOptions(
                        "127.0.0.1", 0, access.cert, access.key, local=access,
                        targets=Vllm()), bound.set_result)])
    up = asyncio.Event()

    async def feed() -> None:  # the agents' stream: fresh readings, as long as it runs
        while True:
            now = scaler.fleet.now()
            scaler.fleet.update_node("node-a", [vllm_pod(f"vllm-{i}", now) for i in range(2)])
            await asyncio.sleep(0.2)

    tasks = [asyncio.create_task(scaler.run(lambda _: up.set())), asyncio.create_task(feed())]
    try:
        await asyncio.wait_for(up.wait(), 10)
        api = await connect(access.write_kubeconfig(await asyncio.wait_for(bound, 10)))
        try:
            body = await api.get_raw(
                "/apis/custom.metrics.k8s.io/v1beta2/namespaces/llm/deployments.apps/vllm/"
                f"{PLANNED}?metricLabelSelector=startupSeconds%3D100")
        finally:
            await api.close()
        served_value = float(parse_quantity(body["items"][0]["value"]))
        assert served_value >= 1
        target = ("--scaler", f"127.0.0.1:{scaler.port}")
        explained = await _tool("explain", "llm/vllm", "--json", *target)
        fleet = await _tool("top", "--json", *target)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert (explained["name"], explained["source"]) == ("Deployment/vllm", SOURCE)
    assert explained["selector"] == "app=vllm"
    (answer,) = explained["answers"]
    assert answer["value"] == served_value
    assert explained["planned_replicas"] == served_value  # the HPA's plan, found
    assert not any("KEDA" in r for r in explained["decision"]["reasons"])
    (workload,) = fleet["workloads"]
    assert (workload["namespace"], workload["name"]) == ("llm", "Deployment/vllm")
    assert workload["answers"][0]["value"] == served_value
