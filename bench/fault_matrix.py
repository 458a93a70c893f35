"""The fault matrix: several agents over real gRPC, one fault at a time, every answer the
scaler gives checked against the truth it was given.

Three simulated GPU nodes, each agent reached through a loopback path that can be frozen or
cut (tests/peers/netcut.py); a real vLLM-format /metrics server for one pod's engine; a
Prometheus-style query API as a demand source; the scaler's roster, subscriber and gRPC
ExternalScaler as `gpuscale scaler --agents ...` wires them. A client polls GetMetrics for
four workloads and IsActive for a scale-to-zero one every 50 ms. The truth never changes
(the pods keep running whatever happens to their agents): a..c are sums of constant GPU
loads, e is the engine's queue, z has pending work.

Checked for every answer: an OK value is never below the truth (an OK IsActive=false never
while work is pending). Reported per fault: answers, OK answers, too-small OK answers, time
from the fault to the first UNAVAILABLE of a workload it affects, and from the fault's end
until every workload answers OK again; and the scaler process's memory around the hostile
inputs.

Usage: .venv/bin/python bench/fault_matrix.py [--hold 3] [--interval 0.2] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.fault_cluster import LOADS, WAITING, Cluster, HiddenPods, Step, free_port, node_spec
from gpuscale.proto import externalscaler_pb2 as pb
from gpuscale.proto import externalscaler_pb2_grpc as pb_grpc
from gpuscale.scaler.answers import Answers
from gpuscale.scaler.edges.keda import ScalerServer, ScalerService
from gpuscale.scaler.sources.demand import DemandSources, parse_config
from gpuscale.scaler.sources.roster import AgentRoster

TRUTH = {"a": 70.0, "b": 60.0, "c": 15.0, "e": WAITING}
WORKLOADS: dict[str, dict[str, str]] = {
    "a": {"podSelector": "app=a"}, "b": {"podSelector": "app=b"},
    "c": {"podSelector": "app=c"},
    "e": {"podSelector": "app=e", "signal": "vllm-waiting", "targetValue": "5"},
    "z": {"podSelector": "app=z", "demandSource": "queue"}}
POLL_S = 0.05


@dataclass
class Answer:
    at: float
    fault: str
    workload: str
    ok: bool
    value: float  # GetMetrics' value, or IsActive as 1/0
    detail: str = ""


@dataclass
class FaultResult:
    name: str
    affects: tuple[str, ...]
    answers: int = 0
    ok: int = 0
    too_small: list[str] = field(default_factory=list)
    to_unavailable_s: float | None = None
    to_recovery_s: float | None = None  # from the heal's end to every answer OK again
    heal_s: float = 0.0  # the heal step itself (an agent's start or shutdown: not ours)
    reasons: set[str] = field(default_factory=set)


async def _kill(c: Cluster) -> None:
    await c.stop_agent("n1")


async def _start_n1(c: Cluster) -> None:
    await c.start_agent("n1", node_spec("n1", LOADS["n1"]))


async def _restart(c: Cluster) -> None:
    await c.stop_agent("n1")
    await _start_n1(c)


async def _startup(c: Cluster) -> None:
    await c.stop_agent("n2")
    spec = node_spec("n2", LOADS["n2"])
    c.hidden = HiddenPods(spec, c.engine.port)
    await c.start_agent("n2", spec, c.hidden)


async def _synced(c: Cluster) -> None:
    assert c.hidden is not None
    c.hidden.synced = True


async def _duplicate(c: Cluster) -> None:
    await c.start_agent("dup", node_spec("n0", {"x-0": 10.0}))
    c.extra[f"127.0.0.1:{c.stream_ports['dup']}"] = "duplicate"
    c.sub.set_addresses(c.addresses())


async def _no_duplicate(c: Cluster) -> None:
    c.extra.pop(f"127.0.0.1:{c.stream_ports['dup']}")
    c.sub.set_addresses(c.addresses())
    await c.stop_agent("dup")


async def _never(c: Cluster) -> None:
    c.extra[f"127.0.0.1:{free_port()}"] = "never"
    c.sub.set_addresses(c.addresses())


async def _no_never(c: Cluster) -> None:
    for addr, why in list(c.extra.items()):
        if why == "never":
            del c.extra[addr]
    c.sub.set_addresses(c.addresses())


def _engine(mode: str) -> Step:
    async def set_mode(c: Cluster) -> None:
        c.engine.mode = mode
    return set_mode


def _queue(mode: str) -> Step:
    async def set_mode(c: Cluster) -> None:
        c.queue.mode = mode
    return set_mode


async def _freeze(c: Cluster) -> None:
    c.paths["n0"].freeze()


async def _cut(c: Cluster) -> None:
    c.paths["n2"].cut()


async def _heal_all(c: Cluster) -> None:
    for p in c.paths.values():
        p.heal()


FAULTS: list[tuple[str, tuple[str, ...], Step, Step]] = [
    ("agent killed (n1)", ("a", "b"), _kill, _start_n1),
    ("agent frozen (n0 path)", ("a", "e"), _freeze, _heal_all),
    ("network partition (n2 cut)", ("b", "c"), _cut, _heal_all),
    ("agent restarted (n1)", (), _restart, _heal_all),
    ("agent starting, pods not synced (n2)", ("a", "b", "c", "e"), _startup, _synced),
    ("duplicate node name (second 'n0')", ("a", "e"), _duplicate, _no_duplicate),
    ("configured agent never reported", ("a", "b", "c", "e"), _never, _no_never),
    ("slow engine (drips a byte / 0.5 s)", ("e",), _engine("drip"), _engine("ok")),
    ("engine reports -43", ("e",), _engine("negative"), _engine("ok")),
    ("engine reports NaN", ("e",), _engine("nan"), _engine("ok")),
    ("engine reports 1e300", ("e",), _engine("huge"), _engine("ok")),
    ("demand source answers null", ("z",), _queue("null"), _queue("ok")),
    ("demand source answers []", ("z",), _queue("list"), _queue("ok")),
    ("demand source answers a negative count", ("z",), _queue("negative"), _queue("ok")),
]


async def poll(stub: pb_grpc.ExternalScalerStub, fault: str, out: list[Answer]) -> None:
    now = time.monotonic()
    for name, md in WORKLOADS.items():
        ref = pb.ScaledObjectRef(name=name, namespace="llm", scalerMetadata=md)
        try:
            if name == "z":
                active = (await stub.IsActive(ref, timeout=2)).result
                out.append(Answer(now, fault, name, True, 1.0 if active else 0.0))
            else:
                metric = f"s0-gpuscale-{md.get('signal', 'gpu-utilization')}"
                got = await stub.GetMetrics(pb.GetMetricsRequest(
                    scaledObjectRef=ref, metricName=metric), timeout=2)
                out.append(Answer(now, fault, name, True,
                                  got.metricValues[0].metricValueFloat))
        except grpc.aio.AioRpcError as exc:
            out.append(Answer(now, fault, name, False, 0.0,
                              f"{exc.code().name}: {exc.details()}"))


def too_small(a: Answer) -> bool:
    if not a.ok:
        return False
    if a.workload == "z":
        return a.value < 1.0  # work is pending: "inactive" would be too small
    return a.value < TRUTH[a.workload] - 1e-6


async def all_ok(stub: pb_grpc.ExternalScalerStub, out: list[Answer], fault: str) -> bool:
    before = len(out)
    await poll(stub, fault, out)
    return all(a.ok for a in out[before:])


async def run_matrix(hold_s: float = 3.0, interval: float = 0.2,
                     recover_within_s: float = 20.0) -> dict[str, Any]:
    cluster = Cluster(interval)
    await cluster.start()
    demand = DemandSources(parse_config({"interval_s": 0.1, "timeout_s": 0.5, "demandSources": [
        {"name": "queue", "kind": "prometheus", "url": f"http://127.0.0.1:{cluster.queue.port}",
         "query": "sum(pending)"}]}))
    demand_task = asyncio.create_task(demand.run())
    answer_fn = Answers(cluster.fleet, AgentRoster(cluster.sub), demand=demand.pending)
    server = ScalerServer(ScalerService(answer_fn),
                          host="127.0.0.1", port=0)
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
    stub = pb_grpc.ExternalScalerStub(channel)
    answers: list[Answer] = []
    results: list[FaultResult] = []
    try:
        deadline = time.monotonic() + 20
        while not await all_ok(stub, answers, "start-up"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster never answered OK: {answers[-5:]}")
            await asyncio.sleep(POLL_S)
        for name, affects, inject, heal in FAULTS:
            res = FaultResult(name, affects)
            first = len(answers)
            began = time.monotonic()
            await inject(cluster)
            while time.monotonic() - began < hold_s:
                await poll(stub, name, answers)
                await asyncio.sleep(POLL_S)
            healing = time.monotonic()
            await heal(cluster)
            healed = time.monotonic()  # recovery is timed from here: the heal's own time
            res.heal_s = healed - healing  # (starting or stopping an agent) is not ours
            while not await all_ok(stub, answers, name):
                if time.monotonic() - healed > recover_within_s:
                    break
                await asyncio.sleep(POLL_S)
            else:
                res.to_recovery_s = time.monotonic() - healed
            mine = answers[first:]
            res.answers, res.ok = len(mine), sum(a.ok for a in mine)
            res.too_small = [f"{a.workload}={a.value:g} at +{a.at - began:.2f}s"
                             for a in mine if too_small(a)]
            down = [a.at for a in mine if not a.ok and a.workload in affects]
            res.to_unavailable_s = (min(down) - began) if down else None
            res.reasons = {a.detail.split(": ", 2)[-1][:140] for a in mine if not a.ok}
            results.append(res)
        memory = await hostile_memory(stub)
    finally:
        await channel.close()
        await server.stop(0.2)
        demand_task.cancel()
        await cluster.stop()
    start_too_small = [a for a in answers if a.fault == "start-up" and too_small(a)]
    return {"results": results, "answers": len(answers),
            "too_small": sum(len(r.too_small) for r in results) + len(start_too_small),
            "memory": memory, "interval": interval, "hold_s": hold_s}


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def hostile_memory(stub: pb_grpc.ExternalScalerStub) -> dict[str, float]:
    """RSS before and after two rounds of 300 calls with 1 MB namespaces and 300 distinct
    16 KiB metadata maps (refused at the edge now): growth in the first round that stops
    in the second is the allocator's high-water mark, not data held."""
    before = rss_mib()
    codes: dict[str, int] = {}
    await _hostile_round(stub, codes)
    first = rss_mib()
    await _hostile_round(stub, codes)
    return {"rss_before_mib": before, "rss_round1_mib": first, "rss_after_mib": rss_mib(),
            **{f"answers_{k}": float(v) for k, v in codes.items()}}


