"""gpuscale explain: the decision from a scaler's reply (pure), and the command against real
agent and scaler processes (the scaler down, data missing, a past moment)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from gpuscale.common.errors import ConfigError, Unavailable
from gpuscale.proto import externalscaler_pb2 as kpb
from gpuscale.proto import externalscaler_pb2_grpc as kpb_grpc
from gpuscale.proto import inspect_pb2 as pb
from gpuscale.scaler.answers import Value
from gpuscale.scaler.answers import activity as activity_rule
from gpuscale.scaler.core.profiles import Target
from gpuscale.telemetry.scenario import builtin_scenarios
from gpuscale.tools.explain import decide, render
from gpuscale.tools.explain_time import parse_time, refused_at
from tests.support.polling import until_sync
from tests.support.ports import free_port
from tests.support.processes import Proc

NOW = 1_800_000_000.0


def reply(*values: float, target: float = 70.0, activation: float = 5.0, pods: int = 2,
          unavailable: str = "", known: bool = False, replicas: int = -1,
          fallback: int = -1, minimum: int = 0, maximum: int = 100,
          behavior: str = "", activity: str = "") -> pb.ExplainReply:
    """``activity``: the scaler's IsActive answer; "" - what its rule gives for these
    values (scaler.answers.activity)."""
    if not activity:
        got = activity_rule([(Target("gpu-utilization", target, activation),
                              Unavailable(unavailable) if unavailable else
                              Value(v, Target("gpu-utilization", target, activation), ()))
                             for v in values])
        activity = ("unavailable" if isinstance(got, Unavailable) else
                    "active" if got else "inactive")
    r = pb.ExplainReply(now=NOW, namespace="llm", name="so", value_mode="sum",
                        pod_count=pods, planned_replicas=-1, activity=activity,
                        activity_reason=unavailable)
    for v in values:
        r.answers.add(metric_name="gpuscale-gpu-utilization", signal="gpu-utilization",
                      target=target, activation=activation, value=v, counted=pods,
                      ready=pods, unavailable=unavailable)
    r.scale_target.CopyFrom(pb.ScaleTarget(
        known=known, kind="Deployment", name="vllm", min_replicas=minimum,
        max_replicas=maximum, replicas=replicas, fallback_replicas=fallback,
        fallback_failures=3, polling_interval=30, cooldown_period=300,
        behavior_json=behavior))
    return r


def test_the_hpa_formula_decides() -> None:
    d = decide(reply(160.0))  # ceil(160 / 70) = 3 over the 2 pods the agents see
    assert (d.current, d.desired, d.active) == (2, 3, True)
    assert any("ceil(160 / 70) -> 3" in line for line in d.lines)
    assert decide(reply(154.0)).desired == 2  # 154/140 = 1.1: within the 10 % tolerance
    lower = decide(reply(160.0), replicas=5)  # 160/350: down to 3, unless held
    assert lower.desired == 3
    assert any("no recorded moments to replay" in line for line in lower.lines)
    assert decide(reply(160.0, known=True, replicas=4)).current == 4  # spec.replicas


def test_scale_down_is_held_by_the_recorded_moments() -> None:
    r = reply(20.0, pods=4)  # now: ceil(20 / 70) = 1
    past = r.past.add(at=NOW - 120.0, pods=4)
    past.answers.add(target=70.0, activation=5.0, value=270.0, ready=4)  # then: 4
    held = decide(r)
    assert held.desired == 4
    assert any("stabilized to 4" in line for line in held.lines)
    fresh = decide(reply(20.0, pods=4, behavior=json.dumps(
        {"scaleDown": {"stabilizationWindowSeconds": 0}})))
    assert fresh.desired == 1


def test_unavailable_holds_or_falls_back() -> None:
    why = "1 of 2 pods have no usable gpu-utilization: llm/v-1 (stale: 9.0s old)"
    held = decide(reply(0.0, unavailable=why, known=True, replicas=3))
    assert (held.desired, held.active) == (3, None)
    assert any(why in line for line in held.lines)
    assert any("no fallback configured" in line for line in held.lines)
    fallback = decide(reply(0.0, unavailable=why, known=True, replicas=3, fallback=6))
    assert fallback.desired == 6
    assert any("answers for 6 replicas" in line for line in fallback.lines)
    # The fallback is a metric value to the HPA: its rate limits and bounds still apply -
    # without a behavior in the ScaledObject, the HPA's own: max(2 x 3, 4) per sync.
    big = decide(reply(0.0, unavailable=why, known=True, replicas=3, fallback=200,
                       maximum=10))
    assert big.desired == 6
    assert any("scale-up limited to 6" in line for line in big.lines)
    behaved = decide(reply(0.0, unavailable=why, known=True, replicas=3, fallback=200,
                           maximum=10, behavior="{}"))
    assert behaved.desired == 7  # the default behavior: +100 % or +4 pods per 15 s
    value = reply(0.0, unavailable=why, known=True, replicas=3, fallback=6)
    value.value_mode = "average"  # metricType Value: 6 / 3 ready x 70 = 140 -> 2 x 3
    falls_back = decide(value)
    assert falls_back.desired == 6
    assert any("fallback value 140 (6 / 3 ready pods x 70)" in line
               for line in falls_back.lines)
    at_zero = decide(reply(0.0, unavailable=why, known=True, replicas=0, fallback=6))
    assert at_zero.desired == 1  # a fallback counts as active: KEDA activates
    value_at_zero = reply(0.0, unavailable=why, known=True, replicas=0, fallback=6)
    value_at_zero.value_mode = "average"  # no Ready pod to divide by: no fallback
    assert decide(value_at_zero).desired == 0
    unknown = reply(0.0, unavailable=why, known=True, replicas=3, fallback=6)
    unknown.scale_target.fallback_behavior = "cached"
    assert any("'cached' is not one this model knows" in line
               for line in decide(unknown).lines)
    higher = reply(0.0, unavailable=why, known=True, replicas=8, fallback=6)
    higher.scale_target.fallback_behavior = "currentReplicasIfHigher"
    assert decide(higher).desired == 8


def test_one_metric_missing_still_scales_up_on_the_others() -> None:
    """The HPA never scales down on a metric it cannot read, but scales up on the rest."""
    r = reply(540.0, known=True, replicas=4)  # ceil(540 / 70) = 8
    r.answers.add(metric_name="gpuscale-vllm-kv-cache", signal="vllm-kv-cache", target=80,
                  activation=0, unavailable="llm/v-1 (stale)")
    up = decide(r)
    assert up.desired == 8
    low = reply(20.0, known=True, replicas=4, behavior=json.dumps(
        {"scaleDown": {"stabilizationWindowSeconds": 0}}))
    low.answers.add(metric_name="gpuscale-vllm-kv-cache", signal="vllm-kv-cache", target=80,
                    activation=0, unavailable="llm/v-1 (stale)")
    assert decide(low).desired == 4  # would be 1 on the readable metric alone


def test_activation_and_scale_to_zero() -> None:
    assert decide(reply(50.0), replicas=0).desired == 1  # KEDA activates 0 -> 1
    assert decide(reply(50.0, minimum=3), replicas=0).desired == 3
    idle = decide(reply(2.0), replicas=0)
    assert (idle.desired, idle.active) == (0, False)
    going = decide(reply(2.0), replicas=2)
    assert any("scales to 0 after cooldownPeriod" in line for line in going.lines)


def test_render_fits_and_names_everything() -> None:
    r = reply(160.0)
    r.pods.add(namespace="llm", name="v-0", node="node-a", ready=True, age=0.4,
               stale_after=3.0, gpus=["MIG 3g.40gb on GPU 0"])
    r.pods[0].signals["gpu-utilization"].value = 77.0
    text = render(r, decide(r))
    assert "MIG 3g.40gb on GPU 0" in text
    assert "-> 3 replicas" in text


def test_piped_lines_wrap_between_values_and_never_cut_one() -> None:
    r = reply(160.0)
    r.metadata.update({"podSelector": "app=" + "a" * 90, "profile": "vllm-planner",
                       "prefillTokensPerSecond": "24632.62765", "ttftSeconds": "2"})
    r.planned_replicas = 4
    r.plan_terms.update({f"term_{i}": i + 0.5 for i in range(20)})
    r.pods.add(namespace="llm", name="p-" + "x" * 60, node="node-with-a-long-name-0123",
               ready=True, age=0.4, stale_after=3.0, gpus=["MIG 3g.40gb on GPU 0", "GPU 1"])
    text = render(r, decide(r), width=80)
    for value in ("podSelector=app=" + "a" * 90, "prefillTokensPerSecond=24632.62765",
                  "p-" + "x" * 60, "node-with-a-long-name-0123",
                  "MIG 3g.40gb on GPU 0, GPU 1", "term_19 19.5"):
        assert any(value in line for line in text.splitlines()), value  # whole, one line
    lines = text.splitlines()
    trigger = lines[1:lines.index(next(x for x in lines if x.startswith("selects")))]
    assert trigger[0].startswith("trigger   ")
    assert all(line.startswith(" " * 10) for line in trigger[1:])
    assert max(len(x) for x in trigger if "a" * 90 not in x) <= 80  # the rest fit 80
    planner = [x for x in lines if "term_" in x]
    assert planner[0].startswith("planner   4 replicas (")
    assert all(len(x) <= 80 for x in planner)
    assert planner[-1].endswith("term_9 9.5)")  # sorted by name: term_9 is the last
    assert "…" not in text


def test_bounds_are_the_scaled_objects_given_or_said_to_be_assumed() -> None:
    low = reply(10.0, minimum=0, maximum=100)  # 10 / 70 per pod: one replica is enough
    assumed = decide(low, replicas=3)
    clamp = next(line for line in assumed.lines if "clamped" in line)
    assert "min 0, max 100 (KEDA's defaults, assumed" in clamp
    assert "pass --min-replicas and --max-replicas" in clamp
    given = decide(low, replicas=3, bounds=(2, 16))
    assert "min 2, max 16 (given with --min-replicas and --max-replicas)" in " ".join(
        given.lines)
    assert given.desired >= 2
    known = decide(reply(10.0, known=True, minimum=1, maximum=16, replicas=3))
    assert "min 1, max 16 (the ScaledObject's)" in " ".join(known.lines)
    assert "assumed" not in " ".join(known.lines)


def test_a_moment_not_recorded_is_said_as_asked() -> None:
    why = "llm/so: the history this scaler keeps runs from A to B"
    clock = refused_at("22:18", NOW - 3600, why)
    asked = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(NOW - 3600))
    assert clock.startswith(f"--at 22:18 ({asked}): {why}")
    assert "not the demo's simulated time" in clock
    ago = refused_at("-1m", NOW - 60, why)
    assert ago.startswith("--at -1m (")
    assert "simulated" not in ago


def test_times() -> None:
    assert parse_time("-5m", NOW) == NOW - 300
    assert parse_time("1799999000", NOW) == 1_799_999_000
    assert parse_time("2027-01-15T03:12:00Z", NOW) == 1_799_982_720
    day = parse_time("03:12", NOW)
    assert 0 < NOW - day <= 86400
    assert time.gmtime(day).tm_hour == 3
    # A second just ahead of now (a printed time rounded up, a clock a little ahead) is
    # today's, not yesterday's; well ahead, it is yesterday's.
    ahead = time.strftime("%H:%M:%S", time.gmtime(NOW + 1))
    assert parse_time(ahead, NOW) == math.floor(NOW) + 1
    later = time.strftime("%H:%M:%S", time.gmtime(NOW + 3600))
    assert parse_time(later, NOW) == math.floor(NOW) + 3600 - 86400
    for bad in ("yesterday", "-xm", "25:99", "", "-infm"):
        with pytest.raises(ConfigError, match="--at"):
            parse_time(bad, NOW)


# -- the command against real processes ------------------------------------------------------


@pytest.fixture(scope="module")
def scaler() -> Iterator[int]:
    """A real agent (the mig-node scenario on simulated GPUs) and a real scaler recording
    its history every 0.5 s."""
    stream, port = free_port(), free_port()
    agent = Proc("agent", "--gpu-backend", "sim", "--scenario",
                 str(builtin_scenarios()["mig-node"]), "--host", "127.0.0.1", "--port", "0",
                 "--stream-port", str(stream), "--interval", "0.5", "--stream-insecure")
    sc = Proc("scaler", "--host", "127.0.0.1", "--port", str(port), "--metrics-port",
              str(free_port()), "--agents", f"127.0.0.1:{stream}", "--agents-insecure",
              "--history-step", "0.5")
    try:
        yield port
    finally:
        sc.stop()
        agent.stop()


def keda_asks(port: int, name: str, **metadata: str) -> None:
    """What KEDA does first: GetMetricSpec (the scaler then knows the ScaledObject)."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = kpb_grpc.ExternalScalerStub(ch)
        ref = kpb.ScaledObjectRef(namespace="llm", name=name, scalerMetadata=metadata)
        stub.GetMetricSpec(ref, timeout=5)


