"""Every policy over one trace, beside the hindsight reference and the fluid bound: what
``gpuscale simulate`` shows and what ``bench/bench_simulate.py`` tabulates (one glue, so
the benchmark's figures are the command's).

Policies, each keyed for ``--policies``: gpuscale's planner and reactive profiles
(through the scaler's own answer function, ``sim.scaler_adapter``), every autoscaler
people run (``sim.baselines``), and static provisioning at the hindsight peak (the fewest
replicas that, held all window, meet the objective - a count nobody knows in advance).
Every autoscaled policy opens on the replicas the opening minutes' work needs, warm (a
window of traffic on a running system, not a cold one).

The reference (``sim.reference``) always starts from *every* policy's schedule, whichever
are shown, so its figure does not depend on ``--policies``, and keeps the policies'
``min_replicas`` (their floor is a constraint of the comparison, not a policy's waste);
the bound
(``sim.fluid_bound``) exists for a time-to-first-token objective only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuscale.models.serving import ServingParams, needed_replicas
from gpuscale.models.slo import DEFAULT_SLO, SloSpec
from gpuscale.sim.baselines import baselines
from gpuscale.sim.fluid_bound import Bound, lower_bound
from gpuscale.sim.reference import MAX_RUNS, Reference, hindsight_reference
from gpuscale.sim.scaler_adapter import planner_policy, profile_signal, wakes
from gpuscale.sim.simulate import Result, run_policy
from gpuscale.traffic.trace import TraceRequest

#: ``--policies`` key -> the policy's name as results show it. ``static`` is named with
#: its count ("static at hindsight peak (4)").
POLICIES = {
    "planner": "gpuscale vllm-planner",
    "vllm-inference": "gpuscale vllm-inference",
    "gpu-utilization": "gpuscale gpu-utilization",
    "vllm-inference-prometheus": "gpuscale vllm-inference via Prometheus",
    "node-max": "node-max GPU util (AverageValue)",
    "cpu-hpa": "CPU-based HPA",
    "dcgm-hpa": "DCGM GPU util HPA",
    "keda-prometheus": "KEDA prometheus vllm waiting",
    "knative-kpa": "Knative KPA",
    "aibrix-kpa": "AIBrix KPA",
    "aibrix-apa": "AIBrix APA",
    "queue-model": "queue model (WVA-like)",
    "static": "static at hindsight peak",
}
SHOWN = (*POLICIES, "reference", "bound")  # every key ``--policies`` takes
STATIC_CAP = 256  # the static search stops here (a trace one count cannot serve)

Progress = Callable[[str, float], None]  # (what runs now, overall fraction done)


@dataclass(frozen=True, slots=True)
class Comparison:
    """What one trace gave: the policies asked for (in ``POLICIES`` order), the reference
    (None when not asked for) and the bound (None when not asked for, or when the
    objective is not a time to first token: ``bound_missing`` says why)."""

    results: tuple[Result, ...]
    reference: Reference | None
    bound: Bound | None
    bound_missing: str | None = None
    # the planner's terms at each minute (minute, steady, burst, kv), when it ran
    planner_terms: tuple[tuple[int, float, float, float], ...] = ()

    def gap(self, r: Result, to: str) -> float | None:
        """``r``'s GPU-hours over the reference's (``to="reference"``) or the bound's,
        less one; None when that figure is not here."""
        base = (self.reference.result.gpu_hours if to == "reference" and self.reference
                else self.bound.gpu_hours if to == "bound" and self.bound else None)
        if base is None:
            return None
        return r.gpu_hours / base - 1.0 if base > 0 else math.inf


def parse_policies(text: str) -> tuple[str, ...]:
    """``--policies``: comma-separated keys of ``SHOWN`` ("all": every one). Raises
    ValueError naming the unknown keys and the known ones."""
    keys = tuple(k.strip() for k in text.split(",") if k.strip())
    if keys == ("all",):
        return SHOWN
    unknown = [k for k in keys if k not in SHOWN]
    if unknown or not keys:
        raise ValueError(f"--policies: unknown {', '.join(unknown) or '(none given)'}; "
                         f"choose from {', '.join(SHOWN)} or all")
    return tuple(k for k in SHOWN if k in keys)


def opening(requests: Sequence[TraceRequest], duration: float,
            params: ServingParams) -> int:
    """The replicas the opening minutes' work needs (what an autoscaled fleet runs when
    the window opens): the most ``needed_replicas`` gives within one mean cold start."""
    need = needed_replicas(requests, duration, params)
    return max(need[:int(params.cold_start_s) + 1] or [1])


def static_peak(requests: Sequence[TraceRequest], duration: float, params: ServingParams,
                slo: SloSpec = DEFAULT_SLO) -> Result:
    """Static provisioning at the hindsight peak: the fewest replicas that, running the
    whole window, miss no minute of the objective (searched from the peak of the work,
    up while minutes miss, down while none does); at ``STATIC_CAP`` the count with the
    fewest missed minutes."""
    need = needed_replicas(requests, duration, params)

    def run(n: int) -> Result:
        return run_policy(f"{POLICIES['static']} ({n})", requests, duration, params,
                          static=n, slo=slo)

    n = max(1, *(need or [1]))
    best = run(n)
    while best.slo_violation_minutes and n < STATIC_CAP:
        n += 1
        got = run(n)
        if got.slo_violation_minutes < best.slo_violation_minutes:
            best = got
    while not best.slo_violation_minutes and n > 1:
        got = run(n - 1)
        if got.slo_violation_minutes:
            break
        n, best = n - 1, got
    return best


#: Every key ``planner_objective`` may set (a caller's own planner keys must not).
OBJECTIVE_KEYS = frozenset({"ttftSeconds", "ttftSecondsPerPromptToken", "queueDelaySeconds",
                            "promptTokens"})


def planner_objective(slo: SloSpec, requests: Sequence[TraceRequest]) -> dict[str, str]:
    """The planner's trigger keys for the objective it is judged by: ``ttftSeconds`` for a
    TTFT one (``ttft-tpot`` too: the planner has no TPOT key; its batch term keeps TPOT),
    ``queueDelaySeconds`` for a queue delay, and for ``ttft-per-token`` the allowance as
    ``ttftSeconds`` (at least its 0.01 s floor), the per-token rate as
    ``ttftSecondsPerPromptToken`` and the requests' mean prompt as ``promptTokens`` (what a
    team that knows its prompts writes: the planner plans a per-token objective at it)."""
    if slo.kind in ("ttft", "ttft-tpot"):
        return {"ttftSeconds": f"{slo.target_s:.10g}"}
    if slo.kind == "queue":
        return {"queueDelaySeconds": f"{slo.target_s:.10g}"}
    prompt = sum(r.input_tokens for r in requests) / max(1, len(requests))
    return {"ttftSeconds": f"{max(0.01, slo.allowance_s):.10g}",
            "ttftSecondsPerPromptToken": f"{slo.target_s:.10g}",
            "promptTokens": f"{max(1.0, prompt):.10g}"}


def policy_runs(params: ServingParams, requests: Sequence[TraceRequest],
                slo: SloSpec, min_replicas: int,
                start: int, **planner: str) -> list[tuple[str, dict[str, Any]]]:
    """(key, ``run_policy`` keyword arguments) for every autoscaled policy, made fresh; the
    planner given the objective it is judged by (``planner_objective``) and ``planner``'s
    trigger keys on top."""
    common = {"min_replicas": min_replicas, "start": start}
    named = {name: kw for name, kw in baselines(params, min_replicas=min_replicas,
                                                    start=start)}
    named[POLICIES["planner"]] = {**planner_policy(
        params, DEFAULT_SLO.target_s, False, **planner_objective(slo, requests),
        **wakes(planner, min_replicas)), **common}
    named[POLICIES["gpu-utilization"]] = {
        "signal": profile_signal({"profile": "gpu-utilization"}, min_replicas), **common}
    keys = {name: key for key, name in POLICIES.items()}
    unknown = set(named) - set(keys)
    if unknown:  # a baseline added without a key: it would never be shown
        raise RuntimeError(f"policies without a --policies key: {sorted(unknown)}")
    return [(keys[name], {"name": name, **named[name]})
            for name in POLICIES.values() if name in named]


def compare(requests: Sequence[TraceRequest], duration: float,
            params: ServingParams | None = None, min_replicas: int = 1,
            progress: Progress | None = None, slo: SloSpec = DEFAULT_SLO,
            shown: Sequence[str] = SHOWN, max_runs: int | None = MAX_RUNS,
            planner: Mapping[str, str] | None = None) -> Comparison:
    """The policies in ``shown`` (keys of ``SHOWN``) over the same requests, judged by
    ``slo``; every policy runs when the reference is asked for (it starts from all);
    ``planner``: trigger keys on top of the planner's own."""
    params = params or ServingParams()
    start = opening(requests, duration, params)
    want_ref = "reference" in shown
    runs = [(k, kw) for k, kw in policy_runs(params, requests, slo, min_replicas, start,
                                             **(planner or {}))
            if want_ref or k in shown]
    with_static = want_ref or "static" in shown
    stages = len(runs) + with_static + (2 * len(runs) if want_ref else 0)

    def report(what: str, done: float) -> Callable[[float], None]:
        def show(fraction: float) -> None:
            if progress is not None:
                progress(what, min(1.0, (done + fraction) / max(1, stages)))
        return show

    results: dict[str, Result] = {}
    terms: tuple[tuple[int, float, float, float], ...] = ()
    for n, (key, named) in enumerate(runs):
        kwargs = dict(named)
        name = kwargs.pop("name")
        results[key] = run_policy(name, requests, duration, params,
                                  progress=report(name, n), slo=slo, **kwargs)
        if key == "planner":
            terms = tuple(kwargs["signal"].terms)
    if with_static:
        report(POLICIES["static"], len(runs))(0.0)
        results["static"] = static_peak(requests, duration, params, slo)
    reference = None
    if want_ref:
        searching = report("hindsight reference", len(runs) + 1)
        reference = hindsight_reference(
            requests, duration, params, list(results.values()), slo=slo, max_runs=max_runs,
            floor=min_replicas, progress=lambda f: searching(f * 2 * len(runs)))
    if progress is not None:
        progress("done", 1.0)
    bound, missing = None, None
    if "bound" in shown:
        if slo.kind in ("ttft", "ttft-tpot"):  # a TPOT bound on top only raises the optimum
            bound = lower_bound(requests, duration, params, slo_s=slo.target_s)
        else:
            missing = (f"the fluid bound holds for a time-to-first-token objective only, "
                       f"not {slo.describe()}")
    return Comparison(tuple(results[k] for k in POLICIES if k in results and k in shown),
                      reference, bound, missing, terms)


