"""Which pods a ScaledObject scales, when its trigger names no podSelector.

KEDA sends the ScaledObject's name and namespace, not its target, so the scaler watches
ScaledObjects (``spec.scaleTargetRef``) and the targets' selectors: Deployments and
StatefulSets by watch; any other scalable kind through its ``/scale`` subresource
(``status.selector``), refreshed in the background. ``resolve`` answers from memory only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from gpuscale.common.errors import Unavailable
from gpuscale.kube.api import Collection, KubeApi, ObjectRef
from gpuscale.kube.errors import ApiError
from gpuscale.kube.listwatch import BACKOFF_S
from gpuscale.kube.replies import int_at, list_at, obj_at, str_at
from gpuscale.scaler.core.selector import Selector, SelectorError, parse_selector

log = logging.getLogger(__name__)

SCALE_REFRESH_S = 30.0
WATCHED = {("apps/v1", "Deployment"), ("apps/v1", "StatefulSet")}

TargetRef = tuple[str, str, str]  # apiVersion, kind, name


def selector_from_label_selector(sel: Mapping[str, Any]) -> Selector:
    """A Kubernetes LabelSelector object (matchLabels, matchExpressions) as a Selector;
    SelectorError for one that is not valid (fields of the wrong JSON type included)."""
    parts = [f"{k}={v}" for k, v in sorted(obj_at(sel, "matchLabels").items())]
    for e in list_at(sel, "matchExpressions"):
        key, op, values = str_at(e, "key"), str_at(e, "operator"), list_at(e, "values")
        if not all(isinstance(v, str) for v in values):
            raise SelectorError(f"matchExpressions values of {key[:80]!r} are not strings")
        if op in ("In", "NotIn"):
            parts.append(f"{key} {op.lower()} ({','.join(values)})")
        elif op == "Exists":
            parts.append(key)
        elif op == "DoesNotExist":
            parts.append(f"!{key}")
        else:
            raise SelectorError(f"unknown matchExpressions operator {op!r}")
    if not parts:
        raise SelectorError("the target's selector is empty (it would select every pod)")
    return parse_selector(",".join(parts))


class WorkloadResolver:
    def __init__(self, api: KubeApi, backoff_s: tuple[float, ...] = BACKOFF_S,
                 scale_refresh_s: float = SCALE_REFRESH_S) -> None:
        self._api = api
        self._so = api.list_watch(Collection("keda.sh/v1alpha1", "scaledobjects"),
                                  "ScaledObject watch", on_change=self._index_so,
                                  backoff_s=backoff_s)
        self._deploy = api.list_watch(Collection("apps/v1", "deployments"), "Deployment watch",
                                      on_change=self._index_targets, backoff_s=backoff_s)
        self._sts = api.list_watch(Collection("apps/v1", "statefulsets"), "StatefulSet watch",
                                   on_change=self._index_targets, backoff_s=backoff_s)
        self._refresh_s = scale_refresh_s
        self._targets: dict[tuple[str, str], TargetRef] = {}  # (ns, so) -> target
        self._specs: dict[tuple[str, str], Mapping[str, Any]] = {}  # (ns, so) -> its spec
        self._replicas: dict[tuple[str, str, str], int] = {}  # (ns, kind, name) -> spec.replicas
        # (ns, apiVersion, kind, name) -> the target's selector, or why it has none
        self._selectors: dict[tuple[str, str, str, str], Selector | Unavailable] = {}
        self._scales: dict[tuple[str, str, str, str], Selector | Unavailable] = {}

    def resolve(self, namespace: str, name: str) -> Selector | Unavailable:
        """The pod selector of ScaledObject ``namespace/name``'s target, or why not."""
        if self._so.synced_at is None:
            return Unavailable(f"ScaledObjects not listed yet ({self._so.state()[1]})")
        target = self._targets.get((namespace, name))
        if target is None:
            return Unavailable(f"ScaledObject {namespace}/{name} not found")
        av, kind, tname = target
        key = (namespace, av, kind, tname)
        if (av, kind) in WATCHED:
            lw = self._deploy if kind == "Deployment" else self._sts
            if lw.synced_at is None:
                return Unavailable(f"{kind}s not listed yet ({lw.state()[1]})")
            return self._selectors.get(
                key, Unavailable(f"{kind} {namespace}/{tname} not found"))
        return self._scales.get(
            key, Unavailable(f"{kind} {namespace}/{tname}: /scale not read yet"))

    def target(self, namespace: str, kind: str, name: str) -> Selector | Unavailable | None:
        """The pod selector of Deployment or StatefulSet ``namespace/name`` (``kind``), from
        the watches; None when the watch has it not; or why it cannot be known (not listed
        yet, a selector that cannot be used)."""
        if ("apps/v1", kind) not in WATCHED:
            return Unavailable(f"{kind} is not watched (Deployment and StatefulSet are)")
        lw = self._deploy if kind == "Deployment" else self._sts
        if lw.synced_at is None:
            return Unavailable(f"{kind}s not listed yet ({lw.state()[1]})")
        return self._selectors.get((namespace, "apps/v1", kind, name))

    def scaled_object(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """ScaledObject ``namespace/name``'s spec as last watched (for gpuscale explain)."""
        return self._specs.get((namespace, name))

    def scaling(self, namespace: str, kind: str, name: str) -> list[str]:
        """The ScaledObjects of ``namespace`` whose target is ``kind``/``name``."""
        return sorted(so for (ns, so), (_, k, n) in self._targets.items()
                      if ns == namespace and k == kind and n == name)

    def replicas(self, namespace: str, kind: str, name: str) -> int | None:
        """A watched Deployment's or StatefulSet's spec.replicas (None: not known)."""
        return self._replicas.get((namespace, kind, name))

    def state(self) -> list[str]:
        return [f"{lw.what}: {why}" for lw in (self._so, self._deploy, self._sts)
                for ok, why in [lw.state()] if not ok]

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._so.run())
            tg.create_task(self._deploy.run())
            tg.create_task(self._sts.run())
            tg.create_task(self._refresh_scales())

    async def _index_so(self) -> None:
        targets = {}
        specs = {}
        for so in self._so.items.values():
            meta, ref = obj_at(so, "metadata"), obj_at(so, "spec", "scaleTargetRef")
            if not str_at(ref, "name"):
                continue
            key = (str_at(meta, "namespace"), str_at(meta, "name"))
            targets[key] = (str_at(ref, "apiVersion") or "apps/v1",
                            str_at(ref, "kind") or "Deployment", str_at(ref, "name"))
            specs[key] = obj_at(so, "spec")
        self._targets, self._specs = targets, specs

    async def _index_targets(self) -> None:
        selectors: dict[tuple[str, str, str, str], Selector | Unavailable] = {}
        replicas: dict[tuple[str, str, str], int] = {}
        for kind, lw in (("Deployment", self._deploy), ("StatefulSet", self._sts)):
            for obj in lw.items.values():
                meta = obj_at(obj, "metadata")
                key = (str_at(meta, "namespace"), "apps/v1", kind, str_at(meta, "name"))
                count = int_at(obj, "spec", "replicas", default=1)  # the API's default
                if count >= 0:
                    replicas[(key[0], kind, key[3])] = count
                try:
                    selectors[key] = selector_from_label_selector(
                        obj_at(obj, "spec", "selector"))
                except SelectorError as exc:
                    selectors[key] = Unavailable(f"{kind} {key[0]}/{key[3]}: {exc}")
        self._selectors, self._replicas = selectors, replicas

    async def _refresh_scales(self) -> None:
        while True:
            wanted = {(ns, av, kind, name) for (ns, _), (av, kind, name) in
                      self._targets.items() if (av, kind) not in WATCHED}
            scales: dict[tuple[str, str, str, str], Selector | Unavailable] = {}
            for key in wanted:
                scales[key] = await self._read_scale(*key)
            self._scales = scales
            await asyncio.sleep(self._refresh_s)

    async def _read_scale(self, ns: str, api_version: str, kind: str,
                          name: str) -> Selector | Unavailable:
        try:
            plural = await self._api.resource_of(api_version, kind)
            if plural is None:
                return Unavailable(f"{api_version} has no kind {kind}")
            body = await self._api.get(ObjectRef(api_version, plural, ns, name, "scale"))
            text = str_at(body, "status", "selector")
            return parse_selector(text)
        except SelectorError as exc:
            return Unavailable(f"{kind} {ns}/{name}: /scale selector: {exc}")
        except ApiError as exc:
            return Unavailable(f"{kind} {ns}/{name}: /scale: {exc}")
