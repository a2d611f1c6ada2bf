"""MySQL / MariaDB plumbing shared by ``mysql.py`` and ``mysql_legacy.py``.

The asyncmy pool, the DSN, fencegate's own tables, the fence check, and the
one place where driver and OS errors become ``StorageError`` s.

How a fenced call holds its scope (every fenced put, delete and read)::

    BEGIN
    INSERT INTO fencegate_fence ... ON DUPLICATE KEY UPDATE token = GREATEST(token, t)
    SELECT token FROM fencegate_fence WHERE scope_sha = ? FOR UPDATE   -- accepted iff == t
    SELECT ... FROM <data> WHERE <key> = ? FOR UPDATE | LOCK IN SHARE MODE
    ... the write ...
    COMMIT

The upsert creates the fence row or takes its exclusive lock (no shared lock
first, so two writers never deadlock upgrading it, and no gap lock on a
missing row); the row lock is held until COMMIT, so every writer of a scope,
through any gateway, queues on it. Every read that decides something is a
*locking* read, which InnoDB answers from the newest committed row version at
any isolation level: the snapshot of REPEATABLE READ (the server default,
left as it is) is never consulted. The fence row is locked before the data
row, in every call.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
from abc import abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any, Final, TypeVar
from urllib.parse import unquote, urlsplit

import asyncmy
import asyncmy.errors

from storage_adapters.base import NO_HOOKS, FencedStore, StoreHooks
from storage_adapters.errors import (
    BadValue,
    StaleToken,
    StorageError,
    StorageUnavailable,
    StoreMisconfigured,
    StoreNotStarted,
)

__all__ = [
    "FENCE_DDL",
    "MysqlDsn",
    "MysqlStoreBase",
    "check_exact_keys",
    "ensure_tables",
    "mysql_errors",
    "parse_dsn",
    "quote_ident",
]

log = logging.getLogger(__name__)
T = TypeVar("T")

FENCE_DDL: Final = (
    "CREATE TABLE IF NOT EXISTS fencegate_fence ("
    " scope_sha BINARY(32) NOT NULL PRIMARY KEY,"  # sha256 of the scope: any length fits a key
    " scope VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,"
    " token BIGINT NOT NULL,"
    " updated_at DATETIME(6) NOT NULL"
    ") ENGINE=InnoDB"
)
# Strict: a value that does not fit its column fails the statement instead of being
# truncated with a warning. An explicit mode also keeps NO_BACKSLASH_ESCAPES off, which
# the driver's escaping of bound values assumes.
_SQL_MODE: Final = "STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION,ERROR_FOR_DIVISION_BY_ZERO"

# Server error numbers, by what they mean for a caller.
_DEADLOCK: Final = 1213  # InnoDB rolled the whole transaction back: safe to run it again
_UNAVAILABLE: Final = frozenset({
    1040,  # too many connections
    1053,  # server shutdown in progress
    1205,  # lock wait timeout
    1213,  # deadlock (after the retries)
    1317,  # query interrupted
    1927,  # connection killed (MariaDB)
    1969,  # statement timeout (MariaDB max_statement_time)
    3024,  # statement timeout (MySQL max_execution_time)
    4031,  # disconnected by the server for inactivity (MySQL 8.0.24+)
})  # fmt: skip
_BAD_VALUE: Final = frozenset({
    1048, 1062, 1101, 1264, 1265, 1292, 1366, 1367, 1406, 1411, 1451, 1452, 1690,
    3140, 3819, 4025, 4078,
})  # fmt: skip
_TOO_BIG: Final = 1153  # a packet above the server's max_allowed_packet
_GONE: Final = frozenset({1054, 1146})  # unknown column, no such table (checked at start)


@dataclass(frozen=True, slots=True)
class MysqlDsn:
    """``mysql://user:password@host:port/database``, taken apart."""

    host: str
    port: int
    user: str
    password: str
    database: str