def format_comparison(c: Comparison) -> str:
    """The table ``gpuscale simulate`` prints: a row per policy, then the reference and
    the bound, each policy's GPU-hours against both."""
    head = (f"{'policy':<40}{'GPU-h':>7}{'vs ref':>8}{'vs bound':>9}{'SLO min':>10}"
            f"{'changes/h':>10}{'max rep':>8}{'p95 TTFT':>9}{'p95 TPOT':>9}{'unserved':>9}"
            f"{'react s':>8}{'zero s':>7}")
    lines = [head, "-" * len(head)]
    rows = list(c.results) + ([c.reference.result] if c.reference else [])
    for r in rows:
        zero = "-" if r.time_to_zero_s is None else f"{r.time_to_zero_s:.0f}"
        react = "-" if r.react_s is None else f"{r.react_s:.0f}"
        lines.append(f"{r.policy[:39]:<40}{r.gpu_hours:>7.2f}{_pct(c.gap(r, 'reference')):>8}"
                     f"{_pct(c.gap(r, 'bound')):>9}"
                     f"{r.slo_violation_minutes:>5}/{r.minutes:<4}"
                     f"{r.replica_changes_per_hour:>10.1f}{r.max_replicas:>8}"
                     f"{r.p95_ttft_s:>9.2f}{r.p95_tpot_s * 1000:>7.0f}ms{r.unserved:>9}"
                     f"{react:>8}{zero:>7}")
    if c.bound is not None:
        lines.append(f"{'fluid lower bound':<40}{c.bound.gpu_hours:>7.2f}")
    elif c.bound_missing:
        lines.append(f"(no bound: {c.bound_missing})")
    if c.reference is not None:
        lines.append(f"({c.reference.describe()})")
    return "\n".join(lines)


