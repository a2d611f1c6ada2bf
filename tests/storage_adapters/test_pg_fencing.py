"""Fencing inside PostgreSQL: the trigger against direct writers, next to the proxy's writes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import asyncpg
import psycopg
import pytest

from storage_adapters import PostgresLegacyStore, StaleToken, TableMismatch
from storage_adapters.errors import UnfencedRefused
from storage_adapters.pg_fencing import (
    fenced_transaction,
    fenced_transaction_sync,
    fencing_status,
    install_fencing,
    uninstall_fencing,
)
from tests.storage_adapters.conftest import create_accounts, pg_settings


@pytest.fixture
async def accounts(pg_dsn: str, pg_schema: str) -> AsyncIterator[PostgresLegacyStore]:
    """The proxy's store over ``accounts``; its start creates ``fencegate_fence``."""
    await create_accounts(pg_dsn, pg_schema)
    store = PostgresLegacyStore(
        "accounts",
        pg_dsn,
        table="accounts",
        key_column="id",
        columns=["v", "note"],
        schema=pg_schema,
        pool_max=2,
        server_settings=pg_settings(pg_schema),
    )
    async with store:
        yield store


async def install(conn: asyncpg.Connection, schema: str, *, require_token: bool = True) -> None:
    await install_fencing(
        conn,
        store="accounts",
        table="accounts",
        key_column="id",
        schema=schema,
        require_token=require_token,
    )


async def v_of(conn: asyncpg.Connection, schema: str, key: str) -> int | None:
    value = await conn.fetchval(f'SELECT v FROM "{schema}".accounts WHERE id = $1', key)
    return None if value is None else int(value)


async def mark(conn: asyncpg.Connection, schema: str, scope: str) -> int | None:
    value = await conn.fetchval(
        f'SELECT token FROM "{schema}".fencegate_fence WHERE scope = $1', scope
    )
    return None if value is None else int(value)


async def test_install_and_uninstall_are_idempotent_and_keep_the_data(
    admin: asyncpg.Connection, accounts: PostgresLegacyStore, pg_schema: str
) -> None:
    await accounts.put("accounts/a", "a", 3, json.dumps({"v": 7}).encode())
    await install(admin, pg_schema)
    await install(admin, pg_schema, require_token=False)
    await install(admin, pg_schema)
    status = await fencing_status(admin, table="accounts", schema=pg_schema)
    assert status == {
        "store": "accounts",
        "key_column": "id",
        "fence_schema": pg_schema,
        "require_token": True,
    }
    triggers = await admin.fetchval(
        "SELECT count(*) FROM pg_trigger"
        " WHERE tgrelid = $1::regclass AND tgname = 'fencegate_fence'",
        f'"{pg_schema}".accounts',
    )
    assert triggers == 1
    with pytest.raises(asyncpg.PostgresError) as refused:
        await admin.execute(f'UPDATE "{pg_schema}".accounts SET v = 8')
    assert refused.value.sqlstate == "FG428"

    assert await uninstall_fencing(admin, table="accounts", schema=pg_schema) is True
    assert await uninstall_fencing(admin, table="accounts", schema=pg_schema) is False
    assert await fencing_status(admin, table="accounts", schema=pg_schema) is None
    assert await v_of(admin, pg_schema, "a") == 7
    assert await mark(admin, pg_schema, "accounts/a") == 3
    # Unfenced writes pass again once the trigger is gone.
    await admin.execute(f'UPDATE "{pg_schema}".accounts SET v = 8')
    assert await v_of(admin, pg_schema, "a") == 8
    users = await admin.fetchval(
        "SELECT count(*) FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid"
        " WHERE p.proname = 'check_fence'"
    )
    function = await admin.fetchval("SELECT to_regprocedure('fencegate.check_fence()')")
    assert users > 0 or function is None  # kept only while another table still uses it


