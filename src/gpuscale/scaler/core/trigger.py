"""ScaledObject trigger metadata -> a validated trigger configuration.

Schema (all values are strings, as KEDA sends them):

================== ============================= ===================================
key                value                         default
================== ============================= ===================================
profile            a name from ``gpuscale profiles``   ``gpu-utilization``
signal             one signal (replaces the profile's)  the profile's signals
targetValue        number > 0, per pod, signal's unit   the profile's target
activationThreshold number >= 0                         the profile's activation
valueMode          ``sum`` | ``average``                ``sum``
metricType         ``AverageValue`` | ``Value``         (keda-gpu-scaler's key: sets
                                                         valueMode sum | average)
podSelector        label selector (``app=vllm,tier in (a,b)``)   the scale target's pods
demandSource       name of a demand source in the scaler's config   none
================== ============================= ===================================

Profile ``vllm-planner`` (the planner, ``scaler.planner``) also takes, each optional:

======================== ========================================== ==================
key                      meaning                                    default
======================== ========================================== ==================
ttftSeconds              time-to-first-token objective, seconds     2
ttftSecondsPerPromptToken  and per prompt token, seconds, 0 to 0.1  0
queueDelaySeconds        or: queueing-delay objective, seconds      (from ttftSeconds)
startupSeconds           creation to Ready of a new replica          measured (*)
prefillTokensPerSecond   prompt tokens/s one replica prefills        30000
decodeTokensPerSecond    generated tokens/s one replica decodes      12000
maxBatch                 sequences one replica batches (max_num_seqs)  256
utilization              busy fraction to plan for, 0.1 to 1          0.85
holdSeconds              scale-down hold                            the start-up
memorySeconds            how long a recurring burst is kept, 1-86400  1200
drainSeconds             the pods' termination grace, 0 to 86400        30
spareReplicas            asked beyond the plan while a scale-up starts,  0
                         a whole number 0 to 10 (``scaler.core.hedge``)
promptTokens             a request's prompt until engines show theirs   1000
======================== ========================================== ==================

(*) Without ``startupSeconds`` the planner measures it: the 90th percentile of the
workload's pods' creation to first Ready, for pods the scaler's pod watch saw start (300 s
until three pods have shown theirs; always 300 s where the scaler has no Kubernetes API).

With ``ttftSeconds`` the queueing budget is the objective less the prefill of the mean
prompt the engines have shown (of a ``promptTokens`` prompt, 1000 unless given, until
they have) at the replica's prefill rate. ``ttftSecondsPerPromptToken`` makes the objective
prompt-aware, as ``gpuscale simulate --slo ttft-per-token`` judges it: a request of P prompt
tokens may take ``ttftSeconds`` + P x ``ttftSecondsPerPromptToken`` to its first token.
The planner plans for it at the mean prompt the engines show (``promptTokens`` until
enough requests have finished): its queueing budget is that prompt's objective less its
prefill. Its metric is
``gpuscale-planned-replicas``, an AverageValue: planned replicas x ``targetValue`` (1).

Numbers are what KEDA's own scalers accept (ASCII decimal, optional sign and exponent; no
``७०``, ``1_000`` or spaces). Targets are at least 0.001: KEDA writes a target as a quantity
with three decimals, so a smaller one would reach the HPA as 0. ``<key>FromEnv`` is accepted
for every key above: KEDA replaces its value with the named variable of the scale target's
container before calling the scaler (and drops the key when the variable is unset), so it
arrives holding the value itself.

``scalerAddress`` (KEDA's own key) and the TLS keys KEDA passes through are accepted and
ignored. Keys naming endpoints or URLs (``vllmEndpoint``, ``tritonEndpoint``, ...) are
refused: gpuscale never fetches an address taken from a ScaledObject.

Parsing is cached per distinct map; any problem raises MetadataError whose message names
the key and the valid choices (the service answers INVALID_ARGUMENT with it).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

from gpuscale.common.errors import ConfigError
from gpuscale.scaler.core.hedge import MAX_SPARE
from gpuscale.scaler.core.planner import PlannerConfig
from gpuscale.scaler.core.profiles import PLANNED, PROFILES, SIGNALS, ProfileName, Target, ValueMode
from gpuscale.scaler.core.selector import Selector, SelectorError, parse_selector

MAX_KEYS = 64
# Distinct metadata maps whose parse is remembered: every trigger KEDA asks about, at the
# 10,000 ScaledObjects one replica may be asked for (a miss costs ~10 µs and a new config
# object on each of KEDA's three calls). Only maps of at most CACHED_TOTAL characters are
# kept (a real trigger's are ~100), so the cache holds at most ~16,384 x 3 KiB.
PARSED_CONFIGS = 16_384
CACHED_TOTAL = 2048
MAX_VALUE = 4096
MAX_TOTAL = 16 * 1024  # all keys and values together
MIN_TARGET = 0.001  # KEDA formats targets with "%.3f": smaller ones reach the HPA as 0
MAX_NUMBER = 1e15  # KEDA's quantities stay exact below this; no real target is near it
FROM_ENV = "FromEnv"
# strconv.ParseFloat's decimal form, ASCII only (Python's float() also takes other digits,
# underscores and surrounding spaces); KEDA's scalers parse numbers with ParseFloat.
_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)

PASSTHROUGH = frozenset({"scalerAddress", "caCert", "tlsClientCert", "tlsClientKey",
                         "tlsCertFile", "unsafeSsl", "enableTLS", "cert", "key"})
PLANNER_KEYS = frozenset({"ttftSeconds", "ttftSecondsPerPromptToken", "queueDelaySeconds",
                          "startupSeconds",
                          "prefillTokensPerSecond", "decodeTokensPerSecond", "maxBatch",
                          "utilization", "holdSeconds", "memorySeconds", "promptTokens",
                          "drainSeconds", "spareReplicas"})
KNOWN = frozenset({"profile", "signal", "targetValue", "activationThreshold", "valueMode",
                   "metricType", "podSelector", "demandSource"}) | PLANNER_KEYS
_URL_KEYS = ("endpoint", "url", "uri", "address", "host", "port")
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", re.ASCII)  # DNS-1123 label
_OBJECT_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", re.ASCII)  # DNS-1123 subdomain


class MetadataError(ConfigError):
    """Trigger metadata that cannot be used; the message names the key and the choices."""


@dataclass(frozen=True, slots=True)
class TriggerConfig:
    profile: ProfileName
    targets: tuple[Target, ...]
    value_mode: ValueMode
    selector: Selector | None  # None: the ScaledObject's scale target's pods
    demand_source: str | None
    planner: PlannerConfig | None = None  # profile vllm-planner

    def metric_name(self, target: Target) -> str:
        return f"gpuscale-{target.signal}"

    def target_for(self, metric_name: str) -> Target | None:
        """The target KEDA asks about; KEDA may prefix the name (``s0-``)."""
        for t in self.targets:
            name = self.metric_name(t)
            if metric_name == name or metric_name.endswith("-" + name):
                return t
        return None


def check_object_name(namespace: str, name: str) -> None:
    """A ScaledObject's namespace and name must be ones Kubernetes allows (a DNS-1123
    label and subdomain): anything else is not from KEDA, and must not become a cache key
    or part of an API path. Raises ConfigError."""
    if len(namespace) > 63 or not _NAMESPACE.fullmatch(namespace):
        raise ConfigError(f"namespace: {namespace[:64]!r} is not a Kubernetes namespace "
                          f"(lowercase letters, digits and '-', at most 63)")
    if len(name) > 253 or not _OBJECT_NAME.fullmatch(name):
        raise ConfigError(f"name: {name[:64]!r} is not a Kubernetes object name "
                          f"(lowercase letters, digits, '-' and '.', at most 253)")


def parse_metadata(metadata: Mapping[str, str]) -> TriggerConfig:
    """Validate trigger metadata (cached per distinct map). Raises MetadataError."""
    if len(metadata) > MAX_KEYS:
        raise MetadataError(f"more than {MAX_KEYS} metadata keys")
    total = sum(len(k) + len(v) for k, v in metadata.items())
    if total > MAX_TOTAL:
        raise MetadataError(f"metadata longer than {MAX_TOTAL} characters in all")
    items = frozenset(metadata.items())
    return _parse(items) if total <= CACHED_TOTAL else _parse.__wrapped__(items)


@lru_cache(maxsize=PARSED_CONFIGS)
def _parse(items: frozenset[tuple[str, str]]) -> TriggerConfig:
    md: dict[str, str] = {}
    given = {k for k, _ in items}
    for key, value in sorted(items):
        if len(value) > MAX_VALUE or len(key) > 256:
            raise MetadataError(f"{key[:64]}: longer than {MAX_VALUE} characters")
        if key.endswith(FROM_ENV) and key[:-len(FROM_ENV)] in KNOWN:
            plain = key[:-len(FROM_ENV)]
            if plain in given:
                raise MetadataError(f"{key}: give {plain} or {key}, not both")
            md[plain] = value  # KEDA has already put the variable's value here
            continue
        md[key] = value
    for key in md:
        if key in PASSTHROUGH or key in KNOWN:
            continue
        if key.lower().removesuffix(FROM_ENV.lower()).endswith(_URL_KEYS):
            raise MetadataError(
                f"{key}: gpuscale does not fetch addresses from ScaledObject metadata (anyone "
                f"who can create a ScaledObject could make the scaler call any host). Engine "
                f"metrics are scraped by the agent from pods that opt in with the "
                f"gpuscale.io/engine annotation; demand sources are declared in the scaler's "
                f"configuration and named with demandSource.")
        raise MetadataError(f"{key}: unknown key; valid keys: {', '.join(sorted(KNOWN))} "
                            f"(each also as <key>FromEnv)")

    profile_name = md.get("profile", ProfileName.GPU_UTILIZATION.value)
    if profile_name not in ProfileName.__members__.values():
        raise MetadataError(f"profile: {profile_name!r} is not one of "
                            f"{', '.join(sorted(PROFILES))}")
    profile = PROFILES[ProfileName(profile_name)]
    targets = list(profile.targets)
    planner = _planner(md) if profile.name is ProfileName.VLLM_PLANNER else None
    if planner is None and (extra := sorted(PLANNER_KEYS & md.keys())):
        raise MetadataError(f"{extra[0]}: only with profile vllm-planner")
    if "signal" in md:
        sig = md["signal"]
        if sig not in SIGNALS:
            raise MetadataError(f"signal: {sig!r} is not one of {', '.join(sorted(SIGNALS))}")
        if (sig == PLANNED) != (planner is not None):
            raise MetadataError(f"signal: {PLANNED} is the vllm-planner profile's only signal"
                                f", and only it has it")
        same = [t for t in targets if t.signal == sig]
        if not same and "targetValue" not in md:
            raise MetadataError(f"targetValue: required with signal {sig!r}, which profile "
                                f"{profile_name!r} has no target for")
        targets = same[:1] or [Target(sig, 1.0, 0.0)]
    if "targetValue" in md:
        if len(targets) > 1:
            raise MetadataError(f"targetValue: profile {profile_name!r} has "
                                f"{len(targets)} signals ({', '.join(t.signal for t in targets)}"
                                f"); choose one with signal")
        targets = [Target(targets[0].signal, _number(md, "targetValue", positive=True),
                          targets[0].activation)]
    if "activationThreshold" in md:
        act = _number(md, "activationThreshold", positive=False)
        targets = [Target(t.signal, t.target, act) for t in targets]

    mode_text = md.get("valueMode")
    modes = {m.value: m for m in ValueMode}
    if mode_text is not None and mode_text not in modes:
        raise MetadataError(f"valueMode: {mode_text!r} is not one of average, sum")
    mode = modes.get(mode_text) if mode_text is not None else None
    if "metricType" in md:
        mt = md["metricType"]
        implied = {"AverageValue": ValueMode.SUM, "Value": ValueMode.AVERAGE}.get(mt)
        if implied is None:
            raise MetadataError(f"metricType: {mt!r} is not one of AverageValue, Value "
                                f"(Utilization is for CPU and memory only)")
        if mode is not None and mode != implied:
            raise MetadataError(f"valueMode: {mode.value!r} contradicts metricType {mt!r} "
                                f"(which means valueMode {implied.value!r}); give one of the "
                                f"two")
        mode = implied
    if planner is not None and mode is ValueMode.AVERAGE:
        raise MetadataError("metricType: the planner's value is a replica count for the "
                            "whole workload: use AverageValue (the default)")

    selector = None
    if "podSelector" in md:
        try:
            selector = parse_selector(md["podSelector"])
        except SelectorError as exc:
            raise MetadataError(f"podSelector: {exc}") from None
    demand = md.get("demandSource") or None
    if demand is not None and not demand.replace("-", "").replace("_", "").isalnum():
        raise MetadataError("demandSource: a name (letters, digits, '-', '_') from the "
                            "scaler's configuration")
    return TriggerConfig(profile.name, tuple(targets), mode or ValueMode.SUM, selector, demand,
                         planner)


def _planner(md: Mapping[str, str]) -> PlannerConfig:
    """The planner's keys, each checked against a range that can be true."""
    def get(key: str, default: float, low: float, high: float) -> float:
        if key not in md:
            return default
        value = _number(md, key, positive=False)  # the range below says what is allowed
        if not low <= value <= high:
            raise MetadataError(f"{key}: must be between {low:g} and {high:g}, got "
                                f"{md[key][:40]!r}")
        return value

    base = PlannerConfig()
    prefill = get("prefillTokensPerSecond", base.prefill_tps, 10.0, 1e8)
    prompt = get("promptTokens", base.prompt_tokens, 1.0, 1e7)
    for key in ("ttftSeconds", "ttftSecondsPerPromptToken"):
        if key in md and "queueDelaySeconds" in md:
            raise MetadataError(f"queueDelaySeconds: give {key} or queueDelaySeconds, not "
                                f"both")
    ttft: float | None = None
    per_token = 0.0
    if "queueDelaySeconds" in md:
        delay = get("queueDelaySeconds", 0.0, 0.01, 3600.0)
    else:
        # A prompt-aware objective: the planner plans it at the mean prompt the engines
        # show; checked here at the configured prompt (see the module).
        ttft = get("ttftSeconds", 2.0, 0.01, 3600.0)
        per_token = get("ttftSecondsPerPromptToken", 0.0, 0.0, 0.1)
        objective = ttft + per_token * prompt
        delay = objective - prompt / prefill
        if delay < 0.01:
            raise MetadataError(f"ttftSeconds: {objective:g}s leaves no time to queue: a "
                                f"{prompt:g}-token prompt alone takes {prompt / prefill:.3g}s "
                                f"to prefill at {prefill:g} tokens/s")
    startup = (get("startupSeconds", 0.0, 1.0, 7200.0) if "startupSeconds" in md
               else None)  # None: measured
    return PlannerConfig(
        delay_s=delay, ttft_s=ttft, ttft_per_token_s=per_token, startup_s=startup,
        prefill_tps=prefill,
        decode_tps=get("decodeTokensPerSecond", base.decode_tps, 1.0, 1e8),
        max_batch=int(get("maxBatch", base.max_batch, 1.0, 1e6)),
        utilization=get("utilization", base.utilization, 0.1, 1.0),
        hold_s=get("holdSeconds", 0.0, 0.0, 86400.0) if "holdSeconds" in md else None,
        memory_s=get("memorySeconds", base.memory_s, 1.0, 86400.0),
        prompt_tokens=prompt, drain_s=get("drainSeconds", base.drain_s, 0.0, 86400.0),
        spare_replicas=_whole(get("spareReplicas", 0.0, 0.0, MAX_SPARE), "spareReplicas"))


def _whole(value: float, key: str) -> int:
    if value != int(value):
        raise MetadataError(f"{key}: a whole number of replicas, got {value:g}")
    return int(value)


def _number(md: Mapping[str, str], key: str, positive: bool) -> float:
    text = md[key]
    if not _NUMBER.fullmatch(text):
        raise MetadataError(f"{key}: {text[:40]!r} is not a number (digits 0-9, an optional "
                            f"sign, point and exponent, as KEDA's scalers read numbers)")
    value = float(text)
    low = MIN_TARGET if positive else 0.0
    if not math.isfinite(value) or not low <= value <= MAX_NUMBER:
        why = (f"at least {MIN_TARGET} (KEDA passes targets to the HPA with three "
               f"decimals: a smaller one becomes 0)" if positive and 0 <= value < low
               else f"between {low:g} and {MAX_NUMBER:g}")
        raise MetadataError(f"{key}: must be {why}, got {text[:40]!r}")
    return value
