"""Fencing inside PostgreSQL, for writers of a legacy table that bypass the proxy.

``install_fencing`` puts the row trigger ``fencegate_fence`` (BEFORE INSERT OR
UPDATE OR DELETE, FOR EACH ROW) on a legacy-table store's table; it runs the
function ``fencegate.check_fence()``. A transaction fences itself with::

    SET LOCAL fencegate.token = '42';          -- the token of the lock it holds
    SET LOCAL fencegate.lock = 'accounts';     -- optional; default scope {store}/{key}

and every row it writes is checked against the proxy's own high-water table
(``fencegate_fence`` in the store's schema), under the same row lock:

    accept iff token >= high_water[scope]; then high_water[scope] = token

else SQLSTATE ``FG409`` (stale token; the message names both numbers), or,
with ``require_token`` (the default), ``FG428`` for a write without a token.
Row triggers do not fire on TRUNCATE, so a statement trigger
``fencegate_fence_truncate`` refuses it (``FG428``) unless unfenced writes are
allowed and no token is set: it cannot be checked row by row (DELETE is).

Lock order. Every fenced writer takes the data row before the fence row:

* UPDATE and DELETE: PostgreSQL locks the row before a BEFORE ROW trigger runs;
* INSERT: the trigger first locks the row of that key if it exists (an
  ``INSERT ... ON CONFLICT DO UPDATE`` would otherwise take the fence row, then
  the conflicting row);
* the proxy's PUT and DELETE lock the row (``FOR UPDATE``) before the fence row.

A new key has no row to lock yet: then every writer takes the fence row, then
inserts, and nobody holds the new row while it waits for the fence row. So
proxy and direct writers of one scope queue instead of deadlocking (40P01).
The token row (``fencegate_legacy_token``, what the proxy's GET reports) is
written last by both, after the fence row.

``fenced_transaction`` (asyncpg) and ``fenced_transaction_sync`` (psycopg 3)
open a transaction with those settings.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, Final

from storage_adapters._pg import ensure_tables, quote_ident
from storage_adapters.errors import TableMismatch
from storage_adapters.postgres_legacy import fence_tables

__all__ = [
    "FUNCTION",
    "STALE_SQLSTATE",
    "TOKEN_REQUIRED_SQLSTATE",
    "TRIGGER",
    "fenced_transaction",
    "fenced_transaction_sync",
    "fencing_status",
    "install_fencing",
    "uninstall_fencing",
]

FUNCTION: Final = "fencegate.check_fence()"
TRIGGER: Final = "fencegate_fence"
STALE_SQLSTATE: Final = "FG409"
TOKEN_REQUIRED_SQLSTATE: Final = "FG428"

# Key types whose text form (what the trigger uses for the scope) is the one a
# client puts in the URL; others (timestamps, char(n), floats) have several.
_KEY_TYPES: Final = frozenset(
    {"text", "character varying", "smallint", "integer", "bigint", "uuid"}
)

# Same advisory key as the stores' DDL: installs and store start-ups take turns.
_DDL_LOCK_KEY: Final = int.from_bytes(b"fencegat", "big", signed=True)

# The trigger function. Arguments (baked into each trigger): store name, key
# column, schema of fencegate_fence, require token ('true'/'false').
# Identifiers reach SQL only through format('%I'); values only through USING.
_FUNCTION_SQL: Final = r"""
CREATE OR REPLACE FUNCTION fencegate.check_fence() RETURNS trigger
LANGUAGE plpgsql AS $fn$
DECLARE
    v_store text := TG_ARGV[0];
    v_key_column text := TG_ARGV[1];
    v_fence_schema text := TG_ARGV[2];
    v_require boolean := TG_ARGV[3]::boolean;
    v_token_text text := nullif(current_setting('fencegate.token', true), '');
    v_lock text := nullif(current_setting('fencegate.lock', true), '');
    v_token bigint;
    v_scopes text[];
    v_scope text;
    v_accepted bigint;
    v_high_water bigint;
    v_old_key text;
    v_new_key text;
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        -- A statement trigger (fencegate_fence_truncate): rows are not checked one by one.
        IF v_require OR v_token_text IS NOT NULL THEN
            RAISE EXCEPTION USING
                ERRCODE = 'FG428',
                MESSAGE = format('fencegate: TRUNCATE of %I.%I cannot be fenced row by row',
                                 TG_TABLE_SCHEMA, TG_TABLE_NAME),
                HINT = 'DELETE FROM the table in a fenced transaction (each row is checked)';
        END IF;
        RETURN NULL;
    END IF;
    IF v_token_text IS NULL THEN
        IF v_require THEN
            RAISE EXCEPTION USING
                ERRCODE = 'FG428',
                MESSAGE = format('fencegate: %s on %I.%I needs a fencing token',
                                 TG_OP, TG_TABLE_SCHEMA, TG_TABLE_NAME),
                HINT = 'SET LOCAL fencegate.token = ''<token>'' in the transaction'
                       ' (the token of the lock you hold)';
        END IF;
        IF TG_OP <> 'DELETE' THEN
            -- An unfenced write: the row no longer carries the token of a fenced one.
            EXECUTE format('UPDATE %I.fencegate_legacy_token SET token = NULL'
                           ' WHERE store = $1 AND key = $2 AND token IS NOT NULL',
                           v_fence_schema)
              USING v_store, to_jsonb(NEW) ->> v_key_column;
        END IF;
        RETURN CASE TG_OP WHEN 'DELETE' THEN OLD ELSE NEW END;
    END IF;
    -- CASE: the cast runs only on digits (OR does not promise an order).
    IF (CASE WHEN v_token_text ~ '^[0-9]{1,19}$'
             THEN v_token_text::numeric > 9223372036854775807 ELSE true END) THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = format('fencegate: fencegate.token has value %L; not a token'
                             ' (a non-negative integer)', v_token_text);
    END IF;
    v_token := v_token_text::bigint;
    IF v_lock IS NOT NULL THEN
        v_scopes := ARRAY[v_lock];
    ELSIF TG_OP = 'DELETE' THEN
        v_scopes := ARRAY[v_store || '/' || (to_jsonb(OLD) ->> v_key_column)];
    ELSIF TG_OP = 'INSERT' THEN
        v_new_key := to_jsonb(NEW) ->> v_key_column;
        v_scopes := ARRAY[v_store || '/' || v_new_key];
    ELSE
        v_old_key := to_jsonb(OLD) ->> v_key_column;
        v_new_key := to_jsonb(NEW) ->> v_key_column;
        IF v_old_key IS NOT DISTINCT FROM v_new_key THEN
            v_scopes := ARRAY[v_store || '/' || v_new_key];
        ELSIF v_old_key < v_new_key THEN
            -- An UPDATE that changes the key writes both keys: check both, in one order.
            v_scopes := ARRAY[v_store || '/' || v_old_key, v_store || '/' || v_new_key];
        ELSE
            v_scopes := ARRAY[v_store || '/' || v_new_key, v_store || '/' || v_old_key];
        END IF;
    END IF;
    IF TG_OP = 'INSERT' THEN
        -- Lock order: the row of this key (if it exists) before the fence row, as
        -- UPDATE, DELETE and the proxy do; see storage_adapters/pg_fencing.py.
        EXECUTE format('SELECT 1 FROM %I.%I AS d WHERE d.%3$I = ($1).%3$I FOR UPDATE',
                       TG_TABLE_SCHEMA, TG_TABLE_NAME, v_key_column) USING NEW;
    END IF;
    FOREACH v_scope IN ARRAY v_scopes LOOP
        IF v_scope IS NULL THEN
            RAISE EXCEPTION USING
                ERRCODE = '23502',
                MESSAGE = format('fencegate: key column %I of %I.%I is NULL; no fence scope',
                                 v_key_column, TG_TABLE_SCHEMA, TG_TABLE_NAME);
        END IF;
        EXECUTE format(
            'INSERT INTO %I.fencegate_fence AS f (scope, token, updated_at)'
            ' VALUES ($1, $2, now()) ON CONFLICT (scope) DO UPDATE'
            ' SET token = EXCLUDED.token, updated_at = EXCLUDED.updated_at'
            ' WHERE f.token <= EXCLUDED.token RETURNING f.token', v_fence_schema)
          INTO v_accepted USING v_scope, v_token;
        IF v_accepted IS NULL THEN
            EXECUTE format('SELECT token FROM %I.fencegate_fence WHERE scope = $1',
                           v_fence_schema)
              INTO v_high_water USING v_scope;
            RAISE EXCEPTION USING
                ERRCODE = 'FG409',
                MESSAGE = format('fencegate: stale token %s for scope %L: the high-water'
                                 ' mark is %s', v_token, v_scope, v_high_water),
                DETAIL = format('token=%s high_water=%s scope=%s',
                                v_token, v_high_water, v_scope),
                HINT = 'a newer lock holder has written; take the lock again';
        END IF;
    END LOOP;
    IF TG_OP <> 'DELETE' THEN
        -- The token of the row's last accepted write, as the gateway's GET reports it.
        IF v_new_key IS NULL THEN  -- a coarse fencegate.lock: the key was not needed so far
            v_new_key := to_jsonb(NEW) ->> v_key_column;
        END IF;
        IF v_new_key IS NOT NULL THEN
            EXECUTE format(
                'INSERT INTO %I.fencegate_legacy_token AS t (store, key, token) VALUES'
                ' ($1, $2, $3) ON CONFLICT (store, key) DO UPDATE SET token = EXCLUDED.token',
                v_fence_schema)
              USING v_store, v_new_key, v_token;
        END IF;
    END IF;
    RETURN CASE TG_OP WHEN 'DELETE' THEN OLD ELSE NEW END;