async def test_install_names_a_missing_table_or_column(
    admin: asyncpg.Connection, accounts: PostgresLegacyStore, pg_schema: str
) -> None:
    with pytest.raises(TableMismatch, match=r"nope' does not exist"):
        await install_fencing(admin, store="x", table="nope", key_column="id", schema=pg_schema)
    with pytest.raises(TableMismatch, match="key column 'missing' does not exist"):
        await install_fencing(
            admin, store="x", table="accounts", key_column="missing", schema=pg_schema
        )
    with pytest.raises(TableMismatch, match="has type 'date'"):
        await install_fencing(
            admin, store="x", table="accounts", key_column="opened", schema=pg_schema
        )
    await admin.execute(
        f'CREATE COLLATION "{pg_schema}".nd'
        " (provider = icu, locale = 'und-u-ks-level2', deterministic = false);"
        f'CREATE TABLE "{pg_schema}".ci (id text COLLATE "{pg_schema}".nd PRIMARY KEY, v int)'
    )
    with pytest.raises(TableMismatch, match="non-deterministic collation 'nd'"):
        await install_fencing(admin, store="x", table="ci", key_column="id", schema=pg_schema)


async def test_stale_direct_update_raises_fg409_and_changes_nothing(
    admin: asyncpg.Connection, accounts: PostgresLegacyStore, pg_schema: str
) -> None:
    await install(admin, pg_schema)
    await accounts.put("accounts/a", "a", 5, json.dumps({"v": 1}).encode())
    with pytest.raises(asyncpg.PostgresError) as refused:
        async with fenced_transaction(admin, 4):
            await admin.execute(f"UPDATE \"{pg_schema}\".accounts SET v = 99 WHERE id = 'a'")
    assert refused.value.sqlstate == "FG409"
    assert "stale token 4" in str(refused.value)
    assert "high-water mark is 5" in str(refused.value)
    assert await v_of(admin, pg_schema, "a") == 1
    assert await mark(admin, pg_schema, "accounts/a") == 5
    # A stale INSERT ... ON CONFLICT and a stale DELETE are refused the same way.
    for sql in (
        f"INSERT INTO \"{pg_schema}\".accounts (id, v) VALUES ('a', 2)"
        " ON CONFLICT (id) DO UPDATE SET v = 2",
        f"DELETE FROM \"{pg_schema}\".accounts WHERE id = 'a'",
    ):
        with pytest.raises(asyncpg.PostgresError) as refused:
            async with fenced_transaction(admin, 4):
                await admin.execute(sql)
        assert refused.value.sqlstate == "FG409"
    assert await v_of(admin, pg_schema, "a") == 1
    # The current token passes and the proxy then sees the direct writer's mark.
    async with fenced_transaction(admin, 6):
        await admin.execute(f"UPDATE \"{pg_schema}\".accounts SET v = 2 WHERE id = 'a'")
    assert await mark(admin, pg_schema, "accounts/a") == 6
    assert (await accounts.get("accounts/a", "a", None)).token == 6  # as the gateway reports
    with pytest.raises(StaleToken) as stale:
        await accounts.put("accounts/a", "a", 5, json.dumps({"v": 3}).encode())
    assert (stale.value.token, stale.value.high_water) == (5, 6)
    assert await v_of(admin, pg_schema, "a") == 2


async def test_the_lock_setting_names_a_coarser_scope(
    admin: asyncpg.Connection, accounts: PostgresLegacyStore, pg_schema: str
) -> None:
    await install(admin, pg_schema)
    await accounts.put("accounts", "a", 10, json.dumps({"v": 1}).encode())
    with pytest.raises(asyncpg.PostgresError) as refused:
        async with fenced_transaction(admin, 9, lock="accounts"):
            await admin.execute(f"INSERT INTO \"{pg_schema}\".accounts (id, v) VALUES ('b', 1)")
    assert refused.value.sqlstate == "FG409"
    async with fenced_transaction(admin, 11, lock="accounts"):
        await admin.execute(f"INSERT INTO \"{pg_schema}\".accounts (id, v) VALUES ('b', 1)")
        await admin.execute(f'UPDATE "{pg_schema}".accounts SET v = v + 1')
    assert await mark(admin, pg_schema, "accounts") == 11
    assert await mark(admin, pg_schema, "accounts/b") is None