def explain(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuscale.cli", "explain", *args],
                          capture_output=True, text=True, timeout=60, check=False,
                          cwd=Path(__file__).parents[2])


@pytest.mark.slow
def test_explain_a_live_workload(scaler: int) -> None:
    keda_asks(scaler, "embed", podSelector="app=triton-embed", profile="gpu-utilization")
    address = f"127.0.0.1:{scaler}"

    def ready() -> subprocess.CompletedProcess[str] | None:
        got = explain("llm/embed", "--scaler", address)
        ok = got.returncode == 0 and "UNAVAILABLE" not in got.stdout
        return got if ok and "MIG " in got.stdout else None  # devices: a tick after pods

    out = until_sync(ready, what="an OK answer")
    assert "triton-embed-0" in out.stdout
    assert "MIG 3g.40gb on GPU" in out.stdout
    assert "result    ->" in out.stdout
    doc = json.loads(explain("llm/embed", "--scaler", address, "--json").stdout)
    assert doc["metadata"] == {"podSelector": "app=triton-embed", "profile": "gpu-utilization"}
    assert doc["decision"]["desired"] >= 1
    by_deployment = explain("llm/triton-embed", "--scaler", address)
    assert by_deployment.returncode == 0
    assert "ScaledObject llm/embed" in by_deployment.stdout
    time.sleep(1.5)  # a few recorded moments
    past = explain("llm/embed", "--scaler", address, "--at=-1s")
    assert past.returncode == 0, past.stderr
    assert "(recorded)" in past.stdout
    # As the help writes it, with a space: a negative duration is a value, not an option.
    spaced = explain("llm/embed", "--scaler", address, "--at", "-1s")
    assert spaced.returncode == 0, spaced.stderr
    assert "(recorded)" in spaced.stdout
    # Before the history: said as asked, with the span kept, in readable times.
    for asked in ("-1h", "-1m"):
        early = explain("llm/embed", "--scaler", address, "--at", asked)
        assert early.returncode == 2  # the input cannot be used, as any bad --at
        assert early.stderr.startswith(f"gpuscale: --at {asked} (20"), early.stderr
        assert "the history this scaler keeps runs from 20" in early.stderr
        assert " UTC" in early.stderr
        assert "Traceback" not in early.stderr


