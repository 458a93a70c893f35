"""The scaler's side of the stream: one link per agent, kept current as agents come and go.

A link subscribes, hands each update to its sink (the scaler's fleet view), timestamped with
its receipt time so agent clock skew does not matter, and on any failure reconnects with
jittered backoff. An update whose pods are not known changes nothing in the sink
(records.deliver, as for an agent in the scaler's own process). A restarted agent (new
agent_id) starts a new sequence; an old or repeated seq of the same agent is ignored. A
silent stream (frozen agent, cut network) is abandoned after an inactivity timeout;
meanwhile its pods' data ages past the staleness bound and their workloads answer
UNAVAILABLE, never a smaller sum. A node whose agent has left discovery is forgotten only
after ``forget_after`` seconds (its pods have gone too, or they will show up with their new
node).

Identity: a stream is keyed in the sink by the address it was dialled at, and its pods are
placed on the node that discovery says the endpoint runs on (the EndpointSlice endpoint's
``nodeName``), not the node the agent claims; with static addresses (no discovery) the
claim is all there is. ``conflicts`` names every node that two current links stand for:
the scaler answers UNAVAILABLE for workloads there rather than merge two agents' pods.
An agent counts as reporting once it has delivered one complete update (attribution
known) and while its latest update is complete; otherwise ``waiting`` says why not.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import grpc

from gpuscale.common.errors import PeerError, Unavailable
from gpuscale.common.freshness import staleness_bound
from gpuscale.proto import telemetry_pb2 as pb
from gpuscale.proto import telemetry_pb2_grpc as pb_grpc
from gpuscale.stream.codec import DecodeError, decode_report
from gpuscale.stream.records import NodeReport, NodeSink, deliver
from gpuscale.stream.tls import DEFAULT_SERVER_NAME

log = logging.getLogger(__name__)

BACKOFF_S = (0.1, 0.25, 0.5, 1.0)  # a dead agent costs one dial a second at most
FORGET_AFTER_S = 300.0
SILENCE_S = 10.0  # a stream silent this long (or five of its agent's intervals) is dropped
CLOSE_TIMEOUT_S = 5.0
MAX_MESSAGE = 16 * 1024 * 1024

Credentials = Callable[[], grpc.ChannelCredentials | None]  # None: plaintext


_WATCHED = frozenset({"expected_node", "node", "connected", "error", "reported",
                      "incomplete"})  # what waiting() and identity read


class Version:
    """A number that changes whenever any link's identity or waiting state does, so the
    roster's per-answer questions (who is waiting, which nodes are claimed twice) are
    computed once per change, not once per answer over every link."""

    def __init__(self) -> None:
        self.value = 0

    def bump(self) -> None:
        self.value += 1


@dataclass
class LinkState:
    address: str
    expected_node: str = ""  # from discovery (EndpointSlice nodeName); "" when unknown
    connected: bool = False
    node: str = ""  # what the agent claims
    agent_id: str = ""
    seq: int = 0
    last_update: float | None = None  # monotonic receipt time
    error: str = ""
    reconnects: int = 0
    updates: int = 0
    reported: bool = False  # delivered a complete update at least once
    incomplete: str = ""  # why the last update carried no pods ("" when it did)
    version: Version | None = field(default=None, repr=False, compare=False)

    def __setattr__(self, name: str, value: object) -> None:
        if name in _WATCHED and self.__dict__.get(name, value) != value:
            version = self.__dict__.get("version")
            if version is not None:
                version.bump()
        object.__setattr__(self, name, value)

    @property
    def identity(self) -> str:
        """The node this link stands for: discovery's word, else the agent's claim."""
        return self.expected_node or self.node

    def waiting(self) -> str:
        """Why this agent's node cannot be vouched for: it has never delivered a complete
        update, or its latest update says its attribution is not complete ("" when it is
        reporting complete updates)."""
        if self.incomplete:
            return f"its attribution is not complete: {self.incomplete}"
        if self.reported:
            return ""
        if self.error:
            return f"not connected: {self.error}"
        return "not connected yet"


class AgentLink:
    def __init__(self, address: str, sink: NodeSink, name: str,
                 credentials: Credentials = lambda: None,
                 backoff_s: tuple[float, ...] = BACKOFF_S,
                 monotonic: Callable[[], float] = time.monotonic,
                 server_name: str = DEFAULT_SERVER_NAME,
                 on_delay: Callable[[float], None] | None = None,
                 expected_node: str = "", version: Version | None = None,
                 silence_s: float = SILENCE_S) -> None:
        self.state = LinkState(address, expected_node, version=version)
        self._silence_s = silence_s
        self.stopped = False  # set by the subscriber's close: no reconnect after it
        self._server_name = server_name
        self._on_delay = on_delay  # seconds from the agent's sample to the update's arrival
        self._sink = sink
        self._name = name
        self._credentials = credentials
        self._backoff_s = backoff_s
        self._monotonic = monotonic

    async def run(self) -> None:
        attempt = 0
        while not self._stopping():
            try:
                if await self._session():
                    attempt = 0
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as exc:
                if self._stopping():  # a cancellation gRPC surfaced as CANCELLED: end
                    return
                self._failed(f"{exc.code().name}: {(exc.details() or '')[:160]}")
            except (DecodeError, TimeoutError) as exc:
                self._failed(str(exc) or type(exc).__name__)
            self.state.connected = False
            delay = self._backoff_s[min(attempt, len(self._backoff_s) - 1)]
            attempt += 1
            self.state.reconnects += 1
            await asyncio.sleep(delay * random.uniform(0.5, 1.5))

    def _stopping(self) -> bool:
        return self.stopped

    def _failed(self, why: str) -> None:
        if why != self.state.error:
            log.warning("agent %s: %s; reconnecting", self.state.address, why)
        self.state.error = why

    async def _session(self) -> bool:
        """One subscription; True when it delivered at least one update."""
        options: list[tuple[str, str | int]] = [
            ("grpc.max_receive_message_length", MAX_MESSAGE),
            ("grpc.keepalive_time_ms", 10_000), ("grpc.keepalive_timeout_ms", 5_000),
            ("grpc.enable_retries", 0)]
        creds = self._credentials()
        if creds is not None:  # agents are dialled by IP: check the certificate's fixed name
            options.append(("grpc.ssl_target_name_override", self._server_name))
        channel = (grpc.aio.secure_channel(self.state.address, creds, options)
                   if creds is not None else
                   grpc.aio.insecure_channel(self.state.address, options))
        got = False
        async with channel:
            stub = pb_grpc.AgentTelemetryStub(channel)  # type: ignore[no-untyped-call]
            call = stub.Subscribe(pb.SubscribeRequest(subscriber=self._name))
            loop = asyncio.get_running_loop()
            # One timer for the stream's silence, moved on by each message (wait_for per
            # message made a task and a timer 1,000 times a second at 1,000 agents).
            async with asyncio.timeout(self._silence_s) as silence:
                while True:
                    msg = await call.read()
                    if msg is grpc.aio.EOF:
                        self._failed("the agent closed the stream")
                        return got
                    got = True
                    silence.reschedule(loop.time() + max(self._silence_s, 5.0 * msg.interval))
                    self._apply(msg)

    def _apply(self, msg: pb.NodeUpdate) -> None:
        s = self.state
        now = self._monotonic()
        if msg.agent_id != s.agent_id:
            if s.agent_id:
                log.info("agent %s (%s) restarted; new sequence", s.address, msg.node)
            s.agent_id, s.seq = msg.agent_id, 0
        elif msg.seq <= s.seq:
            return  # a repeat of what we have
        if s.error:
            log.info("agent %s (%s): receiving again", s.address, msg.node)
        if s.expected_node and msg.node not in (s.expected_node, s.node):
            log.warning("agent %s says it is node %r, but its endpoint runs on node %r; "
                        "its pods are placed on %r", s.address, msg.node[:64],
                        s.expected_node, s.expected_node)
        s.seq, s.node, s.last_update, s.error, s.connected = msg.seq, msg.node, now, "", True
        s.updates += 1
        if self._on_delay is not None:
            self._on_delay(max(0.0, time.time() - msg.sampled_at))
        report = decode_report(msg, now, staleness_bound(msg.interval), node=s.identity)
        if report.complete:
            s.reported = True
        s.incomplete = report.reason
        deliver(report, self._sink, s.address)


class AgentSubscriber:
    """Keeps one AgentLink per discovered agent address."""

    def __init__(self, sink: NodeSink, name: str, credentials: Credentials = lambda: None,
                 forget_after: float = FORGET_AFTER_S,
                 backoff_s: tuple[float, ...] = BACKOFF_S,
                 monotonic: Callable[[], float] = time.monotonic,
                 server_name: str = DEFAULT_SERVER_NAME,
                 on_delay: Callable[[float], None] | None = None) -> None:
        self.sink = sink
        self._server_name = server_name
        self._on_delay = on_delay
        self._name = name
        self._credentials = credentials
        self._forget_after = forget_after
        self._backoff_s = backoff_s
        self._monotonic = monotonic
        self.links: dict[str, tuple[AgentLink, asyncio.Task[None]]] = {}
        self._departed: dict[str, float] = {}  # address -> when its agent left discovery
        self.version = Version()  # bumped by any link's identity or waiting state, and
        #                           by links coming and going
        self._summary: tuple[int, dict[str, list[str]], list[tuple[str, str]]] | None = None

    def set_addresses(self, addresses: Iterable[str] | Mapping[str, str]) -> None:
        """Reconcile links with the agent addresses: a mapping address -> the node its
        endpoint runs on (discovery), or plain addresses (static: no node known)."""
        wanted = dict(addresses) if isinstance(addresses, Mapping) else dict.fromkeys(
            addresses, "")
        for addr in list(self.links):
            link = self.links[addr][0]
            if addr not in wanted or wanted[addr] != link.state.expected_node:
                gone, task = self.links.pop(addr)
                gone.stopped = True
                task.cancel()
                self._departed[addr] = self._monotonic()
                self.version.bump()
                log.info("agent %s left discovery", addr)
        for addr in wanted.keys() - self.links.keys():
            link = AgentLink(addr, self.sink, self._name, self._credentials,
                             self._backoff_s, self._monotonic, self._server_name,
                             self._on_delay, expected_node=wanted[addr],
                             version=self.version)
            self.version.bump()
            self._departed.pop(addr, None)
            self.links[addr] = (link, asyncio.create_task(link.run(), name=f"agent {addr}"))

    def states(self) -> list[LinkState]:
        return [link.state for link, _ in self.links.values()]

    def conflicts(self) -> dict[str, list[str]]:
        """Node -> the addresses of two or more current links that stand for it."""
        return self._summarised()[1]

    def waiting(self) -> list[tuple[str, str]]:
        """(address, why) of every link whose node cannot be vouched for (LinkState.waiting)."""
        return self._summarised()[2]

    def _summarised(self) -> tuple[int, dict[str, list[str]], list[tuple[str, str]]]:
        """Both answers, recomputed over every link only when the version moved: every
        KEDA answer asks them (O(agents) each made the scaler's answers cost ~5 ms at
        1,000 agents, bench_keda)."""
        if self._summary is None or self._summary[0] != self.version.value:
            by_node: dict[str, list[str]] = {}
            waiting = []
            for s in self.states():
                if s.identity:
                    by_node.setdefault(s.identity, []).append(s.address)
                if why := s.waiting():
                    waiting.append((s.address, why))
            self._summary = (self.version.value,
                             {n: sorted(a) for n, a in by_node.items() if len(a) > 1},
                             waiting)
        return self._summary

    def sweep(self) -> None:
        """Forget what agents that left discovery long ago reported."""
        now = self._monotonic()
        for addr, since in list(self._departed.items()):
            if now - since > self._forget_after:
                self.sink.remove_node(addr)
                del self._departed[addr]

    async def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Stop every link; bounded: a link gRPC does not let go of within ``timeout_s``
        is left behind (logged), so a scaler's shutdown never waits on an agent."""
        for link, task in self.links.values():
            link.stopped = True
            task.cancel()
        tasks = [t for _, t in self.links.values()]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=timeout_s)
            if pending:
                log.warning("%d agent links did not stop within %gs", len(pending),
                            timeout_s)
        self.links.clear()