END
$fn$
"""

_TRIGGER_SQL: Final = (
    "SELECT format('CREATE OR REPLACE TRIGGER fencegate_fence"
    " BEFORE INSERT OR UPDATE OR DELETE ON %I.%I FOR EACH ROW"
    " EXECUTE FUNCTION fencegate.check_fence(%L, %L, %L, %L)',"
    " $1::text, $2::text, $3::text, $4::text, $5::text, $6::text)"
)
# Row triggers do not fire on TRUNCATE; this one refuses it as check_fence says.
_TRUNCATE_TRIGGER_SQL: Final = (
    "SELECT format('CREATE OR REPLACE TRIGGER fencegate_fence_truncate"
    " BEFORE TRUNCATE ON %I.%I FOR EACH STATEMENT"
    " EXECUTE FUNCTION fencegate.check_fence(%L, %L, %L, %L)',"
    " $1::text, $2::text, $3::text, $4::text, $5::text, $6::text)"
)

_KEY_SQL: Final = (
    "SELECT format_type(a.atttypid, -1) AS key_type,"
    " (SELECT co.collname FROM pg_collation co WHERE co.oid = a.attcollation"
    "   AND NOT co.collisdeterministic) AS loose_collation"
    " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
    " LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = $3"
    "  AND a.attnum > 0 AND NOT a.attisdropped"
    " WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p')"
)

_STATUS_SQL: Final = (
    "SELECT t.tgargs FROM pg_trigger t"
    " JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace"
    " WHERE n.nspname = $1 AND c.relname = $2 AND t.tgname = 'fencegate_fence'"
)


async def _check_table(conn: Any, store: str, schema: str, table: str, key_column: str) -> None:
    where = f"{schema}.{table}"
    row = await conn.fetchrow(_KEY_SQL, schema, table, key_column)
    if row is None:
        raise TableMismatch(store, where, [f"table {where!r} does not exist"])
    if row["key_type"] is None:
        raise TableMismatch(store, where, [f"key column {key_column!r} does not exist"])
    if row["key_type"] not in _KEY_TYPES:
        raise TableMismatch(
            store,
            where,
            [
                f"key column {key_column!r} has type {row['key_type']!r}; in-database fencing"
                f" needs one of {', '.join(sorted(_KEY_TYPES))} (one text form per key)"
            ],
        )
    if row["loose_collation"] is not None:
        raise TableMismatch(
            store,
            where,
            [
                f"key column {key_column!r} has the non-deterministic collation"
                f" {row['loose_collation']!r}: keys that differ in case or form would name"
                " one row under two lock names; use a deterministic collation"
            ],
        )


async def install_fencing(
    conn: Any,
    *,
    store: str,
    table: str,
    key_column: str,
    schema: str = "public",
    fence_schema: str | None = None,
    require_token: bool = True,
) -> None:
    """Install (or update) ``fencegate.check_fence()`` and the trigger on ``table``; idempotent.

    Args:
        conn: an asyncpg connection (not in a transaction).
        store: the store name, the first part of the default scope ``{store}/{key}``.
        table, key_column, schema: the store's table, as in its config.
        fence_schema: where ``fencegate_fence`` lives (the store's schema by default).
        require_token: refuse writes without ``fencegate.token`` (FG428).

    Raises:
        TableMismatch: the table or key column does not exist or has an unsuitable type.
    """
    fence_schema = fence_schema or schema
    # One transaction: an uninstall elsewhere cannot drop the function in between.
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _DDL_LOCK_KEY)
        await _check_table(conn, store, schema, table, key_column)
        await conn.execute("CREATE SCHEMA IF NOT EXISTS fencegate")
        await conn.execute(_FUNCTION_SQL)
        # A savepoint inside this transaction; the advisory lock is taken again (reentrant).
        await ensure_tables(conn, fence_schema, fence_tables(quote_ident(fence_schema)))
        args = (schema, table, store, key_column, fence_schema, str(require_token).lower())
        for sql in (_TRIGGER_SQL, _TRUNCATE_TRIGGER_SQL):
            await conn.execute(await conn.fetchval(sql, *args))


async def uninstall_fencing(conn: Any, *, table: str, schema: str = "public") -> bool:
    """Remove the trigger from ``table`` and, once no trigger uses it, the function; idempotent.

    The table's rows and the high-water marks are left as they are.

    Returns:
        Whether ``table`` had either trigger (False: nothing to remove there).
    """
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _DDL_LOCK_KEY)
        had = bool(
            await conn.fetchval(
                "SELECT count(*) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid"
                " JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = $1 AND c.relname = $2"
                " AND t.tgname IN ('fencegate_fence', 'fencegate_fence_truncate')",
                schema,
                table,
            )
        )
        target = f"{quote_ident(schema)}.{quote_ident(table)}"
        if had:
            await conn.execute(f"DROP TRIGGER IF EXISTS fencegate_fence ON {target}")
            await conn.execute(f"DROP TRIGGER IF EXISTS fencegate_fence_truncate ON {target}")
        users = await conn.fetchval(
            "SELECT count(*) FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid"
            " JOIN pg_namespace n ON n.oid = p.pronamespace"
            " WHERE n.nspname = 'fencegate' AND p.proname = 'check_fence'"
        )
        if not users:
            await conn.execute("DROP FUNCTION IF EXISTS fencegate.check_fence()")
            left = await conn.fetchval(
                "SELECT (SELECT count(*) FROM pg_class c JOIN pg_namespace n"
                "  ON n.oid = c.relnamespace WHERE n.nspname = 'fencegate')"
                " + (SELECT count(*) FROM pg_proc p JOIN pg_namespace n"
                "  ON n.oid = p.pronamespace WHERE n.nspname = 'fencegate')"
            )
            if not left:
                await conn.execute("DROP SCHEMA IF EXISTS fencegate")
    return had


async def fencing_status(conn: Any, *, table: str, schema: str = "public") -> dict[str, Any] | None:
    """The installed trigger's arguments on ``table``, or None when it is not installed."""
    raw = await conn.fetchval(_STATUS_SQL, schema, table)
    if raw is None:
        return None
    args = bytes(raw).split(b"\x00")
    return {
        "store": args[0].decode(),
        "key_column": args[1].decode(),
        "fence_schema": args[2].decode(),
        "require_token": args[3].decode() == "true",
    }


_SET_SETTINGS: Final = (
    "SELECT set_config('fencegate.token', coalesce({}, ''), true),"
    " set_config('fencegate.lock', coalesce({}, ''), true)"
)
# Inside a caller's transaction the block is a savepoint, and a setting made there
# would stay set until the outer commit: what they were is put back after the block
# (a rolled-back savepoint undoes the settings itself).
_SETTINGS_NOW: Final = (
    "SELECT current_setting('fencegate.token', true), current_setting('fencegate.lock', true)"
)


def _check_token(token: int, lock: str | None) -> tuple[str, str | None]:
    if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < 2**63:
        raise ValueError(f"token has value {token!r}; not a fencing token")
    if lock is not None and (not lock or "\x00" in lock):
        raise ValueError(f"lock has value {lock!r}; not a lock name")
    return str(token), lock


@asynccontextmanager
async def fenced_transaction(conn: Any, token: int, lock: str | None = None) -> AsyncIterator[Any]:
    """An asyncpg transaction whose writes the trigger checks against ``token``.

    Args:
        conn: an asyncpg connection.
        token: the fencing token of the lock the caller holds.
        lock: the lock's name when it is not ``{store}/{key}`` of each row written.

    Raises:
        asyncpg.PostgresError: SQLSTATE ``FG409`` (stale token) from a write in the block.
    """
    token_text, lock = _check_token(token, lock)
    outer = None
    if conn.is_in_transaction():  # a savepoint: SET LOCAL would outlive the block
        outer = tuple(await conn.fetchrow(_SETTINGS_NOW))
    async with conn.transaction() as tx:
        await conn.execute(_SET_SETTINGS.format("$1", "$2"), token_text, lock)
        yield tx
        if outer is not None:
            await conn.execute(_SET_SETTINGS.format("$1", "$2"), *outer)


@contextmanager
def fenced_transaction_sync(conn: Any, token: int, lock: str | None = None) -> Iterator[Any]:
    """The same for a psycopg 3 connection (``psycopg.Connection``); sync."""
    token_text, lock = _check_token(token, lock)
    outer = None
    if conn.info.transaction_status != 0:  # not IDLE: a savepoint, as above
        outer = tuple(conn.execute(_SETTINGS_NOW).fetchone())
    with conn.transaction() as tx:
        conn.execute(_SET_SETTINGS.format("%s", "%s"), (token_text, lock))
        yield tx
        if outer is not None:
            conn.execute(_SET_SETTINGS.format("%s", "%s"), outer)
