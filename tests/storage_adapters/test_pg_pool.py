"""The stores' own connection pool (``storage_adapters/pg_pool.py``) on the real PostgreSQL.

Each pool names its backends by a unique ``application_name``, so that
``pg_stat_activity`` counts exactly its connections.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from storage_adapters import PostgresStore
from storage_adapters.errors import StaleToken
from storage_adapters.pg_pool import PgPool, PoolClosing
from tests._servers import free_port

MakePool = Callable[..., PgPool]


@pytest.fixture
async def make_pool(pg_dsn: str) -> AsyncIterator[MakePool]:
    """``make_pool(**overrides)``: an unstarted pool with its own application_name."""
    pools: list[PgPool] = []

    def make(dsn: str = pg_dsn, **overrides: object) -> PgPool:
        app = f"fg-pool-{uuid.uuid4().hex[:10]}"
        args: dict[str, object] = {
            "min_size": 1,
            "max_size": 1,
            "acquire_timeout": 5.0,
            "connect_timeout": 5.0,
            "command_timeout": 10.0,
            "server_settings": {"application_name": app},
            **overrides,
        }
        pool = PgPool(dsn, **args)  # type: ignore[arg-type]
        pool.app = app  # type: ignore[attr-defined]
        pools.append(pool)
        return pool

    yield make
    for pool in pools:
        pool.terminate()


async def backends(pg_dsn: str, pool: PgPool) -> int:
    admin = await asyncpg.connect(pg_dsn)
    try:
        count: int = await admin.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
            pool.app,  # type: ignore[attr-defined]
        )
        return count
    finally:
        await admin.close()


async def until(check: Callable[[], bool], seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_waiters_are_served_first_come_first_served(make_pool: MakePool) -> None:
    pool = make_pool(max_size=1)
    await pool.start()
    held = await pool.acquire()
    served: list[int] = []

    async def waiter(i: int) -> None:
        conn = await pool.acquire()
        served.append(i)
        await asyncio.sleep(0.01)  # later arrivals queue meanwhile
        pool.release(conn)

    tasks = []
    for i in range(5):
        tasks.append(asyncio.create_task(waiter(i)))
        await asyncio.sleep(0.01)  # queued in order
    assert pool.waiting == 5
    pool.release(held)
    await asyncio.wait_for(asyncio.gather(*tasks), 10)
    assert served == [0, 1, 2, 3, 4]
    assert (pool.size, pool.idle, pool.waiting) == (1, 1, 0)


async def test_a_waiter_times_out_after_acquire_timeout_and_leaves_no_trace(
    make_pool: MakePool,
) -> None:
    pool = make_pool(max_size=1, acquire_timeout=0.2)
    await pool.start()
    held = await pool.acquire()
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(pool.acquire(), 5)
    assert 0.15 < time.monotonic() - started < 2
    assert pool.waiting == 0
    pool.release(held)
    assert await pool.acquire() is held  # the released connection went to idle, not to it


async def test_one_timer_fails_each_waiter_at_its_own_deadline(make_pool: MakePool) -> None:
    # The pool's one timer is armed for the first waiter's deadline; that waiter is
    # served early, and the timer must neither fail the next waiter then nor forget it.
    pool = make_pool(max_size=1, acquire_timeout=1.0)
    await pool.start()
    held = await pool.acquire()
    first = asyncio.create_task(pool.acquire())
    await asyncio.sleep(0.05)
    pool.release(held)
    held = await asyncio.wait_for(first, 5)
    await asyncio.sleep(0.45)
    started = time.monotonic()
    second = asyncio.create_task(pool.acquire())
    await asyncio.sleep(0.6)  # past the first waiter's deadline, not the second's
    assert not second.done()
    assert pool.waiting == 1
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(second, 5)
    assert 0.9 < time.monotonic() - started < 3
    assert pool.waiting == 0
    pool.release(held)
    assert await pool.acquire() is held


async def test_never_more_than_max_size_backends_under_concurrency(
    pg_dsn: str, make_pool: MakePool
) -> None:
    pool = make_pool(min_size=0, max_size=3)
    await pool.start()
    seen: list[int] = []

    async def call() -> None:
        conn = await pool.acquire()
        try:
            seen.append(
                await conn.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1"
                    " AND pg_sleep(0.02) IS NOT NULL",
                    pool.app,  # type: ignore[attr-defined]
                )
            )
            assert pool.size <= 3
        finally:
            pool.release(conn)

    await asyncio.wait_for(asyncio.gather(*(call() for _ in range(30))), 30)
    assert max(seen) == 3
    assert pool.size == 3
    assert await backends(pg_dsn, pool) == 3


async def test_a_connection_the_server_terminated_is_replaced(
    pg_dsn: str, make_pool: MakePool
) -> None:
    pool = make_pool(min_size=1, max_size=1)
    await pool.start()
    conn = await pool.acquire()
    pid = conn.get_server_pid()
    pool.release(conn)
    admin = await asyncpg.connect(pg_dsn)
    try:
        assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
    finally:
        await admin.close()
    await until(conn.is_closed)

    again = await pool.acquire()
    assert again is not conn
    assert await again.fetchval("SELECT 1") == 1
    assert again.get_server_pid() != pid
    pool.release(again)
    assert pool.size == 1


async def test_a_connection_left_in_a_transaction_by_a_failing_block_is_not_reused(
    pg_dsn: str, make_pool: MakePool
) -> None:
    pool = make_pool(min_size=1, max_size=1)
    await pool.start()
    conn = await pool.acquire()
    try:
        await conn.execute("BEGIN")
        await conn.execute("SELECT 1/0")
    except asyncpg.DataError as exc:
        pool.release(conn, exc)
    assert conn.is_closed()
    assert pool.size == 0
    again = await pool.acquire()
    assert again is not conn
    assert not again.is_in_transaction()
    pool.release(again)
    assert await backends(pg_dsn, pool) == 1


async def test_an_ordinary_sql_error_keeps_the_connection_and_others_drop_it(
    make_pool: MakePool,
) -> None:
    pool = make_pool(min_size=0, max_size=1)
    await pool.start()
    conn = await pool.acquire()
    try:
        await conn.execute("SELECT 1/0")
    except asyncpg.DataError as exc:
        pool.release(conn, exc)
    assert await pool.acquire() is conn  # no round trip, no new connection
    pool.release(conn, asyncio.CancelledError())  # a cancelled block: state unknown
    assert conn.is_closed()
    assert (pool.size, pool.idle) == (0, 0)


async def test_idle_connections_above_min_size_close_after_max_idle(
    pg_dsn: str, make_pool: MakePool
) -> None:
    pool = make_pool(min_size=1, max_size=3, max_idle=0.3)
    await pool.start()
    conns = [await pool.acquire() for _ in range(3)]
    for conn in conns:
        pool.release(conn)
    assert await backends(pg_dsn, pool) == 3
    await asyncio.sleep(0.15)
    kept = await pool.acquire()  # used again: the most recently released
    pool.release(kept)
    await until(lambda: pool.size == 1)
    assert pool.idle == 1
    assert await pool.acquire() is kept
    pool.release(kept)
    await until(lambda: sum(not c.is_closed() for c in conns) == 1)
    assert await backends(pg_dsn, pool) == 1


async def test_a_waiter_cancelled_as_a_connection_reaches_it_loses_nothing(
    make_pool: MakePool,
) -> None:
    pool = make_pool(max_size=1, acquire_timeout=1.0)
    await pool.start()
    held = await pool.acquire()
    waiter = asyncio.create_task(pool.acquire())
    await asyncio.sleep(0.01)
    assert pool.waiting == 1
    pool.release(held)  # handed to the waiter ...
    waiter.cancel()  # ... which is cancelled before it runs
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert (pool.size, pool.idle, pool.waiting) == (1, 1, 0)
    assert await pool.acquire() is held


async def test_a_waiter_cancelled_as_a_slot_reaches_it_frees_the_slot(
    make_pool: MakePool,
) -> None:
    pool = make_pool(min_size=0, max_size=1, acquire_timeout=1.0)
    await pool.start()
    held = await pool.acquire()
    waiter = asyncio.create_task(pool.acquire())
    await asyncio.sleep(0.01)
    pool.release(held, RuntimeError("broken"))  # dropped: its slot goes to the waiter ...
    waiter.cancel()  # ... which is cancelled before it opens a connection
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert (pool.size, pool.waiting) == (0, 0)
    conn = await pool.acquire()  # the slot is free again
    assert await conn.fetchval("SELECT 1") == 1


async def test_the_floor_is_restored_in_the_background(make_pool: MakePool) -> None:
    pool = make_pool(min_size=2, max_size=2)
    await pool.start()
    conn = await pool.acquire()
    pool.release(conn, ConnectionResetError())
    assert pool.size < 2 or pool.idle < 2
    await until(lambda: (pool.size, pool.idle) == (2, 2))


async def test_close_waits_for_connections_in_use_then_closes_them(
    pg_dsn: str, make_pool: MakePool
) -> None:
    pool = make_pool(min_size=2, max_size=2)
    await pool.start()
    conn = await pool.acquire()
    closing = asyncio.create_task(pool.close(grace=5.0))
    await asyncio.sleep(0.2)
    assert not closing.done()
    with pytest.raises(PoolClosing):
        await pool.acquire()
    assert await conn.fetchval("SELECT 1") == 1  # still usable while in use
    pool.release(conn)
    assert await asyncio.wait_for(closing, 5) is True
    assert conn.is_closed()
    assert await backends(pg_dsn, pool) == 0


async def test_close_terminates_connections_still_in_use_after_its_grace(
    pg_dsn: str, make_pool: MakePool
) -> None:
    pool = make_pool(min_size=1, max_size=2)
    await pool.start()
    conn = await pool.acquire()
    started = time.monotonic()
    assert await pool.close(grace=0.3) is False
    assert 0.25 < time.monotonic() - started < 3
    assert conn.is_closed()
    deadline = time.monotonic() + 5
    while await backends(pg_dsn, pool):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)


async def test_a_refused_connection_fails_the_call_and_frees_its_slot(
    pg_dsn: str, make_pool: MakePool
) -> None:
    port = free_port()  # nothing listens there
    dsn = urlunsplit(urlsplit(pg_dsn)._replace(netloc=f"postgres@127.0.0.1:{port}"))
    pool = make_pool(dsn, min_size=1, max_size=1)
    with pytest.raises(ConnectionRefusedError):
        await pool.start()
    assert pool.size == 0
    pool = make_pool(dsn, min_size=0, max_size=1, acquire_timeout=2.0)
    await pool.start()
    for _ in range(3):  # each call fails by the refusal, none by waiting for a lost slot
        with pytest.raises(ConnectionRefusedError):
            await pool.acquire()
        assert (pool.size, pool.waiting) == (0, 0)


async def test_a_store_keeps_its_connection_after_a_stale_token(
    pg_dsn: str, pg_schema: str
) -> None:
    """A refused token is an answer, not a broken session: no reconnect per stale write."""
    app = f"fg-pool-{uuid.uuid4().hex[:10]}"
    store = PostgresStore(
        "kv", pg_dsn, schema=pg_schema, pool_min=1, pool_max=1,
        server_settings={"application_name": app},
    )  # fmt: skip
    await store.start()
    try:
        admin = await asyncpg.connect(pg_dsn)
        try:
            pids = "SELECT array_agg(pid) FROM pg_stat_activity WHERE application_name = $1"
            assert await store.put("kv/k", "k", 5, b"five") == 5
            before = await admin.fetchval(pids, app)
            with pytest.raises(StaleToken):
                await store.put("kv/k", "k", 3, b"three")
            assert await store.put("kv/k", "k", 6, b"six") == 6
            assert await admin.fetchval(pids, app) == before
        finally:
            await admin.close()
    finally:
        await store.close()