@pytest.mark.slow
def test_missing_data_and_a_scaler_that_is_not_there(scaler: int) -> None:
    # The scenario's pods export no vLLM metrics: a vLLM trigger cannot be answered.
    keda_asks(scaler, "wrong", podSelector="app=triton-embed", profile="vllm-inference")
    out = until_sync(lambda: (r := explain("llm/wrong", "--scaler", f"127.0.0.1:{scaler}"))
                     and "UNAVAILABLE" in r.stdout and r, what="UNAVAILABLE")
    assert "no vllm metrics" in out.stdout
    assert "does not scale down" in out.stdout
    unknown = explain("llm/nobody", "--scaler", f"127.0.0.1:{scaler}")
    assert unknown.returncode == 1
    assert "has been asked about by KEDA" in unknown.stderr
    assert "Traceback" not in unknown.stderr
    down = explain("llm/embed", "--scaler", f"127.0.0.1:{free_port()}")
    assert down.returncode == 1
    assert "did not answer" in down.stderr
    assert "./dev run" in down.stderr
    assert "Traceback" not in down.stderr
    bad = explain("llm/embed", "--scaler", f"127.0.0.1:{scaler}", "--at", "whenever")
    assert bad.returncode == 2
    assert "--at" in bad.stderr


def _planned(replicas: int, **terms: float) -> pb.ExplainReply:
    r = reply(160.0)
    r.planned_replicas = replicas
    r.plan_terms.update({"steady": 1.2, "burst": 0.9, "concurrency": 0.1, "kv": 0.3,
                         "backlog": 0.0, "required": 1.2, "unheld": 2.0, "held": 2.0,
                         "drain_floor": 0.0,
                         "request_s": 5.0, "startup": 300.0, **terms})
    return r