def parse_dsn(dsn: str) -> MysqlDsn:
    """Parse a ``mysql://`` URL; the database (its path) is required.

    Raises:
        ValueError: not such a URL (the message never shows the password).
    """
    try:
        parts = urlsplit(dsn)
        port = parts.port or 3306
    except ValueError as exc:
        raise ValueError(f"dsn is not a mysql://user:pass@host:3306/db URL: {exc}") from None
    if parts.scheme != "mysql" or not parts.hostname:
        raise ValueError("dsn is not a mysql://user:pass@host:3306/db URL")
    database = unquote(parts.path.lstrip("/"))
    if not database or "/" in database:
        raise ValueError("dsn names no database: mysql://user:pass@host:3306/<database>")
    if parts.query or parts.fragment:
        raise ValueError("dsn takes no ?options or #fragment")
    return MysqlDsn(
        host=parts.hostname,
        port=port,
        user=unquote(parts.username or "root"),
        password=unquote(parts.password or ""),
        database=database,
    )


def quote_ident(name: str) -> str:
    """Quote an identifier with backticks (a backtick inside is doubled)."""
    if "\x00" in name:
        raise ValueError(f"identifier {name!r} contains NUL")
    return "`" + name.replace("`", "``") + "`"


def scope_sha(scope: str) -> bytes:
    return hashlib.sha256(scope.encode()).digest()


def _code(exc: BaseException) -> int:
    args = getattr(exc, "args", ())
    return args[0] if args and isinstance(args[0], int) else 0


def _translate(store: str, exc: BaseException, *, values: bool) -> StorageError:
    if isinstance(exc, asyncmy.errors.MySQLError):
        code = _code(exc)
        text = str(exc.args[1]) if len(exc.args) > 1 else str(exc)
        text = f"{text} (MySQL error {code})" if code else text
        if code == 0 and isinstance(exc, asyncmy.errors.ProgrammingError):
            # Raised before anything was sent: the driver cannot encode an argument.
            error = f"store {store!r} cannot encode the value: {text}"
            return BadValue(error) if values else StorageError(error)
        if code in _UNAVAILABLE or 2000 <= code < 3000 or code == 0:
            return StorageUnavailable(store, text)  # 2xxx: client side, e.g. 2013 lost
        if code == _TOO_BIG:
            return BadValue(
                f"store {store!r}: the body is larger than the server's max_allowed_packet"
                f" allows ({text}); raise max_allowed_packet on the server"
            )
        if code in _BAD_VALUE and values:
            return BadValue(f"store {store!r} refused the value: {text}")
        if code in _GONE:
            return StoreMisconfigured(
                store,
                "the table changed after start and no longer matches the configuration"
                f" (fix the table or the config, then restart): {text}",
            )
        return StorageError(f"store {store!r}: MySQL error: {text}")
    if isinstance(exc, TimeoutError):
        return StorageUnavailable(store, "timed out")
    return StorageUnavailable(store, f"{type(exc).__name__}: {exc}")


@contextmanager
def mysql_errors(store: str, *, values: bool = True) -> Iterator[None]:
    """Turn asyncmy and OS errors into ``StorageError`` s at the package edge.

    With ``values=False`` (start-up DDL and catalog queries) a data error is a plain
    ``StorageError``, not ``BadValue``.
    """
    try:
        yield
    except StorageError:
        raise
    except (asyncmy.errors.MySQLError, OSError, TimeoutError, EOFError) as exc:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise asyncio.CancelledError() from exc
        raise _translate(store, exc, values=values) from exc


async def ensure_tables(cur: Any, tables: Mapping[str, str]) -> None:
    """Create each missing table of fencegate's (``CREATE TABLE IF NOT EXISTS``).

    Looking in ``information_schema`` first means no CREATE privilege is needed
    once the tables exist; IF NOT EXISTS lets two processes start at once.
    """
    await cur.execute(
        "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE()"
        " AND TABLE_NAME IN (" + ", ".join(["%s"] * len(tables)) + ")",
        tuple(tables),
    )
    existing = {row[0] for row in await cur.fetchall()}
    for table, ddl in tables.items():
        if table not in existing:
            log.info("creating table %s", table)
            await cur.execute(ddl)


