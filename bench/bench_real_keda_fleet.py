"""Scenario 5 of the real control plane: 1,000 ScaledObjects with ``external-push`` on the
real KEDA 2.21 (kwok makes 1,000 Deployments cheap), all answered by one gpuscale scaler
installed from the Helm chart. A few of them carry load and must scale; the rest wait at
zero, as an idle fleet does. Prints, as Markdown rows for BENCHMARKS.md:

- how long until every ScaledObject is Ready and every stream is open at the scaler;
- errors: KEDA's own counters (``keda_scaler_errors_total``,
  ``keda_scaled_object_errors_total``), ERROR lines in its log, and the scalers' answers
  by gRPC code, over the whole run and over the soak (a pod that is Ready before its
  agent's next update is UNAVAILABLE for that moment, by design: start-up errors are
  shown, the soak's must be 0);
- the scaler's CPU (per second of wall time) and RSS, and KEDA's and the API server's,
  while idle with no ScaledObject (the yardstick, same run) and while serving all of them.

    .venv/bin/python bench/bench_real_keda_fleet.py [--count 1000] [--soak 300]

Needs root and Go (a cluster of its own, slot 2; ``cluster/build`` first if it is cold)."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.proc import proc_cpu_seconds, proc_mem_mib
from cluster.layout import Layout
from cluster.netns import enter
from cluster.session import Cluster, running
from tests.cluster.workloads import NAMESPACE, inference_deployment, namespace, scaled_object

SLOT = 2
ACTIVE = 4  # workloads with load: 4 x 3 replicas fit the two 8-GPU nodes
ACTIVE_LOAD = 24  # in flight each: 3 replicas at 8 per replica
BATCH = 100  # objects per kubectl apply


class Failed(Exception):
    """The run cannot go on; the cluster's folder (its logs) is kept and named."""


@dataclass(frozen=True)
class Watched:
    """One process whose CPU and memory the bench samples."""

    name: str
    pid: int


def _pids(root: Path) -> list[Watched]:
    """The scalers (the chart runs two), KEDA's operator and the API server of the cluster
    in ``root``."""
    wanted = {"scaler": ("scaler", "--agent-service"), "keda-operator": ("keda-operator",),
              "kube-apiserver": ("kube-apiserver",)}
    found: list[Watched] = []
    scalers = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        line = " ".join(argv)
        if str(root) not in line:
            continue
        for name, words in wanted.items():
            if not all(w in line for w in words):
                continue
            if name == "scaler":
                scalers += 1
                found.append(Watched(f"scaler {scalers}", int(proc.name)))
            elif not any(w.name == name for w in found):
                found.append(Watched(name, int(proc.name)))
    missing = set(wanted) - {w.name.split()[0] for w in found}
    if missing:
        raise Failed(f"processes not found for {sorted(missing)} under {root}")
    return found


def _sample(watched: list[Watched], seconds: float) -> dict[str, tuple[float, float]]:
    """Per process: CPU seconds per wall second over ``seconds``, and the highest RSS."""
    try:
        start = {w.name: proc_cpu_seconds(w.pid) for w in watched}
        peak = {w.name: 0.0 for w in watched}
        began = time.monotonic()
        while time.monotonic() - began < seconds:
            for w in watched:
                peak[w.name] = max(peak[w.name], proc_mem_mib(w.pid)[0])
            time.sleep(2.0)
        wall = time.monotonic() - began
        return {w.name: ((proc_cpu_seconds(w.pid) - start[w.name]) / wall, peak[w.name])
                for w in watched}
    except FileNotFoundError as exc:  # /proc/<pid> gone
        gone = [w.name for w in watched if not Path(f"/proc/{w.pid}").exists()]
        raise Failed(f"{', '.join(gone) or exc}: exited while sampled") from None


def _prometheus_text(url: str, layout: Layout | None = None) -> str:
    """A /metrics page: from the host, or (``layout``) from inside the cluster's network
    namespace, where KEDA's operator serves its metrics on its loopback."""
    if layout is None:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return str(reply.read().decode())
    code = f"import urllib.request;print(urllib.request.urlopen({url!r}).read().decode())"
    return subprocess.run(enter(layout, [sys.executable, "-c", code]), capture_output=True,
                          text=True, check=True, timeout=30).stdout


