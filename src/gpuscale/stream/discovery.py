"""Agent discovery through the EndpointSlices of the agents' headless Service (watched).

Each endpoint gives an address to dial and the node it runs on (``nodeName``, set by the
EndpointSlice controller from the pod's scheduling, not by the agent): the subscriber
places the agent's pods on that node, whatever name the agent claims."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gpuscale.kube.api import Collection, KubeApi
from gpuscale.kube.listwatch import BACKOFF_S
from gpuscale.kube.replies import list_at, obj_at, str_at


def addresses(slices: Iterable[Mapping[str, Any]], port_name: str,
              default_port: int) -> dict[str, str]:
    """``ip:port`` -> node name ("" when the endpoint has none) of every endpoint that is
    not known to be unready; fields of the wrong JSON type read as absent."""
    out: dict[str, str] = {}
    for s in slices:
        port = next((p["port"] for p in list_at(s, "ports")
                     if str_at(p, "name") == port_name and _is_port(obj_at(p).get("port"))),
                    default_port)
        v6 = str_at(s, "addressType") == "IPv6"
        for ep in list_at(s, "endpoints"):
            if obj_at(ep, "conditions").get("ready") is False:
                continue
            for ip in [a for a in list_at(ep, "addresses") if isinstance(a, str)][:1]:
                out[f"[{ip}]:{port}" if v6 else f"{ip}:{port}"] = str_at(ep, "nodeName")
    return out


def _is_port(p: object) -> bool:
    return isinstance(p, int) and not isinstance(p, bool) and 0 < p < 65536


class EndpointSliceDiscovery:
    def __init__(self, api: KubeApi, namespace: str, service: str,
                 on_change: Callable[[dict[str, str]], None], port_name: str = "telemetry",
                 default_port: int = 9401, backoff_s: tuple[float, ...] = BACKOFF_S) -> None:
        self._on_change = on_change
        self._port_name = port_name
        self._default_port = default_port
        self.watch = api.list_watch(
            Collection("discovery.k8s.io/v1", "endpointslices", namespace,
                       label_selector=f"kubernetes.io/service-name={service}"),
            f"EndpointSlice watch of {namespace}/{service}", on_change=self._changed,
            backoff_s=backoff_s)

    async def _changed(self) -> None:
        self._on_change(addresses(self.watch.items.values(), self._port_name,
                                  self._default_port))

    async def run(self) -> None:
        await self.watch.run()
