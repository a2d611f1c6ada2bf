"""MysqlStore and MysqlLegacyStore internals: row locks, the catalog check, values, DSNs.

The routes and codes every store shares are in tests/stores; here is what is
MySQL's own, over the real server (``FENCEGATE_TEST_MYSQL_DSN``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import asyncpg
import pytest

from storage_adapters import (
    BadValue,
    MysqlLegacyStore,
    MysqlStore,
    NotFound,
    StaleToken,
    StorageError,
    StorageUnavailable,
    StoreMisconfigured,
    TableMismatch,
)
from storage_adapters._mysql import parse_dsn, quote_ident, scope_sha
from tests._servers import free_port
from tests.conftest import mysql_connect, with_credentials


async def sql(dsn: str, *statements: str) -> None:
    conn = await mysql_connect(dsn)
    try:
        async with conn.cursor() as cur:
            for statement in statements:
                await cur.execute(statement)
    finally:
        conn.close()


ACCOUNTS = (
    "CREATE TABLE accounts (id VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin PRIMARY KEY,"
    " v BIGINT, note VARCHAR(8), balance DECIMAL(12,2), opened DATE) ENGINE=InnoDB"
)


def legacy(
    dsn: str, *, table: str = "accounts", key_column: str = "id",
    columns: Sequence[str] = ("v", "note", "balance", "opened"),
) -> MysqlLegacyStore:  # fmt: skip
    return MysqlLegacyStore(
        "accounts", dsn, table=table, key_column=key_column, columns=columns, pool_max=2
    )


def test_legacy_configuration_mistakes_are_caught_at_construction() -> None:
    dsn = "mysql://root@127.0.0.1:3306/test"  # not reached: construction opens nothing
    with pytest.raises(ValueError, match="key column 'id'"):
        legacy(dsn, columns=["id", "v"])
    with pytest.raises(ValueError, match="repeats"):
        legacy(dsn, columns=["v", "v"])
    with pytest.raises(ValueError, match="not a name"):
        legacy(dsn, columns=["v", "a\x00b"])
    with pytest.raises(ValueError, match="table has value ''"):
        legacy(dsn, table="")


@pytest.fixture
async def accounts(mysql_dsn: str) -> AsyncIterator[MysqlLegacyStore]:
    await sql(mysql_dsn, ACCOUNTS)
    async with legacy(mysql_dsn) as store:
        yield store


@pytest.fixture
async def kv(mysql_dsn: str) -> AsyncIterator[MysqlStore]:
    async with MysqlStore("kv", mysql_dsn, pool_max=4) as store:
        yield store


# -- row locks ------------------------------------------------------------------------------


async def holding_the_fence(dsn: str, scope: str, token: int, *statements: str) -> Any:
    """Another writer inside its transaction: the mark raised to ``token``, not committed."""
    conn = await mysql_connect(dsn)
    async with conn.cursor() as cur:
        await cur.execute("BEGIN")
        await cur.execute(
            "INSERT INTO fencegate_fence VALUES (%s, %s, %s, NOW(6))"
            " ON DUPLICATE KEY UPDATE token = %s",
            (scope_sha(scope), scope, token, token),
        )
        for statement in statements:
            await cur.execute(statement)
    return conn


async def test_write_that_waited_for_the_fence_row_is_checked_against_the_committed_mark(
    kv: MysqlStore, mysql_dsn: str
) -> None:
    await kv.put("s", "k", 5, b"five")
    other = await holding_the_fence(
        mysql_dsn, "s", 6, "UPDATE fencegate_kv SET value = 'six', token = 6 WHERE `key` = 'k'"
    )
    late = asyncio.create_task(kv.put("s", "k", 5, b"five again"))
    await asyncio.sleep(0.5)
    assert not late.done()  # queued behind the other writer of the scope
    await other.commit()
    other.close()
    with pytest.raises(StaleToken) as caught:
        await late
    assert caught.value.high_water == 6
    record = await kv.get("s", "k", None)
    assert (record.body, record.token) == (b"six", 6)


async def test_fenced_read_that_waited_for_a_write_returns_that_write(
    kv: MysqlStore, mysql_dsn: str
) -> None:
    """REPEATABLE READ (the server default) must not hand the reader an older snapshot."""
    await kv.put("s", "k", 5, b"five")
    other = await holding_the_fence(
        mysql_dsn, "s", 6, "UPDATE fencegate_kv SET value = 'six', token = 6 WHERE `key` = 'k'"
    )
    read = asyncio.create_task(kv.get("s", "k", 7))
    await asyncio.sleep(0.5)
    assert not read.done()
    await other.commit()
    other.close()
    record = await read
    assert (record.body, record.token) == (b"six", 6)
    with pytest.raises(StaleToken):
        await kv.put("s", "k", 6, b"lost update")


async def test_writers_of_one_key_under_two_scopes_both_land(kv: MysqlStore) -> None:
    """Two scopes can insert one missing key at once; a deadlock victim runs again."""
    for round_ in range(20):
        key = f"new/{round_}"
        await asyncio.gather(
            kv.put("scope-a", key, 1 + round_, b"a"), kv.put("scope-b", key, 1 + round_, b"b")
        )
        assert (await kv.get("x", key, None)).body in (b"a", b"b")


async def test_keys_compare_byte_for_byte(kv: MysqlStore) -> None:
    await kv.put("s", "Key", 1, b"upper")
    await kv.put("s", "key", 1, b"lower")
    assert (await kv.get("s", "Key", None)).body == b"upper"
    assert (await kv.get("s", "key", None)).body == b"lower"


async def test_commands_on_a_hung_server_time_out_as_unavailable(mysql_dsn: str) -> None:
    """A stalled connection (lock wait past command_timeout) is 503, and the pool recovers."""
    async with MysqlStore("kv", mysql_dsn, command_timeout=1.0) as kv:
        await kv.put("s", "k", 1, b"one")
        other = await holding_the_fence(mysql_dsn, "s", 2)
        with pytest.raises(StorageUnavailable):
            await kv.put("s", "k", 2, b"two")
        await other.rollback()
        other.close()
        await kv.put("s", "k", 2, b"two")
        assert (await kv.get("s", "k", None)).body == b"two"


# -- the catalog -------------------------------------------------------------------------------


async def test_missing_table_is_named_and_nothing_is_created(mysql_dsn: str) -> None:
    with pytest.raises(TableMismatch, match="does not exist"):
        await legacy(mysql_dsn, table="nope").start()
    conn = await mysql_connect(mysql_dsn)
    try:
        async with conn.cursor() as cur:
            await cur.execute("SHOW TABLES")
            assert await cur.fetchall() in ((), [])
    finally:
        conn.close()


async def test_every_missing_column_is_named(mysql_dsn: str) -> None:
    await sql(mysql_dsn, ACCOUNTS)
    with pytest.raises(TableMismatch) as caught:
        await legacy(mysql_dsn, key_column="ident", columns=["v", "nope", "gone"]).start()
    text = str(caught.value)
    for name in ("'ident'", "'nope'", "'gone'"):
        assert name in text


@pytest.mark.parametrize(
    ("ddl", "columns", "problem"),
    [
        ("CREATE TABLE t (id VARCHAR(9), v INT) ENGINE=InnoDB", ["v"], "no single-column unique"),
        ("CREATE TABLE t (id VARCHAR(9), w INT, v INT, UNIQUE (id, w)) ENGINE=InnoDB", ["v"],
         "no single-column unique"),
        ("CREATE TABLE t (id TEXT, v INT, UNIQUE (id(10))) ENGINE=InnoDB", ["v"],
         "no single-column unique"),
        ("CREATE TABLE t (id DATE PRIMARY KEY, v INT) ENGINE=InnoDB", ["v"], "is date"),
        ("CREATE TABLE t (id INT PRIMARY KEY, v INT, g INT AS (v + 1)) ENGINE=InnoDB", ["g"],
         "generated"),
        ("CREATE TABLE t (id INT PRIMARY KEY, v INT) ENGINE=MyISAM", ["v"], "only InnoDB"),
        ("CREATE VIEW t AS SELECT 1 AS id, 2 AS v", ["v"], "is not a table"),
    ],
)  # fmt: skip
async def test_tables_fencegate_cannot_protect_are_refused(
    mysql_dsn: str, ddl: str, columns: list[str], problem: str
) -> None:
    await sql(mysql_dsn, ddl)
    with pytest.raises(TableMismatch, match=problem):
        await legacy(mysql_dsn, table="t", columns=columns).start()


async def test_odd_identifiers_are_quoted(mysql_dsn: str) -> None:
    await sql(
        mysql_dsn,
        "CREATE TABLE `we``ird tab` (`the key` INT PRIMARY KEY, `a``b` TEXT, `select` INT)"
        " ENGINE=InnoDB",
    )
    async with legacy(
        mysql_dsn, table="we`ird tab", key_column="the key", columns=["a`b", "select"]
    ) as store:
        await store.put("s", "7", 1, json.dumps({"a`b": "x", "select": 3}).encode())
        row = json.loads((await store.get("s", "7", None)).body)
    assert row == {"the key": 7, "a`b": "x", "select": 3}
    assert quote_ident("a`b") == "`a``b`"


# -- values ------------------------------------------------------------------------------------


async def test_a_value_the_column_refuses_writes_nothing_not_even_the_mark(
    accounts: MysqlLegacyStore,
) -> None:
    await accounts.put("s", "a1", 1, b'{"note": "ok", "balance": "1.50"}')
    for body in (b'{"balance": "abc"}', b'{"note": "longer than eight"}', b'{"opened": "x"}',
                 b'{"v": 1e400}', b'{"v": NaN}'):  # fmt: skip
        with pytest.raises(BadValue):
            await accounts.put("s", "a1", 9, body)
    # the refused writes did not raise the mark: token 2 still writes
    await accounts.put("s", "a1", 2, b'{"v": 5}')
    row = json.loads((await accounts.get("s", "a1", None)).body)
    assert row == {"id": "a1", "v": 5, "note": "ok", "balance": 1.5, "opened": None}


async def test_only_the_columns_in_the_body_are_written(accounts: MysqlLegacyStore) -> None:
    await accounts.put("s", "a1", 1, b'{"v": 1, "note": "one", "opened": "2024-02-29"}')
    await accounts.put("s", "a1", 1, b'{"note": null}')
    await accounts.put("s", "a2", 1, b"{}")
    one = json.loads((await accounts.get("s", "a1", None)).body)
    assert one == {"id": "a1", "v": 1, "note": None, "balance": None, "opened": "2024-02-29"}
    assert json.loads((await accounts.get("s", "a2", None)).body)["v"] is None


@pytest.mark.parametrize(
    "collation",
    ["utf8mb4_general_ci", "utf8mb4_unicode_ci", "latin1_swedish_ci", "ascii_general_ci"],
)
async def test_a_case_insensitive_key_column_is_refused(mysql_dsn: str, collation: str) -> None:
    """'Key' and 'key' are one row there: two lock names, two fence scopes for one row."""
    charset = collation.split("_")[0]
    await sql(mysql_dsn, f"CREATE TABLE ci (id VARCHAR(9) CHARACTER SET {charset}"
              f" COLLATE {collation} PRIMARY KEY, v INT) ENGINE=InnoDB")  # fmt: skip
    with pytest.raises(TableMismatch, match=f"collation '{collation}'.*COLLATE {charset}_bin"):
        await legacy(mysql_dsn, table="ci", columns=["v"]).start()
    await sql(mysql_dsn, f"ALTER TABLE ci MODIFY id VARCHAR(9) CHARACTER SET {charset}"
              f" COLLATE {charset}_bin")  # fmt: skip
    async with legacy(mysql_dsn, table="ci", columns=["v"]) as store:
        await store.put("s", "Key", 1, b'{"v": 1}')
        await store.put("s", "key", 1, b'{"v": 2}')
        assert json.loads((await store.get("s", "Key", None)).body)["v"] == 1


async def test_integer_key_column(mysql_dsn: str) -> None:
    await sql(mysql_dsn, "CREATE TABLE n (id BIGINT PRIMARY KEY, v INT) ENGINE=InnoDB")
    async with legacy(mysql_dsn, table="n", columns=["v"]) as store:
        await store.put("s", "42", 1, b'{"v": 1}')
        assert json.loads((await store.get("s", "42", None)).body) == {"id": 42, "v": 1}
        for key in ("abc", "4.2", "1e3", "0x10"):
            with pytest.raises(BadValue, match="not an integer"):
                await store.put("s", key, 1, b'{"v": 2}')
            with pytest.raises(BadValue):
                await store.get("s", key, None)
        with pytest.raises(NotFound):
            await store.get("s", "0", None)  # "abc" was never stored as 0
        # one text per row: "042" is the row of "42", under another lock name
        for alias in ("042", "0042", "-0", "-042"):
            with pytest.raises(BadValue, match="without leading zeros"):
                await store.put(f"n/{alias}", alias, 1, b'{"v": 3}')
            with pytest.raises(BadValue, match="without leading zeros"):
                await store.delete(f"n/{alias}", alias, 1)
        for key in ("9223372036854775808", "-9223372036854775809", "99999999999999999999"):
            with pytest.raises(BadValue, match="out of the range"):
                await store.put("s", key, 1, b'{"v": 4}')
        await store.put("s", "-9223372036854775808", 1, b'{"v": 5}')
        assert json.loads((await store.get("s", "42", None)).body) == {"id": 42, "v": 1}


async def test_unsigned_and_small_integer_key_ranges(mysql_dsn: str) -> None:
    await sql(mysql_dsn, "CREATE TABLE n (id TINYINT UNSIGNED PRIMARY KEY, v INT) ENGINE=InnoDB")
    async with legacy(mysql_dsn, table="n", columns=["v"]) as store:
        await store.put("s", "255", 1, b'{"v": 1}')
        await store.put("s", "0", 1, b'{"v": 1}')
        for key in ("256", "-1"):
            with pytest.raises(BadValue, match=r"out of the range 0\.\.255"):
                await store.put("s", key, 1, b'{"v": 2}')


async def test_blob_columns_read_back_as_valid_compact_json(mysql_dsn: str) -> None:
    await sql(mysql_dsn, "CREATE TABLE b (id INT PRIMARY KEY, v BLOB) ENGINE=InnoDB")
    async with legacy(mysql_dsn, table="b", columns=["v"]) as store:
        await store.put("s", "1", 1, b'{"v": "caf\\u00e9 ok"}')
        assert (await store.get("s", "1", None)).body == '{"id":1,"v":"café ok"}'.encode()
        await sql(mysql_dsn, "INSERT INTO b VALUES (2, 0x61ff62)")  # not UTF-8, by another writer
        body = (await store.get("s", "2", None)).body
        assert json.loads(body) == {"id": 2, "v": "a\ufffdb"}


async def test_rows_written_outside_fencegate_have_no_token(
    accounts: MysqlLegacyStore, mysql_dsn: str
) -> None:
    await sql(mysql_dsn, "INSERT INTO accounts (id, v) VALUES ('ext', 3)")
    record = await accounts.get("s", "ext", None)
    assert record.token is None
    assert json.loads(record.body)["v"] == 3
    await accounts.delete("s", "ext", 4)
    with pytest.raises(NotFound):
        await accounts.get("s", "ext", None)


# -- configuration and reachability ---------------------------------------------------------


@pytest.mark.parametrize(
    ("dsn", "problem"),
    [
        ("postgresql://u@h/db", "not a mysql://"),
        ("mysql://u@h", "names no database"),
        ("mysql://u@h/a/b", "names no database"),
        ("mysql://u@h:99999/db", "not a mysql://"),
        ("mysql://u@h/db?ssl=1", r"takes no \?options"),
    ],
)
def test_bad_dsns_are_refused_at_construction(dsn: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        MysqlStore("kv", dsn)


def test_dsn_parts_are_unquoted() -> None:
    d = parse_dsn("mysql://us%40er:p%3Ass@127.0.0.1:3307/my%20db")
    assert (d.user, d.password, d.host, d.port, d.database) == (
        "us@er", "p:ss", "127.0.0.1", 3307, "my db",
    )  # fmt: skip


async def test_unreachable_server_is_storage_unavailable() -> None:
    store = MysqlStore("kv", f"mysql://root@127.0.0.1:{free_port()}/test", connect_timeout=2)
    with pytest.raises(StorageUnavailable):
        await store.start()


async def test_wrong_credentials_are_a_configuration_error(mysql_dsn: str) -> None:
    dsn = with_credentials(mysql_dsn, "fencegate_nobody", "wrong")
    with pytest.raises(StorageError, match="1045") as caught:
        await MysqlStore("kv", dsn).start()
    assert not isinstance(caught.value, StorageUnavailable)
    assert "wrong" not in str(caught.value)


async def test_a_missing_database_is_a_configuration_error(mysql_dsn: str) -> None:
    dsn = mysql_dsn.rsplit("/", 1)[0] + "/fencegate_no_such_db"
    with pytest.raises(StorageError, match="1049") as caught:
        await MysqlStore("kv", dsn).start()
    assert not isinstance(caught.value, StorageUnavailable)


async def test_a_cancelled_write_leaves_no_lock_and_the_store_works(
    kv: MysqlStore, mysql_dsn: str
) -> None:
    await kv.put("s", "k", 1, b"one")
    other = await holding_the_fence(mysql_dsn, "s", 2)
    waiting = asyncio.create_task(kv.put("s", "k", 3, b"three"))
    await asyncio.sleep(0.3)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await other.rollback()
    other.close()
    # nothing of the cancelled write, and no lock of it left behind
    async with asyncio.timeout(5):
        assert (await kv.get("s", "k", None)).body == b"one"
        await kv.put("s", "k", 2, b"two")
        assert (await kv.get("s", "k", 2)).body == b"two"


async def test_repeated_refusals_leave_the_store_working(kv: MysqlStore) -> None:
    await kv.put("s", "k", 5, b"five")
    for _ in range(12):  # more than the pool holds
        with pytest.raises(StaleToken):
            await kv.put("s", "k", 4, b"four")
    assert (await kv.get("s", "k", 5)).body == b"five"


@pytest.mark.parametrize(
    ("table", "make"),
    [
        ("fencegate_kv", lambda dsn: MysqlStore("kv", dsn, pool_max=2)),
        ("fencegate_legacy_token", lambda dsn: legacy(dsn)),
    ],
)
async def test_a_case_insensitive_key_table_of_fencegate_is_refused_until_altered(
    mysql_dsn: str, table: str, make: Any
) -> None:
    """A hand-made table of fencegate's keyed case-insensitively: "Key" and "key" share a row."""
    await sql(mysql_dsn, ACCOUNTS)
    await sql(mysql_dsn, f"CREATE TABLE {table} (store VARCHAR(64) NOT NULL,"
              " `key` VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci NOT NULL,"
              " value LONGBLOB, content_type VARCHAR(255), token BIGINT NULL,"
              " updated_at DATETIME(6), PRIMARY KEY (store, `key`)) ENGINE=InnoDB")  # fmt: skip
    with pytest.raises(StoreMisconfigured, match="utf8mb4_general_ci") as caught:
        await make(mysql_dsn).start()
    alter = str(caught.value).split("with ", 1)[1].split(" (fails", 1)[0]
    assert alter.startswith(f"ALTER TABLE {table} MODIFY `key`")
    await sql(mysql_dsn, alter)
    async with make(mysql_dsn) as store:
        await store.put("s", "Key", 1, b'{"v": 1}')
        await store.put("s", "key", 1, b'{"v": 2}')
        assert json.loads((await store.get("s", "Key", None)).body)["v"] == 1
        assert json.loads((await store.get("s", "key", None)).body)["v"] == 2


