"""What a policy that cannot see a burst coming must hold to miss no minute of it.

On the generated shapes whose load jumps at a moment nothing before it announces
(``burst10``: one 3-minute burst of 10x the level at 40 % of the hour; ``bursts``: three
2-minute bursts of 8x at 20, 50 and 80 %), a policy that reads only the past can at best
react when a burst starts. This replays replica schedules that do exactly that, in the
simulator (cold starts of 80-300 s, the TTFT objective): ``before`` replicas until a
burst, more from its first second (a change takes effect at the start of a second, so
this is one second sooner than any policy could have seen the burst; ``ServingModel``:
billed from then, Ready after its own cold start), kept ``KEEP_S`` after it ends (the
queue the burst left drains on them: a reactive policy that dropped them at the burst's
last second would miss minutes no policy need miss), ``before`` again after that and the
level after the last - for every count ``before`` from the level's to the burst's - and
prints their GPU-hours and SLO-violating minutes when the reaction is the burst's count,
and the minutes (and which) when it is ``MAX_REPLICAS`` (the most any policy could ask
for). The fewest ``before`` that misses no minute even then is what an online policy must
hold ahead of every burst it cannot foresee; compare the GPU-hours with the hindsight
reference's in ``bench_simulate.py``'s table (the reference asks for the burst's
replicas a start-up ahead, because it knows when). The level's and the burst's counts are
static provisioning's (``compare.static_peak``: the fewest constant count that misses no
minute) of the requests before the first burst and of the whole hour.

For ``bursts`` a policy may also have learned the period from the first two bursts: the
``learned`` row holds the burst's count until the second burst ends, then the level
until a start-up (``LEAD_S``, the longest cold start) before the third burst's time as
the first two foretell it (the second's start plus their distance), each kept ``KEEP_S``
after its burst too.

Usage: .venv/bin/python bench/bench_onset.py [--seeds 1 2] [--keep 120]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuscale.models.serving import ServingParams
from gpuscale.models.slo import DEFAULT_SLO
from gpuscale.sim.compare import static_peak
from gpuscale.sim.simulate import run_policy
from gpuscale.traffic.patterns import shape_of, synthetic

HOUR = 3600.0
RATE = 60.0  # requests/s at the busiest, as bench_simulate.py generates its shapes
LEAD_S = 300  # the longest cold start: a replica asked for this early is Ready in time
MAX_REPLICAS = 64  # the simulator's (and bench_simulate.py's policies') upper bound
KEEP_S = 120  # a burst's count is kept this long after it ends (its backlog drains)

SHAPES = ("burst10", "bursts")


def bursts_of(shape: str) -> list[tuple[int, int]]:
    """(start s, length s) of each stretch at the shape's peak (``traffic/patterns.py``)."""
    rate, peak = shape_of(shape, HOUR)
    out: list[tuple[int, int]] = []
    for t in range(int(HOUR)):
        if rate(t) < peak:
            continue
        if out and sum(out[-1]) == t:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((t, 1))
    return out


def schedule(seconds: int, bursts: list[tuple[int, int]], level: int, peak: int,
             before: int, keep: int = KEEP_S) -> list[int]:
    """Replicas per second: ``peak`` from each burst's first second to ``keep`` seconds
    after its end, ``before`` at every other second up to the last burst's end (a policy
    that cannot tell when a burst comes cannot tell that none will), ``level`` after it
    (generous: it cannot know the last burst was the last either)."""
    last_end = bursts[-1][0] + bursts[-1][1]
    out = [before] * last_end + [level] * max(0, seconds - last_end)
    for start, length in bursts:
        out[start:start + length + keep] = [peak] * (length + keep)
    return out[:seconds]


def learned(seconds: int, bursts: list[tuple[int, int]], level: int,
            peak: int, keep: int = KEEP_S) -> list[int]:
    """The burst's count until ``keep`` after the second burst ends, then the level until
    LEAD_S before each later burst's time as the first two foretell it (one period after
    the last), to ``keep`` after it."""
    out = [level] * seconds
    (first, _), (second, length) = bursts[0], bursts[1]
    second_end = second + length
    out[:second_end + keep] = [peak] * (second_end + keep)
    start = second
    for _ in bursts[2:]:
        start += second - first
        begin = max(second_end, start - LEAD_S)
        out[begin:start + length + keep] = [peak] * (start + length + keep - begin)
    return out[:seconds]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--keep", type=int, default=KEEP_S,
                    help=f"seconds a burst's count is kept after it ends ({KEEP_S}; 0: "
                         f"dropped at its last second, as before)")
    args = ap.parse_args()
    params = ServingParams()
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
          f"{sys.version.split()[0]}; SLO per minute: {DEFAULT_SLO.describe()}")
    head = (f"{'load':<14}{'schedule':<36}{'GPU-h':>8}{'SLO min':>9}"
            f"   {f'SLO min, {MAX_REPLICAS} from each onset (which)'}")
    print(head)
    print("-" * len(head))
    for shape in SHAPES:
        bursts = bursts_of(shape)
        for seed in args.seeds:
            requests = synthetic(shape, HOUR, RATE, seed=seed)
            duration = requests[-1].arrival_s + 300.0
            seconds = int(duration) + 2
            first = bursts[0][0]
            level = max(static_peak([r for r in requests if r.arrival_s < first], first,
                                    params).steps)
            peak = max(static_peak(requests, duration, params).steps)
            rows: list[tuple[str, list[int], list[int] | None]] = [
                (f"{before} before, {peak} from each onset",
                 schedule(seconds, bursts, level, peak, before, args.keep),
                 schedule(seconds, bursts, level, MAX_REPLICAS, before, args.keep))
                for before in range(level, peak + 1)]
            if len(bursts) > 2:
                rows.append((f"{peak} until burst 2 ends, then learned",
                             learned(seconds, bursts, level, peak, args.keep), None))
            for label, steps, most in rows:
                r = run_policy(label, requests, duration, params, schedule=steps,
                               max_replicas=MAX_REPLICAS)
                more = ""
                if most is not None:
                    m = run_policy(label, requests, duration, params, schedule=most,
                                   max_replicas=MAX_REPLICAS)
                    more = f"{m.slo_violation_minutes} {list(m.bad_minutes)}"
                print(f"{shape + ' s' + str(seed):<14}{label:<36}{r.gpu_hours:>8.2f}"
                      f"{r.slo_violation_minutes:>9d}   {more}", flush=True)


if __name__ == "__main__":
    main()
