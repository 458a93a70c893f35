"""``gpuscale simulate``: replay a request trace through KEDA + HPA + a scaling policy and
the serving model, for several policies side by side.

Each policy runs its own copy of the world: a ServingModel fed the same arrivals, the KEDA
and HPA models, and a signal. gpuscale's profiles and planner use the scaler's own answer
function (through ``sim.scaler_adapter``): the replicas' simulated telemetry becomes
PodRecords in a FleetView, and ``Answers.value`` gives the number KEDA would get. The
other policies stand for what people run today: the per-node scaler's maximum GPU
utilization under AverageValue, a GPU-blind CPU HPA, static provisioning at the peak, and
the hindsight reference (``sim.reference``), searched with the arrivals known in advance.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from gpuscale.models.hpa import SCALE_DOWN, Metric, MetricSource, Rules, TargetType
from gpuscale.models.keda import ScaledObjectLoop, ScaledObjectSpec, builtin_active
from gpuscale.models.serving import InFlightRequest, ServingModel, ServingParams
from gpuscale.models.slo import DEFAULT_SLO, Slo, SloSpec
from gpuscale.traffic.scale import sharpest_rise
from gpuscale.traffic.trace import TraceRequest

Signal = Callable[[ServingModel, float], list[Metric]]


@runtime_checkable
class ScalerSignal(Protocol):
    """A Signal read through gpuscale's scaler (``sim.scaler_adapter``): it answers KEDA's
    IsActive too, by the scaler's one activity rule, for the instant it was last read.
    Any other Signal stands for a scaler built into KEDA (``models.keda.builtin_active``)."""

    def __call__(self, model: ServingModel, now: float) -> list[Metric]: ...

    def active(self, now: float) -> bool | None: ...

# A policy with its own control loop (not the HPA's), called every step with (model, now,
# current replicas): the replica count it wants, or None to leave the decision to the
# HPA/KEDA loop (when a signal is given) or keep the current count.
Decider = Callable[[ServingModel, float, int], int | None]


@dataclass(frozen=True, slots=True)
class Result:
    policy: str
    gpu_hours: float
    slo_violation_minutes: int
    minutes: int
    replica_changes_per_hour: float
    max_replicas: int
    p95_ttft_s: float
    unserved: int  # requests still queued or running at the end
    time_to_zero_s: float | None = None  # from the last arrival to zero replicas (min 0)
    react_s: float | None = None  # from the sharpest load rise to the next scale-up
    timeline: tuple[tuple[float, int, float, float], ...] = field(default=(), repr=False)
    #   (minute start, replicas, requests waiting, worst SLO measure - time to first token
    #   by default - of the requests that arrived in that minute), one per minute
    bad_minutes: tuple[int, ...] = ()  # the minutes that missed the SLO, in order
    # The replicas in effect in each step, in order: the policy's schedule. Replayed with
    # ``run_policy(schedule=...)`` it is the same run (same cold-start draws, same bill).
    steps: tuple[int, ...] = field(default=(), repr=False)
    stopped_at: float | None = None  # ``until`` ended the run here: judged up to here only
    cut_requests: int = 0  # requests a scale-down's drain deadline cut off (they start over)
    p95_tpot_s: float = 0.0  # time per output token, of the finished requests (Slo)


def node_max_signal(model: ServingModel, now: float) -> list[Metric]:
    """The per-node scaler: one node's highest GPU utilization, as an AverageValue."""
    ready = [s.duty_cycle for s in model.signals(now) if s.ready]
    return [Metric(MetricSource.EXTERNAL, TargetType.AVERAGE_VALUE, 70.0,
                   max(ready) if ready else 0.0)]


def cpu_signal(model: ServingModel, now: float) -> list[Metric]:
    """A GPU-blind HPA on CPU: an inference server's CPU barely moves with GPU load
    (tokenization and scheduling; modelled 15 % + 10 % x duty cycle)."""
    values = tuple(15.0 + 0.1 * s.duty_cycle for s in model.signals(now) if s.ready)
    return [Metric(MetricSource.PODS, TargetType.AVERAGE_VALUE, 70.0, pod_values=values or (None,))]


