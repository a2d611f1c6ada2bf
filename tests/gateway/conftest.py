"""Gateway fixtures: the app over real lock backends (in-process, redis x3) and real stores."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
from prometheus_client import CollectorRegistry

from gateway.app import create_app
from gateway.config import Config, parse_config
from tests._gateway import Client as Client  # the tests of this package import it from here
from tests._gateway import ServeClient
from tests._servers import RedisNode

Start = Callable[..., Awaitable[Client]]

API_KEYS = {
    "admin": "admin-secret-key",
    "billing": "billing-secret-key",
    "reader": "reader-secret-key",
}


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def auth_section() -> dict[str, Any]:
    return {
        "keys": [
            {"name": "admin", "sha256": sha(API_KEYS["admin"]), "locks": [""], "stores": [""]},
            {
                "name": "billing",
                "sha256": sha(API_KEYS["billing"]),
                "locks": ["billing/"],
                "stores": ["files/billing/"],
                "verbs": ["lock", "read", "write"],
            },
            {
                "name": "reader",
                "sha256": sha(API_KEYS["reader"]),
                "locks": [""],
                "stores": [""],
                "verbs": ["read"],
            },
        ]
    }


def bearer(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {API_KEYS[name]}"}


@pytest.fixture(params=["memory", "redis3"])
def lock_urls(request: pytest.FixtureRequest) -> list[str]:
    """The lock backend: none (in-process) or three real redis-server nodes."""
    if request.param == "memory":
        return []
    nodes: list[RedisNode] = request.getfixturevalue("redis3")
    return [n.url for n in nodes]


@pytest.fixture
def files_root(tmp_path: Path) -> Path:
    return tmp_path / "files"


@pytest.fixture
async def legacy_table(pg_dsn: str, pg_schema: str) -> AsyncIterator[str]:
    """An existing table the gateway protects as it is: accounts(id, balance, note)."""
    conn = await asyncpg.connect(pg_dsn)
    try:
        await conn.execute(
            f'CREATE TABLE "{pg_schema}".accounts ('
            " id text PRIMARY KEY, balance numeric(12,2) NOT NULL DEFAULT 0, note text)"
        )
        yield "accounts"
    finally:
        await conn.close()


async def take(client: Client, name: str, ttl_ms: int = 10_000) -> dict[str, Any]:
    """Take the lock ``name``; its grant (token, lease_id)."""
    response = await client.post(f"/v1/locks/{name}", json={"ttl_ms": ttl_ms})
    assert response.status == 200, await response.text()
    grant: dict[str, Any] = await response.json()
    return grant


async def drop(client: Client, grant: dict[str, Any]) -> None:
    """Release a lease taken by ``take``."""
    response = await client.delete(
        f"/v1/locks/{grant['name']}", headers={"X-Lease-Id": grant["lease_id"]}
    )
    assert response.status == 204


async def error(response: Any, status: int, code: str) -> dict[str, Any]:
    """Check an error reply's status, code and message; its body."""
    assert response.status == status, await response.text()
    body: dict[str, Any] = await response.json()
    assert body["error"] == code, body
    assert body["message"], body
    return body


def assert_lease_token(reported: int, granted: int, lock_urls: list[str]) -> None:
    """``reported`` (by status or renew) is the token of the lease granted ``granted``.

    Over Redis too, even when a node with a higher counter granted after the
    quorum decided (``test_reported_token_is_the_grant_token_when_node_counters_disagree``).
    """
    assert reported == granted, (reported, granted, lock_urls)


def make_config(
    *,
    lock_urls: list[str] | None = None,
    stores: dict[str, Any] | None = None,
    auth: dict[str, Any] | None = None,
    locks: dict[str, Any] | None = None,
    **top: Any,
) -> Config:
    raw: dict[str, Any] = {"stores": stores or {}, **top}
    raw["locks"] = {"redis": lock_urls or [], "node_timeout_ms": 100, **(locks or {})}
    if auth is not None:
        raw["auth"] = auth
    return parse_config(raw)


@pytest.fixture
def start(gateway_client: ServeClient) -> Start:
    """Start a gateway for a config (a fresh metrics registry each), served as ``fencegate
    serve`` serves it, and return its client."""

    async def start(config: Config, registry: CollectorRegistry | None = None) -> Client:
        return await gateway_client(create_app(config, registry=registry or CollectorRegistry()))

    return start


def store_section(kind: str, *, files_root: Path, pg_dsn: str, pg_schema: str) -> dict[str, Any]:
    """``[stores.<kind>]`` for one store of each kind, named after the kind."""
    if kind == "files":
        return {"type": "files", "root": str(files_root)}
    if kind == "kv":
        return {"type": "postgres", "dsn": pg_dsn, "schema": pg_schema}
    return {
        "type": "postgres",
        "dsn": pg_dsn,
        "schema": pg_schema,
        "table": "accounts",
        "key_column": "id",
        "columns": ["balance", "note"],
    }


class TcpProxy:
    """A TCP forwarder to a real server that a test can cut (storage unreachable)."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._flowing = asyncio.Event()
        self._flowing.set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self._writers |= {writer, up_writer}
        pipes = [
            asyncio.create_task(self._pipe(reader, up_writer)),
            asyncio.create_task(self._pipe(up_reader, writer)),
        ]
        self._tasks.update(pipes)
        await asyncio.wait(pipes)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                await self._flowing.wait()
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    def stall(self) -> None:
        """Hold every byte in both directions until ``resume`` (a storage that hangs)."""
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    async def cut(self) -> None:
        """Refuse new connections and drop every open one."""
        self._flowing.set()
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in self._writers:
            writer.transport.abort()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


@pytest.fixture
async def pg_proxy(pg_dsn: str) -> AsyncIterator[TcpProxy]:
    parts = urlsplit(pg_dsn)
    proxy = TcpProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    await proxy.start()
    yield proxy
    await proxy.cut()


def via_proxy(dsn: str, proxy: TcpProxy) -> str:
    parts = urlsplit(dsn)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@127.0.0.1:{proxy.port}" if userinfo else f"127.0.0.1:{proxy.port}"
    return urlunsplit(parts._replace(netloc=netloc))
