"""The API client: lightkube's httpx2 client, with lightkube's TLS and credentials.

Why lightkube, and this part of it: gpuscale reads raw JSON, pages its own lists and parses
its own watch lines (kube/listwatch.py, kube/replies.py), so it needs from a Kubernetes
client only what is hard to get right - config loading, TLS and credentials - and none of
the typed models (kubernetes_asyncio's cost the agent about 36 MiB; BENCHMARKS.md).
``lightkube.config.client_adapter.AsyncClient`` is the factory lightkube's own AsyncClient
builds its httpx2 client with, so this client authenticates exactly as lightkube does:
the service account's token file (re-read when the server answers 401, after the kubelet
rotated it), bearer tokens, client certificates, CA files and data, exec plugins
(``client.authentication.k8s.io`` v1alpha1 and v1beta1, run again on a 401) and basic
auth. Reaching into ``lightkube.AsyncClient`` for its private httpx client, or rebuilding
the auth ourselves, would be the hackier routes.

A credential that fails at request time (an exec plugin that fails or prints no token, a
token file that is gone) is an ApiError like any failed call.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

import httpx2
from lightkube import ConfigError as LightkubeConfigError
from lightkube.config.client_adapter import AsyncClient, ConnectionParams
from lightkube.config.kubeconfig import SingleConfig
from lightkube.config.models import User

from gpuscale.kube.api import GET_TIMEOUT_S, KubeApi
from gpuscale.kube.errors import ApiError

CONNECT_TIMEOUT_S = 10.0


def api_for(config: SingleConfig) -> KubeApi:
    """A KubeApi on ``config``'s server with its TLS settings and credentials (none for a
    context without a user, as kubectl). OSError for a CA or key file that cannot be read,
    lightkube's ConfigError for a credential it does not support (auth-provider)."""
    if config.user is None:
        config = config._replace(user=User())
    http = AsyncClient(config, ConnectionParams(
        timeout=httpx2.Timeout(GET_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)))
    if http.auth is not None:
        http.auth = _Credentials(http.auth)
    return KubeApi(http)


class _Credentials(httpx2.Auth):
    """lightkube's auth flow, its failures turned into ApiError: an exec plugin that
    fails or prints no token, a token file that is gone."""

    def __init__(self, inner: httpx2.Auth) -> None:
        self._inner = inner
        self.requires_request_body = inner.requires_request_body
        self.requires_response_body = inner.requires_response_body

    async def async_auth_flow(
            self, request: httpx2.Request) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        flow = self._inner.async_auth_flow(request)
        try:
            step = await flow.__anext__()
            while True:
                step = await flow.asend((yield step))
        except StopAsyncIteration:
            return
        except (LightkubeConfigError, OSError, ValueError, LookupError, TypeError) as exc:
            raise ApiError(f"credentials unusable: {type(exc).__name__}: "
                           f"{str(exc)[:200]}") from None
        finally:
            await flow.aclose()
