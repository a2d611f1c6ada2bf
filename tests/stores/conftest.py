"""The store types of the contract suite: a registry, one factory per type.

A factory sets up real storage for one test and returns a ``Subject``: the
``[stores.<name>]`` section that reaches it, how bodies hold a value, and how
to cut the storage off and bring it back (the outage test). Adding a store
type to the suite is adding one entry to ``STORE_TYPES``.

Network storage is reached through a ``FaultProxy`` (tests/campaign/proxy.py)
on loopback, so that a test can cut every connection and heal it again
without touching the server that other tests share.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
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
from tests._s3_server import CREDENTIALS
from tests.campaign.proxy import FaultProxy
from tests.conftest import mysql_connect
from tests.storage_adapters.conftest import s3_bucket, s3_server  # noqa: F401  # fixtures


@dataclass(frozen=True)
class Subject:
    """One store under test, as the gateway's configuration names it."""

    type: str  # the registry key; also the store's name in URLs
    section: dict[str, Any]
    cut: Callable[[], Awaitable[None]]
    """Make the storage unreachable (connections dropped, or the folder gone)."""
    restore: Callable[[], Awaitable[None]]
    legacy: bool = False
    """Bodies are JSON objects of column values (an existing table)."""
    scopes: bool = True
    """Honours ``X-Fencing-Lock``; a store that does not answers it 400."""
    bad_bodies: tuple[bytes, ...] = ()
    """Bodies the store refuses with 400 bad_request."""
    server: bool = True
    """Reached over the network: ``cut`` before start makes its server unreachable."""
    extra: dict[str, Any] = field(default_factory=dict)
    """More ``[stores.<name>]`` sections for the same gateway."""
    aliases: tuple[tuple[str, str], ...] = (("7", "007"), ("key", "Key"), ("0", "-0"))
    """(key, other text) pairs: one row or two, never one row under two lock names."""

    @property
    def name(self) -> str:
        return self.type

    def encode(self, value: str) -> bytes:
        if self.legacy:
            return json.dumps({"note": value, "balance": "1.50"}).encode()
        return value.encode()

    def decode(self, raw: bytes) -> str:
        if self.legacy:
            note: str = json.loads(raw)["note"]
            return note
        return raw.decode()


Factory = Callable[[dict[str, Any], Path], AbstractAsyncContextManager[Subject]]


@dataclass(frozen=True)
class StoreType:
    """A registry entry: the fixtures its storage needs, and the factory of its subject."""

    needs: tuple[str, ...]
    make: Factory


@asynccontextmanager
async def proxied(dsn: str) -> AsyncIterator[tuple[str, FaultProxy]]:
    """``dsn`` rewritten to go through a loopback proxy of its own."""
    parts = urlsplit(dsn)
    assert parts.hostname in ("127.0.0.1", "localhost", "::1"), "only loopback targets"
    proxy = FaultProxy(parts.port or {"mysql": 3306}.get(parts.scheme, 5432))
    await proxy.start()
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@127.0.0.1:{proxy.port}" if userinfo else f"127.0.0.1:{proxy.port}"
    try:
        yield urlunsplit(parts._replace(netloc=netloc)), proxy
    finally:
        await proxy.close()


def _proxy_switch(proxy: FaultProxy) -> dict[str, Callable[[], Awaitable[None]]]:
    async def cut() -> None:
        proxy.set("cut")

    async def restore() -> None:
        proxy.heal()

    return {"cut": cut, "restore": restore}


# -- PostgreSQL -------------------------------------------------------------------------------


@asynccontextmanager
async def postgres_kv(res: dict[str, Any], tmp_path: Path) -> AsyncIterator[Subject]:
    dsn, schema = res["pg_dsn"], res["pg_schema"]
    async with proxied(dsn) as (via, proxy):
        section = {"type": "postgres", "dsn": via, "schema": schema, "acquire_timeout_ms": 2000}
        yield Subject("postgres_kv", section, **_proxy_switch(proxy))


@asynccontextmanager
async def postgres_kv_batched(res: dict[str, Any], tmp_path: Path) -> AsyncIterator[Subject]:
    """The kv store with a pool of one connection: concurrent fenced PUTs go in batches."""
    dsn, schema = res["pg_dsn"], res["pg_schema"]
    async with proxied(dsn) as (via, proxy):
        section = {
            "type": "postgres", "dsn": via, "schema": schema, "acquire_timeout_ms": 2000,
            "pool_max": 1,
        }  # fmt: skip
        yield Subject("postgres_kv_batched", section, **_proxy_switch(proxy))


