"""The agent's side of the stream: every subscriber gets the node's latest state per tick.

Each subscriber has a one-slot mailbox: a new update replaces one not yet sent, so a slow
or frozen scaler costs the agent one message of memory, never a backlog. Updates are full
(the node's whole state), so skipping one loses nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import grpc

from gpuscale.proto import telemetry_pb2 as pb
from gpuscale.proto import telemetry_pb2_grpc as pb_grpc
from gpuscale.stream.codec import encode_report
from gpuscale.stream.records import NodeReport

log = logging.getLogger(__name__)

# Device news (for the operator tools) rides on one update in this many seconds: decoding
# them costs a scaler as much as the pods (bench_fleet), and no KEDA answer needs them.
DEVICES_EVERY_S = 5.0

Context = grpc.aio.ServicerContext[Any, Any]


class _Mailbox:
    def __init__(self) -> None:
        self.item: pb.NodeUpdate | None = None
        self.ready = asyncio.Event()

    def put(self, update: pb.NodeUpdate) -> None:
        self.item = update  # replaces an unsent one
        self.ready.set()

    async def get(self) -> pb.NodeUpdate:
        await self.ready.wait()
        self.ready.clear()
        item, self.item = self.item, None
        assert item is not None
        return item


class TelemetryPublisher(pb_grpc.AgentTelemetryServicer):
    def __init__(self, node: str, interval: float) -> None:
        self.node = node
        self.interval = interval
        self.agent_id = uuid.uuid4().hex
        self._seq = 0
        self._devices_every = max(1, round(DEVICES_EVERY_S / interval)) if interval > 0 else 1
        self._devices_seq = -self._devices_every  # the first update carries them
        self._latest: pb.NodeUpdate | None = None
        self._boxes: set[_Mailbox] = set()
        self.stopping = asyncio.Event()

    @property
    def subscribers(self) -> int:
        return len(self._boxes)

    def publish_report(self, report: NodeReport) -> None:
        """Send one tick's report to every subscriber. A subscriber that connects later
        gets this latest update - an incomplete one too, never an older complete one that
        would look fresh on arrival. Device news is due on the first update, at once to a
        new subscriber, and then every DEVICES_EVERY_S; the report's devices ride only on
        a due update. An update that carries none (its pods are not known) leaves the news
        due, for the next update that has it."""
        self._seq = report.seq
        due = self._seq - self._devices_seq >= self._devices_every
        if due and report.devices is not None:
            self._devices_seq = self._seq
        elif report.devices is not None:
            report = dataclasses.replace(report, devices=None)
        update = encode_report(report, self.agent_id, time.time())
        self._latest = update
        for box in self._boxes:
            box.put(update)

    @property
    def seq(self) -> int:
        """The seq of the last report published (0: none yet)."""
        return self._seq

    async def Subscribe(self, request: pb.SubscribeRequest,
                        context: Context) -> AsyncIterator[pb.NodeUpdate]:
        box = _Mailbox()
        if self._latest is not None:
            box.put(self._latest)
        self._boxes.add(box)
        self._devices_seq = -self._devices_every  # the next update brings it the devices
        log.info("subscriber %s connected", request.subscriber[:64] or context.peer())
        try:
            while not self.stopping.is_set():
                get = asyncio.ensure_future(box.get())
                stop = asyncio.ensure_future(self.stopping.wait())
                try:
                    done, _ = await asyncio.wait({get, stop},
                                                 return_when=asyncio.FIRST_COMPLETED)
                finally:  # also when the subscriber leaves (the RPC is cancelled here):
                    get.cancel()  # a pending one left behind is logged as destroyed
                    stop.cancel()
                if get in done:
                    yield get.result()
        finally:
            self._boxes.discard(box)
