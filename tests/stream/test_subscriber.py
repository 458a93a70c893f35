"""The subscriber's summary of its links (who is waiting, which nodes are claimed twice),
asked by every KEDA answer through the roster."""

from __future__ import annotations


def test_the_roster_summary_follows_every_change_that_matters() -> None:
    """conflicts() and waiting() are cached per version: each field they read bumps it when
    its value changes; per-message bookkeeping (seq, updates, last_update) does not."""
    from gpuscale.scaler.state.fleet import FleetView
    from gpuscale.stream.subscriber import AgentSubscriber, LinkState, Version

    version = Version()
    state = LinkState("10.0.0.1:9401", version=version)
    state.seq, state.updates, state.last_update = 5, 9, 1.0
    assert version.value == 0
    state.node = "n1"
    state.node = "n1"
    assert version.value == 1
    for name, value in (("reported", True), ("incomplete", "no pod list"), ("error", "x"),
                        ("connected", True), ("expected_node", "n2")):
        before = version.value
        setattr(state, name, value)
        assert version.value == before + 1, name

    sub = AgentSubscriber(FleetView(), "t")
    a, b = (LinkState(addr, version=sub.version) for addr in ("a:1", "b:1"))
    sub.states = lambda: [a, b]  # type: ignore[method-assign]
    assert sub.waiting() == [("a:1", "not connected yet"), ("b:1", "not connected yet")]
    a.node, b.node, a.reported, b.reported = "n1", "n1", True, True
    assert sub.conflicts() == {"n1": ["a:1", "b:1"]}
    assert sub.waiting() == []
    b.node = "n2"
    assert sub.conflicts() == {}
    b.incomplete = "attribution: kubelet unreachable"
    assert sub.waiting() == [("b:1", "its attribution is not complete: attribution: kubelet "
                                     "unreachable")]


async def test_a_stream_that_falls_silent_is_dropped_and_redialled() -> None:
    """A frozen agent keeps its connection open and sends nothing: after the silence
    bound the link gives the stream up (TimeoutError) and dials again, so its pods age
    into UNAVAILABLE instead of waiting on a dead stream forever."""
    import asyncio

    import grpc

    from gpuscale.proto import telemetry_pb2_grpc as tpb_grpc
    from gpuscale.scaler.state.fleet import FleetView
    from gpuscale.stream.publisher import TelemetryPublisher
    from gpuscale.stream.records import NodeReport, PodRecord
    from gpuscale.stream.subscriber import AgentLink
    from tests.support.polling import until

    pub = TelemetryPublisher("node-a", 0.05)
    server = grpc.aio.server()
    tpb_grpc.add_AgentTelemetryServicer_to_server(pub, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    fleet = FleetView()
    pub.publish_report(NodeReport("node-a", 1, 0.0, 0.05, (PodRecord(
        "llm", "v-0", "node-a", {"app": "v"}, None, True, {"gpu-utilization": 5.0},
        0.0),), ()))
    link = AgentLink(f"127.0.0.1:{port}", fleet, "t", backoff_s=(0.05,), silence_s=0.3)
    task = asyncio.create_task(link.run())
    try:
        await until(lambda: link.state.updates >= 1, 5.0, "the first update")
        await until(lambda: link.state.error == "TimeoutError", 5.0, "the silence noticed")
        await until(lambda: link.state.reconnects >= 1, 5.0, "a new dial")
    finally:
        link.stopped = True
        task.cancel()
        await server.stop(0)
