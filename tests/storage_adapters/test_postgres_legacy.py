"""PostgresLegacyStore: an existing table, checked against the catalog, written as it is."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence

import asyncpg
import pytest

from storage_adapters import (
    BadValue,
    NotFound,
    PostgresLegacyStore,
    StaleToken,
    StorageError,
    TableMismatch,
)
from tests.storage_adapters.conftest import create_accounts, pg_settings


def legacy(
    pg_dsn: str,
    schema: str,
    *,
    table: str = "accounts",
    key_column: str = "id",
    columns: Sequence[str] = ("v", "note", "balance", "opened"),
) -> PostgresLegacyStore:
    return PostgresLegacyStore(
        "accounts",
        pg_dsn,
        table=table,
        key_column=key_column,
        columns=columns,
        schema=schema,
        pool_max=2,
        server_settings=pg_settings(schema),
    )


@pytest.fixture
async def accounts(pg_dsn: str, pg_schema: str) -> AsyncIterator[PostgresLegacyStore]:
    await create_accounts(pg_dsn, pg_schema)
    async with legacy(pg_dsn, pg_schema) as store:
        yield store


async def test_missing_table_is_named(pg_dsn: str, pg_schema: str) -> None:
    with pytest.raises(TableMismatch) as caught:
        await legacy(pg_dsn, pg_schema, table="nope").start()
    assert caught.value.problems == [f"table '{pg_schema}.nope' does not exist"]
    assert "nope" in str(caught.value)


async def test_every_missing_column_is_named(pg_dsn: str, pg_schema: str) -> None:
    await create_accounts(pg_dsn, pg_schema)
    store = legacy(pg_dsn, pg_schema, key_column="ident", columns=["v", "colour", "size"])
    with pytest.raises(TableMismatch) as caught:
        await store.start()
    assert caught.value.problems == [
        "key column 'ident' does not exist",
        "column 'colour' does not exist",
        "column 'size' does not exist",
    ]
    with pytest.raises(StorageError):  # it did not start
        await store.ping()


async def test_key_column_needs_a_unique_index(pg_dsn: str, pg_schema: str) -> None:
    await create_accounts(pg_dsn, pg_schema)
    with pytest.raises(TableMismatch) as caught:
        await legacy(pg_dsn, pg_schema, key_column="note", columns=["v"]).start()
    assert caught.value.problems == [
        "key column 'note' has no single-column unique index or constraint"
    ]


async def test_views_and_generated_columns_are_refused(
    admin: asyncpg.Connection, pg_dsn: str, pg_schema: str
) -> None:
    await create_accounts(pg_dsn, pg_schema)
    await admin.execute(
        f'CREATE VIEW "{pg_schema}".accounts_view AS SELECT * FROM "{pg_schema}".accounts'
    )
    with pytest.raises(TableMismatch, match="is not a table"):
        await legacy(pg_dsn, pg_schema, table="accounts_view").start()
    await admin.execute(
        f'ALTER TABLE "{pg_schema}".accounts'
        " ADD COLUMN twice bigint GENERATED ALWAYS AS (v * 2) STORED"
    )
    with pytest.raises(TableMismatch, match="'twice' is generated"):
        await legacy(pg_dsn, pg_schema, columns=["v", "twice"]).start()


def test_configuration_mistakes_are_caught_at_construction(pg_dsn: str) -> None:
    with pytest.raises(ValueError, match="key column 'id'"):
        legacy(pg_dsn, "public", columns=["id", "v"])
    with pytest.raises(ValueError, match="repeats"):
        legacy(pg_dsn, "public", columns=["v", "v"])
    with pytest.raises(ValueError, match="not a name"):
        legacy(pg_dsn, "public", columns=[""])


async def row(admin: asyncpg.Connection, schema: str, key: str) -> dict[str, object] | None:
    found = await admin.fetchrow(f'SELECT * FROM "{schema}".accounts WHERE id = $1', key)
    return dict(found) if found is not None else None


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"v": 1, "colour": "red"}', "unknown column(s) 'colour'"),
        (b"not json", "body is not JSON"),
        (b"\xff\xfe{}", "body is not JSON"),
        (b'[{"v": 1}]', "must be a JSON object"),
        (b'"v"', "must be a JSON object"),
        (b'{"v": NaN}', "body is not JSON"),
        (b'{"id": "other", "v": 1}', "key column 'id' is set by the key in the URL"),
        (b'{"v": "twelve"}', "invalid input syntax for type bigint"),
        (b'{"v": 1.5}', "invalid input syntax for type bigint"),
        (b'{"balance": 12345678901234.5}', "numeric field overflow"),
        (b'{"opened": "yesterday-ish"}', "invalid input syntax for type date"),
    ],
)
async def test_bad_bodies_write_nothing(
    accounts: PostgresLegacyStore,
    admin: asyncpg.Connection,
    pg_schema: str,
    body: bytes,
    message: str,
) -> None:
    await accounts.put("s", "a", 5, b'{"v": 1, "note": "kept"}')
    before = await row(admin, pg_schema, "a")
    with pytest.raises(BadValue) as caught:
        await accounts.put("s", "a", 9, body)
    assert message in str(caught.value)
    assert caught.value.code == "bad_request"
    assert await row(admin, pg_schema, "a") == before
    # nor was the mark raised to 9, nor the key's token changed
    assert await accounts.put("s", "a", 6, b"{}") == 6
    assert (await accounts.get("s", "a", None)).token == 6


async def test_get_returns_the_row_as_json(accounts: PostgresLegacyStore) -> None:
    await accounts.put(
        "s",
        "a",
        3,
        b'{"v": 9007199254740993, "note": "h\\u00e9", "balance": "10.505", "opened": "2024-02-29"}',
    )
    record = await accounts.get("s", "a", None)
    assert record.content_type == "application/json"
    assert record.token == 3
    # bigint beyond 2**53 and numeric stay exact JSON numbers; a date is an ISO string
    assert record.body.decode() == (
        '{"id":"a","v":9007199254740993,"note":"hé","balance":10.51,"opened":"2024-02-29"}'
    )


async def test_only_the_columns_in_the_body_are_written(
    accounts: PostgresLegacyStore, admin: asyncpg.Connection, pg_schema: str
) -> None:
    await accounts.put("s", "a", 1, b'{"v": 1, "note": "first"}')
    await accounts.put("s", "a", 1, b'{"v": 2}')
    assert await row(admin, pg_schema, "a") == {
        "id": "a",
        "v": 2,
        "note": "first",
        "balance": None,
        "opened": None,
    }
    await accounts.put("s", "a", 1, b'{"note": null}')
    assert json.loads((await accounts.get("s", "a", None)).body)["note"] is None


async def test_sql_metacharacters_are_stored_literally(
    admin: asyncpg.Connection, pg_dsn: str, pg_schema: str
) -> None:
    table = 'Odd "Table"; DROP TABLE x; --'
    await admin.execute(
        f'CREATE TABLE "{pg_schema}"."Odd ""Table""; DROP TABLE x; --" ('
        ' "Key Col" text PRIMARY KEY, "v\'; DELETE FROM y; --" text, "$1" text)'
    )
    hostile = "'); DROP TABLE accounts; -- $1 %s \\ \" ; /*"
    async with legacy(
        pg_dsn,
        pg_schema,
        table=table,
        key_column="Key Col",
        columns=["v'; DELETE FROM y; --", "$1"],
    ) as store:
        key = "1--1:/~._-"  # the SQL-ish characters of the key alphabet
        body = json.dumps({"v'; DELETE FROM y; --": hostile, "$1": "$2"}).encode()
        await store.put("s", key, 1, body)
        record = await store.get("s", key, 1)
        assert json.loads(record.body) == {
            "Key Col": key,
            "v'; DELETE FROM y; --": hostile,
            "$1": "$2",
        }
        stored = await admin.fetchrow(
            f'SELECT * FROM "{pg_schema}"."Odd ""Table""; DROP TABLE x; --"'
        )
        assert dict(stored) == {"Key Col": key, "v'; DELETE FROM y; --": hostile, "$1": "$2"}
        await store.delete("s", key, 2)
        with pytest.raises(NotFound):
            await store.get("s", key, None)


async def test_integer_key_column(admin: asyncpg.Connection, pg_dsn: str, pg_schema: str) -> None:
    await admin.execute(
        f'CREATE TABLE "{pg_schema}".items (id bigint PRIMARY KEY, qty integer NOT NULL DEFAULT 0,'
        " price numeric(8,2), seen timestamptz)"
    )
    async with legacy(pg_dsn, pg_schema, table="items", columns=["qty", "price", "seen"]) as store:
        await store.put("s", "42", 4, b'{"qty": 3, "price": 1.5, "seen": "2024-01-02T03:04:05Z"}')
        assert await admin.fetchval(f'SELECT qty FROM "{pg_schema}".items WHERE id = 42') == 3
        record = await store.get("s", "42", None)
        assert json.loads(record.body) == {
            "id": 42,
            "qty": 3,
            "price": 1.5,
            "seen": "2024-01-02T03:04:05+00:00",
        }
        # "042" would be the same row under another lock name: refused, naming "42"
        with pytest.raises(BadValue, match="row of key '42'"):
            await store.get("s", "042", None)
        await store.put("s", "42", 4, b"{}")  # no column: the row is left as it is
        assert json.loads((await store.get("s", "42", None)).body)["qty"] == 3
        with pytest.raises(BadValue, match="not an integer"):
            await store.put("s", "forty-two", 5, b'{"qty": 1}')
        with pytest.raises(BadValue, match="not-null"):
            await store.put("s", "43", 5, b'{"qty": null}')
        with pytest.raises(NotFound):
            await store.get("s", "44", None)


async def test_rows_written_outside_fencegate_have_no_token(
    accounts: PostgresLegacyStore, admin: asyncpg.Connection, pg_schema: str
) -> None:
    await admin.execute(f"INSERT INTO \"{pg_schema}\".accounts (id, v) VALUES ('ext', 1)")
    record = await accounts.get("s", "ext", None)
    assert (json.loads(record.body)["v"], record.token) == (1, None)
    await accounts.put("s", "ext", 2, b'{"v": 2}')
    await accounts.delete("s", "ext", 3)
    # the token row went with the data row
    await admin.execute(f"INSERT INTO \"{pg_schema}\".accounts (id, v) VALUES ('ext', 4)")
    assert (await accounts.get("s", "ext", None)).token is None


async def test_stale_write_leaves_row_and_token(
    accounts: PostgresLegacyStore, admin: asyncpg.Connection, pg_schema: str
) -> None:
    await accounts.put("s", "a", 5, b'{"v": 5}')
    with pytest.raises(StaleToken):
        await accounts.put("s", "a", 4, b'{"v": 4, "note": "late"}')
    assert await row(admin, pg_schema, "a") == {
        "id": "a",
        "v": 5,
        "note": None,
        "balance": None,
        "opened": None,
    }
    assert (await accounts.get("s", "a", None)).token == 5


# -- one text per row ---------------------------------------------------------------------------


async def test_integer_keys_have_one_text_per_row(
    admin: asyncpg.Connection, pg_dsn: str, pg_schema: str
) -> None:
    """'7' and '007' are one row: only '7' is a key, else two lock names would share it."""
    await admin.execute(f'CREATE TABLE "{pg_schema}".n (id integer PRIMARY KEY, v bigint)')
    async with legacy(pg_dsn, pg_schema, table="n", columns=["v"]) as store:
        await store.put("n/7", "7", 5, b'{"v": 1}')
        for alias in ("007", "07", "-0", "-07"):
            with pytest.raises(BadValue, match="without leading zeros"):
                await store.put(f"n/{alias}", alias, 1, b'{"v": 2}')
            with pytest.raises(BadValue):
                await store.get(f"n/{alias}", alias, 1)
            with pytest.raises(BadValue):
                await store.delete(f"n/{alias}", alias, 1)
        for key in ("2147483648", "-2147483649", "abc", "7.0", "1e3"):
            with pytest.raises(BadValue):
                await store.put("n/x", key, 1, b'{"v": 2}')
        await store.put("n/0", "0", 1, b'{"v": 0}')
        await store.put("n/-2147483648", "-2147483648", 1, b'{"v": 3}')
        assert json.loads((await store.get("n/7", "7", None)).body) == {"id": 7, "v": 1}
        assert (await store.get("n/7", "7", None)).token == 5


async def test_uuid_keys_are_lowercase_and_hyphenated(
    admin: asyncpg.Connection, pg_dsn: str, pg_schema: str
) -> None:
    await admin.execute(f'CREATE TABLE "{pg_schema}".u (id uuid PRIMARY KEY, v bigint)')
    key = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
    async with legacy(pg_dsn, pg_schema, table="u", columns=["v"]) as store:
        await store.put(f"u/{key}", key, 1, b'{"v": 1}')
        for alias in (key.upper(), key.replace("-", ""), "urn:uuid:" + key):
            with pytest.raises(BadValue, match=key):
                await store.put(f"u/{alias}", alias, 1, b'{"v": 2}')
        with pytest.raises(BadValue, match="not a UUID"):
            await store.put("u/x", "not-a-uuid", 1, b'{"v": 2}')
        assert json.loads((await store.get("u", key, None)).body)["v"] == 1


@pytest.mark.parametrize(
    ("column", "problem"),
    [
        ("numeric PRIMARY KEY", "has type 'numeric'"),
        ("date PRIMARY KEY", "has type 'date'"),
        ("boolean PRIMARY KEY", "has type 'boolean'"),
        ("text COLLATE {schema}.nd PRIMARY KEY", "non-deterministic collation 'nd'"),
    ],
)
async def test_key_columns_without_one_text_per_value_are_refused(
    admin: asyncpg.Connection, pg_dsn: str, pg_schema: str, column: str, problem: str
) -> None:
    await admin.execute(
        f'CREATE COLLATION "{pg_schema}".nd'
        " (provider = icu, locale = 'und-u-ks-level2', deterministic = false)"
    )
    column = column.format(schema=f'"{pg_schema}"')
    await admin.execute(f'CREATE TABLE "{pg_schema}".k (id {column}, v bigint)')
    with pytest.raises(TableMismatch, match=problem):
        await legacy(pg_dsn, pg_schema, table="k", columns=["v"]).start()


async def test_a_column_dropped_under_a_running_store_is_a_configuration_error(
    accounts: PostgresLegacyStore, admin: asyncpg.Connection, pg_schema: str
) -> None:
    # The catalog was checked at start; a table changed since is the store's
    # configuration gone wrong (503 storage_config), not an internal error (500).
    from gateway.errors import status_of
    from storage_adapters.errors import StoreMisconfigured

    await accounts.put("accounts/a", "a", 1, b'{"v": 1}')
    await admin.execute(f'ALTER TABLE "{pg_schema}".accounts DROP COLUMN note')
    with pytest.raises(StoreMisconfigured, match="note") as refused:
        await accounts.get("accounts/a", "a", None)
    assert status_of(refused.value) == 503
    with pytest.raises(StoreMisconfigured, match="note"):
        await accounts.put("accounts/a", "a", 1, b'{"note": "x"}')
