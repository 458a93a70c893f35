"""gpuscale idle's arithmetic on hand-built buckets, its parsers, and its output shapes."""

from __future__ import annotations

import csv
import io
import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuscale.common.errors import ConfigError
from gpuscale.tools.client import ToolError
from gpuscale.tools.idle import (
    Bucket,
    Device,
    Options,
    build_report,
    device_share,
    idle_now,
    price_of,
)
from gpuscale.tools.idle_format import CSV_COLUMNS, table, to_csv, to_json
from gpuscale.tools.idle_options import parse_duration, parse_prices, prices_from_mapping
from gpuscale.tools.idle_sources import Series, devices_from_matrices
from gpuscale.tools.promql import _result, owners
from tests.support.strategies import json_values

T0 = 1_800_000_000.0  # a multiple of 60
H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"


def minutes(n: int, util: float | None, pods: tuple[str, ...] = ("llm/vllm-0",),
            owners: tuple[str, ...] | None = None, start: float = T0) -> tuple[Bucket, ...]:
    own = owners if owners is not None else tuple("Deployment/vllm" for _ in pods)
    return tuple(Bucket(start + 60 * i, 60.0, pods, own, util) for i in range(n))


def gpu(buckets: tuple[Bucket, ...], model: str = H100, fraction: float = 1.0,
        uuid: str = "GPU-0") -> Device:
    return Device("node-1", uuid, model, fraction, buckets)


def one(devices: list[Device], now: float = T0 + 3600, **kw: Any) -> Any:
    return build_report(devices, now, Options(**{"window_s": 3600.0, **kw}))


def test_a_whole_gpu_an_hour_at_a_quarter() -> None:
    r = one([gpu(minutes(60, 25.0))], prices={H100: 2.0})
    t = r.total
    assert (t.allocated_h, t.measured_h) == pytest.approx((1.0, 1.0))
    assert t.used_h == pytest.approx(0.25)
    assert t.idle_share == pytest.approx(0.75)
    assert t.coverage == pytest.approx(1.0)
    assert (t.cost_allocated, t.cost_idle) == pytest.approx((2.0, 1.5))
    assert [(w.namespace, w.workload) for w in r.workloads] == [("llm", "Deployment/vllm")]
    assert r.data_coverage == pytest.approx(1.0)
    assert [p.allocated for p in r.timeline] == [1.0] * 60


def test_a_mig_instance_counts_and_costs_its_fraction() -> None:
    mig = gpu(minutes(60, 50.0), f"{A100} 1g.10gb", 0.125, "MIG-1")
    r = one([mig], prices={A100: 1.6})
    assert r.total.allocated_h == pytest.approx(0.125)
    assert r.total.cost_allocated == pytest.approx(0.125 * 1.6)
    # Priced as an instance: per instance-hour.
    r = one([mig], prices={f"{A100} 1g.10gb": 0.3, A100: 1.6})
    assert r.total.cost_allocated == pytest.approx(0.3)
    assert price_of(f"{A100} 3g.40gb", 0.5, {A100.lower(): 2.0}) == 2.0  # case-insensitive
    assert price_of(f"{A100} 3g.40gb", 0.5, {"NVIDIA L4": 2.0}) is None


def test_an_amd_partition_counts_and_costs_its_share_of_the_gpu() -> None:
    mi = "AMD Instinct MI300X"
    assert device_share(f"{mi} cpx.nps1") == (mi, 1 / 8)
    assert device_share(f"{mi} QPX.NPS4") == (mi, 1 / 4)
    assert device_share(mi) is None
    assert price_of(f"{mi} cpx.nps1", 1 / 8, {mi: 4.0}) == 4.0  # the GPU's price per hour
    part = gpu(minutes(60, 50.0), f"{mi} cpx.nps1", 1 / 8, "p-3")
    r = one([part], prices={mi: 4.0})
    assert r.total.allocated_h == pytest.approx(1 / 8)
    assert r.total.cost_allocated == pytest.approx(4.0 / 8)


