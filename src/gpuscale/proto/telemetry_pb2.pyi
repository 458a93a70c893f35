from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SubscribeRequest(_message.Message):
    __slots__ = ("subscriber",)
    SUBSCRIBER_FIELD_NUMBER: _ClassVar[int]
    subscriber: str
    def __init__(self, subscriber: _Optional[str] = ...) -> None: ...

class NodeUpdate(_message.Message):
    __slots__ = ("node", "agent_id", "seq", "sampled_at", "interval", "pods", "attribution_ok", "attribution_detail", "devices", "has_devices")
    NODE_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    SAMPLED_AT_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_FIELD_NUMBER: _ClassVar[int]
    PODS_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTION_OK_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTION_DETAIL_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    HAS_DEVICES_FIELD_NUMBER: _ClassVar[int]
    node: str
    agent_id: str
    seq: int
    sampled_at: float
    interval: float
    pods: _containers.RepeatedCompositeFieldContainer[PodSignals]
    attribution_ok: bool
    attribution_detail: str
    devices: _containers.RepeatedCompositeFieldContainer[Device]
    has_devices: bool
    def __init__(self, node: _Optional[str] = ..., agent_id: _Optional[str] = ..., seq: _Optional[int] = ..., sampled_at: _Optional[float] = ..., interval: _Optional[float] = ..., pods: _Optional[_Iterable[_Union[PodSignals, _Mapping]]] = ..., attribution_ok: _Optional[bool] = ..., attribution_detail: _Optional[str] = ..., devices: _Optional[_Iterable[_Union[Device, _Mapping]]] = ..., has_devices: _Optional[bool] = ...) -> None: ...

class Device(_message.Message):
    __slots__ = ("uuid", "parent_uuid", "index", "model", "sharing", "utilization", "memory_used", "memory_total", "pods", "claims")
    UUID_FIELD_NUMBER: _ClassVar[int]
    PARENT_UUID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SHARING_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_FIELD_NUMBER: _ClassVar[int]
    PODS_FIELD_NUMBER: _ClassVar[int]
    CLAIMS_FIELD_NUMBER: _ClassVar[int]
    uuid: str
    parent_uuid: str
    index: int
    model: str
    sharing: str
    utilization: Reading
    memory_used: Reading
    memory_total: Reading
    pods: _containers.RepeatedScalarFieldContainer[str]
    claims: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, uuid: _Optional[str] = ..., parent_uuid: _Optional[str] = ..., index: _Optional[int] = ..., model: _Optional[str] = ..., sharing: _Optional[str] = ..., utilization: _Optional[_Union[Reading, _Mapping]] = ..., memory_used: _Optional[_Union[Reading, _Mapping]] = ..., memory_total: _Optional[_Union[Reading, _Mapping]] = ..., pods: _Optional[_Iterable[str]] = ..., claims: _Optional[_Iterable[str]] = ...) -> None: ...

class PodSignals(_message.Message):
    __slots__ = ("namespace", "name", "labels", "owner_kind", "owner_name", "ready", "signals")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class SignalsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Reading
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Reading, _Mapping]] = ...) -> None: ...
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    OWNER_KIND_FIELD_NUMBER: _ClassVar[int]
    OWNER_NAME_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    SIGNALS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    name: str
    labels: _containers.ScalarMap[str, str]
    owner_kind: str
    owner_name: str
    ready: bool
    signals: _containers.MessageMap[str, Reading]
    def __init__(self, namespace: _Optional[str] = ..., name: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., owner_kind: _Optional[str] = ..., owner_name: _Optional[str] = ..., ready: _Optional[bool] = ..., signals: _Optional[_Mapping[str, Reading]] = ...) -> None: ...

class Reading(_message.Message):
    __slots__ = ("value", "absent", "detail")
    VALUE_FIELD_NUMBER: _ClassVar[int]
    ABSENT_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    value: float
    absent: str
    detail: str
    def __init__(self, value: _Optional[float] = ..., absent: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...
