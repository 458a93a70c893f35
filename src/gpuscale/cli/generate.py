"""``gpuscale generate``: a ScaledObject (and optionally a plain HPA) for a workload."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from gpuscale.cli.common import fail

MAX_MANIFEST_BYTES = 1024 * 1024


def add_parser(sub: Any) -> None:
    g = sub.add_parser("generate", help="write a ScaledObject (and a plain HPA) that is right "
                                        "for a Deployment or StatefulSet manifest")
    g.add_argument("manifest", type=Path, help="the workload's YAML (- for standard input); "
                                               "the first Deployment or StatefulSet in it")
    g.add_argument("--scaler-address", default="gpuscale-scaler.gpuscale.svc:6000")
    g.add_argument("--min", type=int, default=1, dest="min_replicas",
                   help="minReplicaCount (0 only with --demand-source)")
    g.add_argument("--max", type=int, default=8, dest="max_replicas")
    g.add_argument("--startup-seconds", type=float, default=None,
                   help="how long a new replica takes to become Ready (default 180)")
    g.add_argument("--demand-source", default="", help="a demand source of the scaler's "
                                                       "config (needed for --min 0)")
    g.add_argument("--planner", action="store_true",
                   help="vLLM: plan ahead of traffic (profile vllm-planner)")
    g.add_argument("--ttft-seconds", type=float, default=None,
                   help="with --planner: the time-to-first-token objective")
    g.add_argument("--keda-version", default="2.17",
                   help="the KEDA the cluster runs (a fallback that keeps the current "
                        "replicas needs 2.17; older gets none, and the HPA holds on errors)")
    g.add_argument("--hpa", action="store_true",
                   help="also a plain HPA on the custom metrics API (for clusters without "
                        "KEDA; apply one or the other, not both)")
    g.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import yaml

    from gpuscale.common.errors import ConfigError
    from gpuscale.control.generate import Options, generate, workload_from

    try:
        if str(args.manifest) == "-":
            raw = sys.stdin.read(MAX_MANIFEST_BYTES + 1)
        else:
            with args.manifest.open(encoding="utf-8") as f:
                raw = f.read(MAX_MANIFEST_BYTES + 1)
        if len(raw) > MAX_MANIFEST_BYTES:
            raise ConfigError(f"{args.manifest}: larger than {MAX_MANIFEST_BYTES} bytes")
        try:
            docs = [d for d in yaml.safe_load_all(raw) if d is not None]
        except yaml.YAMLError as exc:
            raise ConfigError(f"{args.manifest}: not YAML ({str(exc)[:200]})") from None
        targets = [d for d in docs if isinstance(d, dict)
                   and d.get("kind") in ("Deployment", "StatefulSet")]
        if not targets:
            raise ConfigError(f"{args.manifest}: no Deployment or StatefulSet in it")
        major, _, minor = args.keda_version.partition(".")
        if not (major.isdigit() and minor.isdigit()):
            raise ConfigError(f"--keda-version: {args.keda_version[:20]!r} is not MAJOR.MINOR")
        out = generate(workload_from(targets[0]), Options(
            args.scaler_address, args.min_replicas, args.max_replicas, args.startup_seconds,
            args.demand_source, args.planner, args.ttft_seconds, (int(major), int(minor))))
        if len(targets) > 1:
            print(f"gpuscale: {len(targets)} workloads in {args.manifest}: this is for the "
                  f"first, {targets[0].get('kind')} "
                  f"{(targets[0].get('metadata') or {}).get('name')}", file=sys.stderr)
    except (ConfigError, OSError, UnicodeDecodeError) as exc:
        return fail(exc if isinstance(exc, ConfigError) else f"{args.manifest}: {exc}")
    header = "".join(f"# {n}\n" for n in out.notes)
    body = [out.scaled_object] + ([out.hpa] if args.hpa else [])
    if args.hpa:
        header += "# the HPA is for clusters without KEDA: apply it or the ScaledObject\n"
    print(header + yaml.safe_dump_all(body, sort_keys=False), end="")
    for note in out.notes:
        if note.startswith("WARNING"):
            print(f"gpuscale: {note}", file=sys.stderr)
    return 0
