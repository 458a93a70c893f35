"""Credentials for the API: in-cluster when running in a pod, else a kubeconfig.

The config is read by lightkube (``KubeConfig``: the service account, or a kubeconfig's
current context); kube/credentials.py makes the client of it.
"""

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
    (``find_kubeconfig``; its current context). ConfigError, naming the problem, when
    neither is usable. The Kubernetes client is imported only here, when a component needs
    the API."""
    import yaml
    from lightkube import ConfigError as LightkubeConfigError
    from lightkube.config.kubeconfig import KubeConfig

    from gpuscale.kube.credentials import api_for

    try:
        if in_cluster(kubeconfig):
            config = KubeConfig.from_service_account()
        else:
            path = find_kubeconfig(kubeconfig)
            if path is None:
                raise ConfigError("no Kubernetes credentials: not in a pod, and no "
                                  "kubeconfig (--kubeconfig, $KUBECONFIG, ~/.kube/config)")
            config = KubeConfig.from_file(path)
        single = config.get()
        assert single is not None  # get() without a default raises instead
        return api_for(single)
    except ConfigError:
        raise
    except KeyError as exc:  # a context naming a cluster or user that is not there
        raise ConfigError(f"Kubernetes config unusable: {exc} is not defined") from None
    except (LightkubeConfigError, OSError, ValueError, TypeError, AttributeError,
            yaml.YAMLError) as exc:  # files, YAML, fields of the wrong type, TLS
        raise ConfigError(f"Kubernetes config unusable: {exc}") from None
