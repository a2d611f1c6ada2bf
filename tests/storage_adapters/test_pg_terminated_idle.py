"""A pooled connection that PostgreSQL ends while it is idle does not fail the next call.

PostgreSQL ending a backend (fast shutdown, ``pg_terminate_backend``) sends its
client a FATAL ErrorResponse, then closes. asyncpg's protocol, idle, cannot
place that message and stays in its error-consuming state (2) until the close
is processed; a call handed that connection in between failed with
``InternalClientError: cannot switch to state 12; another operation (2) is in
progress`` (seen under load during PostgreSQL restarts). Here a proxy forwards
the FATAL at once but holds the close back, which makes that window as long as
the test needs: the store must terminate that connection and retry the call on
a new one.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from storage_adapters import PostgresStore


class CloseHoldingProxy:
    """Forwards bytes both ways; when the server closes the first connection, its client
    side stays open (later connections close normally)."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = 0
        self.server_closed = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        first = not self._writers
        self._writers += [writer, up_writer]
        to_server = asyncio.create_task(self._pipe(reader, up_writer, close=True))
        to_client = asyncio.create_task(self._pipe(up_reader, writer, close=not first))
        self._tasks |= {to_server, to_client}
        await to_client
        if first:
            self.server_closed.set()  # its client's socket stays open: the close is held

    @staticmethod
    async def _pipe(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, close: bool
    ) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        if close:
            writer.close()

    async def close(self) -> None:
        for writer in self._writers:
            writer.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


@pytest.fixture
async def proxy(pg_dsn: str) -> AsyncIterator[CloseHoldingProxy]:
    parts = urlsplit(pg_dsn)
    proxy = CloseHoldingProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    await proxy.start()
    yield proxy
    await proxy.close()


async def test_a_connection_terminated_while_idle_is_replaced_and_the_call_retried(
    pg_dsn: str, pg_schema: str, proxy: CloseHoldingProxy
) -> None:
    parts = urlsplit(pg_dsn)
    netloc = parts.netloc.rpartition("@")
    via = urlunsplit(parts._replace(netloc=f"{netloc[0]}{netloc[1]}127.0.0.1:{proxy.port}"))
    app = f"fg-idle-{uuid.uuid4().hex[:8]}"
    store = PostgresStore(
        "kv", via, schema=pg_schema, pool_min=1, pool_max=1,
        server_settings={"application_name": app},
    )  # fmt: skip
    await store.start()
    try:
        assert await store.put("kv/k", "k", 1, b"one") == 1
        admin = await asyncpg.connect(pg_dsn)
        try:
            ended = await admin.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE application_name = $1",
                app,
            )
        finally:
            await admin.close()
        assert ended == 1
        await asyncio.wait_for(proxy.server_closed.wait(), 10)
        await asyncio.sleep(0.1)  # the client has read the FATAL; its socket is still open

        assert await store.put("kv/k", "k", 2, b"two") == 2
        record = await store.get("kv/k", "k", None)
        assert (record.body, record.token) == (b"two", 2)
    finally:
        await store.close()