def test_a_time_sliced_gpu_is_split_between_its_pods() -> None:
    pods = ("dev/a", "dev/b", "ml/c", "ml/d")
    dev = gpu(minutes(60, 40.0, pods, ("Deployment/a", "", "Job/c", "Job/c")))
    r = one([dev])
    assert {n.namespace: n.allocated_h for n in r.namespaces} == pytest.approx(
        {"dev": 0.5, "ml": 0.5})
    assert {w.workload: w.allocated_h for w in r.workloads} == pytest.approx(
        {"Deployment/a": 0.25, "Pod/b": 0.25, "Job/c": 0.5})  # owner unknown: the pod
    assert r.total.used_h == pytest.approx(0.4)
    filtered = one([dev], namespace="ml")
    assert [n.namespace for n in filtered.namespaces] == ["ml"]
    assert filtered.total.allocated_h == pytest.approx(0.5)


def test_minutes_without_data_are_neither_used_nor_idle() -> None:
    # 30 minutes measured at 0 %, 10 minutes held without a reading, 20 minutes absent.
    b = (*minutes(30, 0.0), *minutes(10, None, start=T0 + 1800))
    r = one([gpu(b)])
    t = r.total
    assert t.allocated_h == pytest.approx(40 / 60)
    assert t.measured_h == pytest.approx(0.5)
    assert t.idle_share == pytest.approx(1.0)  # of the measured part only
    assert t.coverage == pytest.approx(0.75)
    assert r.data_coverage == pytest.approx(40 / 60)
    # Unmeasured at the end: not idle now, however long it was idle before.
    assert r.idle == ()


def test_the_window_cuts_buckets_and_the_current_minute_counts_so_far() -> None:
    now = T0 + 30 * 60 + 20  # 20 s into minute 30
    r = one([gpu(minutes(31, 10.0))], now=now, window_s=600.0)
    assert r.total.allocated_h == pytest.approx(600 / 3600)
    assert r.timeline[0].start == T0 + 20 * 60  # the bucket the window starts in


@pytest.mark.parametrize(("util", "n", "idle_for", "idle"), [
    (9.99, 10, 600.0, True),
    (10.0, 10, 600.0, False),  # at the threshold is not under it
    (9.99, 10, 601.0, False),  # ten minutes are not more than ten
    (0.0, 9, 600.0, False),
])
def test_idle_now_threshold_edges(util: float, n: int, idle_for: float, idle: bool) -> None:
    busy = minutes(5, 80.0)
    quiet = minutes(n, util, start=T0 + 300)
    now = T0 + 300 + 60 * n  # the end of the last bucket
    found = idle_now(gpu((*busy, *quiet)), now, Options(idle_for_s=idle_for))
    assert (found is not None) is idle
    if found is not None:
        assert found.idle_s == 600.0
        assert found.utilization == pytest.approx(util)
        assert found.pods == ("llm/vllm-0",)


def test_idle_now_needs_contiguous_allocated_measured_recent_minutes() -> None:
    opts = Options(idle_for_s=300.0)
    gap = (*minutes(5, 0.0), *minutes(5, 0.0, start=T0 + 360))  # minute 5 missing
    assert idle_now(gpu(gap), T0 + 660, opts) is not None  # the last five suffice
    assert idle_now(gpu(gap), T0 + 660, Options(idle_for_s=400.0)) is None
    free = (*minutes(5, 0.0), *minutes(1, 0.0, pods=(), start=T0 + 300))
    assert idle_now(gpu(free), T0 + 360, opts) is None  # not allocated now
    assert idle_now(gpu(minutes(10, 0.0)), T0 + 661, opts) is None  # not heard lately
    assert idle_now(gpu(minutes(10, 0.0)), T0 + 659, opts) is not None
    assert idle_now(gpu(minutes(10, 0.0)), T0 + 600, Options(idle_for_s=300.0,
                                                             namespace="other")) is None


