"""Fenced PUTs that find every pooled connection busy, written together in one statement.

A fenced PUT to the postgres store normally runs alone on a pooled connection
(``PostgresStore._put``). When the pool has no idle connection and no room for
another, it does not wait for a connection on its own: it joins the queue here,
and the next connection the pool hands out takes every queued PUT (up to
``MAX_ROWS`` rows, ``MAX_BYTES`` of values, one PUT per scope and per key) in
ONE statement: one round trip, one commit, one WAL flush for all of them,
instead of one each. Under a light load nothing is queued and nothing waits
for company; under a heavy one the batches grow with the queue.

Each row keeps the single PUT's guarantee, in the same statement: its scope's
mark is raised by the same ``ON CONFLICT ... WHERE token <= EXCLUDED.token``
(the fence row locked until commit, so writers of a scope queue on it through
any gateway), and its kv row is written only when that mark was raised; a row
whose token is stale writes nothing and gets ``StaleToken`` with the mark as it
is after the statement. One PUT per scope and per key: ``ON CONFLICT DO UPDATE``
may not touch a row twice in one statement, and two PUTs of one scope or key
keep their order by going in successive batches.

Lock order: the statement takes every fence row it raises first, in scope
order (the kv rows come from a sort and an aggregate over the fence CTE, which
must read all of it before the first kv row is written), then the kv rows in
key order. A single PUT and a fenced delete take one fence row, then one kv
row. Every writer thus locks in one global order (fence rows by scope, then kv
rows by key), so batches and single writes never wait on each other in a cycle,
even when one key is written under two scopes (``X-Fencing-Lock``).

A batch waits at most ``LOCK_TIMEOUT_MS`` for a row lock: a scope whose fence
row another session holds longer (a long transaction of a writer fenced by the
trigger, say) must not hold up every other PUT of the batch. A batch that the
server refuses as a whole (a lock it waited for too long, one row's value, any
error it answered on a live session) is rerun one PUT at a time, so that each
PUT gets its own answer and waits only for its own scope. A connection error fails every PUT of the
batch with the same ``StorageUnavailable``; each may be retried once by the
store, as a single PUT is. A PUT whose caller is cancelled while it waits in
the queue is dropped from it; once sent, it is written or refused with the rest.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import asyncpg

from storage_adapters._pg import DRIVER_ERRORS, reusable_after, storage_error
from storage_adapters.errors import StaleToken, StorageError, StorageUnavailable
from storage_adapters.pg_pool import PgPool

__all__ = ["LOCK_TIMEOUT_MS", "MAX_BYTES", "MAX_ROWS", "PutBatches", "RunAlone", "batch_put_sql"]

MAX_ROWS: Final = 64
"""PUTs in one statement at most."""
MAX_BYTES: Final = 1 << 20
"""Value bytes in one statement at most (a larger value still goes, alone)."""
LOCK_TIMEOUT_MS: Final = 200
"""How long a batch waits for a row lock (set for its own transaction only): a scope
held longer elsewhere (another gateway's batch, a trigger-fenced writer's transaction)
must not hold up the batch's other PUTs, which then run alone."""


class RunAlone(Exception):
    """Set on a PUT whose batch the server refused as a whole: run it on its own."""


def batch_put_sql(schema_q: str, kv: str) -> str:
    """The batched fenced upsert: $1 scopes, $2 tokens, $3 keys, $4 values, $5 content
    types (arrays, one element per PUT), $6 store name; returns the keys written."""
    return (
        "WITH input AS (SELECT t.* FROM"
        f" (SELECT set_config('lock_timeout', '{LOCK_TIMEOUT_MS}ms', true)) AS g,"
        " unnest($1::text[], $2::bigint[], $3::text[], $4::bytea[], $5::text[])"
        " AS t(scope, token, key, value, content_type)),"
        f" fence AS (INSERT INTO {schema_q}.fencegate_fence AS f (scope, token, updated_at)"
        " SELECT scope, token, now() FROM input ORDER BY scope"
        " ON CONFLICT (scope) DO UPDATE"
        " SET token = EXCLUDED.token, updated_at = EXCLUDED.updated_at"
        " WHERE f.token <= EXCLUDED.token"
        " RETURNING f.scope),"
        " accepted AS (SELECT array_agg(scope) AS scopes FROM fence)"
        f" INSERT INTO {kv} AS kv (store, key, value, content_type, token, updated_at)"
        " SELECT $6::text, i.key, i.value, i.content_type, i.token, now()"
        " FROM input i, accepted a WHERE i.scope = ANY (a.scopes) ORDER BY i.key"
        " ON CONFLICT (store, key) DO UPDATE SET value = EXCLUDED.value,"
        " content_type = EXCLUDED.content_type, token = EXCLUDED.token,"
        " updated_at = EXCLUDED.updated_at"
        " RETURNING kv.key"
    )


@dataclass(slots=True)
class _Put:
    scope: str
    key: str
    token: int
    body: bytes
    content_type: str
    done: asyncio.Future[None]


