"""An in-process asyncio TCP proxy for one (gateway, Redis node) link, with faults.

The gateway is configured with the proxy's port instead of the node's, so the
nemesis can change what the link does at any time:

* ``pass``: bytes flow both ways;
* ``delay``: every chunk waits ``delay`` seconds before it is forwarded (order kept);
* ``blackhole``: connections stay open, nothing is forwarded either way (a partition
  that TCP does not notice); new connections are accepted and left hanging;
* ``cut``: every open connection is closed now (RST-like: the peer sees EOF) and
  new connections are closed at once until healed;
* ``drop_up`` / ``drop_down``: the first bytes from the gateway to the node
  (commands) or from the node to the gateway (replies) are discarded and the
  connection is closed, as TCP ends a connection whose segments stay lost: a
  command that ran but whose reply never came back, or one that never arrived.
  A byte stream is never left with a hole in it (TCP cannot do that: a client
  would match later replies to the wrong commands).

Only loopback addresses are ever used.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Final, Literal

if TYPE_CHECKING:
    from tests.campaign.trace import LinkTrace, Tracer

__all__ = ["MODES", "FaultProxy", "Mode"]

Mode = Literal["pass", "delay", "blackhole", "cut", "drop_up", "drop_down"]
MODES: Final[tuple[Mode, ...]] = ("pass", "delay", "blackhole", "cut", "drop_up", "drop_down")
LOOPBACK: Final = "127.0.0.1"
CHUNK: Final = 65536


class FaultProxy:
    """Listen on ``127.0.0.1:port`` and forward to ``127.0.0.1:target_port``."""

    def __init__(
        self, target_port: int, *, port: int = 0, trace: tuple[Tracer, int, int] | None = None
    ) -> None:
        self.target_port = target_port
        # (tracer, gateway, node): every connection's traffic of the traced name is logged
        self.trace = trace
        self.port = port
        self.mode: Mode = "pass"
        self.delay = 0.0
        self.connections = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, LOOPBACK, self.port)
        self.port = int(self._server.sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        return f"redis://{LOOPBACK}:{self.port}/0"

    def set(self, mode: Mode, delay: float = 0.0) -> None:
        """Change what the link does; ``cut`` also closes every open connection now."""
        if mode not in MODES:
            raise ValueError(f"unknown proxy mode {mode!r}")
        self.mode = mode
        self.delay = delay
        if mode == "cut":
            self._close_all()

    def heal(self) -> None:
        self.set("pass")

    def _close_all(self) -> None:
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self._close_all()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _accept(self, down_r: asyncio.StreamReader, down_w: asyncio.StreamWriter) -> None:
        self.connections += 1
        if self.mode == "cut":
            down_w.transport.abort()
            return
        try:
            up_r, up_w = await asyncio.open_connection(LOOPBACK, self.target_port)
        except OSError:
            down_w.transport.abort()  # the node is down: the gateway sees a closed connection
            return
        self._writers.update((down_w, up_w))
        link = None
        if self.trace is not None:
            tracer, gateway, node = self.trace
            link = tracer.link(gateway, node, self.connections)
        pair = (
            asyncio.create_task(self._pump(down_r, up_w, "up", link)),
            asyncio.create_task(self._pump(up_r, down_w, "down", link)),
        )
        for task in pair:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        try:
            await asyncio.wait(pair, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in pair:
                task.cancel()
            for writer in (down_w, up_w):
                writer.transport.abort()
                self._writers.discard(writer)
            if link is not None:
                link.closed()

    def loses(self, data: bytes, direction: str) -> bool:
        """Whether this chunk is lost whatever the mode (a subclass picks chunks)."""
        return False

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, direction: str,
        link: LinkTrace | None = None,
    ) -> None:  # fmt: skip
        """Copy one direction until EOF, applying the link's mode to every chunk."""
        with contextlib.suppress(OSError, ConnectionError):
            while True:
                data = await reader.read(CHUNK)
                if not data:
                    return
                while self.mode == "blackhole":  # noqa: ASYNC110  # the nemesis flips modes
                    await asyncio.sleep(0.05)  # held, not lost: TCP would retransmit
                if self.mode == "cut":
                    return
                if self.mode == f"drop_{direction}" or self.loses(data, direction):
                    if link is not None:
                        link.lost(direction, data)
                    return  # the chunk is lost; the caller closes both sides
                if self.mode == "delay" and self.delay > 0:
                    await asyncio.sleep(self.delay)
                writer.write(data)
                if link is not None:
                    link.feed(direction, data)
                await writer.drain()
