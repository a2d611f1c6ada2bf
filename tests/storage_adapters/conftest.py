"""Fixtures for the storage adapters: each kind of store over real storage."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from storage_adapters import (
    FencedStore,
    FileStore,
    MysqlLegacyStore,
    MysqlStore,
    PostgresLegacyStore,
    PostgresStore,
    Record,
    S3Store,
)
from storage_adapters.base import NO_HOOKS, StoreHooks
from tests._s3_server import CREDENTIALS, MotoServer
from tests.conftest import mysql_connect

KINDS = ["postgres", "postgres_legacy", "mysql", "mysql_legacy", "files"]


@dataclass
class Recorder:
    """StoreHooks that remembers every call."""

    writes: list[tuple[str, bool]] = field(default_factory=list)
    rejections: list[tuple[str, str]] = field(default_factory=list)

    def write_done(self, store: str, seconds: float, ok: bool) -> None:
        assert seconds >= 0
        self.writes.append((store, ok))

    def rejected(self, store: str, reason: str) -> None:
        self.rejections.append((store, reason))


@dataclass
class Backend:
    """One kind of store over one piece of real storage; ``make`` opens another instance."""

    kind: str
    make: Callable[..., FencedStore]  # make(hooks=...) -> a new, unstarted store
    app_name: str = ""

    def body(self, n: int) -> bytes:
        """The body that stores the number n (a JSON object for a legacy table)."""
        if self.kind.endswith("_legacy"):
            return json.dumps({"v": n}).encode()
        return str(n).encode()

    def value(self, record: Record) -> int:
        if self.kind.endswith("_legacy"):
            return int(json.loads(record.body)["v"])
        return int(record.body)


def pg_settings(schema: str) -> dict[str, str]:
    """A per-test application_name, so a test can find (and kill) its own backends."""
    return {"application_name": f"fg-{schema}"}


async def create_accounts(dsn: str, schema: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            f'CREATE TABLE "{schema}".accounts ('
            " id text PRIMARY KEY, v bigint, note text, balance numeric(12,2), opened date)"
        )
    finally:
        await conn.close()


async def create_mysql_accounts(dsn: str) -> None:
    conn = await mysql_connect(dsn)
    try:
        async with conn.cursor() as cur:
            await cur.execute(
                "CREATE TABLE accounts (id VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin"
                " PRIMARY KEY, v BIGINT, note TEXT, balance DECIMAL(12,2), opened DATE)"
                " ENGINE=InnoDB"
            )
    finally:
        conn.close()


# the storage fixtures each kind needs: only those are set up for its tests
NEEDS: dict[str, tuple[str, ...]] = {
    "postgres": ("pg_dsn", "pg_schema"),
    "postgres_legacy": ("pg_dsn", "pg_schema"),
    "mysql": ("mysql_dsn",),
    "mysql_legacy": ("mysql_dsn",),
    "files": (),
}


@pytest.fixture(params=KINDS)
def store_kind(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    """A kind of store and the storage fixtures it needs (resolved here, outside the loop)."""
    name: str = request.param
    return name, {fixture: request.getfixturevalue(fixture) for fixture in NEEDS[name]}


@pytest.fixture
async def backend(store_kind: tuple[str, dict[str, Any]], tmp_path: Path) -> Backend:
    kind_name, storage = store_kind
    return await _backend(kind_name, storage, tmp_path)


async def _backend(kind: str, storage: dict[str, Any], tmp_path: Path) -> Backend:
    pg_dsn, pg_schema = storage.get("pg_dsn", ""), storage.get("pg_schema", "")
    mysql_dsn = storage.get("mysql_dsn", "")
    if kind == "mysql":

        def make_mysql(hooks: StoreHooks = NO_HOOKS) -> FencedStore:
            return MysqlStore("kv", mysql_dsn, pool_max=4, hooks=hooks)

        return Backend(kind, make_mysql)
    if kind == "mysql_legacy":
        await create_mysql_accounts(mysql_dsn)

        def make_mysql_legacy(hooks: StoreHooks = NO_HOOKS) -> FencedStore:
            return MysqlLegacyStore(
                "accounts",
                mysql_dsn,
                table="accounts",
                key_column="id",
                columns=["v", "note", "balance", "opened"],
                pool_max=4,
                hooks=hooks,
            )

        return Backend(kind, make_mysql_legacy)
    settings = pg_settings(pg_schema)
    if kind == "postgres":

        def make_kv(hooks: StoreHooks = NO_HOOKS) -> FencedStore:
            return PostgresStore(
                "kv", pg_dsn, schema=pg_schema, pool_max=4, server_settings=settings, hooks=hooks
            )

        return Backend(kind, make_kv, settings["application_name"])
    if kind == "postgres_legacy":
        await create_accounts(pg_dsn, pg_schema)

        def make_legacy(hooks: StoreHooks = NO_HOOKS) -> FencedStore:
            return PostgresLegacyStore(
                "accounts",
                pg_dsn,
                table="accounts",
                key_column="id",
                columns=["v", "note", "balance", "opened"],
                schema=pg_schema,
                pool_max=4,
                server_settings=settings,
                hooks=hooks,
            )

        return Backend(kind, make_legacy, settings["application_name"])
    root = tmp_path / "root"

    def make_files(hooks: StoreHooks = NO_HOOKS) -> FencedStore:
        return FileStore("files", root, hooks=hooks)

    return Backend(kind, make_files)


def s3_backend(server: MotoServer, bucket: str, *, name: str = "s3") -> Backend:
    """The s3 store over ``bucket`` of a running moto server (one entry of a store registry)."""

    def make_s3(hooks: StoreHooks = NO_HOOKS) -> FencedStore:
        return S3Store(
            name,
            bucket=bucket,
            endpoint=server.endpoint,
            prefix="data/",
            timeout=5.0,
            hooks=hooks,
            **CREDENTIALS,
        )

    return Backend("s3", make_s3)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    """One moto server (S3-compatible, conditional writes) for the session."""
    server = MotoServer(tmp_path_factory.mktemp("moto"))
    server.start()
    yield server
    server.kill()


@pytest.fixture
def s3_bucket(s3_server: MotoServer) -> str:
    """A new bucket per test (the server is restarted by outage tests: start it again)."""
    if not s3_server.alive:
        s3_server.start()
    return s3_server.create_bucket()


@pytest.fixture
async def store(backend: Backend) -> AsyncIterator[FencedStore]:
    async with backend.make() as opened:
        yield opened


@pytest.fixture
async def kv(pg_dsn: str, pg_schema: str) -> AsyncIterator[PostgresStore]:
    async with PostgresStore(
        "kv", pg_dsn, schema=pg_schema, pool_max=4, server_settings=pg_settings(pg_schema)
    ) as opened:
        yield opened


@pytest.fixture
async def files(tmp_path: Path) -> AsyncIterator[FileStore]:
    async with FileStore("files", tmp_path / "root") as opened:
        yield opened


@pytest.fixture
async def admin(pg_dsn: str) -> AsyncIterator[asyncpg.Connection]:
    """A plain connection to the test database, for setup and inspection."""
    conn = await asyncpg.connect(pg_dsn)
    try:
        yield conn
    finally:
        await conn.close()
