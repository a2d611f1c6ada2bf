"""PostgreSQL plumbing shared by ``postgres.py`` and ``postgres_legacy.py``.

The pool, fencegate's own tables, the mark SQL, and the one place where
asyncpg and OS errors become ``StorageError`` s.

The pool is ``pg_pool.PgPool``, not asyncpg's: on the fenced PUT, asyncpg's
pool cost a task per release (``asyncio.shield``) and a timeout per acquire,
more than the statement itself; ours hands out and takes back an idle
connection with no task, timer or future, and no reset round trip (the
stores set no session state and use no LISTEN, cursors or session-level
advisory locks, only transaction-scoped ones: nothing to undo). A
connection whose block failed is kept only after an error the server
answered on a live session (``reusable_after``), open and outside a
transaction; any other is terminated and replaced when next needed.
"""

from __future__ import annotations

import asyncio
import logging
from abc import abstractmethod
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import TracebackType
from typing import Any, Final

import asyncpg

from storage_adapters import pg_pool
from storage_adapters.base import NO_HOOKS, FencedStore, StoreHooks
from storage_adapters.errors import (
    BadValue,
    StaleToken,
    StorageError,
    StorageUnavailable,
    StoreMisconfigured,
    StoreNotStarted,
    UnfencedRefused,
)
from storage_adapters.pg_pool import PgPool

__all__ = [
    "DRIVER_ERRORS",
    "RECONNECT_LOG",
    "PgStoreBase",
    "check_exact_keys",
    "ensure_tables",
    "fence_ddl",
    "pg_errors",
    "quote_ident",
    "raise_mark_sql",
    "storage_error",
]

log = logging.getLogger(__name__)

# Serialises fencegate's DDL across processes that start at the same time (any value
# works as long as every fencegate uses the same one): b"fencegat" as a bigint.
_DDL_LOCK_KEY: Final = int.from_bytes(b"fencegat", "big", signed=True)

# SQLSTATE classes that say "the server or the connection cannot serve this now".
_UNAVAILABLE_CLASSES: Final = frozenset({"08", "40", "53", "55", "57", "58", "XX"})
# A table or column that start found in the catalog is gone (undefined column, table).
_GONE: Final = frozenset({"42703", "42P01"})
_CHANGED: Final = (
    "the table changed after start and no longer matches the configuration"
    " (fix the table or the config, then restart)"
)
# SQLSTATE classes that say "this value cannot be stored" (data exception, constraint).
_BAD_VALUE_CLASSES: Final = frozenset({"22", "23"})


class _ReconnectLog(logging.Filter):
    """One line per change of reason instead of a traceback per reconnect attempt.

    While PostgreSQL is down, the pool (``pg_pool``, as asyncpg's did) logs
    "Failed to restore the pool connection floor; retrying" at WARNING with a full
    traceback on every attempt, burying real errors. This filter on the pool's logger
    keeps the first attempt of each reason as one line without the traceback
    and drops the repeats; ``recovered`` (a store reached the server again)
    logs that once and re-arms it.
    """

    _PREFIX: Final = "Failed to restore the pool connection floor"

    def __init__(self) -> None:
        super().__init__()
        self.reason: str | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(self._PREFIX):
            return True
        exc = record.exc_info[1] if record.exc_info else None
        reason = f"{type(exc).__name__}: {exc}" if exc is not None else "unknown reason"
        record.exc_info, record.exc_text = None, None
        if reason == self.reason:
            return False
        self.reason = reason
        record.msg = "PostgreSQL pool cannot reconnect (%s); retrying (said once per reason)"
        record.args = (reason,)
        return True

    def recovered(self, store: str) -> None:
        if self.reason is not None:
            self.reason = None
            log.warning("store %r reaches PostgreSQL again", store)


RECONNECT_LOG: Final = _ReconnectLog()
logging.getLogger(pg_pool.__name__).addFilter(RECONNECT_LOG)


def quote_ident(name: str) -> str:
    """Quote an identifier for SQL (as PostgreSQL's ``quote_ident``, always quoting)."""
    if "\x00" in name:
        raise ValueError(f"identifier {name!r} contains NUL")
    return '"' + name.replace('"', '""') + '"'


def fence_ddl(schema_q: str) -> str:
    return (
        f"CREATE TABLE {schema_q}.fencegate_fence ("
        " scope text PRIMARY KEY,"
        " token bigint NOT NULL,"
        " updated_at timestamptz NOT NULL DEFAULT now())"
    )