def run_policy(name: str, requests: Sequence[TraceRequest], duration: float,
               params: ServingParams, signal: Signal | None = None,
               static: int | None = None, schedule: Sequence[int] | None = None,
               min_replicas: int = 1, max_replicas: int = 64, dt: float = 1.0,
               progress: Callable[[float], None] | None = None,
               start: int | None = None, scale_down: Rules | None = SCALE_DOWN,
               scale_up: Rules | None = None,
               decider: Decider | None = None,
               slo: SloSpec = DEFAULT_SLO,
               until: Callable[[ServingModel, float], bool] | None = None,
               idlest_first: bool = False, round_robin: bool = False) -> Result:
    """One policy over the requests. The replicas running when the window opens (warm):
    ``static``, the schedule's first step, else ``start`` (default ``min_replicas``, at
    least 1). ``schedule``: the replicas in effect in each step (a ``Result.steps``; past
    its end, its last), followed as they are, whatever ``min_replicas``/``max_replicas``.
    ``idlest_first``: scale-downs remove the Ready replica with the fewest running
    requests (pod-deletion-cost; see ``ServingModel``). ``round_robin``: requests go to the
    Ready replicas in turn, not to the least loaded.
    ``scale_down``: the HPA's scale-down behavior (Kubernetes' default), its scale-up the
    default; None: no behavior at all (a ScaledObject or HPA that sets none: the HPA's own
    limits, ``models.hpa``). ``decider``: a policy's own loop (see ``Decider``); a count it
    returns, clamped to [min, max], replaces that step's HPA/KEDA decision. ``slo``: the
    objective minutes are judged by.

    Each step [now, now + dt) serves its arrivals, then the policy reads the signals at its
    end and decides; a change takes effect at now + dt, the instant a new replica is billed
    from and its cold start counts from (a removed one drains from then)."""
    model = ServingModel(params, idlest_first=idlest_first, round_robin=round_robin)
    loop = ScaledObjectLoop(ScaledObjectSpec(min_replicas=min_replicas,
                                             max_replicas=max_replicas),
                            scale_up=scale_up, scale_down=scale_down)
    replicas = static if static is not None else max(min_replicas, start or 1)
    if schedule:
        replicas = schedule[0]
    model.set_replicas(replicas, 0.0, warm=True)  # what runs when the window opens
    loop.warm(0.0, replicas)
    i, changes = 0, 0
    timeline = []
    zero_at: float | None = None
    ups: list[float] = []
    steps_run = [replicas]
    stopped: float | None = None
    order = sorted(requests, key=lambda r: r.arrival_s)
    steps = int(duration / dt)
    report_every = max(1, steps // 100)
    for k in range(steps):
        now = k * dt
        if progress is not None and k % report_every == 0:
            progress(k / steps)
        batch = []
        while i < len(order) and order[i].arrival_s < now + dt:
            r = order[i]
            batch.append(InFlightRequest(r.arrival_s, r.input_tokens, r.output_tokens))
            i += 1
        model.arrive(batch)
        model.step(now, dt)
        desired = replicas
        wanted = decider(model, now, replicas) if decider is not None else None
        if schedule:
            desired = schedule[min(k + 1, len(schedule) - 1)]
        elif wanted is not None:
            desired = max(min_replicas, min(max_replicas, wanted))
        elif signal is not None and loop.due(now, replicas):
            metrics = signal(model, now)  # GetMetrics, then IsActive (None: UNAVAILABLE)
            active = signal.active(now) if isinstance(signal, ScalerSignal) \
                else builtin_active(metrics)
            ready = sum(1 for s in model.signals(now) if s.ready)
            desired = loop.decide(now, replicas, ready, metrics, active)
        if desired != replicas:
            if desired > replicas:
                ups.append(now)
            model.set_replicas(desired, now + dt)
            changes += 1
            replicas = desired
            if replicas == 0 and i >= len(order) and zero_at is None:
                zero_at = now
        steps_run.append(replicas)
        if k % int(60 / dt) == 0:
            timeline.append((now, replicas, float(len(model.queue))))
        if until is not None and (k + 1) % int(60 / dt) == 0 and until(model, now + dt):
            stopped = now + dt
            break
    if progress is not None:
        progress(1.0)
    judged = Slo.of(model, duration if stopped is None else stopped, slo)
    last_arrival = order[-1].arrival_s if order else 0.0
    rise = sharpest_rise(order)
    react = next((t - rise for t in ups if t >= rise), None) \
        if rise is not None and (signal is not None or decider is not None) \
        else None  # static, a schedule: no reaction
    return Result(name, model.gpu_seconds / 3600.0, len(judged.bad_minutes), judged.minutes,
                  changes / (duration / 3600.0), max(t[1] for t in timeline),
                  judged.p95_ttft_s, judged.unserved,
                  None if zero_at is None else zero_at - last_arrival, react,
                  tuple((t, n, q, judged.worst.get(int(t // 60), 0.0))
                        for t, n, q in timeline),
                  tuple(sorted(judged.bad_minutes)), tuple(steps_run[:steps]), stopped,
                  model.cut, judged.p95_tpot_s)