def test_why_the_planner_has_its_count() -> None:
    """The planner line says which term sets the count: the one that binds, the hold, or
    the drain floor (a scale-down that would cut long requests)."""
    binding = render(_planned(2), decide(reply(160.0)))
    assert "why       ceil(steady 1.2): the last minute's work" in binding
    queued = render(_planned(2, backlog=0.7, required=1.9), decide(reply(160.0)))
    assert "ceil(steady 1.2 + backlog 0.7 (the queue spread over a start-up))" in queued
    held = render(_planned(5), decide(reply(160.0)))
    assert "held: 5 was needed within the last start-up (300 s; the load alone needs 2)" \
        in held
    kept = render(_planned(5, drain_floor=5.0, request_s=200.0), decide(reply(160.0)))
    assert ("kept at the 5 Ready pods: a scale-down would cut more than 2% of a minute's "
            "requests (they run ~200 s") in kept
    before = render(_planned(5, drain_floor=5.0, request_s=math.nan), decide(reply(160.0)))
    why = next(line for line in before.splitlines() if line.startswith("why"))
    assert "has not seen a minute of them yet" in why
    assert "nan" not in why
    # A spare on top (spareReplicas) is said as one: the count below it has its own reason.
    spare = render(_planned(3, spare=1.0), decide(reply(160.0)))
    assert "ceil(steady 1.2): the last minute's work" in spare
    assert "+ 1 spare while the scale-up starts (spareReplicas" in spare
