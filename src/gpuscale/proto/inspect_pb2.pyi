from gpuscale.proto import telemetry_pb2 as _telemetry_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FleetRequest(_message.Message):
    __slots__ = ("namespace", "node")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    node: str
    def __init__(self, namespace: _Optional[str] = ..., node: _Optional[str] = ...) -> None: ...

class FleetReply(_message.Message):
    __slots__ = ("now", "nodes", "pods", "workloads", "stale_after")
    NOW_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    PODS_FIELD_NUMBER: _ClassVar[int]
    WORKLOADS_FIELD_NUMBER: _ClassVar[int]
    STALE_AFTER_FIELD_NUMBER: _ClassVar[int]
    now: float
    nodes: _containers.RepeatedCompositeFieldContainer[Node]
    pods: _containers.RepeatedCompositeFieldContainer[Pod]
    workloads: _containers.RepeatedCompositeFieldContainer[Workload]
    stale_after: float
    def __init__(self, now: _Optional[float] = ..., nodes: _Optional[_Iterable[_Union[Node, _Mapping]]] = ..., pods: _Optional[_Iterable[_Union[Pod, _Mapping]]] = ..., workloads: _Optional[_Iterable[_Union[Workload, _Mapping]]] = ..., stale_after: _Optional[float] = ...) -> None: ...

class Node(_message.Message):
    __slots__ = ("name", "address", "connected", "age", "problem", "devices", "stale_after")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    AGE_FIELD_NUMBER: _ClassVar[int]
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    STALE_AFTER_FIELD_NUMBER: _ClassVar[int]
    name: str
    address: str
    connected: bool
    age: float
    problem: str
    devices: _containers.RepeatedCompositeFieldContainer[_telemetry_pb2.Device]
    stale_after: float
    def __init__(self, name: _Optional[str] = ..., address: _Optional[str] = ..., connected: _Optional[bool] = ..., age: _Optional[float] = ..., problem: _Optional[str] = ..., devices: _Optional[_Iterable[_Union[_telemetry_pb2.Device, _Mapping]]] = ..., stale_after: _Optional[float] = ...) -> None: ...

class Pod(_message.Message):
    __slots__ = ("namespace", "name", "node", "owner_kind", "owner_name", "ready", "age", "stale_after", "signals", "labels", "gpus")
    class SignalsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: _telemetry_pb2.Reading
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[_telemetry_pb2.Reading, _Mapping]] = ...) -> None: ...
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    OWNER_KIND_FIELD_NUMBER: _ClassVar[int]
    OWNER_NAME_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    AGE_FIELD_NUMBER: _ClassVar[int]
    STALE_AFTER_FIELD_NUMBER: _ClassVar[int]
    SIGNALS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    name: str
    node: str
    owner_kind: str
    owner_name: str
    ready: bool
    age: float
    stale_after: float
    signals: _containers.MessageMap[str, _telemetry_pb2.Reading]
    labels: _containers.ScalarMap[str, str]
    gpus: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, namespace: _Optional[str] = ..., name: _Optional[str] = ..., node: _Optional[str] = ..., owner_kind: _Optional[str] = ..., owner_name: _Optional[str] = ..., ready: _Optional[bool] = ..., age: _Optional[float] = ..., stale_after: _Optional[float] = ..., signals: _Optional[_Mapping[str, _telemetry_pb2.Reading]] = ..., labels: _Optional[_Mapping[str, str]] = ..., gpus: _Optional[_Iterable[str]] = ...) -> None: ...

class Workload(_message.Message):
    __slots__ = ("namespace", "name", "seen", "answers", "pods", "planned_replicas")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SEEN_FIELD_NUMBER: _ClassVar[int]
    ANSWERS_FIELD_NUMBER: _ClassVar[int]
    PODS_FIELD_NUMBER: _ClassVar[int]
    PLANNED_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    name: str
    seen: float
    answers: _containers.RepeatedCompositeFieldContainer[Answer]
    pods: int
    planned_replicas: int
    def __init__(self, namespace: _Optional[str] = ..., name: _Optional[str] = ..., seen: _Optional[float] = ..., answers: _Optional[_Iterable[_Union[Answer, _Mapping]]] = ..., pods: _Optional[int] = ..., planned_replicas: _Optional[int] = ...) -> None: ...

class Answer(_message.Message):
    __slots__ = ("metric_name", "signal", "target", "activation", "value", "unavailable", "counted", "starting", "ready")
    METRIC_NAME_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    ACTIVATION_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    COUNTED_FIELD_NUMBER: _ClassVar[int]
    STARTING_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    metric_name: str
    signal: str
    target: float
    activation: float
    value: float
    unavailable: str
    counted: int
    starting: int
    ready: int
    def __init__(self, metric_name: _Optional[str] = ..., signal: _Optional[str] = ..., target: _Optional[float] = ..., activation: _Optional[float] = ..., value: _Optional[float] = ..., unavailable: _Optional[str] = ..., counted: _Optional[int] = ..., starting: _Optional[int] = ..., ready: _Optional[int] = ...) -> None: ...

