"""PostgresStore on the real server: row-lock serialisation, schema creation, recovery."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from storage_adapters import (
    FencedStore,
    PostgresLegacyStore,
    PostgresStore,
    StaleToken,
    StorageUnavailable,
    StoreMisconfigured,
)
from tests.storage_adapters.conftest import create_accounts, pg_settings


async def wait_until_waiting_on_a_lock(admin: asyncpg.Connection, app_name: str) -> None:
    """Return once a backend of ``app_name`` waits for a row lock (its statement has started)."""
    for _ in range(500):
        waiting = await admin.fetchval(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE application_name = $1 AND wait_event_type = 'Lock'",
            app_name,
        )
        if waiting:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the call never waited for the fence row lock")


async def in_flight_write(pg_dsn: str, schema: str, scope: str, token: int) -> asyncpg.Connection:
    """Another gateway in the middle of an accepted write: fence row raised and locked."""
    conn = await asyncpg.connect(pg_dsn)
    await conn.execute("BEGIN")
    await conn.execute(
        f'UPDATE "{schema}".fencegate_fence SET token = $2 WHERE scope = $1', scope, token
    )
    return conn


@pytest.mark.parametrize("isolation", ["read committed", "serializable"])
async def test_write_that_waited_for_the_fence_row_is_checked_against_the_committed_mark(
    admin: asyncpg.Connection, pg_dsn: str, pg_schema: str, isolation: str
) -> None:
    """Also with a database whose default isolation is stricter: the store keeps READ
    COMMITTED, where the waiting statement re-checks the newest mark instead of failing."""
    settings = {**pg_settings(pg_schema), "default_transaction_isolation": isolation}
    async with PostgresStore("kv", pg_dsn, schema=pg_schema, server_settings=settings) as kv:
        await _write_waits_then_is_refused(kv, admin, pg_dsn, pg_schema)


async def _write_waits_then_is_refused(
    kv: PostgresStore, admin: asyncpg.Connection, pg_dsn: str, pg_schema: str
) -> None:
    await kv.put("s", "k", 5, b"five")
    other = await in_flight_write(pg_dsn, pg_schema, "s", 6)
    await other.execute(
        f'UPDATE "{pg_schema}".fencegate_kv SET value = $1, token = 6 WHERE key = $2', b"six", "k"
    )
    late = asyncio.create_task(kv.put("s", "k", 5, b"five again"))
    await wait_until_waiting_on_a_lock(admin, f"fg-{pg_schema}")
    assert not late.done()  # serialised behind the other writer of the scope
    await other.execute("COMMIT")
    await other.close()
    with pytest.raises(StaleToken) as caught:
        await late
    assert caught.value.high_water == 6
    record = await kv.get("s", "k", None)
    assert (record.body, record.token) == (b"six", 6)


async def test_fenced_read_that_waited_for_a_write_returns_that_write(
    kv: PostgresStore, admin: asyncpg.Connection, pg_dsn: str, pg_schema: str
) -> None:
    """A one-statement fenced read would return b"old" here, and its holder would
    then overwrite b"new" (accepted before the read raised the mark): a lost update."""
    await kv.put("s", "k", 5, b"old")
    other = await in_flight_write(pg_dsn, pg_schema, "s", 6)
    await other.execute(
        f'UPDATE "{pg_schema}".fencegate_kv SET value = $1, token = 6 WHERE key = $2', b"new", "k"
    )
    read = asyncio.create_task(kv.get("s", "k", 7))
    await wait_until_waiting_on_a_lock(admin, f"fg-{pg_schema}")
    await other.execute("COMMIT")
    await other.close()
    record = await read
    assert (record.body, record.token) == (b"new", 6)
    with pytest.raises(StaleToken):
        await kv.put("s", "k", 6, b"late")


async def test_delete_that_waited_for_an_insert_deletes_it(
    kv: PostgresStore, admin: asyncpg.Connection, pg_dsn: str, pg_schema: str
) -> None:
    """A one-statement delete would not see the row inserted by the writer it waited for."""
    await kv.put("s", "other", 5, b"x")  # the fence row of scope s exists
    other = await in_flight_write(pg_dsn, pg_schema, "s", 6)
    await other.execute(
        f'INSERT INTO "{pg_schema}".fencegate_kv (store, key, value, content_type, token)'
        " VALUES ('kv', 'k', 'new', 'text/plain', 6)"
    )
    delete = asyncio.create_task(kv.delete("s", "k", 7))
    await wait_until_waiting_on_a_lock(admin, f"fg-{pg_schema}")
    await other.execute("COMMIT")
    await other.close()
    await delete
    assert (
        await admin.fetchval(f'SELECT count(*) FROM "{pg_schema}".fencegate_kv WHERE key = $1', "k")
        == 0
    )


async def test_legacy_fenced_read_that_waited_for_a_write_returns_that_write(
    admin: asyncpg.Connection, pg_dsn: str, pg_schema: str
) -> None:
    await create_accounts(pg_dsn, pg_schema)
    async with PostgresLegacyStore(
        "accounts",
        pg_dsn,
        table="accounts",
        key_column="id",
        columns=["v"],
        schema=pg_schema,
        server_settings=pg_settings(pg_schema),
    ) as store:
        await store.put("s", "k", 5, b'{"v": 5}')
        other = await in_flight_write(pg_dsn, pg_schema, "s", 6)
        await other.execute(f'UPDATE "{pg_schema}".accounts SET v = 6 WHERE id = $1', "k")
        read = asyncio.create_task(store.get("s", "k", 7))
        await wait_until_waiting_on_a_lock(admin, f"fg-{pg_schema}")
        await other.execute("COMMIT")
        await other.close()
        assert (await read).body == b'{"id":"k","v":6}'


async def test_schema_creation_is_idempotent_and_concurrent(
    admin: asyncpg.Connection, pg_dsn: str, pg_schema: str
) -> None:
    await create_accounts(pg_dsn, pg_schema)
    stores: list[FencedStore] = [
        PostgresStore(f"kv{i}", pg_dsn, schema=pg_schema, pool_min=1) for i in range(4)
    ]
    stores += [
        PostgresLegacyStore(
            f"acc{i}", pg_dsn, table="accounts", key_column="id", columns=["v"], schema=pg_schema
        )
        for i in range(4)
    ]
    try:
        await asyncio.gather(*(store.start() for store in stores))  # like 8 gateways at once
        await asyncio.gather(*(store.start() for store in stores))
        for store in stores:
            await store.put("s", "k", 1, b'{"v": 1}')
    finally:
        await asyncio.gather(*(store.close() for store in stores))
    tables = await admin.fetch(
        "SELECT tablename FROM pg_tables WHERE schemaname = $1 ORDER BY 1", pg_schema
    )
    assert [t["tablename"] for t in tables] == [
        "accounts",
        "fencegate_fence",
        "fencegate_kv",
        "fencegate_legacy_token",
    ]
    # A restart finds everything in place, and keeps the marks.
    async with PostgresStore("kv0", pg_dsn, schema=pg_schema) as again:
        await again.put("s", "k", 2, b"")
    async with PostgresStore("kv0", pg_dsn, schema=pg_schema) as again:
        with pytest.raises(StaleToken):
            await again.put("s", "k", 1, b"")


async def test_a_missing_schema_is_created(
    admin: asyncpg.Connection, pg_dsn: str, pg_schema: str
) -> None:
    schema = f"{pg_schema}_created"
    await admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    try:
        async with PostgresStore("kv", pg_dsn, schema=schema) as store:
            await store.put("s", "k", 1, b"v")
        assert await admin.fetchval("SELECT count(*) FROM pg_namespace WHERE nspname = $1", schema)
    finally:
        await admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


async def test_pool_recovers_after_its_backends_are_killed(
    admin: asyncpg.Connection, pg_dsn: str, pg_schema: str
) -> None:
    """What a PostgreSQL restart does to the pool: every connection is closed by the server."""
    app = f"fg-{pg_schema}"
    async with PostgresStore(
        "kv",
        pg_dsn,
        schema=pg_schema,
        pool_min=2,
        pool_max=2,
        server_settings={"application_name": app},
    ) as store:
        await store.put("s", "k", 1, b"before")
        kill = (
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name = $1"
        )
        assert await admin.fetchval(kill, app) == 2
        await asyncio.sleep(0.3)  # the server is back; the closed connections are noticed
        for n in range(2, 6):
            await store.put("s", "k", n, b"after")
        # Killed just before use: each pooled connection may fail one call, then is replaced.
        assert await admin.fetchval(kill, app) >= 1
        failures = 0
        for n in range(6, 12):
            try:
                await store.put("s", "k", n, b"again")
            except StorageUnavailable:
                failures += 1
        assert failures <= 2
        await store.ping()
        record = await store.get("s", "k", None)
        assert (record.body, record.token) == (b"again", 11)


async def test_unreachable_server_is_storage_unavailable() -> None:
    store = PostgresStore("kv", "postgresql://postgres@127.0.0.1:1/test", connect_timeout=2)
    with pytest.raises(StorageUnavailable) as caught:
        await store.start()
    assert caught.value.code == "storage_unavailable"
    assert caught.value.store == "kv"
    assert isinstance(caught.value.__cause__, OSError)


async def test_body_and_content_type_are_kept_exactly(kv: PostgresStore) -> None:
    body = bytes(range(256)) * 64
    await kv.put("s", "bin", 1, body, content_type="image/png; q=0.5")
    record = await kv.get("s", "bin", 1)
    assert record.body == body
    assert record.content_type == "image/png; q=0.5"
    await kv.put("s", "empty", 1, b"")
    assert (await kv.get("s", "empty", None)).body == b""


async def test_stores_sharing_a_schema_do_not_share_keys(
    kv: PostgresStore, pg_dsn: str, pg_schema: str
) -> None:
    async with PostgresStore("other", pg_dsn, schema=pg_schema) as other:
        await kv.put("kv/k", "k", 1, b"mine")
        await other.put("other/k", "k", 1, b"theirs")
        assert (await kv.get("kv/k", "k", None)).body == b"mine"
        assert (await other.get("other/k", "k", None)).body == b"theirs"


async def test_a_kv_table_whose_keys_do_not_compare_byte_for_byte_is_refused(
    admin: asyncpg.Connection, pg_dsn: str, pg_schema: str
) -> None:
    """A hand-made fencegate_kv keyed case-insensitively: "Key" and "key" share a row."""
    schema = f'"{pg_schema}"'
    await admin.execute(
        f"CREATE SCHEMA IF NOT EXISTS {schema}; CREATE COLLATION {schema}.nd"
        " (provider = icu, locale = 'und-u-ks-level2', deterministic = false)"
    )
    await admin.execute(
        f"CREATE TABLE {schema}.fencegate_kv (store text NOT NULL,"
        f" key text COLLATE {schema}.nd NOT NULL, value bytea NOT NULL,"
        " content_type text NOT NULL, token bigint,"
        " updated_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (store, key))"
    )

    def make() -> PostgresStore:
        return PostgresStore("kv", pg_dsn, schema=pg_schema, server_settings=pg_settings(pg_schema))

    with pytest.raises(StoreMisconfigured, match="compare byte for byte") as caught:
        await make().start()
    alter = str(caught.value).split("fix it with ", 1)[1]
    await admin.execute(alter)
    async with make() as store:
        await store.put("s", "Key", 1, b"upper")
        await store.put("s", "key", 1, b"lower")
        assert (await store.get("s", "Key", None)).body == b"upper"


async def test_a_put_after_the_table_changed_type_prepares_its_statement_anew(
    admin: asyncpg.Connection, pg_dsn: str, pg_schema: str
) -> None:
    """The fenced PUT keeps a prepared statement per connection; a column type changed
    under it ("cached plan must not change result type") costs no failed write."""
    settings = pg_settings(pg_schema)
    async with PostgresStore(
        "kv", pg_dsn, schema=pg_schema, pool_max=1, server_settings=settings
    ) as kv:
        await kv.put("s", "k", 1, b"one")
        await admin.execute(
            f'ALTER TABLE "{pg_schema}".fencegate_kv ALTER COLUMN token TYPE numeric'
        )
        assert await kv.put("s", "k", 2, b"two") == 2
        assert await kv.put("s", "k", 3, b"three") == 3
        with pytest.raises(StaleToken):
            await kv.put("s", "k", 2, b"late")
        record = await kv.get("s", "k", None)
        assert (record.body, record.token) == (b"three", 3)


async def test_statements_of_closed_connections_are_not_kept(
    admin: asyncpg.Connection, pg_dsn: str, pg_schema: str
) -> None:
    app = f"fg-{pg_schema}"
    async with PostgresStore(
        "kv", pg_dsn, schema=pg_schema, pool_max=1, server_settings={"application_name": app}
    ) as kv:
        kill = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1"
        for n in range(1, 5):
            await kv.put("s", "k", n, b"v")
            await admin.execute(kill, app)
            await asyncio.sleep(0.1)  # the close is noticed: the next put opens a connection
        await kv.put("s", "k", 5, b"v")
        assert len(kv._put_stmts) == 1
