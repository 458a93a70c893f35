"""Generated protobuf modules match their .proto sources (python -m gpuscale.proto.generate)."""

from __future__ import annotations

from pathlib import Path

from google.protobuf.descriptor import FieldDescriptor

from gpuscale.proto.generate import PROTO_DIR, generate


def test_generated_modules_have_not_drifted(tmp_path: Path) -> None:
    fresh = generate(tmp_path)
    assert fresh, "no .proto sources found"
    for path in fresh:
        committed = PROTO_DIR / path.name
        assert committed.exists(), f"{path.name} is not committed: run the generator"
        assert committed.read_bytes() == path.read_bytes(), (
            f"{path.name} differs from its .proto: run python -m gpuscale.proto.generate")


# KEDA's externalscaler.proto at kedacore/keda@8b4f083ca8c8c2baf8477e322bd4d16ac4dfa09a
# (pkg/scalers/externalscaler/externalscaler.proto; StreamMetricSpec since 82ac584, on main
# only, in no release up to v2.20.2): every method with its streaming, every field with its
# number and type. What KEDA's Go client puts on the wire is fixed by exactly these.
KEDA_METHODS = {
    "IsActive": ("ScaledObjectRef", "IsActiveResponse", False),
    "StreamIsActive": ("ScaledObjectRef", "IsActiveResponse", True),
    "GetMetricSpec": ("ScaledObjectRef", "GetMetricSpecResponse", False),
    "GetMetrics": ("GetMetricsRequest", "GetMetricsResponse", False),
    "StreamMetricSpec": ("ScaledObjectRef", "GetMetricSpecResponse", True),
}
KEDA_FIELDS = {
    "ScaledObjectRef": {"name": (1, "string"), "namespace": (2, "string"),
                        "scalerMetadata": (3, "map")},
    "IsActiveResponse": {"result": (1, "bool")},
    "GetMetricSpecResponse": {"metricSpecs": (1, "repeated MetricSpec")},
    "MetricSpec": {"metricName": (1, "string"), "targetSize": (2, "int64"),
                   "targetSizeFloat": (3, "double")},
    "GetMetricsRequest": {"scaledObjectRef": (1, "ScaledObjectRef"),
                          "metricName": (2, "string")},
    "GetMetricsResponse": {"metricValues": (1, "repeated MetricValue")},
    "MetricValue": {"metricName": (1, "string"), "metricValue": (2, "int64"),
                    "metricValueFloat": (3, "double")},
}


def _kind(field: FieldDescriptor) -> str:
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        return "map"
    names = {FieldDescriptor.TYPE_STRING: "string", FieldDescriptor.TYPE_BOOL: "bool",
             FieldDescriptor.TYPE_INT64: "int64", FieldDescriptor.TYPE_DOUBLE: "double"}
    base = field.message_type.name if field.message_type is not None else names[field.type]
    return f"repeated {base}" if field.is_repeated else base


def test_the_external_scaler_contract_is_kedas_on_the_wire() -> None:
    from gpuscale.proto import externalscaler_pb2 as pb

    service = pb.DESCRIPTOR.services_by_name["ExternalScaler"]
    assert service.full_name == "externalscaler.ExternalScaler"
    got = {m.name: (m.input_type.name, m.output_type.name, m.server_streaming)
           for m in service.methods}
    assert got == KEDA_METHODS
    assert not any(m.client_streaming for m in service.methods)
    for message, fields in KEDA_FIELDS.items():
        desc = pb.DESCRIPTOR.message_types_by_name[message]
        assert {f.name: (f.number, _kind(f)) for f in desc.fields} == fields, message