class ExplainRequest(_message.Message):
    __slots__ = ("namespace", "name", "at", "history")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    name: str
    at: float
    history: float
    def __init__(self, namespace: _Optional[str] = ..., name: _Optional[str] = ..., at: _Optional[float] = ..., history: _Optional[float] = ...) -> None: ...

class ExplainReply(_message.Message):
    __slots__ = ("now", "namespace", "name", "metadata", "selector", "value_mode", "seen", "answers", "pods", "missing", "plan_terms", "planned_replicas", "at", "scale_target", "demand_source", "demand", "pod_count", "past", "step", "activity", "activity_reason", "source")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class PlanTermsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    NOW_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    SELECTOR_FIELD_NUMBER: _ClassVar[int]
    VALUE_MODE_FIELD_NUMBER: _ClassVar[int]
    SEEN_FIELD_NUMBER: _ClassVar[int]
    ANSWERS_FIELD_NUMBER: _ClassVar[int]
    PODS_FIELD_NUMBER: _ClassVar[int]
    MISSING_FIELD_NUMBER: _ClassVar[int]
    PLAN_TERMS_FIELD_NUMBER: _ClassVar[int]
    PLANNED_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    SCALE_TARGET_FIELD_NUMBER: _ClassVar[int]
    DEMAND_SOURCE_FIELD_NUMBER: _ClassVar[int]
    DEMAND_FIELD_NUMBER: _ClassVar[int]
    POD_COUNT_FIELD_NUMBER: _ClassVar[int]
    PAST_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    ACTIVITY_FIELD_NUMBER: _ClassVar[int]
    ACTIVITY_REASON_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    now: float
    namespace: str
    name: str
    metadata: _containers.ScalarMap[str, str]
    selector: str
    value_mode: str
    seen: float
    answers: _containers.RepeatedCompositeFieldContainer[Answer]
    pods: _containers.RepeatedCompositeFieldContainer[Pod]
    missing: _containers.RepeatedScalarFieldContainer[str]
    plan_terms: _containers.ScalarMap[str, float]
    planned_replicas: int
    at: float
    scale_target: ScaleTarget
    demand_source: str
    demand: str
    pod_count: int
    past: _containers.RepeatedCompositeFieldContainer[Past]
    step: float
    activity: str
    activity_reason: str
    source: str
    def __init__(self, now: _Optional[float] = ..., namespace: _Optional[str] = ..., name: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ..., selector: _Optional[str] = ..., value_mode: _Optional[str] = ..., seen: _Optional[float] = ..., answers: _Optional[_Iterable[_Union[Answer, _Mapping]]] = ..., pods: _Optional[_Iterable[_Union[Pod, _Mapping]]] = ..., missing: _Optional[_Iterable[str]] = ..., plan_terms: _Optional[_Mapping[str, float]] = ..., planned_replicas: _Optional[int] = ..., at: _Optional[float] = ..., scale_target: _Optional[_Union[ScaleTarget, _Mapping]] = ..., demand_source: _Optional[str] = ..., demand: _Optional[str] = ..., pod_count: _Optional[int] = ..., past: _Optional[_Iterable[_Union[Past, _Mapping]]] = ..., step: _Optional[float] = ..., activity: _Optional[str] = ..., activity_reason: _Optional[str] = ..., source: _Optional[str] = ...) -> None: ...

class Past(_message.Message):
    __slots__ = ("at", "answers", "pods", "planned_replicas")
    AT_FIELD_NUMBER: _ClassVar[int]
    ANSWERS_FIELD_NUMBER: _ClassVar[int]
    PODS_FIELD_NUMBER: _ClassVar[int]
    PLANNED_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    at: float
    answers: _containers.RepeatedCompositeFieldContainer[Answer]
    pods: int
    planned_replicas: int
    def __init__(self, at: _Optional[float] = ..., answers: _Optional[_Iterable[_Union[Answer, _Mapping]]] = ..., pods: _Optional[int] = ..., planned_replicas: _Optional[int] = ...) -> None: ...