def test_unknown_prices_are_said_not_zero() -> None:
    devices = [gpu(minutes(60, 50.0)), gpu(minutes(60, 50.0), "NVIDIA L4", uuid="GPU-1")]
    r = one(devices, prices={H100: 2.0})
    assert r.unpriced_models == ("NVIDIA L4",)
    assert r.total.unpriced_h == pytest.approx(1.0)
    assert r.total.cost_allocated == pytest.approx(2.0)
    out = table(r, "test")
    assert "2.00+?" in out
    assert "No price for: NVIDIA L4" in out
    doc = to_json(r, "test")
    assert doc["total"]["unpriced_gpu_hours"] == pytest.approx(1.0)
    none = to_json(one(devices), "test")
    assert none["total"]["cost_allocated"] is None
    assert "?" in table(one(devices), "test")


def test_the_output_shapes() -> None:
    quiet = gpu(minutes(60, 1.0, ("nb/jupyter-alice",), ("Pod/jupyter-alice",)),
                uuid="GPU-9")
    r = one([gpu(minutes(60, 70.0)), quiet], prices={H100: 2.5})
    doc = json.loads(json.dumps(to_json(r, "test")))  # plain JSON: no NaN, no objects
    assert [n["namespace"] for n in doc["namespaces"]] == ["llm", "nb"]
    assert [i["device"] for i in doc["idle_now"]] == ["GPU-9"]
    assert doc["idle_now"][0]["idle_minutes"] == pytest.approx(60.0)
    assert doc["idle_now"][0]["cost_per_hour"] == pytest.approx(2.5)
    assert len(doc["timeline"]) == 60
    rows = list(csv.DictReader(io.StringIO(to_csv(r))))
    assert tuple(rows[0]) == CSV_COLUMNS
    assert [row["kind"] for row in rows] == ["namespace", "namespace", "workload", "workload",
                                              "total", "idle_device"]
    assert float(rows[4]["gpu_hours_allocated"]) == pytest.approx(2.0)
    assert rows[5]["pods"] == "nb/jupyter-alice"
    text = table(r, "test")
    assert "GPU-9" in text
    assert "TOTAL" in text


# -- the Prometheus shapes ------------------------------------------------------------------


def _s(labels: dict[str, str], points: list[tuple[float, float]]) -> Series:
    return Series(labels, tuple(points))


def test_devices_from_prometheus_matrices() -> None:
    base = {"Hostname": "n1", "modelName": H100}
    t1, t2 = T0 + 60, T0 + 120
    held = [
        # A time-sliced GPU: one series per holder; a scrape that renamed our labels.
        _s({**base, "UUID": "GPU-ts", "pod": "a", "namespace": "dev"}, [(t1, 3), (t2, 3)]),
        _s({**base, "UUID": "GPU-ts", "exported_pod": "b", "exported_namespace": "dev",
            "pod": "agent-x", "namespace": "gpuscale"}, [(t2, 3)]),
        # A MIG instance.
        _s({**base, "UUID": "GPU-m", "GPU_I_ID": "1", "GPU_I_PROFILE": "3g.40gb",
            "pod": "c", "namespace": "ml"}, [(t1, 3)]),
    ]
    util = [_s({**base, "UUID": "GPU-ts", "pod": "a", "namespace": "dev"},
               [(t1, 30.0), (t2, 50.0)]),
            _s({**base, "UUID": "GPU-m", "GPU_I_ID": "1", "GPU_I_PROFILE": "3g.40gb",
                "pod": "c", "namespace": "ml"}, [(t1, math.nan)])]
    memory = [_s({**base, "UUID": "GPU-m", "GPU_I_ID": "1"}, [(t2, 40.0)]),
              _s({**base, "UUID": "GPU-m"}, [(t2, 80.0)])]
    devices = {d.device: d for d in devices_from_matrices(
        held, util, memory, 60.0, {"dev/a": "Deployment/web"})}
    ts = devices["GPU-ts"]
    assert [(b.start, b.pods, b.owners, b.utilization) for b in ts.buckets] == [
        (T0, ("dev/a",), ("Deployment/web",), 30.0),
        (T0 + 60, ("dev/a", "dev/b"), ("Deployment/web", ""), 50.0)]
    mig = devices["GPU-m/1"]
    assert (mig.model, mig.fraction) == (f"{H100} 3g.40gb", 0.5)
    assert mig.buckets[0].utilization is None  # NaN is no reading
    # Without memory totals: its compute slices.
    alone = devices_from_matrices(held[2:], [], [], 60.0, {})
    assert alone[0].fraction == pytest.approx(3 / 7)