async def test_a_column_dropped_under_a_running_store_is_a_configuration_error(
    accounts: MysqlLegacyStore, mysql_dsn: str
) -> None:
    from gateway.errors import status_of
    from storage_adapters.errors import StoreMisconfigured

    await accounts.put("accounts/a", "a", 1, b'{"v": 1}')
    await sql(mysql_dsn, "ALTER TABLE accounts DROP COLUMN note")
    with pytest.raises(StoreMisconfigured, match="note") as refused:
        await accounts.get("accounts/a", "a", None)
    assert status_of(refused.value) == 503
    with pytest.raises(StoreMisconfigured, match="note"):
        await accounts.put("accounts/a", "a", 1, b'{"note": "x"}')


# -- values PostgreSQL refuses are refused here too --------------------------------------------

# The same columns on both servers; PostgreSQL converts a JSON value with the column's
# input function (jsonb_to_record), MariaDB would round 1.5 into an INT and take true as 1.
TYPED_PG = ("id text PRIMARY KEY, i integer, s smallint, b bigint, d numeric(12,2),"
            " f double precision, t text")  # fmt: skip
TYPED_MYSQL = (
    "CREATE TABLE typed (id VARCHAR(9) CHARACTER SET ascii COLLATE ascii_bin PRIMARY KEY,"
    " i INT, s SMALLINT, b BIGINT, d DECIMAL(12,2), f DOUBLE, t VARCHAR(40), flag BOOLEAN)"
    " ENGINE=InnoDB"
)
TYPED_COLUMNS = ("i", "s", "b", "d", "f", "t")
TYPED_BODIES = (
    # integer columns: a number with a fraction in its text, a bool, a string that is
    # not an integer's text: refused; an exponent that leaves no fraction is an integer
    '{"i": 1.5}', '{"i": 2.0}', '{"i": 100.00}', '{"i": 1.50e1}', '{"i": true}',
    '{"i": false}', '{"i": "5.0"}', '{"i": "5.5"}', '{"i": "1e2"}', '{"i": "abc"}',
    '{"i": 1e2}', '{"i": 1.0e1}', '{"i": 7}', '{"i": -0}', '{"i": "5"}', '{"i": " 5 "}',
    '{"i": "+5"}', '{"i": "-12"}', '{"i": null}', '{"s": 2.5}', '{"s": true}',
    '{"b": 9.75}', '{"b": true}', '{"b": 9223372036854775807}',
    # decimal and float columns: bools refused, fractions kept or rounded
    '{"d": true}', '{"d": 1.555}', '{"d": "5.0"}', '{"d": 1e2}', '{"f": true}',
    '{"f": false}', '{"f": 1.5}', '{"f": "2.5"}',
    # text: numbers and bools are text
    '{"t": 1.5}', '{"t": true}', '{"t": "x"}',
)  # fmt: skip