class ScaleTarget(_message.Message):
    __slots__ = ("known", "kind", "name", "min_replicas", "max_replicas", "replicas", "fallback_replicas", "fallback_failures", "polling_interval", "cooldown_period", "behavior_json", "fallback_behavior")
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MIN_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    MAX_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_FAILURES_FIELD_NUMBER: _ClassVar[int]
    POLLING_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    COOLDOWN_PERIOD_FIELD_NUMBER: _ClassVar[int]
    BEHAVIOR_JSON_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_BEHAVIOR_FIELD_NUMBER: _ClassVar[int]
    known: bool
    kind: str
    name: str
    min_replicas: int
    max_replicas: int
    replicas: int
    fallback_replicas: int
    fallback_failures: int
    polling_interval: int
    cooldown_period: int
    behavior_json: str
    fallback_behavior: str
    def __init__(self, known: _Optional[bool] = ..., kind: _Optional[str] = ..., name: _Optional[str] = ..., min_replicas: _Optional[int] = ..., max_replicas: _Optional[int] = ..., replicas: _Optional[int] = ..., fallback_replicas: _Optional[int] = ..., fallback_failures: _Optional[int] = ..., polling_interval: _Optional[int] = ..., cooldown_period: _Optional[int] = ..., behavior_json: _Optional[str] = ..., fallback_behavior: _Optional[str] = ...) -> None: ...

class UsageRequest(_message.Message):
    __slots__ = ("window", "namespace")
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    window: float
    namespace: str
    def __init__(self, window: _Optional[float] = ..., namespace: _Optional[str] = ...) -> None: ...

class UsageReply(_message.Message):
    __slots__ = ("now", "minute", "kept", "devices", "untracked", "advisory")
    NOW_FIELD_NUMBER: _ClassVar[int]
    MINUTE_FIELD_NUMBER: _ClassVar[int]
    KEPT_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    UNTRACKED_FIELD_NUMBER: _ClassVar[int]
    ADVISORY_FIELD_NUMBER: _ClassVar[int]
    now: float
    minute: float
    kept: float
    devices: _containers.RepeatedCompositeFieldContainer[DeviceUsage]
    untracked: int
    advisory: _containers.RepeatedCompositeFieldContainer[AdvisoryPlan]
    def __init__(self, now: _Optional[float] = ..., minute: _Optional[float] = ..., kept: _Optional[float] = ..., devices: _Optional[_Iterable[_Union[DeviceUsage, _Mapping]]] = ..., untracked: _Optional[int] = ..., advisory: _Optional[_Iterable[_Union[AdvisoryPlan, _Mapping]]] = ...) -> None: ...

class AdvisoryPlan(_message.Message):
    __slots__ = ("namespace", "name", "planned", "actual", "planned_gpu_hours", "actual_gpu_hours", "known_seconds", "unknown_seconds", "why")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PLANNED_FIELD_NUMBER: _ClassVar[int]
    ACTUAL_FIELD_NUMBER: _ClassVar[int]
    PLANNED_GPU_HOURS_FIELD_NUMBER: _ClassVar[int]
    ACTUAL_GPU_HOURS_FIELD_NUMBER: _ClassVar[int]
    KNOWN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    WHY_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    name: str
    planned: int
    actual: int
    planned_gpu_hours: float
    actual_gpu_hours: float
    known_seconds: float
    unknown_seconds: float
    why: str
    def __init__(self, namespace: _Optional[str] = ..., name: _Optional[str] = ..., planned: _Optional[int] = ..., actual: _Optional[int] = ..., planned_gpu_hours: _Optional[float] = ..., actual_gpu_hours: _Optional[float] = ..., known_seconds: _Optional[float] = ..., unknown_seconds: _Optional[float] = ..., why: _Optional[str] = ...) -> None: ...

class DeviceUsage(_message.Message):
    __slots__ = ("node", "uuid", "model", "fraction", "minutes")
    NODE_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    FRACTION_FIELD_NUMBER: _ClassVar[int]
    MINUTES_FIELD_NUMBER: _ClassVar[int]
    node: str
    uuid: str
    model: str
    fraction: float
    minutes: _containers.RepeatedCompositeFieldContainer[Minute]
    def __init__(self, node: _Optional[str] = ..., uuid: _Optional[str] = ..., model: _Optional[str] = ..., fraction: _Optional[float] = ..., minutes: _Optional[_Iterable[_Union[Minute, _Mapping]]] = ...) -> None: ...

class Minute(_message.Message):
    __slots__ = ("start", "pods", "owners", "utilization", "samples")
    START_FIELD_NUMBER: _ClassVar[int]
    PODS_FIELD_NUMBER: _ClassVar[int]
    OWNERS_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    start: float
    pods: _containers.RepeatedScalarFieldContainer[str]
    owners: _containers.RepeatedScalarFieldContainer[str]
    utilization: float
    samples: int
    def __init__(self, start: _Optional[float] = ..., pods: _Optional[_Iterable[str]] = ..., owners: _Optional[_Iterable[str]] = ..., utilization: _Optional[float] = ..., samples: _Optional[int] = ...) -> None: ...
