"""Service names for programs in the namespace: there is no cluster DNS, so the runner
writes the namespace's hosts file (``ip netns exec`` mounts /etc/netns/<ns>/hosts over
/etc/hosts) with every Service's ready endpoints - what a headless Service's DNS answers.
Written in place: the mount follows the file, not a new one renamed over it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from cluster.netns import ETC_NETNS

SERVICE_LABEL = "kubernetes.io/service-name"


def hosts_dir(netns: str) -> Path:
    return ETC_NETNS / netns


def render(slices: Iterable[Mapping[str, Any]]) -> str:
    names: dict[str, list[str]] = {}
    for s in slices:
        meta = s.get("metadata") or {}
        svc = (meta.get("labels") or {}).get(SERVICE_LABEL)
        if not svc:
            continue
        fqdn = f"{svc}.{meta.get('namespace')}.svc"
        for ep in s.get("endpoints") or []:
            if (ep.get("conditions") or {}).get("ready") is False:
                continue
            for ip in (ep.get("addresses") or [])[:1]:
                names.setdefault(str(ip), []).append(fqdn)
    lines = ["127.0.0.1 localhost", "::1 localhost"]
    for ip, fqdns in sorted(names.items()):
        for fqdn in sorted(set(fqdns)):
            lines.append(f"{ip} {fqdn} {fqdn}.cluster.local")
    return "\n".join(lines) + "\n"


def write_in_place(path: Path, text: str) -> bool:
    """Rewrites ``path`` when its text differs; True when it did."""
    try:
        if path.read_text() == text:
            return False
    except OSError:
        pass
    with path.open("r+" if path.exists() else "w") as f:
        f.seek(0)
        f.write(text)
        f.truncate()
    return True