def test_owners_resolve_replicasets_to_deployments() -> None:
    pods = [_s({"namespace": "llm", "pod": "vllm-0", "owner_kind": "ReplicaSet",
                "owner_name": "vllm-5d9f"}, [(T0, 1)]),
            _s({"namespace": "llm", "pod": "job-x", "owner_kind": "Job",
                "owner_name": "job"}, [(T0, 1)]),
            _s({"namespace": "llm", "pod": "bare", "owner_kind": "<none>",
                "owner_name": "<none>"}, [(T0, 1)])]
    rs = [_s({"namespace": "llm", "replicaset": "vllm-5d9f", "owner_kind": "Deployment",
              "owner_name": "vllm"}, [(T0, 1)])]
    assert owners(pods, rs) == {"llm/vllm-0": "Deployment/vllm", "llm/job-x": "Job/job"}


@given(json_values(["resultType", "result", "metric", "values", "value"]))
def test_any_reply_data_is_series_or_a_clear_error(data: Any) -> None:
    for kind in ("matrix", "vector"):
        try:
            got = _result(data if isinstance(data, dict) else {"result": data}, kind, "q")
        except ToolError as exc:
            said = str(exc)
        else:
            assert all(isinstance(s, Series) for s in got)
            continue
        assert "malformed" in said


# -- parsers --------------------------------------------------------------------------------


def test_price_tables() -> None:
    assert parse_prices(f"{H100}=2.50, {A100} = 1.6") == {H100: 2.5, A100: 1.6}
    assert parse_prices("weird=name=3") == {"weird=name": 3.0}
    assert prices_from_mapping({H100: 2.5, "NVIDIA L4": "0.7"}, "f") == {
        H100: 2.5, "NVIDIA L4": 0.7}


@pytest.mark.parametrize(("text", "says"), [
    ("", "empty"), ("H100", "not MODEL=PRICE"), ("=2", "no GPU model"),
    ("H100=", "not a price"), ("H100=two", "not a price"), ("H100=nan", "0 to"),
    ("H100=inf", "0 to"), ("H100=-1", "0 to"), ("H100=1,H100=2", "priced twice"),
    ("H1\x0000=1", "not a GPU name"), ("a=1,,b=2", "empty"), ("x" * 30000, "longer"),
])
def test_malformed_price_tables_say_why(text: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        parse_prices(text)


@pytest.mark.parametrize("data", [[1, 2], "H100=2", {"H100": True}, {"H100": None},
                                  {"H100": [1]}, {"": 1}, {"H100": "cheap"}])
def test_malformed_price_files_say_why(data: object) -> None:
    with pytest.raises(ConfigError):
        prices_from_mapping(data, "prices.yaml")


@given(st.text(max_size=200))
def test_any_price_text_parses_or_says_why(text: str) -> None:
    try:
        table = parse_prices(text)
    except ConfigError as exc:
        said = str(exc)
    else:
        assert all(math.isfinite(v) and v >= 0 for v in table.values())
        assert all(k and k.isprintable() for k in table)
        return
    assert said.startswith("--price: ")


@given(st.dictionaries(st.text("ABCDHLMNVXabcdfgmsx0123456789 -._+()", min_size=1, max_size=40)
                       .filter(lambda s: s.strip() == s),
                       st.floats(0, 1e6, allow_nan=False), max_size=10))
def test_price_tables_round_trip(table: dict[str, float]) -> None:
    text = ",".join(f"{k}={v!r}" for k, v in table.items())
    if table:
        assert parse_prices(text) == table


@pytest.mark.parametrize(("text", "seconds"), [("90", 90), ("90s", 90), ("10m", 600),
                                                ("1.5h", 5400), ("2d", 172800)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text, "--window") == seconds


@given(st.text(max_size=50))
def test_any_duration_parses_or_says_why(text: str) -> None:
    try:
        assert parse_duration(text, "--window") > 0
    except ConfigError as exc:
        said = str(exc)
    else:
        return
    assert said.startswith("--window: ")