def raise_mark_sql(schema_q: str, scope: str = "$1", token: str = "$2", *, after: str = "") -> str:
    """The fence check: returns the token when accepted (mark raised or equal), else no row.

    ``ON CONFLICT DO UPDATE`` locks the fence row even when its ``WHERE`` fails and
    re-reads the newest committed version after waiting, so concurrent writers of one
    scope queue on that row lock until the writer ahead of them commits. ``after``
    (a FROM list of one-row items) is evaluated before the fence row is touched.
    """
    source = (
        f"SELECT {scope}::text, {token}::bigint, now() FROM {after}"
        if after
        else f"VALUES ({scope}::text, {token}::bigint, now())"
    )
    return (
        f"INSERT INTO {schema_q}.fencegate_fence AS f (scope, token, updated_at)"
        f" {source}"
        " ON CONFLICT (scope) DO UPDATE"
        " SET token = EXCLUDED.token, updated_at = EXCLUDED.updated_at"
        " WHERE f.token <= EXCLUDED.token"
        " RETURNING f.token"
    )


async def ensure_tables(conn: Any, schema: str, tables: Mapping[str, str]) -> None:
    """Create the schema and each missing table, under an advisory lock.

    Checking the catalog first means no DDL (and no CREATE privilege) is needed
    when the tables exist; the transaction-scoped advisory lock makes two
    processes that start at once take turns instead of failing on a duplicate.
    """
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _DDL_LOCK_KEY)
        found = await conn.fetchval("SELECT count(*) FROM pg_namespace WHERE nspname = $1", schema)
        if not found:
            log.info("creating schema %r", schema)
            await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {quote_ident(schema)}")
        rows = await conn.fetch(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = $1 AND c.relname = ANY($2::text[])",
            schema,
            list(tables),
        )
        existing = {row["relname"] for row in rows}
        for table, ddl in tables.items():
            if table not in existing:
                log.info("creating table %s.%s", schema, table)
                await conn.execute(ddl)


async def check_exact_keys(conn: Any, store: str, schema: str, table: str) -> None:
    """Refuse a ``table`` of fencegate's whose ``key`` is not text compared byte for byte.

    fencegate creates it ``text`` with the database's (deterministic) collation; a
    table made by hand with ``citext`` or a non-deterministic collation would let
    "Key" and "key" (two lock names) write one row. Not altered automatically.
    """
    row = await conn.fetchrow(
        "SELECT format_type(a.atttypid, -1) AS type, co.collname, co.collisdeterministic"
        " FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " LEFT JOIN pg_collation co ON co.oid = a.attcollation"
        " WHERE n.nspname = $1 AND c.relname = $2 AND a.attname = 'key' AND NOT a.attisdropped",
        schema,
        table,
    )
    if (
        row is not None
        and row["type"] in ("text", "character varying")
        and row["collisdeterministic"] is not False
    ):
        return
    if row is None:
        what = "has no column key"
    else:
        what = f"has column key of type {row['type']!r} collation {row['collname']!r}"
    raise StoreMisconfigured(
        store,
        f"table {schema}.{table} {what}: keys must compare byte for byte, or keys that"
        " differ only in case would write one row under two lock names; fix it with"
        f' ALTER TABLE {quote_ident(schema)}.{table} ALTER COLUMN key TYPE text COLLATE "C"',
    )


def _translate(store: str, exc: BaseException) -> StorageError:
    if isinstance(exc, asyncpg.PostgresError):
        state = str(getattr(exc, "sqlstate", "") or "")
        text = f"{exc} (SQLSTATE {state})" if state else str(exc)
        if state == "FG409":  # the in-database trigger (pg_fencing.py): stale token
            return _stale_from_trigger(exc)
        if state == "FG428":
            return UnfencedRefused(store, text)
        if state[:2] in _UNAVAILABLE_CLASSES or isinstance(exc, asyncpg.PostgresConnectionError):
            return StorageUnavailable(store, text)
        if state[:2] in _BAD_VALUE_CLASSES:
            return BadValue(f"store {store!r} refused the value: {text}")
        if state in _GONE:
            return StoreMisconfigured(store, f"{_CHANGED}: {text}")
        return StorageError(f"store {store!r}: PostgreSQL error: {text}")
    if isinstance(exc, asyncpg.InterfaceError) and isinstance(exc, ValueError):
        # Client-side argument encoding failed (or a malformed DSN): not a reachability issue.
        return BadValue(f"store {store!r} cannot encode the value: {exc}")
    if isinstance(exc, TimeoutError):
        return StorageUnavailable(store, "timed out")
    return StorageUnavailable(store, f"{type(exc).__name__}: {exc}")