PG_ACCOUNTS = "id text PRIMARY KEY, balance numeric(12,2) NOT NULL DEFAULT 0, note text"
LEGACY_BAD_BODIES = (
    b"not json",
    b"[1]",
    b'{"nope": 1}',
    b'{"id": "other"}',
    b'{"balance": "abc"}',
    b'{"note\\"; DROP TABLE accounts; --": 1}',
    b"\xff\xfe",
    b"[" * 3000 + b"]" * 3000,  # nested past the parser's recursion limit
    b'{"note": ' + b"[" * 3000 + b"]" * 3000 + b"}",
    b'{"note": "\\ud800"}',  # valid JSON text, but a lone surrogate is no UTF-8 character
    b'{"balance": null}',  # NOT NULL
    b'{"balance": 123456789012345678901234567890}',  # beyond DECIMAL(12,2)
    b'{"balance": 1e400}',  # beyond any float
    b'{"balance": true}',  # PostgreSQL's numeric refuses it; MySQL would store 1.00
)


@asynccontextmanager
async def postgres_legacy(res: dict[str, Any], tmp_path: Path) -> AsyncIterator[Subject]:
    dsn, schema = res["pg_dsn"], res["pg_schema"]
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f'CREATE TABLE "{schema}".accounts ({PG_ACCOUNTS})')
    finally:
        await conn.close()
    async with proxied(dsn) as (via, proxy):
        section = {
            "type": "postgres", "dsn": via, "schema": schema, "acquire_timeout_ms": 2000,
            "table": "accounts", "key_column": "id", "columns": ["balance", "note"],
        }  # fmt: skip
        yield Subject(
            "postgres_legacy", section, legacy=True, bad_bodies=LEGACY_BAD_BODIES,
            **_proxy_switch(proxy),
        )  # fmt: skip


# -- MySQL / MariaDB ----------------------------------------------------------------------------


@asynccontextmanager
async def mysql_kv(res: dict[str, Any], tmp_path: Path) -> AsyncIterator[Subject]:
    async with proxied(res["mysql_dsn"]) as (via, proxy):
        section = {"type": "mysql", "dsn": via, "acquire_timeout_ms": 2000}
        yield Subject("mysql_kv", section, **_proxy_switch(proxy))


MYSQL_ACCOUNTS = (
    "id VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin PRIMARY KEY,"
    " balance DECIMAL(12,2) NOT NULL DEFAULT 0, note LONGTEXT"
)


@asynccontextmanager
async def mysql_legacy(res: dict[str, Any], tmp_path: Path) -> AsyncIterator[Subject]:
    dsn = res["mysql_dsn"]
    conn = await mysql_connect(dsn)
    try:
        async with conn.cursor() as cur:
            await cur.execute(f"CREATE TABLE accounts ({MYSQL_ACCOUNTS}) ENGINE=InnoDB")
    finally:
        conn.close()
    async with proxied(dsn) as (via, proxy):
        section = {
            "type": "mysql", "dsn": via, "acquire_timeout_ms": 2000,
            "table": "accounts", "key_column": "id", "columns": ["balance", "note"],
        }  # fmt: skip
        yield Subject(
            "mysql_legacy", section, legacy=True, bad_bodies=LEGACY_BAD_BODIES,
            **_proxy_switch(proxy),
        )  # fmt: skip


# -- legacy tables with typed key columns (one row, several texts) ------------------------------

UUID = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
INT_ALIASES = (("7", "007"), ("7", "07"), ("0", "-0"), ("-7", "-007"))


@asynccontextmanager
async def postgres_legacy_typed(res: dict[str, Any], tmp_path: Path) -> AsyncIterator[Subject]:
    """Two tables: an integer and a uuid key column, as two stores of one gateway."""
    dsn, schema = res["pg_dsn"], res["pg_schema"]
    conn = await asyncpg.connect(dsn)
    try:
        for table, key in (("by_int", "integer"), ("by_uuid", "uuid")):
            await conn.execute(f'CREATE TABLE "{schema}".{table} ('
                               f"{PG_ACCOUNTS.replace('id text', f'id {key}')})")  # fmt: skip
    finally:
        await conn.close()
    common = {"type": "postgres", "dsn": dsn, "schema": schema, "key_column": "id",
              "columns": ["balance", "note"]}  # fmt: skip
    yield Subject(
        "pg_by_int", {**common, "table": "by_int"}, _nothing, _nothing, legacy=True,
        aliases=INT_ALIASES, extra={"pg_by_uuid": {**common, "table": "by_uuid"}},
    )  # fmt: skip


@asynccontextmanager
async def mysql_legacy_typed(res: dict[str, Any], tmp_path: Path) -> AsyncIterator[Subject]:
    dsn = res["mysql_dsn"]
    conn = await mysql_connect(dsn)
    try:
        async with conn.cursor() as cur:
            columns = MYSQL_ACCOUNTS.split(" PRIMARY KEY", 1)[1]
            await cur.execute(f"CREATE TABLE by_int (id INT PRIMARY KEY{columns}) ENGINE=InnoDB")
    finally:
        conn.close()
    section = {"type": "mysql", "dsn": dsn, "table": "by_int", "key_column": "id",
               "columns": ["balance", "note"]}  # fmt: skip
    yield Subject("mysql_by_int", section, _nothing, _nothing, legacy=True, aliases=INT_ALIASES)


