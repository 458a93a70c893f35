"""The cluster's network namespace: made with iproute2, entered with ``ip netns exec``.

Making it needs CAP_NET_ADMIN (root, or a user namespace that has it); without it the
error says so in one line."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from cluster.layout import Layout

NETNS_DIR = Path("/var/run/netns")
ETC_NETNS = Path("/etc/netns")


class NetnsError(RuntimeError):
    pass


def _ip(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    argv = ["ip", *(["-n", ns] if ns else []), *args]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise NetnsError(f"`{' '.join(argv)}` failed: {done.stderr.strip()}")
    return done


def exists(layout: Layout) -> bool:
    return (NETNS_DIR / layout.netns).exists()


def create(layout: Layout) -> None:
    """The namespace, its loopback answering for the pod range, and the veth to the host."""
    if shutil.which("ip") is None:
        raise NetnsError("`ip` (iproute2) is not installed: apt-get install iproute2")
    if os.geteuid() != 0:
        raise NetnsError("the cluster runs in a network namespace of its own, which needs "
                         "root (CAP_NET_ADMIN): run it as root or in a root container")
    if exists(layout):
        raise NetnsError(f"network namespace {layout.netns} exists: a cluster is running "
                         f"(stop it with ./dev cluster stop) or one was killed (`ip netns "
                         f"del {layout.netns}`)")
    ns, peer = layout.netns, f"gsc{layout.slot}n"
    _ip("netns", "add", ns)
    try:
        _ip("link", "set", "lo", "up", ns=ns)
        _ip("link", "add", layout.host_veth, "type", "veth", "peer", "name", peer)
        _ip("link", "set", peer, "netns", ns)
        _ip("addr", "add", f"{layout.host_ip}/30", "dev", layout.host_veth)
        _ip("link", "set", layout.host_veth, "up")
        _ip("addr", "add", f"{layout.ns_ip}/30", "dev", peer, ns=ns)
        _ip("link", "set", peer, "up", ns=ns)
        _ip("route", "add", "local", str(layout.pod_range), "dev", "lo", ns=ns)
        # No default route: nothing inside can reach past the host's end of the veth.
        _ip("route", "add", str(layout.pod_range), "via", layout.ns_ip)
        # `ip netns exec` mounts these over /etc for what runs inside: the Service names
        # the pod runner writes (cluster/dns.py) resolve there and nowhere else.
        etc = ETC_NETNS / layout.netns
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text("127.0.0.1 localhost\n::1 localhost\n")
        # A name that is no Service's fails at once, and no query leaves the namespace.
        (etc / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
    except NetnsError:
        delete(layout)
        raise


def delete(layout: Layout) -> None:
    """Removes the namespace (its end of the veth goes with it) and the host's route."""
    _ip("route", "del", str(layout.pod_range), check=False)
    _ip("link", "del", layout.host_veth, check=False)
    _ip("netns", "del", layout.netns, check=False)
    shutil.rmtree(ETC_NETNS / layout.netns, ignore_errors=True)


def enter(layout: Layout, argv: Sequence[str]) -> list[str]:
    """``argv`` run inside the namespace."""
    return ["ip", "netns", "exec", layout.netns, *argv]