async def check_exact_keys(cur: Any, store: str, table: str, ddl: str) -> None:
    """Refuse a ``table`` of fencegate's whose `key` column does not compare byte for byte.

    fencegate creates it ``ascii_bin``; a table made by hand with a case-insensitive
    collation would let "Key" and "key" (two lock names) write one row. A ``_bin``
    collation pads with spaces (PAD SPACE) on MariaDB, which is harmless: keys
    hold no spaces (``validate_key``). Not altered automatically: the ALTER
    rebuilds the table under a lock, which is the operator's call.
    """
    await cur.execute(
        "SELECT DATA_TYPE, COLLATION_NAME FROM information_schema.COLUMNS"
        " WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s AND COLUMN_NAME = 'key'",
        (table,),
    )
    row = await cur.fetchone()
    if row is None:
        raise StoreMisconfigured(store, f"table {table} has no column `key`; expected: {ddl}")
    data_type, collation = str(row[0]).lower(), str(row[1] or "")
    if data_type in ("varbinary", "binary") or collation.endswith("_bin"):
        return
    raise StoreMisconfigured(
        store,
        f"column `key` of table {table} has collation {collation!r}: keys that differ only"
        " in case would write one row under two lock names; make it byte-exact with"
        f" ALTER TABLE {table} MODIFY `key` VARCHAR(512) CHARACTER SET ascii COLLATE ascii_bin"
        " NOT NULL (fails, changing nothing, if a key is not ASCII)",
    )