async def test_write_without_token_raises_fg428_unless_unfenced_is_allowed(
    admin: asyncpg.Connection, accounts: PostgresLegacyStore, pg_schema: str
) -> None:
    await admin.execute(f"INSERT INTO \"{pg_schema}\".accounts (id, v) VALUES ('x', 0)")
    await install(admin, pg_schema)
    for sql in (
        f"INSERT INTO \"{pg_schema}\".accounts (id, v) VALUES ('n', 1)",
        f'UPDATE "{pg_schema}".accounts SET v = 1',
        f'DELETE FROM "{pg_schema}".accounts',
    ):
        with pytest.raises(asyncpg.PostgresError) as refused:
            async with admin.transaction():
                await admin.execute(sql)
        assert refused.value.sqlstate == "FG428", sql
        assert "needs a fencing token" in str(refused.value)
    # The proxy's unfenced write (a fencing = "none" store) is refused too, clearly.
    with pytest.raises(UnfencedRefused, match="allow-unfenced"):
        await accounts.put("accounts/y", "y", None, json.dumps({"v": 1}).encode())
    await install(admin, pg_schema, require_token=False)
    async with fenced_transaction(admin, 2):
        await admin.execute(f"UPDATE \"{pg_schema}\".accounts SET v = 4 WHERE id = 'x'")
    assert (await accounts.get("accounts/x", "x", None)).token == 2
    await admin.execute(f"UPDATE \"{pg_schema}\".accounts SET v = 5 WHERE id = 'x'")
    assert (await accounts.get("accounts/x", "x", None)).token is None  # unfenced now
    await accounts.put("accounts/y", "y", None, json.dumps({"v": 1}).encode())
    assert await v_of(admin, pg_schema, "x") == 5
    assert await mark(admin, pg_schema, "accounts/x") == 2
    # A stale token is still refused in that mode.
    await accounts.put("accounts/x", "x", 4, json.dumps({"v": 6}).encode())
    with pytest.raises(asyncpg.PostgresError) as refused:
        async with fenced_transaction(admin, 3):
            await admin.execute(f"UPDATE \"{pg_schema}\".accounts SET v = 7 WHERE id = 'x'")
    assert refused.value.sqlstate == "FG409"


async def test_bad_token_setting_is_refused(
    admin: asyncpg.Connection, accounts: PostgresLegacyStore, pg_schema: str
) -> None:
    await install(admin, pg_schema)
    with pytest.raises(asyncpg.PostgresError) as refused:
        await admin.execute(
            "BEGIN; SET LOCAL fencegate.token = 'abc';"
            f" INSERT INTO \"{pg_schema}\".accounts (id, v) VALUES ('n', 1); COMMIT"
        )
    await admin.execute("ROLLBACK")
    assert refused.value.sqlstate == "22023"
    with pytest.raises(ValueError, match="not a fencing token"):
        async with fenced_transaction(admin, -1):
            pass
    for text in ("9223372036854775808", "99999999999999999999"):  # above bigint: refused
        with pytest.raises(asyncpg.PostgresError) as refused:
            await admin.execute(
                f"BEGIN; SET LOCAL fencegate.token = '{text}';"
                f" INSERT INTO \"{pg_schema}\".accounts (id, v) VALUES ('n', 1); COMMIT"
            )
        await admin.execute("ROLLBACK")
        assert refused.value.sqlstate == "22023", text
    with pytest.raises(ValueError, match="not a fencing token"):
        async with fenced_transaction(admin, 2**63):
            pass