def _sums(text: str, names: tuple[str, ...]) -> dict[str, float]:
    """Each metric's sum over its series (0 where it has none yet)."""
    out = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        match = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})?\s+(\S+)", line)
        if match and match.group(1) in out:
            out[match.group(1)] += float(match.group(3))
    return out


def _by_label(text: str, name: str, label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        value = re.search(rf'{label}="([^"]*)"', line)
        key = value.group(1) if value else "?"
        out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def _until(check: Callable[[], bool], within: float, what: str) -> float:
    began = time.monotonic()
    while not check():
        if time.monotonic() - began > within:
            raise Failed(f"not within {within:.0f} s: {what}")
        time.sleep(2.0)
    return time.monotonic() - began


def _ready_count(cluster: Cluster) -> int:
    items = cluster.get("scaledobject", "-n", NAMESPACE)["items"]
    return sum(1 for so in items for c in (so.get("status") or {}).get("conditions") or []
               if c.get("type") == "Ready" and c.get("status") == "True")


def _objects(count: int) -> list[dict[str, Any]]:
    """``count`` Deployments and their ScaledObjects: the first ACTIVE at one replica and
    minReplicaCount 1, the rest at zero (minReplicaCount 0, an idle fleet)."""
    out: list[dict[str, Any]] = []
    for i in range(count):
        name = f"fleet-{i:04d}"
        active = i < ACTIVE
        out.append(inference_deployment(name, replicas=1 if active else 0))
        out.append(scaled_object(name, name, push=True, min_replicas=1 if active else 0,
                                 max_replicas=3, polling=30, cooldown=300))
    return out


def _scaler_urls(cluster: Cluster) -> list[str]:
    pods = cluster.get("pods", "-n", "gpuscale", "-l",
                       "app.kubernetes.io/component=scaler")["items"]
    return [f"http://{p['status']['podIP']}:9402/metrics" for p in pods]


def _streams(urls: list[str]) -> float:
    """KEDA's StreamIsActive streams open, over every scaler replica (one per trigger)."""
    return sum(_by_label(_prometheus_text(u), "gpuscale_scaler_streams", "method").get(
        "StreamIsActive", 0.0) for u in urls)


def _keda_log_errors(layout: Layout, since: str = "") -> list[str]:
    """KEDA's ERROR lines (console encoding: time, tab, level), those at or after the
    ISO time ``since`` when given."""
    text = (layout.logs / "keda-operator.log").read_text(errors="replace")
    return [line for line in text.splitlines()
            if "\tERROR\t" in line and line.split("\t", 1)[0] >= since]


def _row(name: str, idle: tuple[float, float], busy: tuple[float, float]) -> str:
    return (f"| {name} | {idle[0]:.3f} | {busy[0]:.3f} | {idle[1]:.0f} | {busy[1]:.0f} |")


KEDA_ERRORS = ("keda_scaler_errors_total", "keda_scaled_object_errors_total")


def _keda_errors(cluster: Cluster) -> dict[str, float]:
    return _sums(_prometheus_text("http://127.0.0.1:8080/metrics", cluster.layout),
                 KEDA_ERRORS)


def _codes(urls: list[str]) -> dict[str, float]:
    """The scalers' unary answers to KEDA, by gRPC code, summed over the replicas."""
    out: dict[str, float] = {}
    for u in urls:
        for code, n in _by_label(_prometheus_text(u), "gpuscale_scaler_requests_total",
                                 "code").items():
            out[code] = out.get(code, 0.0) + n
    return out


def _start(cluster: Cluster, count: int) -> tuple[float, float, list[str]]:
    """Applies the fleet; seconds until every ScaledObject is Ready and until every
    stream is open, and the scalers' /metrics addresses."""
    objects = _objects(count)
    began = time.monotonic()
    for i in range(0, len(objects), BATCH):
        cluster.apply(*objects[i:i + BATCH])
    print(f"applied {count} Deployments + ScaledObjects in {time.monotonic() - began:.0f} s",
          flush=True)
    _until(lambda: _ready_count(cluster) >= count, 1800, f"{count} ScaledObjects Ready")
    ready = time.monotonic() - began
    urls = _scaler_urls(cluster)
    _until(lambda: _streams(urls) >= count, 900, f"{count} streams open at the scalers")
    opened = time.monotonic() - began
    print(f"all Ready after {ready:.0f} s, all streams open after {opened:.0f} s", flush=True)
    return ready, opened, urls


def _scale_active(cluster: Cluster) -> float:
    for i in range(ACTIVE):
        cluster.load(f"{NAMESPACE}/fleet-{i:04d}", ACTIVE_LOAD)
    return _until(lambda: all(cluster.replicas(NAMESPACE, f"fleet-{i:04d}") >= 3
                              for i in range(ACTIVE)), 600,
                  f"the {ACTIVE} loaded workloads at 3 replicas")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=1000)
    p.add_argument("--soak", type=float, default=300.0, help="seconds sampled at full load")
    p.add_argument("--idle", type=float, default=60.0, help="seconds sampled before")
    args = p.parse_args()
    tmp = tempfile.mkdtemp(prefix="gs-fleet-")
    try:
        return _run(args, Path(tmp))
    except Failed as exc:
        print(f"bench_real_keda_fleet: {exc}; the cluster's logs are kept in {tmp}/logs",
              file=sys.stderr)
        return 2


