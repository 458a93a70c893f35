"""The agent's side of the stream: every subscriber gets the node's latest state per tick.

Each subscriber has a one-slot mailbox: a new update replaces one not yet sent, so a slow
or frozen scaler costs the agent one message of memory, never a backlog. Updates are full
(the node's whole state), so skipping one loses nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc

from gpuscale.proto import telemetry_pb2 as pb
from gpuscale.proto import telemetry_pb2_grpc as pb_grpc
from gpuscale.stream.codec import encode
from gpuscale.stream.records import DeviceRecord, PodRecord

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

    def publish(self, records: list[PodRecord] | str, node: str = "",
                devices: Sequence[DeviceRecord] | None = None) -> None:
        """Called once per tick with the node's pods, or why there are none to trust this
        tick (a reason string). ``node``: the node the readings are from (the backend's;
        default: the name this publisher was given). A subscriber that connects later gets
        this latest update - an incomplete one too, never an older complete one that would
        look fresh on arrival."""
        self._seq += 1
        if devices is not None:  # device news every DEVICES_EVERY_S, and the first tick
            if self._seq - self._devices_seq < self._devices_every:
                devices = None
            else:
                self._devices_seq = self._seq
        update = encode(node or self.node, self.agent_id, self._seq, time.time(),
                        self.interval, records, devices)
        self._latest = update
        for box in self._boxes:
            box.put(update)

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
                done, pending = await asyncio.wait({get, stop},
                                                   return_when=asyncio.FIRST_COMPLETED)
                for t in pending:
                    t.cancel()
                if get in done:
                    yield get.result()
        finally:
            self._boxes.discard(box)