async def test_every_token_the_gateway_accepts_is_a_token_here_too(
    admin: asyncpg.Connection, accounts: PostgresLegacyStore, pg_schema: str
) -> None:
    # The gateway takes any X-Fencing-Token from 1 to 2**63 - 1 (a bigint), 19 digits.
    await install(admin, pg_schema)
    big = 2**63 - 1
    async with fenced_transaction(admin, big):
        await admin.execute(f"INSERT INTO \"{pg_schema}\".accounts (id, v) VALUES ('b', 1)")
    assert await mark(admin, pg_schema, "accounts/b") == big
    with pytest.raises(asyncpg.PostgresError) as refused:
        async with fenced_transaction(admin, 10**18):  # 19 digits, below the mark
            await admin.execute(f"UPDATE \"{pg_schema}\".accounts SET v = 2 WHERE id = 'b'")
    assert refused.value.sqlstate == "FG409"
    assert await v_of(admin, pg_schema, "b") == 1


async def test_paused_direct_writer_late_update_is_refused(
    admin: asyncpg.Connection, accounts: PostgresLegacyStore, pg_dsn: str, pg_schema: str
) -> None:
    """Holder t reads in its transaction and pauses; holder t+1 writes; t's late write fails."""
    await install(admin, pg_schema)
    await accounts.put("accounts/a", "a", 1, json.dumps({"v": 10}).encode())
    paused = await asyncpg.connect(pg_dsn)
    try:
        late = fenced_transaction(paused, 2)
        await late.__aenter__()
        read = await paused.fetchval(f"SELECT v FROM \"{pg_schema}\".accounts WHERE id = 'a'")
        # The pause: meanwhile the next holder (token 3) reads and writes.
        async with fenced_transaction(admin, 3):
            await admin.execute(f"UPDATE \"{pg_schema}\".accounts SET v = v + 1 WHERE id = 'a'")
        with pytest.raises(asyncpg.PostgresError) as refused:
            await paused.execute(
                f"UPDATE \"{pg_schema}\".accounts SET v = $1 WHERE id = 'a'", read + 1
            )
        await late.__aexit__(type(refused.value), refused.value, None)
        assert refused.value.sqlstate == "FG409"
    finally:
        await paused.close()
    assert await v_of(admin, pg_schema, "a") == 11
    assert await mark(admin, pg_schema, "accounts/a") == 3


async def test_psycopg_variant(
    admin: asyncpg.Connection, accounts: PostgresLegacyStore, pg_dsn: str, pg_schema: str
) -> None:
    await install(admin, pg_schema)
    await accounts.put("accounts/a", "a", 5, json.dumps({"v": 1}).encode())

    def direct() -> str | None:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            try:
                with fenced_transaction_sync(conn, 4):
                    conn.execute(f"UPDATE \"{pg_schema}\".accounts SET v = 50 WHERE id = 'a'")
            except psycopg.Error as exc:
                stale = exc.sqlstate
            else:
                stale = None
            with fenced_transaction_sync(conn, 5):
                conn.execute(f"UPDATE \"{pg_schema}\".accounts SET v = 2 WHERE id = 'a'")
            with fenced_transaction_sync(conn, 7, lock="accounts/a"):
                conn.execute(f"UPDATE \"{pg_schema}\".accounts SET v = v + 1 WHERE id = 'a'")
            return stale

    assert await asyncio.to_thread(direct) == "FG409"
    assert await v_of(admin, pg_schema, "a") == 3
    assert await mark(admin, pg_schema, "accounts/a") == 7


async def wait_until_blocked(admin: asyncpg.Connection, pid: int) -> None:
    """Wait (bounded) until backend ``pid`` waits for a lock."""
    for _ in range(200):
        state = await admin.fetchval(
            "SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1", pid
        )
        if state == "Lock":
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"backend {pid} never waited for a lock")


