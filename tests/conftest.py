"""Shared fixtures: real redis-server nodes and a PostgreSQL schema per test."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._gateway import ServeClient, ServeServer, clients, servers
from tests._servers import RedisNode

PG_DSN = os.environ.get("FENCEGATE_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
MYSQL_DSN = os.environ.get("FENCEGATE_TEST_MYSQL_DSN", "mysql://root@127.0.0.1:3306/test")


@pytest.fixture(scope="session")
def redis_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[RedisNode]]:
    """Five redis-server processes for the whole session (tests use 1, 3 or 5)."""
    base = tmp_path_factory.mktemp("redis")
    nodes = [RedisNode(base / f"node{i}") for i in range(5)]
    for node in nodes:
        node.start()
    yield nodes
    for node in nodes:
        node.stop()


def _fresh(nodes: list[RedisNode]) -> list[RedisNode]:
    for node in nodes:
        if not node.alive:
            node.start()
        node.resume()
        node.flushall()
    return nodes


@pytest.fixture
def redis1(redis_pool: list[RedisNode]) -> list[RedisNode]:
    return _fresh(redis_pool[:1])


@pytest.fixture
def redis3(redis_pool: list[RedisNode]) -> list[RedisNode]:
    return _fresh(redis_pool[:3])


@pytest.fixture
def redis5(redis_pool: list[RedisNode]) -> list[RedisNode]:
    return _fresh(redis_pool[:5])


@pytest.fixture
def own_redis3(tmp_path: Path) -> Iterator[list[RedisNode]]:
    """Three nodes of this test's own, for fault tests that kill and restart them."""
    nodes = [RedisNode(tmp_path / f"node{i}") for i in range(3)]
    for node in nodes:
        node.start()
    yield nodes
    for node in nodes:
        node.stop()


@pytest.fixture
async def pg_schema() -> AsyncIterator[str]:
    """A unique PostgreSQL schema on the running server, dropped afterwards."""
    import uuid

    import asyncpg

    schema = f"fg_test_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(PG_DSN)
    try:
        await conn.execute(f'CREATE SCHEMA "{schema}"')
        yield schema
    finally:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await conn.close()


@pytest.fixture
def pg_dsn() -> str:
    return PG_DSN


@pytest.fixture
async def mysql_dsn() -> AsyncIterator[str]:
    """A DSN of a database of this test's own on the running MySQL/MariaDB, dropped afterwards.

    ``FENCEGATE_TEST_MYSQL_DSN`` names the server and an account that may create databases.
    """
    import uuid
    from urllib.parse import urlsplit, urlunsplit

    database = f"fencegate_test_{uuid.uuid4().hex[:12]}"
    admin = await mysql_connect(MYSQL_DSN)
    try:
        async with admin.cursor() as cur:
            await cur.execute(f"CREATE DATABASE `{database}`")
        yield urlunsplit(urlsplit(MYSQL_DSN)._replace(path=f"/{database}"))
        async with admin.cursor() as cur:
            await cur.execute(f"DROP DATABASE IF EXISTS `{database}`")
    finally:
        admin.close()


def with_credentials(dsn: str, user: str, password: str) -> str:
    """``dsn`` with another user and password (for wrong-credential tests)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(dsn)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:{password}@{host}"))


async def mysql_connect(dsn: str) -> Any:
    """A plain autocommit asyncmy connection, for setup and inspection."""
    import asyncmy

    from storage_adapters._mysql import parse_dsn

    d = parse_dsn(dsn)
    return await asyncmy.connect(
        host=d.host, port=d.port, user=d.user, password=d.password, database=d.database,
        autocommit=True, charset="utf8mb4",
    )  # fmt: skip


# Tests that keep a core busy for tens of seconds (the model's searches, the fault
# campaigns' clusters under load) run one after another on one worker, so that at most
# one of each kind competes with the timing-sensitive tests on the other workers.
ONE_WORKER = {"tests/model/": "model", "tests/campaign/test_campaign.py": "campaign"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``--dist loadgroup``), keep the tests of a module that uses a
    module-scoped fixture (a server started once for the module) on one worker, so that
    the fixture starts once, not once per worker; and those of ``ONE_WORKER``."""
    for item in items:
        path = item.nodeid.split("::")[0]
        group = next((g for prefix, g in ONE_WORKER.items() if path.startswith(prefix)), None)
        info = getattr(item, "_fixtureinfo", None)
        defs = info.name2fixturedefs.values() if info is not None else ()
        if group is None and any(d[-1].scope == "module" for d in defs if d):
            group = path
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(autouse=True)
def _no_lock_protocol_bug(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Every test fails if an acquire moved between states protocol.py does not allow."""
    yield
    bugs = [r.getMessage() for r in caplog.records if "lock protocol bug" in r.getMessage()]
    assert not bugs, bugs


@pytest.fixture
async def gateway_client() -> AsyncIterator[ServeClient]:
    """``await gateway_client(app)``: a test client of ``app`` served as ``fencegate serve``
    serves it (``tests/_gateway.py``); use it, not pytest-aiohttp's ``aiohttp_client``."""
    async with clients() as serve:
        yield serve


@pytest.fixture
async def gateway_server() -> AsyncIterator[ServeServer]:
    """``await gateway_server(app, ssl=None)``: ``app`` served as ``fencegate serve`` serves it."""
    async with servers() as serve:
        yield serve


@pytest.fixture
def aiohttp_client() -> None:
    """pytest-aiohttp's fixture serves with ``handler_cancellation`` on: a disconnect
    cancels a handler, which never happens under ``fencegate serve``."""
    pytest.fail("use gateway_client: aiohttp_client does not serve the app as fencegate serve does")


@pytest.fixture
def aiohttp_server() -> None:
    """As ``aiohttp_client``."""
    pytest.fail("use gateway_server: aiohttp_server does not serve the app as fencegate serve does")
