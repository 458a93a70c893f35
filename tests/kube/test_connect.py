"""Connecting with a kubeconfig: each kind of credential reaches the API-server peer, a
kubeconfig that cannot work is a ConfigError naming why, and a credential that fails
only when a request is made is an ApiError - nothing of lightkube or httpx2 escapes."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuscale.common.errors import ConfigError
from gpuscale.kube.api import KubeApi, ObjectRef
from gpuscale.kube.connect import connect
from gpuscale.kube.errors import ApiError
from tests.peers.kubeapi import KubeApiPeer
from tests.support.kubeconfig import write_kubeconfig

GV = "example.com/v1"


def url(peer: KubeApiPeer) -> str:
    return f"http://127.0.0.1:{peer.port}"


async def discover(api: KubeApi) -> str:
    """A request the peer authenticates: the ConfigMap's ``data.answer``."""
    try:
        got = await api.get(ObjectRef("v1", "configmaps", "kube-system", "settings"))
        return str(got["data"]["answer"])
    finally:
        await api.close()


@pytest.fixture
def peer(kubeapi: KubeApiPeer) -> KubeApiPeer:
    kubeapi.set_configmap("kube-system", "settings", {"answer": "42"})
    return kubeapi


async def test_a_bearer_token(peer: KubeApiPeer, tmp_path: Path) -> None:
    path = write_kubeconfig(tmp_path / "config", url(peer), {"token": peer.token})
    assert await discover(await connect(path)) == "42"


async def test_a_wrong_token_is_an_api_error_not_an_exception_of_the_client(
        peer: KubeApiPeer, tmp_path: Path) -> None:
    path = write_kubeconfig(tmp_path / "config", url(peer), {"token": "stale"})
    with pytest.raises(ApiError) as info:
        await discover(await connect(path))
    assert info.value.status == 401
    assert "unauthorized (401)" in str(info.value)


async def test_a_context_without_a_user_is_anonymous(peer: KubeApiPeer,
                                                     tmp_path: Path) -> None:
    path = write_kubeconfig(tmp_path / "config", url(peer), None)
    with pytest.raises(ApiError, match=r"unauthorized \(401\)"):
        await discover(await connect(path))


def plugin(tmp_path: Path, token: str | None) -> dict[str, Any]:
    """A kubeconfig user whose token comes from an exec plugin (a Python script)."""
    script = tmp_path / "plugin.py"
    reply = {"apiVersion": "client.authentication.k8s.io/v1beta1",
             "kind": "ExecCredential", "status": {"token": token}}
    body = f"print({json.dumps(json.dumps(reply))})" if token else \
        "import sys; sys.exit('no credentials today')"
    script.write_text(body)
    return {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1",
                     "command": sys.executable, "args": [str(script)]}}


async def test_an_exec_plugin(peer: KubeApiPeer, tmp_path: Path) -> None:
    path = write_kubeconfig(tmp_path / "config", url(peer), plugin(tmp_path, peer.token))
    assert await discover(await connect(path)) == "42"


@pytest.mark.parametrize("user", [
    pytest.param(lambda tmp: plugin(tmp, None), id="a plugin that fails"),
    pytest.param(lambda tmp: {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1",
                                       "command": str(tmp / "missing")}},
                 id="a plugin that is not there"),
    pytest.param(lambda tmp: {"tokenFile": str(tmp / "gone")}, id="a token file gone"),
])
async def test_credentials_that_fail_at_request_time_are_api_errors(
        peer: KubeApiPeer, tmp_path: Path, user: Any) -> None:
    path = write_kubeconfig(tmp_path / "config", url(peer), user(tmp_path))
    api = await connect(path)
    with pytest.raises(ApiError, match="credentials unusable"):
        await discover(api)


async def test_a_rotated_token_file_is_read_again(peer: KubeApiPeer,
                                                  tmp_path: Path) -> None:
    """The service account's token as the kubelet rotates it: the API server answers the
    old one 401, and lightkube reads the file again."""
    peer.discovery[GV] = [{"name": "inferencesets", "kind": "InferenceSet"}]
    token = tmp_path / "token"
    token.write_text(peer.token)
    api = await connect(write_kubeconfig(tmp_path / "config", url(peer),
                                         {"tokenFile": str(token)}))
    try:
        assert await api.resource_of(GV, "InferenceSet") == "inferencesets"
        peer.token = "second"
        token.write_text("second\n")
        api._resources.clear()  # ask the server again
        assert await api.resource_of(GV, "InferenceSet") == "inferencesets"
    finally:
        await api.close()


BAD = {
    "not YAML": ("clusters: [", "Kubernetes config unusable"),
    "not a mapping": ("just text", "Kubernetes config unusable"),
    "no clusters": (yaml.safe_dump({"contexts": []}), "'clusters' is not defined"),
    "no current context": (yaml.safe_dump({"clusters": [], "contexts": []}),
                           "No current context"),
    "a context naming no cluster": (
        yaml.safe_dump({"current-context": "x", "clusters": [],
                        "contexts": [{"name": "x", "context": {"cluster": "nowhere"}}]}),
        "'nowhere' is not defined"),
    "a server that is not a string": (
        yaml.safe_dump({"current-context": "x",
                        "clusters": [{"name": "c", "cluster": {"server": [1]}}],
                        "contexts": [{"name": "x", "context": {"cluster": "c"}}]}),
        "Kubernetes config unusable"),
    "a CA file that is not there": (
        yaml.safe_dump({"current-context": "x",
                        "clusters": [{"name": "c", "cluster": {
                            "server": "https://k", "certificate-authority": "/nonexistent"}}],
                        "contexts": [{"name": "x", "context": {"cluster": "c"}}]}),
        "Kubernetes config unusable"),
    "an auth provider": (
        yaml.safe_dump({"current-context": "x",
                        "clusters": [{"name": "c", "cluster": {"server": "https://k"}}],
                        "users": [{"name": "u", "user": {"auth-provider": {"name": "gcp"}}}],
                        "contexts": [{"name": "x", "context": {"cluster": "c",
                                                               "user": "u"}}]}),
        "auth-provider not supported"),
}


@pytest.mark.parametrize("case", list(BAD))
async def test_bad_kubeconfigs_are_config_errors(tmp_path: Path, case: str) -> None:
    text, why = BAD[case]
    path = tmp_path / "config"
    path.write_text(text)
    with pytest.raises(ConfigError, match="Kubernetes config unusable") as info:
        await connect(path)
    assert why in str(info.value)


async def test_a_kubeconfig_that_is_not_there(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"Kubernetes config unusable: .*not found"):
        await connect(tmp_path / "missing")


async def test_no_credentials_at_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="no Kubernetes credentials: not in a pod"):
        await connect()


@pytest.mark.skipif(Path("/var/run/secrets/kubernetes.io/serviceaccount").exists(),
                    reason="this machine is a pod")
async def test_in_a_pod_without_a_service_account(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    with pytest.raises(ConfigError, match=r"Kubernetes config unusable: .*token"):
        await connect()