async def test_upsert_takes_the_row_before_the_fence_row(
    admin: asyncpg.Connection, accounts: PostgresLegacyStore, pg_dsn: str, pg_schema: str
) -> None:
    """A holds the row (FOR UPDATE); B upserts that key; A then updates: no 40P01.

    Without the trigger locking the row on INSERT first, B's trigger took the
    fence row and waited for the row, while A's UPDATE waited for the fence row.
    """
    await admin.execute(f"INSERT INTO \"{pg_schema}\".accounts (id, v) VALUES ('a', 1)")
    await install(admin, pg_schema)
    first, second = await asyncpg.connect(pg_dsn), await asyncpg.connect(pg_dsn)
    try:
        holder = fenced_transaction(first, 2)
        await holder.__aenter__()
        await first.execute(f"SELECT v FROM \"{pg_schema}\".accounts WHERE id = 'a' FOR UPDATE")

        async def upsert() -> None:
            async with fenced_transaction(second, 3):
                await second.execute(
                    f"INSERT INTO \"{pg_schema}\".accounts (id, v) VALUES ('a', 100)"
                    " ON CONFLICT (id) DO UPDATE SET v = accounts.v + 100"
                )

        task = asyncio.create_task(upsert())
        await wait_until_blocked(admin, second.get_server_pid())
        await first.execute(f"UPDATE \"{pg_schema}\".accounts SET v = v + 1 WHERE id = 'a'")
        await holder.__aexit__(None, None, None)
        async with asyncio.timeout(10):
            await task
    finally:
        await first.close()
        await second.close()
    assert await v_of(admin, pg_schema, "a") == 102
    assert await mark(admin, pg_schema, "accounts/a") == 3


async def test_proxy_delete_queues_behind_a_direct_writer_holding_the_row(
    admin: asyncpg.Connection, accounts: PostgresLegacyStore, pg_dsn: str, pg_schema: str
) -> None:
    """A direct writer holds the row; the proxy's fenced DELETE (newer token) waits for the
    row before it raises the mark, so the direct writer's UPDATE (its mark still current)
    passes and commits, then the DELETE runs. With the mark raised first, the two waited
    for each other (40P01)."""
    await accounts.put("accounts/a", "a", 1, json.dumps({"v": 1}).encode())
    await install(admin, pg_schema)
    direct = await asyncpg.connect(pg_dsn)
    try:
        late = fenced_transaction(direct, 1)
        await late.__aenter__()
        await direct.execute(f"SELECT v FROM \"{pg_schema}\".accounts WHERE id = 'a' FOR UPDATE")
        task = asyncio.create_task(accounts.delete("accounts/a", "a", 2))
        for _ in range(200):
            waiting = await admin.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1"
                " AND wait_event_type = 'Lock'",
                pg_settings(pg_schema)["application_name"],
            )
            if waiting:
                break
            await asyncio.sleep(0.02)
        assert waiting, "the proxy's DELETE never waited for the row"
        await direct.execute(f"UPDATE \"{pg_schema}\".accounts SET v = 9 WHERE id = 'a'")
        await late.__aexit__(None, None, None)
        async with asyncio.timeout(10):
            await task
    finally:
        await direct.close()
    assert await v_of(admin, pg_schema, "a") is None
    assert await mark(admin, pg_schema, "accounts/a") == 2


async def test_an_update_that_changes_the_key_is_checked_for_both_keys(
    admin: asyncpg.Connection, accounts: PostgresLegacyStore, pg_schema: str
) -> None:
    await accounts.put("accounts/a", "a", 5, json.dumps({"v": 1}).encode())
    await accounts.put("accounts/b", "b", 9, json.dumps({"v": 2}).encode())
    await admin.execute(f"DELETE FROM \"{pg_schema}\".accounts WHERE id = 'b'")  # no trigger yet
    await install(admin, pg_schema)
    with pytest.raises(asyncpg.PostgresError) as refused:
        async with fenced_transaction(admin, 7):
            await admin.execute(f"UPDATE \"{pg_schema}\".accounts SET id = 'b' WHERE id = 'a'")
    assert refused.value.sqlstate == "FG409"
    assert "accounts/b" in str(refused.value)
    assert await v_of(admin, pg_schema, "a") == 1
    async with fenced_transaction(admin, 10):
        await admin.execute(f"UPDATE \"{pg_schema}\".accounts SET id = 'b' WHERE id = 'a'")
    assert await mark(admin, pg_schema, "accounts/a") == 10
    assert await mark(admin, pg_schema, "accounts/b") == 10


