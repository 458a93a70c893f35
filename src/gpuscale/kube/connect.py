"""Credentials for the API: in-cluster when running in a pod, else a kubeconfig."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from gpuscale.common.errors import ConfigError

if TYPE_CHECKING:  # the Kubernetes client is a heavy import: only when connecting
    from gpuscale.kube.api import KubeApi


def in_cluster(kubeconfig: Path | None) -> bool:
    """In a pod (the service host is set) and no kubeconfig asked for."""
    return kubeconfig is None and bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def find_kubeconfig(explicit: Path | None) -> Path | None:
    """``explicit``, else the first file of $KUBECONFIG, else ~/.kube/config if it exists."""
    if explicit is not None:
        return explicit
    env = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
    default = Path(env) if env else Path("~/.kube/config").expanduser()
    return default if default.exists() else None


def credentials_available(kubeconfig: Path | None) -> bool:
    return in_cluster(kubeconfig) or find_kubeconfig(kubeconfig) is not None


async def connect(kubeconfig: Path | None = None) -> KubeApi:
    """An API client with in-cluster credentials, or those of the kubeconfig
    (``find_kubeconfig``). ConfigError, naming the problem, when neither is usable. The
    Kubernetes client is imported only here, when a component needs the API."""
    from kubernetes_asyncio import client, config

    from gpuscale.kube.api import KubeApi

    conf = client.Configuration()
    try:
        if in_cluster(kubeconfig):
            config.load_incluster_config(client_configuration=conf)  # type: ignore[no-untyped-call]
        else:
            path = find_kubeconfig(kubeconfig)
            if path is None:
                raise ConfigError("no Kubernetes credentials: not in a pod, and no "
                                  "kubeconfig (--kubeconfig, $KUBECONFIG, ~/.kube/config)")
            await config.load_kube_config(config_file=str(path), client_configuration=conf)
    except (config.ConfigException, OSError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"Kubernetes config unusable: {exc}") from None
    return KubeApi(client.ApiClient(conf))