async def _hostile_round(stub: pb_grpc.ExternalScalerStub, codes: dict[str, int]) -> None:
    for i in range(300):
        refs = [pb.ScaledObjectRef(name="so", namespace=f"{i}" + "x" * 1_000_000,
                                   scalerMetadata={"podSelector": "app=a"}),
                pb.ScaledObjectRef(name="so", namespace="llm", scalerMetadata={
                    "podSelector": f"app=a{i}", **{f"k{j}": "v" * 4000 for j in range(4)}})]
        for ref in refs:
            try:
                await stub.IsActive(ref, timeout=5)
                codes["OK"] = codes.get("OK", 0) + 1
            except grpc.aio.AioRpcError as exc:
                codes[exc.code().name] = codes.get(exc.code().name, 0) + 1


def report(out: dict[str, Any]) -> str:
    rows = ["| fault | answers | OK | too-small OK | to UNAVAILABLE | heal step | "
            "heal done to recovery | a reason given |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in out["results"]:
        down = f"{r.to_unavailable_s:.2f} s" if r.to_unavailable_s is not None else "-"
        up = f"{r.to_recovery_s:.2f} s" if r.to_recovery_s is not None else "NOT RECOVERED"
        reason = sorted(r.reasons)[0].replace("|", "/") if r.reasons else "-"
        rows.append(f"| {r.name} | {r.answers} | {r.ok} | {len(r.too_small)} | {down} | "
                    f"{r.heal_s:.2f} s | {up} | {reason[:110]} |")
    m = out["memory"]
    rows.append("")
    rows.append(f"answers checked: {out['answers']}; too-small OK answers: "
                f"{out['too_small']}; sample interval {out['interval']} s, each fault held "
                f"{out['hold_s']} s")
    rows.append(f"hostile inputs, two rounds of 300 x 1 MB namespace + 300 x 16 KiB "
                f"metadata maps: RSS {m['rss_before_mib']:.1f} -> {m['rss_round1_mib']:.1f} "
                f"-> {m['rss_after_mib']:.1f} MiB; answers "
                + ", ".join(f"{k[8:]}={int(v)}" for k, v in m.items()
                            if k.startswith("answers_")))
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hold", type=float, default=3.0, help="seconds each fault lasts")
    p.add_argument("--interval", type=float, default=0.2, help="agent sample interval")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    out = asyncio.run(run_matrix(args.hold, args.interval))
    print(f"# {platform.machine()} {platform.python_version()} "
          f"{time.strftime('%Y-%m-%d')}")
    if args.json:
        print(json.dumps({**out, "results": [vars(r) | {"reasons": sorted(r.reasons)}
                                             for r in out["results"]]}, indent=1))
    else:
        print(report(out))


if __name__ == "__main__":
    main()
