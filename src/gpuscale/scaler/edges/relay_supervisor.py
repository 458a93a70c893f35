"""The relay's supervisor (``scaler.edges.relay``): the fleet process starts its front - a
child process on KEDA's port - on a socket pair, pings it every ``HEARTBEAT_S`` (a front
silent for ``WEDGED_S`` is wedged: killed, and the scaler ends) and stops it gracefully
with the scaler. The fleet process ends when its front ends."""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
import time
from typing import Any

from gpuscale.scaler.edges.relay import HEARTBEAT_S, ID_SPACE, STOP_GRACE_S, WEDGED_S
from gpuscale.scaler.edges.relay_backend import RelayBackend

log = logging.getLogger(__name__)


class Front:
    """The front as the fleet process runs it: a child process on KEDA's port, connected to
    ``backend`` by a socket pair (nothing on the file system, nothing else can connect)."""

    def __init__(self, backend: RelayBackend, heartbeat_s: float = HEARTBEAT_S,
                 wedged_s: float = WEDGED_S) -> None:
        self.backend = backend
        self.heartbeat_s, self.wedged_s = heartbeat_s, wedged_s
        self.port = 0
        self._proc: asyncio.subprocess.Process | None = None
        self._serving: asyncio.Task[None] | None = None

    async def start(self, address: str, tls: Any, options: list[tuple[str, int]]) -> int:
        """Start the child; the port it bound. OSError when it could not listen
        (everything started is stopped again)."""
        import json

        ours, theirs = socket.socketpair()
        try:
            reader, writer = await asyncio.open_unix_connection(sock=ours)
            self._serving = asyncio.get_running_loop().create_task(
                self.backend.serve(reader, writer))
            argv = [sys.executable, "-P", "-m", "gpuscale.scaler.edges.relay_front",
                    "--fd", str(theirs.fileno()), "--address", address,
                    "--options", json.dumps(dict(options))]
            if tls is not None:
                argv += ["--tls", str(tls.cert), str(tls.key), str(tls.ca)]
            proc = self._proc = await asyncio.create_subprocess_exec(
                *argv, stdout=asyncio.subprocess.PIPE,  # its log lines: this stderr
                pass_fds=(theirs.fileno(),))
            theirs.close()
            assert proc.stdout is not None
            line = (await proc.stdout.readline()).decode().strip()
            if not line.startswith("listening "):
                await proc.wait()
                raise OSError(line.removeprefix("cannot listen: ") or
                              f"the gRPC front exited with {proc.returncode}")
        except BaseException:
            theirs.close()
            await self.stop()
            raise
        self.port = int(line.split()[1])
        return self.port

    async def watch(self) -> None:
        """Until the child ends, or answers no ping for ``wedged_s`` of rounds in a row
        (then it is killed): then RuntimeError (the scaler cannot answer KEDA). Counted in
        rounds - a ping, then ``heartbeat_s`` for its answer - so a pause of this process
        (a stopped VM) costs a round or two, not a kill."""
        proc = self._proc
        assert proc is not None
        backend = self.backend
        backend.answered = time.monotonic()
        ended = asyncio.get_running_loop().create_task(proc.wait())
        seq, missed = 0, 0
        try:
            while not ended.done():
                seq, before = seq % (ID_SPACE - 1) + 1, backend.answered_seq
                backend.ping(seq)
                await asyncio.wait((ended,), timeout=self.heartbeat_s)
                # any answer in the round counts: a busy front may answer an earlier ping
                missed = 0 if backend.answered_seq != before else missed + 1
                if not ended.done() and missed * self.heartbeat_s >= self.wedged_s:
                    silent = self.silent_s()
                    log.error("the scaler's gRPC front has not answered for %.0f s; killing "
                              "it and stopping", silent)
                    proc.kill()
                    await ended
                    raise RuntimeError(f"the scaler's gRPC front did not answer for "
                                       f"{silent:.0f} s (killed)")
        finally:
            ended.cancel()
        code = proc.returncode
        log.error("the scaler's gRPC front exited with %s; stopping", code)
        raise RuntimeError(f"the scaler's gRPC front exited with {code}")

    def silent_s(self) -> float:
        """Seconds since the front last answered a ping."""
        return time.monotonic() - self.backend.answered

    async def stop(self, stopping: asyncio.Event | None = None) -> None:
        """Graceful, as the in-process server stops: the child refuses new calls
        (SIGTERM), then ``stopping`` is set (this process ends its streams, their ends
        reach KEDA through the child), then the child is waited for (killed past the
        grace)."""
        proc = self._proc
        if proc is not None and proc.returncode is None:
            proc.terminate()
        if stopping is not None:
            stopping.set()
        if proc is not None:
            try:
                await asyncio.shield(asyncio.wait_for(proc.wait(), STOP_GRACE_S + 2))
            except TimeoutError:
                proc.kill()
                await asyncio.shield(proc.wait())
        self.backend.disconnect()
        if self._serving is not None:
            self._serving.cancel()

