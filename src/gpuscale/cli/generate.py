"""``gpuscale generate``: a ScaledObject (or, with ``--hpa``, a plain HPA) for a workload."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from gpuscale.cli.common import fail

MAX_MANIFEST_BYTES = 1024 * 1024


def add_parser(sub: Any) -> None:
    g = sub.add_parser("generate", help="write a ScaledObject (or a plain HPA) that is right "
                                        "for a Deployment or StatefulSet manifest")
    g.add_argument("manifest", type=Path, nargs="?", default=None,
                   help="the workload's YAML (- for standard input); the first Deployment or "
                        "StatefulSet in it")
    g.add_argument("--from-cluster", metavar="KIND/NAME", default=None,
                   help="read the workload from the cluster instead: deployment/NAME or "
                        "statefulset/NAME (with --namespace, --kubeconfig)")
    g.add_argument("-n", "--namespace", default="default",
                   help="with --from-cluster: its namespace (default)")
    g.add_argument("--kubeconfig", type=Path, default=None,
                   help="with --from-cluster: the kubeconfig (default: $KUBECONFIG, "
                        "~/.kube/config, or in-cluster credentials)")
    g.add_argument("--scaler-address", default=None,
                   help="the ScaledObject's scalerAddress (default: the Helm chart's "
                        "Service, gpuscale-scaler.gpuscale.svc:6000); not with --hpa, which "
                        "reads the metrics API the APIService names")
    g.add_argument("--min", type=int, default=1, dest="min_replicas",
                   help="minReplicaCount (0 only with --demand-source)")
    g.add_argument("--max", type=int, default=8, dest="max_replicas")
    g.add_argument("--startup-seconds", type=float, default=None,
                   help="how long a new replica takes to become Ready (default 180 for the "
                        "scale-down steps; with --planner, left out: the scaler measures it "
                        "from the pods)")
    g.add_argument("--demand-source", default="", help="a demand source of the scaler's "
                                                       "config (needed for --min 0)")
    g.add_argument("--planner", action="store_true",
                   help="vLLM: plan ahead of traffic (profile vllm-planner)")
    g.add_argument("--ttft-seconds", type=float, default=None,
                   help="with --planner (only): the time-to-first-token objective")
    g.add_argument("--keda-version", default=None,
                   help="the KEDA the cluster runs (default 2.17: a fallback that keeps the "
                        "current replicas needs 2.17; older gets none, and the HPA holds on "
                        "errors)")
    g.add_argument("--hpa", action="store_true",
                   help="write a plain HPA on the custom metrics API instead of the "
                        "ScaledObject (for clusters without KEDA): one autoscaler per output")
    g.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import yaml

    from gpuscale.common.errors import ConfigError, GpuscaleError
    from gpuscale.tools.generate import (
        DEFAULT_SCALER_ADDRESS,
        Options,
        generate,
        workload_from,
    )

    if (args.manifest is None) == (args.from_cluster is None):
        return fail("give a MANIFEST file (or -) or --from-cluster KIND/NAME, one of them", 2)
    source = args.manifest if args.manifest is not None else \
        f"{args.namespace}/{args.from_cluster}"
    try:
        if args.from_cluster is not None:
            raw = from_cluster(args.from_cluster, args.namespace, args.kubeconfig)
        elif str(args.manifest) == "-":
            raw = sys.stdin.read(MAX_MANIFEST_BYTES + 1)
        else:
            with args.manifest.open(encoding="utf-8") as f:
                raw = f.read(MAX_MANIFEST_BYTES + 1)
        if len(raw) > MAX_MANIFEST_BYTES:
            raise ConfigError(f"{source}: larger than {MAX_MANIFEST_BYTES} bytes")
        try:
            docs = [d for d in yaml.safe_load_all(raw) if d is not None]
        except (yaml.YAMLError, RecursionError) as exc:
            raise ConfigError(not_yaml(source, raw, exc)) from None
        targets = [d for d in docs if isinstance(d, dict)
                   and d.get("kind") in ("Deployment", "StatefulSet")]
        if not targets:
            raise ConfigError(f"{source}: no Deployment or StatefulSet in it")
        for option, given in (("--keda-version", args.keda_version),
                              ("--scaler-address", args.scaler_address)):
            if args.hpa and given is not None:
                raise ConfigError(f"{option}: with --hpa there is no ScaledObject for it; "
                                  f"drop one of them")
        keda = "2.17" if args.keda_version is None else args.keda_version
        major, _, minor = keda.partition(".")
        if not (major.isdigit() and minor.isdigit()):
            raise ConfigError(f"--keda-version: {keda[:20]!r} is not MAJOR.MINOR")
        try:
            workload = workload_from(targets[0], docs)
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None
        address = args.scaler_address or DEFAULT_SCALER_ADDRESS
        out = generate(workload, Options(
            address, args.min_replicas, args.max_replicas, args.startup_seconds,
            args.demand_source, args.planner, args.ttft_seconds, (int(major), int(minor))))
        if len(targets) > 1:
            print(f"gpuscale: {len(targets)} workloads in {source}: this is for the "
                  f"first, {targets[0].get('kind')} "
                  f"{(targets[0].get('metadata') or {}).get('name')}", file=sys.stderr)
    except GpuscaleError as exc:
        return fail(exc)
    except (OSError, UnicodeDecodeError) as exc:
        return fail(f"{source}: {exc}", 2)
    # One autoscaler per output: applying both would make two HPAs fight over the workload.
    notes = out.hpa_notes if args.hpa else out.notes
    header = "".join(f"# {n}\n" for n in notes)
    if args.hpa:
        header += ("# a plain HPA on gpuscale's custom metrics API, for clusters without "
                   "KEDA (docs/hpa.md); without --hpa: the ScaledObject instead\n")
    body = out.hpa if args.hpa else out.scaled_object
    print(header + yaml.safe_dump(body, sort_keys=False), end="")
    for note in notes:
        if note.startswith("WARNING"):
            print(f"gpuscale: {note}", file=sys.stderr)
    return 0


def not_yaml(source: object, raw: str, exc: BaseException) -> str:
    """One line for a manifest PyYAML could not read: ``FILE:LINE:COLUMN: not YAML:
    problem`` (PyYAML's own message is several lines and names "<unicode string>")."""
    import yaml

    if isinstance(exc, RecursionError):
        return f"{source}: not YAML that can be read: nested too deeply"
    where, problem = "", str(exc).split("\n", 1)[0]
    if isinstance(exc, yaml.reader.ReaderError):  # a character YAML does not allow
        pos = max(0, min(exc.position, len(raw)))
        line, col = raw.count("\n", 0, pos) + 1, pos - (raw.rfind("\n", 0, pos) + 1) + 1
        where = f":{line}:{col}"  # its first line: unacceptable character #x...: why
    elif isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        if mark is not None:
            where = f":{mark.line + 1}:{mark.column + 1}"
        problem = exc.problem or exc.context or problem
        if exc.problem and exc.context and exc.context_mark is not None:
            problem += (f" ({exc.context} at {exc.context_mark.line + 1}:"
                        f"{exc.context_mark.column + 1})")
    return f"{source}{where}: not YAML: {' '.join(problem.split())[:200]}"


KINDS = {"deployment": "deployments", "deployments": "deployments",
         "deploy": "deployments", "statefulset": "statefulsets",
         "statefulsets": "statefulsets", "sts": "statefulsets"}


def from_cluster(ref: str, namespace: str, kubeconfig: Path | None) -> str:
    """The workload's JSON (JSON is YAML) read from the API server with the kubeconfig's
    (or in-cluster) credentials. ConfigError for a reference that is not KIND/NAME, ApiError
    (the API's own words: not found, forbidden, unauthorized) otherwise."""
    import asyncio
    import json

    from gpuscale.common.errors import ConfigError
    from gpuscale.kube.api import ObjectRef
    from gpuscale.kube.connect import connect

    kind, _, name = ref.partition("/")
    plural = KINDS.get(kind.lower())
    if plural is None or not name:
        raise ConfigError(f"--from-cluster {ref[:80]!r}: give deployment/NAME or "
                          f"statefulset/NAME")

    async def read() -> dict[str, Any]:
        api = await connect(kubeconfig)
        try:
            return await asyncio.wait_for(
                api.get(ObjectRef("apps/v1", plural, namespace, name)), 30)
        finally:
            await api.close()

    try:
        return json.dumps(asyncio.run(read()))
    except TimeoutError:
        raise ConfigError(f"--from-cluster: the API server did not answer within 30 s "
                          f"for {namespace}/{ref}") from None