class PutBatches:
    """The queue of fenced PUTs of one store that wait for a connection, and its batches."""

    def __init__(self, store: str, schema_q: str, kv: str, pool: Callable[[], PgPool]) -> None:
        self._store = store
        self._pool = pool
        self._sql = batch_put_sql(schema_q, kv)
        self._marks_sql = (
            f"SELECT scope, token FROM {schema_q}.fencegate_fence WHERE scope = ANY ($1::text[])"
        )
        self._queue: deque[_Put] = deque()
        self._taker = False  # a task waits for a connection for the queue
        self._tasks: set[asyncio.Task[None]] = set()
        self.statements = 0
        """Batch statements sent (tests and benchmarks read it)."""
        self.rows = 0
        """PUTs sent in them."""

    def wanted(self, pool: PgPool) -> bool:
        """Whether a fenced PUT should queue here: others already do, or the pool is full."""
        return bool(self._queue) or pool.full

    async def put(self, scope: str, key: str, token: int, body: bytes, content_type: str) -> None:
        """Write in the next batch; raises ``StaleToken``, a ``StorageError`` or ``RunAlone``."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append(_Put(scope, key, token, body, content_type, done))
        if not self._taker:
            self._start_taker()
        await done  # cancelled here: the future is cancelled, and skipped if still queued

    def _start_taker(self) -> None:
        self._taker = True
        task = asyncio.get_running_loop().create_task(self._take_and_write())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _take_and_write(self) -> None:
        """Wait for a connection, take a batch from the queue, and write it."""
        try:
            pool = self._pool()
            conn = await pool.acquire()
        except BaseException as exc:
            self._taker = False
            queued, self._queue = self._queue, deque()
            self._fail(queued, exc)
            if not isinstance(exc, (Exception, asyncio.CancelledError)):
                raise
            return
        batch = self._take()
        self._taker = False
        if self._queue:  # left over (a scope or key twice) or come since: the next batch
            self._start_taker()
        if not batch:  # every PUT taken was cancelled meanwhile
            pool.release(conn)
            return
        await self._write(pool, conn, batch)

    def _take(self) -> list[_Put]:
        """The oldest queued PUTs, one per scope and per key, within the batch's bounds.

        A PUT left in the queue still claims its scope and key: no later PUT of either
        goes ahead of it (of A(s1, k1), B(s2, k1), C(s2, k2), only A goes now: B waits
        for k1, and C for B's scope)."""
        queue = self._queue
        batch: list[_Put] = []
        scopes: set[str] = set()
        keys: set[str] = set()
        left: deque[_Put] = deque()
        size = 0
        while queue:
            put = queue.popleft()
            if put.done.done():  # its caller was cancelled
                continue
            if (
                len(batch) >= MAX_ROWS
                or (batch and size + len(put.body) > MAX_BYTES)
                or put.scope in scopes
                or put.key in keys
            ):
                left.append(put)
            else:
                batch.append(put)
                size += len(put.body)
            scopes.add(put.scope)
            keys.add(put.key)
        self._queue = left
        return batch

    async def _write(self, pool: PgPool, conn: Any, batch: list[_Put]) -> None:
        self.statements += 1
        self.rows += len(batch)
        try:
            written = {
                row[0]
                for row in await conn.fetch(
                    self._sql,
                    [p.scope for p in batch],
                    [p.token for p in batch],
                    [p.key for p in batch],
                    [p.body for p in batch],
                    [p.content_type for p in batch],
                    self._store,
                )
            }
            stale = [p for p in batch if p.key not in written]
            marks: dict[str, int] = {}
            if stale:
                rows = await conn.fetch(self._marks_sql, [p.scope for p in stale])
                marks = {scope: int(token) for scope, token in rows}
        except BaseException as exc:
            pool.release(conn, exc)
            refused = isinstance(exc, asyncpg.PostgresError) and reusable_after(exc)
            self._fail(batch, RunAlone() if refused else exc)
            if not isinstance(exc, (Exception, asyncio.CancelledError)):
                raise
            return
        pool.release(conn)
        for put in batch:
            if put.done.done():
                continue
            if put.key in written:
                put.done.set_result(None)
            else:
                put.done.set_exception(
                    StaleToken(put.token, marks.get(put.scope, 0), scope=put.scope)
                )

    def _fail(self, puts: list[_Put] | deque[_Put], exc: BaseException) -> None:
        for put in puts:
            if not put.done.done():
                put.done.set_exception(self._error(exc))

    def _error(self, exc: BaseException) -> BaseException:
        """What one PUT of a failed batch raises: its own instance, caused by ``exc``."""
        if isinstance(exc, RunAlone):
            return RunAlone()
        if isinstance(exc, StorageError):  # the store was closed under the queue
            return exc
        error: BaseException | None = None
        if isinstance(exc, DRIVER_ERRORS):
            error = storage_error(self._store, exc)
        if error is None or isinstance(error, asyncio.CancelledError):
            # Our task was cancelled (the loop is closing), or a bug: never silently.
            error = StorageUnavailable(self._store, f"batch not written: {type(exc).__name__}")
        error.__cause__ = exc  # as ``raise ... from exc`` on the single path (_retry_once)
        return error
