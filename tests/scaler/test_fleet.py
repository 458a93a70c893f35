"""The fleet view's bookkeeping: selections, moves between nodes, per-pod signals."""

from __future__ import annotations

from gpuscale.scaler.core.selector import parse_selector
from gpuscale.scaler.state.fleet import FleetView
from gpuscale.stream.records import PodRecord


def rec(name: str, node: str, app: str = "a", ns: str = "ns", util: float = 1.0) -> PodRecord:
    return PodRecord(ns, name, node, {"app": app}, None, True, {"gpu-utilization": util}, 0.0)


def names(records: list[PodRecord]) -> list[str]:
    return [r.name for r in records]


def test_selection_follows_pods_coming_going_and_relabelled() -> None:
    fleet = FleetView(monotonic=lambda: 0.0)
    sel = parse_selector("app=a")
    fleet.update_node("n1", [rec("p1", "n1"), rec("p2", "n1", app="b")])
    fleet.update_node("n2", [rec("p3", "n2")])
    assert names(fleet.select("ns", sel)) == ["p1", "p3"]
    fleet.update_node("n1", [rec("p1", "n1"), rec("p2", "n1", app="a")])  # relabelled
    assert names(fleet.select("ns", sel)) == ["p1", "p2", "p3"]
    fleet.update_node("n2", [])
    assert names(fleet.select("ns", sel)) == ["p1", "p2"]
    fleet.remove_node("n1")
    assert fleet.select("ns", sel) == []
    assert fleet.pod_count() == 0


def test_updates_are_seen_without_membership_change() -> None:
    fleet = FleetView(monotonic=lambda: 0.0)
    sel = parse_selector("app=a")
    fleet.update_node("n1", [rec("p1", "n1", util=10.0)])
    assert fleet.select("ns", sel)[0].signals["gpu-utilization"] == 10.0
    fleet.update_node("n1", [rec("p1", "n1", util=55.0)])
    assert fleet.select("ns", sel)[0].signals["gpu-utilization"] == 55.0


def test_a_pod_moving_between_nodes_is_kept_by_its_new_node() -> None:
    fleet = FleetView(monotonic=lambda: 0.0)
    sel = parse_selector("app=a")
    fleet.update_node("n1", [rec("p1", "n1")])
    fleet.update_node("n2", [rec("p1", "n2")])  # the new node reports first
    fleet.update_node("n1", [])  # then the old one drops it
    assert [(r.name, r.node) for r in fleet.select("ns", sel)] == [("p1", "n2")]
    fleet.remove_node("n1")
    assert names(fleet.select("ns", sel)) == ["p1"]


def test_a_pod_a_departed_node_had_taken_over_counts_again_when_its_node_reports_it(
        ) -> None:
    """The safety promise: node n1 reports p1, n2 reports it too (it owns it now), n2's
    link goes and takes p1 with it; n1's next report must bring p1 back into every
    selection - not leave it counted in the fleet but missing from the workload's sum."""
    fleet = FleetView(monotonic=lambda: 0.0)
    sel = parse_selector("app=a")
    fleet.update_node("n1", [rec("p1", "n1"), rec("p2", "n1")])
    fleet.update_node("n2", [rec("p1", "n2")])
    fleet.remove_node("n2")
    assert names(fleet.select("ns", sel)) == ["p2"]
    fleet.update_node("n1", [rec("p1", "n1", util=7.0), rec("p2", "n1")])
    assert [(r.name, r.node, r.signals["gpu-utilization"])
            for r in fleet.select("ns", sel)] == [("p1", "n1", 7.0), ("p2", "n1", 1.0)]
    assert fleet.pod_count() == 2


def test_namespaces_do_not_leak() -> None:
    fleet = FleetView(monotonic=lambda: 0.0)
    fleet.update_node("n1", [rec("p1", "n1", ns="x"), rec("p2", "n1", ns="y")])
    assert names(fleet.select("x", parse_selector("app=a"))) == ["p1"]


def test_the_selection_cache_is_bounded_by_entries_and_bytes() -> None:
    """Every distinct (namespace, selector) a caller sends is remembered until the bounds:
    hostile callers cannot grow it without limit."""
    from gpuscale.scaler.core.selector import parse_selector
    from gpuscale.scaler.state import fleet as fleet_module

    view = FleetView()
    for i in range(fleet_module.CACHE_ENTRIES + 500):
        view.select("ns", parse_selector(f"app=a{i}"))
        assert len(view._select_cache) <= fleet_module.CACHE_ENTRIES
    long_value = "v" * 63
    cleared = False
    for i in range(6000):  # ~3.5 KB each: past the byte bound before the entry bound
        before = view._cache_bytes
        view.select("ns", parse_selector(",".join(f"k{i}-{j}={long_value}" for j in range(50))))
        cleared = cleared or view._cache_bytes < before
        assert view._cache_bytes <= fleet_module.CACHE_BYTES + 4096
    assert cleared
