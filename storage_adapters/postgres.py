"""A key-value store owned by fencegate, in PostgreSQL, fenced by the mark table.

Tables (created by ``start`` in ``schema`` when missing)::

    fencegate_fence(scope text PRIMARY KEY, token bigint NOT NULL, updated_at timestamptz)
    fencegate_kv(store text, key text, value bytea, content_type text, token bigint,
                 updated_at timestamptz, PRIMARY KEY (store, key))

How each call reaches the server (all prepared statements, cached by asyncpg):

* ``put``: ONE statement (when the pool has no connection free, one statement
  for every fenced PUT waiting for one: ``pg_put_batch.py``). A data-modifying
  CTE upserts the fence row with
  ``ON CONFLICT ... WHERE fencegate_fence.token <= EXCLUDED.token`` and the kv
  upsert selects from it, so the kv row is written only when the fence row
  was; the fence row lock, held until commit, queues every other writer of the
  scope through any gateway. Only when nothing was written a second query
  reads the mark for ``StaleToken``. The fenced one is prepared once per
  connection and kept by the store (``_put_stmt``), not looked up in asyncpg's cache.
* fenced ``get``: two statements, raise the mark, then read. Not one: in READ
  COMMITTED a statement reads with the snapshot taken when it *started*, so a
  fenced read that waited on the fence row lock of an in-flight write would
  raise the mark after that write committed but return the value from before
  it, and the reader's next write would silently overwrite it (the lost
  update that fenced reads exist to prevent). The second statement's snapshot
  is taken after the mark is raised, so it sees every write accepted before.
* fenced ``delete``: one short transaction, raise the mark, then delete, for
  the same reason (a DELETE does not see a row inserted by a writer it waited
  for), with the fence row locked until the delete commits.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import asyncpg

from storage_adapters._pg import (
    DRIVER_ERRORS,
    RECONNECT_LOG,
    PgStoreBase,
    check_exact_keys,
    ensure_tables,
    fence_ddl,
    raise_mark_sql,
    storage_error,
)
from storage_adapters.base import NO_HOOKS, Record, StoreHooks
from storage_adapters.errors import NotFound
from storage_adapters.pg_pool import PgPool
from storage_adapters.pg_put_batch import PutBatches, RunAlone

__all__ = ["PostgresStore"]

_KV: Final = "fencegate_kv"


class PostgresStore(PgStoreBase):
    """A key-value store in fencegate's own table, one row per ``(store, key)``.

    Args:
        name: the store name (``[stores.<name>]``), also the ``store`` column.
        dsn: a libpq connection string or URL.
        schema: where ``fencegate_fence`` and ``fencegate_kv`` live (created if missing).
        pool_min, pool_max: connection pool bounds (``pg_pool.PgPool``).
        hooks: metrics hooks.
        acquire_timeout: seconds to wait for a pooled connection.
        command_timeout: seconds one statement may run; None for no limit.
        connect_timeout: seconds to open one connection.
        server_settings: session settings; ``application_name`` is ``fencegate`` unless
            set here or in the DSN; ``default_transaction_isolation`` is always READ COMMITTED.
    """

    kind = "postgres"

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
        super().__init__(
            name,
            dsn,
            schema=schema,
            pool_min=pool_min,
            pool_max=pool_max,
            hooks=hooks,
            acquire_timeout=acquire_timeout,
            command_timeout=command_timeout,
            connect_timeout=connect_timeout,
            server_settings=server_settings,
        )
        s = self._schema_q
        kv = f"{s}.{_KV}"
        on_conflict = (
            " ON CONFLICT (store, key) DO UPDATE SET value = EXCLUDED.value,"
            " content_type = EXCLUDED.content_type, token = EXCLUDED.token,"
            " updated_at = EXCLUDED.updated_at"
            " RETURNING kv.token"
        )
        # $1 scope, $2 store, $3 token, $4 key, $5 body, $6 content type. The kv row is
        # written only if the fence CTE returned a row, i.e. the token was accepted.
        self._put_sql = (
            f"WITH fence AS ({raise_mark_sql(s, '$1', '$3')})"
            f" INSERT INTO {kv} AS kv (store, key, value, content_type, token, updated_at)"
            " SELECT $2::text, $4::text, $5::bytea, $6::text, fence.token, now() FROM fence"
            + on_conflict
        )
        # The baseline: the same upsert without the fence. $1 store, $2 key, $3 body, $4 type.
        self._put_unfenced_sql = (
            f"INSERT INTO {kv} AS kv (store, key, value, content_type, token, updated_at)"
            " VALUES ($1::text, $2::text, $3::bytea, $4::text, NULL, now())" + on_conflict
        )
        self._get_sql = (
            f"SELECT value, content_type, token FROM {s}.{_KV} WHERE store = $1 AND key = $2"
        )
        self._delete_sql = f"DELETE FROM {s}.{_KV} WHERE store = $1 AND key = $2"
        # The fenced upsert prepared on each connection (asyncpg PreparedStatement).
        self._put_stmts: dict[Any, Any] = {}
        # Fenced PUTs that find the pool full, written together (pg_put_batch.py).
        self.batches = PutBatches(self.name, s, kv, self._require_started)

    async def _prepare(self, conn: object) -> None:
        s = self._schema_q
        kv_ddl = (
            f"CREATE TABLE {s}.{_KV} ("
            " store text NOT NULL,"
            " key text NOT NULL,"
            " value bytea NOT NULL,"
            " content_type text NOT NULL,"
            " token bigint,"
            " updated_at timestamptz NOT NULL DEFAULT now(),"
            " PRIMARY KEY (store, key))"
        )
        await ensure_tables(conn, self.schema, {"fencegate_fence": fence_ddl(s), _KV: kv_ddl})
        await check_exact_keys(conn, self.name, self.schema, _KV)

    async def _put(
        self, scope: str, key: str, token: int | None, body: bytes, content_type: str
    ) -> int | None:
        pool = self._require_started()
        batched = False
        if token is not None and self.batches.wanted(pool):
            try:
                await self.batches.put(scope, key, token, body, content_type)
                batched = True
            except RunAlone:
                pass  # the server refused its batch as a whole: alone, for its own answer
        if not batched:
            await self._put_alone(pool, scope, key, token, body, content_type)
        if RECONNECT_LOG.reason is not None:  # the call ran: the server answers again
            RECONNECT_LOG.recovered(self.name)
        return token

    async def _put_alone(
        self, pool: PgPool, scope: str, key: str, token: int | None, body: bytes, content_type: str
    ) -> None:
        """The PUT in a statement of its own, on a connection of its own.

        ``async with self._conn()`` spelled out, as on no other path: the fenced PUT
        is the gateway's hottest store call, and the checkout's two coroutines cost.
        """
        try:
            conn = await pool.acquire()
            try:
                if token is None:
                    await conn.fetchrow(self._put_unfenced_sql, self.name, key, body, content_type)
                else:
                    stmt = self._put_stmts.get(conn)
                    if stmt is None:
                        stmt = await self._put_stmt(conn)
                    args = (scope, self.name, token, key, body, content_type)
                    try:
                        row = await stmt.fetchrow(*args)
                    except asyncpg.exceptions.InvalidCachedStatementError:
                        # The table changed under the statement (ALTER TABLE): as
                        # conn.fetchrow does with its cached one, prepare it anew, once.
                        self._put_stmts.pop(conn, None)
                        row = await conn.fetchrow(self._put_sql, *args)
                    if row is None:
                        raise await self._stale(conn, scope, token)
            except BaseException as exc:
                pool.release(conn, exc)
                raise
            pool.release(conn)
        except DRIVER_ERRORS as exc:
            raise storage_error(self.name, exc) from exc

    async def _put_stmt(self, conn: Any) -> Any:
        """The fenced upsert prepared on ``conn``, kept for the connection's next PUTs.

        ``conn.fetchrow(sql)`` finds the same server-side statement in asyncpg's
        cache, but through five coroutines, a cache lookup and clock reads per
        call; a prepared statement binds and executes straight away. PgPool hands
        connections back as they are (no reset), so the statement stays valid for
        as long as its connection is open; those of closed connections are
        dropped here before the dict outgrows the pool.
        """
        if len(self._put_stmts) >= self._pool_max:
            self._put_stmts = {c: st for c, st in self._put_stmts.items() if not c.is_closed()}
        stmt = self._put_stmts[conn] = await conn.prepare(self._put_sql)
        return stmt

    async def _get(self, scope: str, key: str, token: int | None) -> Record:
        async with self._conn() as conn:
            if token is not None:
                # Its own statement, committed before the read starts: see the module doc.
                await self._raise_mark(conn, scope, token)
            row = await conn.fetchrow(self._get_sql, self.name, key)
        if row is None:
            raise NotFound(self.name, key)
        return Record(
            body=bytes(row["value"]), token=row["token"], content_type=row["content_type"]
        )

    async def _delete(self, scope: str, key: str, token: int | None) -> None:
        async with self._conn() as conn:
            if token is None:
                await conn.execute(self._delete_sql, self.name, key)
                return
            async with conn.transaction():
                await self._raise_mark(conn, scope, token)
                await conn.execute(self._delete_sql, self.name, key)
