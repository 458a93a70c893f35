"""What a kubelet mounts into a container, for a pod that runs as a process here: Secret
and ConfigMap volumes are written under the cluster's directory, and the container's
arguments that name a mount path are pointed at that copy (a process has no mount
namespace of its own). Contents are refreshed on every tick, as a kubelet does."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuscale.kube.api import KubeApi


async def materialize(api: KubeApi, pod: Mapping[str, Any], root: Path) -> dict[str, Path]:
    """mountPath -> local directory, for the first container's Secret/ConfigMap mounts."""
    meta, spec = pod["metadata"], pod["spec"]
    ns = meta["namespace"]
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    container = (spec.get("containers") or [{}])[0]
    out: dict[str, Path] = {}
    for mount in container.get("volumeMounts") or []:
        vol = volumes.get(mount.get("name"), {})
        files: dict[str, bytes] = {}
        if "secret" in vol:
            obj = await api.get_raw(
                f"/api/v1/namespaces/{ns}/secrets/{vol['secret']['secretName']}")
            files = {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
        elif "configMap" in vol:
            obj = await api.get_raw(
                f"/api/v1/namespaces/{ns}/configmaps/{vol['configMap']['name']}")
            files = {k: str(v).encode() for k, v in (obj.get("data") or {}).items()}
        else:
            continue
        local = root / "volumes" / meta["uid"] / mount["name"]
        local.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            target = local / Path(name).name
            if not target.exists() or target.read_bytes() != data:
                tmp = target.with_suffix(target.suffix + ".tmp")
                tmp.write_bytes(data)
                tmp.chmod(0o600)
                tmp.replace(target)
        out[str(mount["mountPath"]).rstrip("/")] = local
    return out


def rewrite(args: list[str], mounts: Mapping[str, Path]) -> list[str]:
    """``args`` with every mount path they name (``--x=/tls/tls.crt``) made local."""
    longest_first = sorted(mounts.items(), key=lambda m: -len(m[0]))

    def local(arg: str) -> str:
        for mount_path, directory in longest_first:
            if mount_path + "/" in arg:
                return arg.replace(mount_path + "/", f"{directory}/")
        return arg
    return [local(a) for a in args]