def _pct(gap: float | None) -> str:
    if gap is None:
        return "-"
    if math.isinf(gap):
        return "inf"
    return f"{0.0 if abs(gap) < 0.005 else gap:+.0%}"  # never "-0%"


def alternatives(requests: Sequence[TraceRequest], duration: float, params: ServingParams,
                 min_replicas: int, max_replicas: int,
                 reactive: str = "vllm-inference") -> list[tuple[str, Result]]:
    """What the same requests cost other ways, in the simulator, for the demo's ending:
    (label, result) for a fleet sized in advance (static at ``max_replicas``: what runs
    without autoscaling), the ``reactive`` gpuscale profile (a queue target, KEDA's
    defaults), and static at the hindsight peak (the fewest that meet the objective all
    window - a count nobody knows in advance, labelled so)."""
    start = opening(requests, duration, params)
    runs = dict(policy_runs(params, requests, DEFAULT_SLO, max(1, min_replicas), start))
    kwargs = dict(runs[reactive])
    name = kwargs.pop("name")
    reacted = run_policy(name, requests, duration, params, **kwargs)
    fixed = run_policy(f"static at {max_replicas}", requests, duration, params,
                       static=max_replicas)
    peak = static_peak(requests, duration, params)
    n = peak.policy.rsplit("(", 1)[-1].rstrip(")")
    return [(f"static at --max-replicas {max_replicas} (sized in advance)", fixed),
            (f"gpuscale {reactive} (reactive, KEDA defaults)", reacted),
            (f"static at {n} (the peak, known only in hindsight)", peak)]