async def _nothing() -> None:
    pass


TYPED_KEY_TYPES: dict[str, StoreType] = {
    "postgres_legacy_typed": StoreType(("pg_dsn", "pg_schema"), postgres_legacy_typed),
    "mysql_legacy_typed": StoreType(("mysql_dsn",), mysql_legacy_typed),
}


@pytest.fixture(params=list(TYPED_KEY_TYPES))
def typed_store_type(request: pytest.FixtureRequest) -> tuple[StoreType, dict[str, Any]]:
    entry = TYPED_KEY_TYPES[request.param]
    return entry, {name: request.getfixturevalue(name) for name in entry.needs}


@pytest.fixture
async def typed_subject(
    typed_store_type: tuple[StoreType, dict[str, Any]], tmp_path: Path
) -> AsyncIterator[Subject]:
    """A legacy table whose key column is typed: several texts name one row."""
    entry, resources = typed_store_type
    async with entry.make(resources, tmp_path) as made:
        yield made


# -- S3-compatible object storage ---------------------------------------------------------------


@asynccontextmanager
async def s3(res: dict[str, Any], tmp_path: Path) -> AsyncIterator[Subject]:
    server, bucket = res["s3_server"], res["s3_bucket"]
    async with proxied(server.endpoint) as (via, proxy):
        section = {
            "type": "s3", "bucket": bucket, "endpoint": via, "prefix": "data/",
            "command_timeout_ms": 2000, **CREDENTIALS,
        }  # fmt: skip
        # per-key scope only: X-Fencing-Lock is refused with 400 (DESIGN.md "More stores")
        yield Subject("s3", section, scopes=False, **_proxy_switch(proxy))


# -- files --------------------------------------------------------------------------------------


@asynccontextmanager
async def files(res: dict[str, Any], tmp_path: Path) -> AsyncIterator[Subject]:
    root = tmp_path / "files-root"
    away = tmp_path / "files-root.away"

    # Permissions do not stop root (these tests may run as root): the outage is the
    # folder going away, as an unmounted volume does, and coming back.
    async def cut() -> None:
        os.rename(root, away)

    async def restore() -> None:
        os.rename(away, root)

    yield Subject("files", {"type": "files", "root": str(root)}, cut, restore, server=False)


STORE_TYPES: dict[str, StoreType] = {
    "postgres_kv": StoreType(("pg_dsn", "pg_schema"), postgres_kv),
    "postgres_kv_batched": StoreType(("pg_dsn", "pg_schema"), postgres_kv_batched),
    "postgres_legacy": StoreType(("pg_dsn", "pg_schema"), postgres_legacy),
    "mysql_kv": StoreType(("mysql_dsn",), mysql_kv),
    "mysql_legacy": StoreType(("mysql_dsn",), mysql_legacy),
    "s3": StoreType(("s3_server", "s3_bucket"), s3),
    "files": StoreType((), files),
}


@pytest.fixture(params=list(STORE_TYPES))
def store_type(request: pytest.FixtureRequest) -> tuple[StoreType, dict[str, Any]]:
    """A registry entry and the fixtures it needs (resolved here, outside the event loop)."""
    entry = STORE_TYPES[request.param]
    return entry, {name: request.getfixturevalue(name) for name in entry.needs}


@pytest.fixture
async def subject(
    store_type: tuple[StoreType, dict[str, Any]], tmp_path: Path
) -> AsyncIterator[Subject]:
    """Each store type of the registry, over its real storage."""
    entry, resources = store_type
    async with entry.make(resources, tmp_path) as made:
        yield made


def config_for(subject: Subject, lock_urls: list[str] | None = None, **top: Any) -> Config:
    stores = {subject.name: subject.section, **subject.extra}
    raw: dict[str, Any] = {"stores": stores, **top}
    raw["locks"] = {"redis": lock_urls or [], "node_timeout_ms": 200}
    return parse_config(raw)


Start = Callable[..., Awaitable[Client]]


@pytest.fixture
def start(gateway_client: ServeClient) -> Start:
    """Start an in-process gateway for a config (fresh metrics registry), served as
    ``fencegate serve`` serves it, and return its client."""

    async def start(config: Config, registry: CollectorRegistry | None = None) -> Client:
        return await gateway_client(create_app(config, registry=registry or CollectorRegistry()))

    return start


@pytest.fixture
async def client(start: Start, subject: Subject) -> Client:
    return await start(config_for(subject))
