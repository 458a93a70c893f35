"""What hostile input costs the scaler's memory, measured from outside (issue 39).

A real ``gpuscale scaler`` on loopback (no agents: every call is answered from an empty
fleet view), its RSS read from /proc (with ``--answer-process``, the scaler and its gRPC
front together). In order, on one connection, each phase followed by the RSS:

- yardstick: ``--calls`` well-formed calls (IsActive, GetMetricSpec, GetMetrics in turn);
- ``--calls`` calls whose ScaledObjectRef namespace is 1 MB (refused by gRPC's message
  limit now: RESOURCE_EXHAUSTED; INVALID_ARGUMENT before it, from the name check);
- ``--calls`` calls with a 79 KB namespace: just under the limit, so they reach Python and
  are refused there (INVALID_ARGUMENT) - what a refused call keeps after it ends;
- ``--calls`` Inspect/Explain calls (same port) with a 79 KB namespace;
- ``--http-conns`` connections to the scaler's /metrics port, each sending a request head
  of 100 header lines of 8 KB and never finishing it (held open for 2 s);
- one well-formed call, which must still be answered.

``--src DIR`` runs the scaler from another source tree (e.g. a ``git worktree`` of an
older commit) for a before/after in the same run.

Usage: .venv/bin/python bench/bench_hostile.py [--calls 1000] [--answer-process]
       [--http-conns 300] [--src DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "src"))

import grpc  # noqa: E402

from bench.proc import child_env, children, proc_mem_mib  # noqa: E402
from gpuscale.proto import externalscaler_pb2 as pb  # noqa: E402
from gpuscale.proto import externalscaler_pb2_grpc as pb_grpc  # noqa: E402
from gpuscale.proto import inspect_pb2, inspect_pb2_grpc  # noqa: E402

METADATA = {"podSelector": "app=vllm"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def scaler(answer_process: bool, src: Path | None) -> Iterator[tuple[list[int], int, int]]:
    """A real scaler on loopback: (its pids, KEDA's port, the /metrics port)."""
    port, mport = free_port(), free_port()
    argv = [sys.executable, "-m", "gpuscale.cli", "--log-level", "ERROR", "scaler",
            "--host", "127.0.0.1", "--port", str(port), "--metrics-port", str(mport),
            "--agents", "127.0.0.1:1", "--agents-insecure",
            *(["--answer-process"] if answer_process else [])]
    env = child_env(*([src] if src is not None else []))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            env=env, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if "gpuscale scaler on" not in line:
            sys.exit(f"the scaler did not start: {line!r}")
        yield [proc.pid, *children(proc.pid)], port, mport
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def rss_mib(pids: list[int]) -> float:
    time.sleep(0.5)  # let the last calls' work finish
    return sum(proc_mem_mib(p)[0] for p in pids)


def calls(n: int, stub: pb_grpc.ExternalScalerStub, ref: pb.ScaledObjectRef) -> Counter[str]:
    """``n`` unary calls with ``ref``, the three methods in turn; status codes counted."""
    methods: list[Callable[[], Any]] = [
        lambda: stub.IsActive(ref, timeout=30),
        lambda: stub.GetMetricSpec(ref, timeout=30),
        lambda: stub.GetMetrics(pb.GetMetricsRequest(
            scaledObjectRef=ref, metricName="s0-gpuscale-gpu-utilization"), timeout=30)]
    codes: Counter[str] = Counter()
    for i in range(n):
        try:
            methods[i % 3]()
            codes["OK"] += 1
        except grpc.RpcError as exc:
            codes[exc.code().name] += 1
    return codes


def explains(n: int, channel: grpc.Channel, namespace: str) -> Counter[str]:
    stub = inspect_pb2_grpc.InspectStub(channel)
    codes: Counter[str] = Counter()
    for _ in range(n):
        try:
            stub.Explain(inspect_pb2.ExplainRequest(namespace=namespace, name="so"),
                         timeout=30)
            codes["OK"] += 1
        except grpc.RpcError as exc:
            codes[exc.code().name] += 1
    return codes


def header_flood(mport: int, conns: int, pids: list[int]) -> tuple[float, str]:
    """``conns`` connections, each a request head of 100 x 8 KB header lines never
    finished; the RSS while they are open, and what the last one was answered."""
    head = b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + b"".join(
        b"X-H%d: %s\r\n" % (i, b"a" * 8000) for i in range(100))
    socks = []
    try:
        for _ in range(conns):
            s = socket.create_connection(("127.0.0.1", mport), timeout=5)
            socks.append(s)
            with contextlib.suppress(OSError):
                s.sendall(head)
        time.sleep(2)
        rss = rss_mib(pids)
        socks[-1].settimeout(0.5)
        try:
            answer = socks[-1].recv(64).split(b"\r\n")[0].decode() or "closed"
        except TimeoutError:
            answer = "no answer (held open)"
        except OSError as exc:
            answer = f"closed ({exc.strerror})"
        return rss, answer
    finally:
        for s in socks:
            s.close()


def text(codes: Counter[str]) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in sorted(codes.items()))


def run(n: int, answer_process: bool, http_conns: int, src: Path | None) -> list[str]:
    mode = "--answer-process" if answer_process else "in process"
    out = [f"scaler ({mode}{f', source {src}' if src else ''}), {n:,} calls a phase:"]
    with scaler(answer_process, src) as (pids, port, mport), grpc.insecure_channel(
            f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", 8 << 20)]) as ch:
        stub = pb_grpc.ExternalScalerStub(ch)
        good = pb.ScaledObjectRef(name="so", namespace="llm", scalerMetadata=METADATA)
        calls(30, stub, good)  # connected, caches filled
        start = rss_mib(pids)
        out.append(f"  start: RSS {start:.1f} MiB")
        phases: list[tuple[str, Callable[[], Counter[str]]]] = [
            ("well-formed calls (yardstick)", lambda: calls(n, stub, good)),
            ("1 MB namespaces", lambda: calls(n, stub, pb.ScaledObjectRef(
                name="so", namespace="x" * 1_000_000, scalerMetadata=METADATA))),
            ("79 KB namespaces (under the limit)", lambda: calls(n, stub, pb.ScaledObjectRef(
                name="so", namespace="y" * 79_000, scalerMetadata=METADATA))),
            ("Explain, 79 KB namespaces", lambda: explains(n, ch, "z" * 79_000))]
        for label, phase in phases:
            codes = phase()
            rss = rss_mib(pids)
            out.append(f"  after {label}: RSS {rss:.1f} MiB ({rss - start:+.1f} from the "
                       f"start); {text(codes)}")
        if http_conns:
            rss, answer = header_flood(mport, http_conns, pids)
            out.append(f"  {http_conns} /metrics connections, 800 KB request heads never "
                       f"finished: RSS {rss:.1f} MiB ({rss - start:+.1f}); the last one: "
                       f"{answer}")
            out.append(f"  after they closed: RSS {rss_mib(pids):.1f} MiB")
        after = calls(3, stub, good)
        out.append(f"  then three well-formed calls: {text(after)}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--answer-process", action="store_true")
    ap.add_argument("--http-conns", type=int, default=300)
    ap.add_argument("--src", type=Path, default=None,
                    help="run the scaler from this source tree (the src/ of a worktree)")
    args = ap.parse_args()
    print(f"grpcio {grpc.__version__}, Python {sys.version.split()[0]}, "
          f"{time.strftime('%Y-%m-%d')}")
    print("\n".join(run(args.calls, args.answer_process, args.http_conns, args.src)),
          flush=True)


if __name__ == "__main__":
    main()