async def _outcome(store: Any, token: int, body: str) -> int | str | None:
    """The integer value read back from the column written, or "refused"."""
    column = next(iter(json.loads(body)))
    try:
        await store.put("s", "k1", token, body.encode())
    except BadValue:
        return "refused"
    row = json.loads((await store.get("s", "k1", None)).body)
    value = row[column]
    return value if column in ("i", "s", "b") else None


async def test_a_value_postgresql_refuses_for_its_column_is_refused_here_too(
    mysql_dsn: str, pg_dsn: str, pg_schema: str
) -> None:
    """Each body against the same table on PostgreSQL and on MariaDB: refused (400
    bad_request, BadValue) on one exactly when on the other, and an integer column
    reads back the same number where both accept it."""
    from storage_adapters import PostgresLegacyStore

    await sql(mysql_dsn, TYPED_MYSQL)
    conn = await asyncpg.connect(pg_dsn)
    try:
        await conn.execute(f'CREATE TABLE "{pg_schema}".typed ({TYPED_PG})')
    finally:
        await conn.close()
    pg = PostgresLegacyStore("typed", pg_dsn, schema=pg_schema, table="typed", key_column="id",
                             columns=TYPED_COLUMNS, pool_max=2)  # fmt: skip
    my = MysqlLegacyStore("typed", mysql_dsn, table="typed", key_column="id",
                          columns=(*TYPED_COLUMNS, "flag"), pool_max=2)  # fmt: skip
    differ = []
    async with pg, my:
        for token, body in enumerate(TYPED_BODIES, start=1):
            want, got = await _outcome(pg, token, body), await _outcome(my, token, body)
            if want != got:
                differ.append(f"{body}: postgresql {want!r}, mariadb {got!r}")
        assert not differ, "\n".join(differ)
        refused = [b for b in TYPED_BODIES if await _outcome(pg, 1000, b) == "refused"]
        assert len(refused) == 17, refused  # the list is not all one way
        # MySQL's BOOLEAN is TINYINT(1): true and false are its values (as PostgreSQL's
        # boolean takes them), a fraction is not
        await my.put("k2", "k2", 1, b'{"flag": true, "t": "kept"}')
        assert json.loads((await my.get("k2", "k2", None)).body)["flag"] == 1
        with pytest.raises(BadValue, match="'flag'"):
            await my.put("k2", "k2", 2, b'{"flag": 1.5}')
        # a refused value writes nothing, not even the other columns or the mark
        with pytest.raises(BadValue, match=r"column 'i'.*1\.5"):
            await my.put("k2", "k2", 9, b'{"t": "changed", "i": 1.5}')
        await my.put("k2", "k2", 3, b'{"f": 0.5}')  # token 3 < 9: the mark was not raised
        assert json.loads((await my.get("k2", "k2", None)).body)["t"] == "kept"
