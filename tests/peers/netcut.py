"""A TCP path that a test can cut or freeze without privileges: a loopback proxy in front
of a real server.

- ``freeze()``: bytes stop moving both ways but every connection stays open - what a
  partitioned network or a stopped process looks like to the peer (keepalives go
  unanswered, reads just wait).
- ``cut()``: every connection is reset and new ones are refused - a node that left.
- ``heal()``: bytes flow again; new connections are accepted.
"""

from __future__ import annotations

import asyncio
import contextlib


class NetPath:
    def __init__(self, target_port: int, host: str = "127.0.0.1") -> None:
        self.target_port = target_port
        self.host = host
        self.port = 0
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._refusing = False
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.StreamWriter] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, self.host, 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def stop(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def freeze(self) -> None:
        self._flowing.clear()

    def cut(self) -> None:
        self._refusing = True
        for w in list(self._conns):
            w.transport.abort()
        self._conns.clear()

    def heal(self) -> None:
        self._refusing = False
        self._flowing.set()

    async def _accept(self, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        if self._refusing:
            writer.transport.abort()
            return
        try:
            up_r, up_w = await asyncio.open_connection(self.host, self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self._conns.update((writer, up_w))
        await asyncio.gather(self._pump(reader, up_w), self._pump(up_r, writer),
                             return_exceptions=True)
        for w in (writer, up_w):
            self._conns.discard(w)
            w.transport.abort()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(65536):
                await self._flowing.wait()
                if writer.transport.is_closing():
                    return
                writer.write(data)
                await writer.drain()
        writer.transport.abort()