def _run(args: argparse.Namespace, tmp: Path) -> int:
    with running(tmp, SLOT) as cluster:
        watched = _pids(tmp)
        cluster.apply(namespace())
        print(f"idle yardstick: {args.idle:.0f} s with no ScaledObject", flush=True)
        idle = _sample(watched, args.idle)
        ready, opened, urls = _start(cluster, args.count)
        scaled = _scale_active(cluster)
        print(f"loaded workloads at 3 in {scaled:.0f} s; soaking {args.soak:.0f} s", flush=True)
        since = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
        keda_before, codes_before = _keda_errors(cluster), _codes(urls)
        busy = _sample(watched, args.soak)
        keda, codes = _keda_errors(cluster), _codes(urls)
        open_now = _streams(urls)
        errors, soak_errors = (_keda_log_errors(cluster.layout),
                               _keda_log_errors(cluster.layout, since))
        sampled = range(ACTIVE, args.count, max(1, args.count // 50))
        zero = sum(1 for i in sampled if cluster.replicas(NAMESPACE, f"fleet-{i:04d}") == 0)
    soak_keda = {k: keda[k] - keda_before[k] for k in KEDA_ERRORS}
    soak_codes = {k: v - codes_before.get(k, 0.0) for k, v in codes.items()}
    print(f"\n{args.count} ScaledObjects (external-push) on {len(urls)} scaler replicas, "
          f"{ACTIVE} loaded, soak {args.soak:.0f} s, {time.strftime('%Y-%m-%d')}")
    print(f"- all Ready {ready:.0f} s after the first apply; every stream open at "
          f"{opened:.0f} s; StreamIsActive open at the end: {open_now:.0f}")
    print(f"- loaded workloads at 3 replicas {scaled:.0f} s after their load; sampled idle "
          f"ones still at 0: {zero} of {len(sampled)}")
    print(f"- KEDA's error counters, whole run: {json.dumps(keda)}; during the soak: "
          f"{json.dumps(soak_keda)}")
    print(f"- ERROR lines in KEDA's log, whole run: {len(errors)}; during the soak: "
          f"{len(soak_errors)}")
    for line in (soak_errors or errors)[:5]:
        print(f"    {line[:300]}")
    print(f"- the scalers' unary answers by gRPC code, whole run: {json.dumps(codes)}; "
          f"during the soak: {json.dumps(soak_codes)}")
    print("\n| process | CPU s/s idle (yardstick) | CPU s/s with all | RSS MiB idle | "
          "RSS MiB with all |\n|---|---|---|---|---|")
    for w in watched:
        print(_row(w.name, idle[w.name], busy[w.name]))
    failed = sum(soak_keda.values()) + len(soak_errors)
    if failed or open_now < args.count:
        print(f"errors or streams missing; the cluster's logs are kept in {tmp}/logs")
        return 1
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
