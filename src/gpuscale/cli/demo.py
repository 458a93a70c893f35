"""``gpuscale demo``: the closed loop on simulated GPUs (demo/loop), or with
``--scenario`` a static simulated fleet served until stopped (demo/scenario)."""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuscale.cli.common import fail
from gpuscale.common.errors import ConfigError
from gpuscale.demo.defaults import (
    DEFAULT_DURATION,
    DEFAULT_RATE,
    DEFAULT_SPEED,
    GPUS_PER_NODE,
)
from gpuscale.telemetry.scenario import builtin_scenarios
from gpuscale.traffic.patterns import PATTERNS

if TYPE_CHECKING:
    from gpuscale.demo.view import Summary
    from gpuscale.demo.world import LiveConfig


def add_parser(sub: Any) -> None:
    demo = sub.add_parser(
        "demo", help="the closed loop on simulated GPUs: load -> replicas -> agents -> "
                     "scaler on :6000 -> KEDA/HPA model over gRPC -> replicas follow load "
                     "(or, with --scenario, a static simulated fleet served until stopped)")
    demo.add_argument("--scenario", default=None,
                      help="serve a static scenario instead of the closed loop "
                           f"({', '.join(builtin_scenarios())} or a YAML file) until stopped")
    demo.add_argument("--speed", type=float, default=None,
                      help="fast-forward: simulated time runs this many times faster "
                           f"(default {DEFAULT_SPEED:g} for the loop, 1 for a scenario)")
    live = demo.add_mutually_exclusive_group()
    live.add_argument("--trace", type=Path,
                      help="loop: replay this request trace (CSV as for simulate)")
    live.add_argument("--pattern", choices=PATTERNS,
                      help="loop: a synthetic load shape (default diurnal)")
    demo.add_argument("--rate", type=float, default=None,
                      help=f"loop: busiest requests/s of a pattern (default {DEFAULT_RATE:g}), "
                           "or a multiplier of a trace's arrivals (default 1)")
    demo.add_argument("--duration", type=float, default=None,
                      help=f"loop: simulated seconds (default {DEFAULT_DURATION:g} for a "
                           "pattern, the whole trace otherwise)")
    demo.add_argument("--profile", default="vllm-planner",
                      help="loop: the gpuscale profile KEDA asks for (default vllm-planner, "
                           "whose terms the screen shows)")
    demo.add_argument("--min-replicas", type=int, default=1,
                      help="loop: minReplicaCount (0: scale to zero when idle)")
    demo.add_argument("--max-replicas", type=int, default=16,
                      help="loop: maxReplicaCount (at most 8 per --nodes)")
    demo.add_argument("--nodes", type=int, default=2, help="loop: simulated 8xH100 nodes")
    demo.add_argument("--interval", type=float, default=1.0,
                      help="scenario: sample interval, s")
    demo.add_argument("--host", default="127.0.0.1",
                      help="listen address of the scaler and, for a scenario, of the "
                           "agents (default 127.0.0.1: KEDA's port and the agents' streams "
                           "are plaintext here; 0.0.0.0 serves every interface)")
    demo.add_argument("--port", type=int, default=6000, help="scaler gRPC port (6000)")
    demo.add_argument("--hpa", action="store_true",
                      help="the closed loop through the plain-HPA path: the scaler serves the "
                           "custom metrics API on loopback (local mode: its own certificate, "
                           "a token, no API server) and an HPA model reads it over HTTPS; "
                           "prints the kubectl command that reads the same")
    demo.add_argument("--metrics-api-port", type=int, default=0,
                      help="with --hpa: the metrics API's port (default: one free)")
    demo.add_argument("--metrics-port", type=int, default=9400,
                      help="first agent's metrics port; node i uses this + i (9400)")
    demo.add_argument("--scaler-config", type=Path, default=None,
                      help="scaler configuration YAML (demand sources)")
    # Tests: record the scaler's history every N seconds instead of every 15 (minute
    # buckets stay 60 s wide), so `gpuscale idle` sees data without waiting minutes.
    demo.add_argument("--history-step", type=float, default=None, help=argparse.SUPPRESS)
    demo.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.scenario is None:
        return _run_loop(args)
    loop_only = [f"--{k}" for k in ("pattern", "trace", "rate", "duration")
                 if getattr(args, k) is not None] + (["--hpa"] if args.hpa else [])
    if loop_only:
        return fail(f"{', '.join(loop_only)} drive the closed loop; a --scenario runs its own "
                    "load", 2)
    if args.history_step is not None and not 0.1 <= args.history_step <= 60:
        return fail("--history-step must be 0.1 to 60 seconds", 2)
    try:
        from gpuscale.demo.scenario import ScenarioOptions, serve_scenario

        return _serve(serve_scenario(ScenarioOptions(
            args.scenario, host=args.host, port=args.port,
            speed=args.speed or 1.0, interval=args.interval, metrics_port=args.metrics_port,
            scaler_config=args.scaler_config, history_step=args.history_step)))
    except ConfigError as exc:  # ScenarioError is one
        return fail(exc)