async def read_node(address: str, credentials: Credentials = lambda: None,
                    server_name: str = DEFAULT_SERVER_NAME, timeout_s: float = 10.0,
                    name: str = "gpuscale-gpus") -> NodeReport:
    """One agent's node as its stream shows it now: the first update that carries its
    devices (the agent sends them with its first update and every few after). Raises
    PeerError naming the agent and why when it cannot (refused, TLS, silent, not an
    agent's stream)."""
    options: list[tuple[str, str | int]] = [
        ("grpc.max_receive_message_length", MAX_MESSAGE), ("grpc.enable_retries", 0)]
    creds = credentials()
    if creds is not None:
        options.append(("grpc.ssl_target_name_override", server_name))
    channel = (grpc.aio.secure_channel(address, creds, options) if creds is not None
               else grpc.aio.insecure_channel(address, options))
    why = ""  # the agent's own reason while its updates carry no devices
    try:
        async with channel, asyncio.timeout(timeout_s):
            stub = pb_grpc.AgentTelemetryStub(channel)  # type: ignore[no-untyped-call]
            call = stub.Subscribe(pb.SubscribeRequest(subscriber=name))
            while True:
                msg = await call.read()
                if msg is grpc.aio.EOF:
                    raise PeerError(f"agent {address}: it closed the stream")
                report = decode_report(msg, time.monotonic(), staleness_bound(msg.interval))
                if report.devices is not None:
                    call.cancel()
                    return report
                if isinstance(report.pods, Unavailable):  # no devices until it knows its pods
                    why = f": node {report.node}'s pods are not known: {report.pods.reason}"
    except TimeoutError:
        raise PeerError(f"agent {address}: no update with its devices within "
                        f"{timeout_s:g}s{why}") from None
    except grpc.aio.AioRpcError as exc:
        raise PeerError(f"agent {address}: {exc.code().name}: "
                        f"{(exc.details() or '')[:200]}") from None
    except DecodeError as exc:
        raise PeerError(f"agent {address}: {exc}") from None