async def test_truncate_is_refused_unless_unfenced_writes_are_allowed(
    admin: asyncpg.Connection, accounts: PostgresLegacyStore, pg_schema: str
) -> None:
    # Row triggers do not fire on TRUNCATE: without a statement trigger it would empty
    # the table with no token at all, under --require-token.
    await accounts.put("accounts/a", "a", 3, json.dumps({"v": 7}).encode())
    await install(admin, pg_schema)
    truncate = f'TRUNCATE "{pg_schema}".accounts'
    with pytest.raises(asyncpg.PostgresError) as refused:
        await admin.execute(truncate)
    assert refused.value.sqlstate == "FG428"
    assert "TRUNCATE" in str(refused.value)
    with pytest.raises(asyncpg.PostgresError) as refused:
        async with fenced_transaction(admin, 5):
            await admin.execute(truncate)
    assert refused.value.sqlstate == "FG428"
    assert await v_of(admin, pg_schema, "a") == 7
    # --allow-unfenced lets unfenced writes through, a TRUNCATE too; a fenced one is
    # still refused (it cannot be checked row by row: DELETE is).
    await install(admin, pg_schema, require_token=False)
    with pytest.raises(asyncpg.PostgresError) as refused:
        async with fenced_transaction(admin, 5):
            await admin.execute(truncate)
    assert refused.value.sqlstate == "FG428"
    await admin.execute(truncate)
    assert await v_of(admin, pg_schema, "a") is None
    assert await uninstall_fencing(admin, table="accounts", schema=pg_schema) is True
    count = (
        "SELECT count(*) FROM pg_trigger WHERE tgrelid = $1::regclass AND tgname LIKE 'fencegate%'"
    )
    assert await admin.fetchval(count, f'"{pg_schema}".accounts') == 0
    # Half an install (the row trigger dropped by hand): uninstall says it removed something.
    await install(admin, pg_schema)
    await admin.execute(f'DROP TRIGGER fencegate_fence ON "{pg_schema}".accounts')
    assert await uninstall_fencing(admin, table="accounts", schema=pg_schema) is True
    assert await admin.fetchval(count, f'"{pg_schema}".accounts') == 0
    assert await uninstall_fencing(admin, table="accounts", schema=pg_schema) is False


async def test_a_block_inside_a_callers_transaction_leaves_no_token_set_after_it(
    admin: asyncpg.Connection, accounts: PostgresLegacyStore, pg_dsn: str, pg_schema: str
) -> None:
    # Inside an open transaction the block is a savepoint, where SET LOCAL would last
    # until the outer commit: a write after the block would pass with the block's token.
    await install(admin, pg_schema)
    await accounts.put("accounts/a", "a", 5, json.dumps({"v": 1}).encode())
    update = f"UPDATE \"{pg_schema}\".accounts SET v = v + 1 WHERE id = 'a'"

    async def block_then_write() -> None:
        async with admin.transaction():
            async with fenced_transaction(admin, 5):
                await admin.execute(update)
            await admin.execute(update)  # no token any more

    with pytest.raises(asyncpg.PostgresError) as refused:
        await block_then_write()
    assert refused.value.sqlstate == "FG428"
    async with admin.transaction():  # an outer token is what the block puts back
        async with fenced_transaction(admin, 6, lock="accounts/a"):
            await admin.execute(update)
        async with fenced_transaction(admin, 7):
            async with fenced_transaction(admin, 8):
                await admin.execute(update)
            with pytest.raises(asyncpg.PostgresError) as stale:
                async with admin.transaction():  # the outer 7 again, below the mark of 8
                    await admin.execute(update)
            assert stale.value.sqlstate == "FG409"
    assert await v_of(admin, pg_schema, "a") == 3
    assert await mark(admin, pg_schema, "accounts/a") == 8

    def direct() -> str | None:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            try:
                with conn.transaction():
                    with fenced_transaction_sync(conn, 8):
                        conn.execute(update)
                    conn.execute(update)
            except psycopg.Error as exc:
                return exc.sqlstate
            return None

    assert await asyncio.to_thread(direct) == "FG428"
    assert await v_of(admin, pg_schema, "a") == 3