def _serve(main: Coroutine[Any, Any, object]) -> int:
    """Run a demo until it ends; a port that cannot be bound (alone or inside a task
    group) is exit 1 with the reason, not a traceback."""
    def bind_error(exc: BaseException) -> bool:  # a closed stdout is the CLI's (main)
        return isinstance(exc, OSError) and not isinstance(exc, BrokenPipeError)

    try:
        asyncio.run(main)
    except OSError as exc:
        if not bind_error(exc):
            raise
        return fail(f"cannot listen: {exc}", 1)
    except ExceptionGroup as group:
        bind = group.subgroup(bind_error)
        if bind is None:
            raise
        return fail(f"cannot listen: {_leaf(bind)}", 1)
    return 0


def _leaf(error: BaseException) -> BaseException:
    """The first error a (nested) exception group holds: the port's, not "unhandled errors
    in a TaskGroup"."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


def _run_loop(args: argparse.Namespace) -> int:
    """The closed loop (demo/loop.py) from the demo's command line."""
    from gpuscale.demo.loop import run_live
    from gpuscale.demo.world import LiveConfig
    from gpuscale.scaler.core.profiles import PROFILES
    from gpuscale.traffic.requests import load_requests

    def refuse(why: str) -> int:
        return fail(why, 2)

    speed = DEFAULT_SPEED if args.speed is None else args.speed
    if not 0 < speed <= 1000:
        return refuse("--speed must be above 0 and at most 1000")
    if not 1 <= args.nodes <= 16:
        return refuse("--nodes must be 1 to 16")
    if not 0 <= args.min_replicas <= args.max_replicas <= args.nodes * GPUS_PER_NODE \
            or args.max_replicas < 1:
        return refuse(f"need 0 <= --min-replicas <= --max-replicas <= "
                      f"{args.nodes * GPUS_PER_NODE} (8 GPUs per node) and --max-replicas "
                      ">= 1")
    if args.profile not in PROFILES:
        return refuse(f"--profile {args.profile!r} is not one of {', '.join(PROFILES)}")
    if args.metrics_api_port and not args.hpa:
        return refuse("--metrics-api-port: only with --hpa")
    try:
        requests, duration = load_requests(
            args.pattern, args.trace,
            args.rate if args.rate is not None else 1.0 if args.trace else DEFAULT_RATE,
            args.duration, pattern_duration=DEFAULT_DURATION)
    except ValueError as exc:
        return refuse(str(exc))
    # The agents' stream connecting is routine here; the view carries what matters.
    logging.getLogger("gpuscale.stream").setLevel(logging.WARNING)
    cfg = LiveConfig(requests, duration, speed=speed, nodes=args.nodes,
                     profile=args.profile, min_replicas=args.min_replicas,
                     max_replicas=args.max_replicas, host=args.host,
                     port=args.port, hpa=args.hpa, metrics_api_port=args.metrics_api_port)
    done: list[Summary] = []

    async def loop() -> None:
        done.append(await run_live(cfg))

    code = _serve(loop())
    if code == 0 and done:
        print("\nthe same requests, other ways: replaying them in the simulator (a fleet "
              "sized\nin advance, the reactive profile, a search for the hindsight peak: "
              "seconds)...", flush=True)
        print("\n".join(compared(cfg, done[0])), flush=True)
    return code


def compared(cfg: LiveConfig, summary: Summary) -> list[str]:
    """The run beside what the same requests cost other ways (the simulator: the same
    serving model, cold starts and objective), within 80 columns."""
    from gpuscale.sim.compare import alternatives

    ran = [r for r in cfg.requests if r.arrival_s < summary.duration]
    rows = [(f"this run: gpuscale {cfg.profile}, live", summary.gpu_hours,
             summary.slo_minutes)]
    rows += [(label.replace(" (reactive, KEDA defaults)", ", simulated, KEDA defaults"),
              r.gpu_hours, r.slo_violation_minutes) for label, r in alternatives(
        ran, summary.duration, cfg.params, cfg.min_replicas, cfg.max_replicas)]
    out = ["", "the same requests, other ways (simulated):",
           f"  {'':<52}{'GPU-h':>8}{'SLO min':>9}"]
    out += [f"  {label[:52]:<52}{gpu_h:>8.2f}{slo:>9d}" for label, gpu_h, slo in rows]
    return [
        *out,
        "live: through the real agents and scaler, with their sampling and KEDA's",
        "  polling as they fell; simulated: the simulator's replay of the same requests,",
        "  so one profile can give two figures. The hindsight peak is not a budget that",
        "  was missed: it is the fewest replicas that would have met the SLO all window,",
        "  found once the traffic was seen. Without hindsight a fleet sized in advance",
        "  covers any peak, and one that scales pays for replicas started ahead of load."]