class MysqlStoreBase(FencedStore):
    """A fenced store over one asyncmy pool; subclasses create their tables in ``_prepare``."""

    def __init__(
        self,
        name: str,
        dsn: str,
        *,
        pool_min: int = 1,
        pool_max: int = 10,
        hooks: StoreHooks = NO_HOOKS,
        acquire_timeout: float = 5.0,
        command_timeout: float = 10.0,
        connect_timeout: float = 5.0,
    ) -> None:
        super().__init__(name, hooks=hooks)
        if not 0 <= pool_min <= pool_max or pool_max < 1:
            raise ValueError(
                f"store {name!r}: pool_min {pool_min!r} and pool_max {pool_max!r}"
                " need 0 <= pool_min <= pool_max and pool_max >= 1"
            )
        try:
            self._dsn = parse_dsn(dsn)
        except ValueError as exc:
            raise ValueError(f"store {name!r}: {exc}") from None
        self.database = self._dsn.database
        self._pool_min = pool_min
        self._pool_max = pool_max
        self._acquire_timeout = acquire_timeout
        self._command_timeout = command_timeout
        self._connect_timeout = connect_timeout
        self._pool: Any = None
        self._start_lock = asyncio.Lock()

    async def start(self) -> None:
        async with self._start_lock:
            if self._pool is not None:
                return
            lock_wait = max(1, math.ceil(self._command_timeout))
            d = self._dsn
            with mysql_errors(self.name, values=False):
                async with asyncio.timeout(self._connect_timeout + self._command_timeout):
                    pool = await asyncmy.create_pool(
                        minsize=self._pool_min,
                        maxsize=self._pool_max,
                        host=d.host,
                        port=d.port,
                        user=d.user,
                        password=d.password,
                        database=d.database,
                        charset="utf8mb4",
                        autocommit=True,
                        connect_timeout=self._connect_timeout,
                        max_allowed_packet=64 << 20,
                        init_command=(
                            f"SET SESSION sql_mode = '{_SQL_MODE}',"
                            f" innodb_lock_wait_timeout = {lock_wait}"
                        ),
                    )
            try:
                async with self._cursor(values=False, pool=pool) as cur:
                    await self._prepare(cur)
            except BaseException:
                await asyncio.shield(self._close_pool(pool))
                raise
            self._pool = pool  # only now: calls before this answer StoreNotStarted
            log.info("store %r (%s) started", self.name, self.kind)

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await self._close_pool(pool)

    async def _close_pool(self, pool: Any) -> None:
        pool.close()
        try:
            await asyncio.wait_for(pool.wait_closed(), timeout=10.0)
        except TimeoutError:
            log.warning("store %r: pool did not close in 10 s; terminating", self.name)
            pool.terminate()

    async def ping(self) -> None:
        async with self._cursor() as cur:
            await cur.execute("SELECT 1")
            await cur.fetchone()

    @abstractmethod
    async def _prepare(self, cur: Any) -> None:
        """Create fencegate's tables and check the catalog, on one connection."""

    @asynccontextmanager
    async def _cursor(self, *, values: bool = True, pool: Any = None) -> AsyncIterator[Any]:
        """A cursor on a pooled connection (autocommit), errors inside translated.

        A connection that failed in any way (server error aside) is closed, not
        pooled again: after a timeout or a cut its protocol state is unknown.
        """
        pool = pool or self._pool
        if pool is None:
            raise StoreNotStarted(self.name)
        with mysql_errors(self.name, values=values):
            async with asyncio.timeout(self._acquire_timeout):
                conn = await pool.acquire()
            try:
                async with asyncio.timeout(self._command_timeout):
                    async with conn.cursor() as cur:
                        yield cur
            except BaseException as exc:
                if not _server_error(exc):
                    conn.close()
                raise
            finally:
                pool.release(conn)

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[Any]:
        """A cursor inside BEGIN ... COMMIT.

        A refusal (stale token, bad value: the connection is fine) rolls back. After
        anything else (cancelled, timed out, connection lost) the connection's protocol
        state is unknown: ``_cursor`` closes it and the server rolls back.
        """
        async with self._cursor() as cur:
            await cur.execute("BEGIN")
            try:
                yield cur
            except BaseException as exc:
                if _server_error(exc):
                    await cur.connection.rollback()
                raise
            await cur.connection.commit()

    async def _retrying(self, call: Callable[[], Awaitable[T]]) -> T:
        """Run a transaction again when InnoDB chose it as a deadlock victim (rolled back)."""
        for _ in range(2):
            try:
                return await call()
            except StorageUnavailable as exc:
                if _code(exc.__cause__ or exc) != _DEADLOCK:
                    raise
                log.info("store %r: deadlock victim, running the transaction again", self.name)
        return await call()

    async def _hold_fence(self, cur: Any, scope: str, token: int) -> None:
        """Raise the mark of ``scope`` to ``token`` and lock its row until COMMIT.

        Raises:
            StaleToken: the mark is newer; the caller's transaction rolls back.
        """
        sha = scope_sha(scope)
        await cur.execute(
            "INSERT INTO fencegate_fence (scope_sha, scope, token, updated_at)"
            " VALUES (%s, %s, %s, NOW(6)) ON DUPLICATE KEY UPDATE"
            " updated_at = IF(token < %s, NOW(6), updated_at), token = GREATEST(token, %s)",
            (sha, scope, token, token, token),
        )
        await cur.execute(
            "SELECT token FROM fencegate_fence WHERE scope_sha = %s FOR UPDATE", (sha,)
        )
        row = await cur.fetchone()
        high_water = int(row[0])
        if high_water != token:
            raise StaleToken(token, high_water, scope=scope)


def _server_error(exc: BaseException) -> bool:
    """An error the server answered with: the connection itself is fine."""
    if isinstance(exc, StorageError):
        return not isinstance(exc, StorageUnavailable)
    code = _code(exc)
    return (
        isinstance(exc, asyncmy.errors.MySQLError)
        and 1000 <= code < 2000
        and code
        not in (
            1927,
            1053,
        )
    )