def _stale_from_trigger(exc: BaseException) -> StorageError:
    """``StaleToken`` from the trigger's DETAIL ``token=N high_water=M scope=S``."""
    detail = str(getattr(exc, "detail", "") or "")
    fields = dict(part.split("=", 1) for part in detail.split(" ", 2) if "=" in part)
    try:
        return StaleToken(
            int(fields["token"]), int(fields["high_water"]), scope=fields.get("scope", "")
        )
    except (KeyError, ValueError):
        return StorageError(f"refused by the in-database fencing trigger: {exc}")


# What a call to asyncpg may raise that is ours to translate (``storage_error``).
DRIVER_ERRORS: Final = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.InternalClientError,
    OSError,
    TimeoutError,
)


def storage_error(store: str, exc: BaseException, *, values: bool = True) -> BaseException:
    """The error to raise instead of the driver error ``exc`` (see ``pg_errors``)."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        # A cancelled call whose cleanup failed (e.g. the connection release timed
        # out on a hung server): the cancellation wins, never a storage error.
        return asyncio.CancelledError()
    error = _translate(store, exc)
    if isinstance(error, BadValue) and not values:
        error = StorageError(f"store {store!r}: {exc}")
    return error


@contextmanager
def pg_errors(store: str, *, values: bool = True) -> Iterator[None]:
    """Turn asyncpg and OS errors into ``StorageError`` s at the package edge.

    With ``values=False`` (start-up DDL and catalog queries, which carry no client
    value) a data or constraint error is a plain ``StorageError``, not ``BadValue``.
    """
    try:
        yield
    except StorageError:
        raise
    except DRIVER_ERRORS as exc:
        raise storage_error(store, exc, values=values) from exc


class _Checkout:
    """``async with store._conn() as conn``: a pooled connection, errors translated.

    A class rather than ``asynccontextmanager`` around ``pg_errors``: the same
    steps, without an async generator and a generator per call.
    """

    __slots__ = ("_conn", "_pool", "_store")

    def __init__(self, store: str, pool: PgPool) -> None:
        self._store = store
        self._pool = pool
        self._conn: Any = None

    async def __aenter__(self) -> Any:
        try:
            self._conn = await self._pool.acquire()
        except DRIVER_ERRORS as exc:
            raise storage_error(self._store, exc) from exc
        return self._conn

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self._pool.release(self._conn, exc)
        except DRIVER_ERRORS as failed:  # as pg_errors around the release
            raise storage_error(self._store, failed) from failed
        if exc is None:
            if RECONNECT_LOG.reason is not None:  # the block ran: the server answers again
                RECONNECT_LOG.recovered(self._store)
        elif isinstance(exc, DRIVER_ERRORS) and not isinstance(exc, StorageError):
            raise storage_error(self._store, exc) from exc


class PgStoreBase(FencedStore):
    """A fenced store over one ``PgPool``; subclasses create their tables in ``_prepare``."""

    def __init__(
        self,
        name: str,
        dsn: str,
        *,
        schema: str = "public",
        pool_min: int = 1,
        pool_max: int = 10,
        hooks: StoreHooks = NO_HOOKS,
        acquire_timeout: float = 5.0,
        command_timeout: float | None = 10.0,
        connect_timeout: float = 5.0,
        server_settings: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(name, hooks=hooks)
        if not 0 <= pool_min <= pool_max or pool_max < 1:
            raise ValueError(
                f"store {name!r}: pool_min {pool_min!r} and pool_max {pool_max!r}"
                " need 0 <= pool_min <= pool_max and pool_max >= 1"
            )
        self.schema = schema
        self._schema_q = quote_ident(schema)
        self._dsn = dsn
        self._pool_min = pool_min
        self._pool_max = pool_max
        self._acquire_timeout = acquire_timeout
        self._command_timeout = command_timeout
        self._connect_timeout = connect_timeout
        defaults = {} if "application_name" in dsn else {"application_name": "fencegate"}
        # The fencing statements rely on READ COMMITTED: a fresh snapshot per statement,
        # and ON CONFLICT re-checking the newest row version after a lock wait (under
        # REPEATABLE READ or SERIALIZABLE concurrent writers of a scope would fail instead).
        self._server_settings = {
            **defaults,
            **(server_settings or {}),
            "default_transaction_isolation": "read committed",
        }
        self._pool: PgPool | None = None
        self._start_lock = asyncio.Lock()

    async def start(self) -> None:
        async with self._start_lock:
            if self._pool is not None:
                return
            pool = PgPool(
                self._dsn,
                min_size=self._pool_min,
                max_size=self._pool_max,
                acquire_timeout=self._acquire_timeout,
                connect_timeout=self._connect_timeout,
                command_timeout=self._command_timeout,
                server_settings=self._server_settings,
                reusable_after=reusable_after,
            )
            try:
                with pg_errors(self.name):
                    await pool.start()
                with pg_errors(self.name, values=False):
                    conn = await pool.acquire()
                    try:
                        await self._prepare(conn)
                    except BaseException as exc:
                        pool.release(conn, exc)
                        raise
                    pool.release(conn)
            except BaseException:
                await asyncio.shield(pool.close())
                raise
            self._pool = pool
            log.info("store %r (%s) started", self.name, self.kind)

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None and not await pool.close(grace=10.0):
            log.warning("store %r: pool did not close in 10 s; terminating", self.name)

    async def ping(self) -> None:
        async with self._conn() as conn:
            await conn.fetchval("SELECT 1")

    @abstractmethod
    async def _prepare(self, conn: Any) -> None:
        """Create fencegate's tables and check the catalog, on one connection."""

    def _conn(self) -> _Checkout:
        """A pooled connection, with errors from inside the block translated.

        A connection whose block failed other than by an error the server answered
        (a dead connection after a restart or ``pg_terminate_backend``, a protocol out
        of step as in ``_not_sent``, a timeout, a cancellation) is terminated by the
        pool and replaced when next needed, so the pool recovers by itself; the call
        that met the dead connection fails with ``StorageUnavailable``.
        """
        return _Checkout(self.name, self._require_started())

    # A connection that PostgreSQL ends while it is idle in the pool (fast shutdown,
    # pg_terminate_backend) first receives an ErrorResponse (FATAL 57P01). asyncpg's
    # protocol, idle, cannot place it and stays in its error-consuming state until the
    # socket's close is processed; a query given that connection in between fails with
    # "InternalClientError: cannot switch to state 12; another operation (2) is in
    # progress" before that statement is sent. The connection is terminated (``_conn``)
    # and the call retried once on another: every call is idempotent for its token (a
    # mark raised to the same token, the same write or delete again), and a transaction
    # left open dies with the terminated connection.
    def _retry_once(self, exc: StorageUnavailable) -> bool:
        return _not_sent(exc)

    def _require_started(self) -> PgPool:
        if self._pool is None:
            raise StoreNotStarted(self.name)
        return self._pool

    async def _stale(self, conn: Any, scope: str, token: int) -> StaleToken:
        """The error for a rejected token, with the mark as it is now (the reject path only)."""
        high_water = await conn.fetchval(
            f"SELECT token FROM {self._schema_q}.fencegate_fence WHERE scope = $1", scope
        )
        return StaleToken(token, int(high_water or 0), scope=scope)

    async def _raise_mark(self, conn: Any, scope: str, token: int) -> None:
        """Raise the mark of ``scope`` to ``token`` (committed with the caller's transaction)."""
        accepted = await conn.fetchval(raise_mark_sql(self._schema_q), scope, token)
        if accepted is None:
            raise await self._stale(conn, scope, token)


def reusable_after(exc: BaseException) -> bool:
    """A connection whose block raised ``exc`` may serve again (if open and not in a transaction).

    Yes after an error the server answered on a live session (a constraint, a stale
    token found by the statement) or one of ours raised after an answer; no after a
    connection error or the server ending the session (class 08, 57P0x: shutdown).
    """
    if isinstance(exc, StorageError):
        return True
    return (
        isinstance(exc, asyncpg.PostgresError)
        and not isinstance(exc, asyncpg.PostgresConnectionError)
        and not str(getattr(exc, "sqlstate", "") or "").startswith("57P")
    )


def _not_sent(exc: StorageUnavailable) -> bool:
    """The call failed on a connection whose protocol could not start its next statement."""
    cause = exc.__cause__
    return isinstance(cause, asyncpg.exceptions.InternalClientError) and str(cause).startswith(
        "cannot switch to state"
    )
