"""Fenced PUTs batched when the pool is full (pg_put_batch.py), on the real server.

Each test fills a one-connection pool with a PUT that waits on a fence row lock
held by another session (``in_flight_write``), queues PUTs behind it, then lets
the first one go: the queue is then written by as many statements as the rules
allow, and the counters of ``PostgresStore.batches`` say how many.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import asyncpg
import pytest

from storage_adapters import (
    BadValue,
    NotFound,
    PostgresStore,
    StaleToken,
    StorageUnavailable,
    pg_put_batch,
)
from storage_adapters.pg_put_batch import LOCK_TIMEOUT_MS
from tests.storage_adapters.conftest import pg_settings
from tests.storage_adapters.test_postgres import in_flight_write, wait_until_waiting_on_a_lock


@pytest.fixture
async def one(pg_dsn: str, pg_schema: str) -> AsyncIterator[PostgresStore]:
    """A store whose pool has one connection: a second PUT in flight queues."""
    async with PostgresStore(
        "kv",
        pg_dsn,
        schema=pg_schema,
        pool_min=1,
        pool_max=1,
        server_settings=pg_settings(pg_schema),
    ) as opened:
        yield opened


@pytest.fixture
async def patient(
    monkeypatch: pytest.MonkeyPatch, pg_dsn: str, pg_schema: str
) -> AsyncIterator[PostgresStore]:
    """As ``one``, with batches that wait 20 s for a lock: for the tests of what happens
    while a batch waits, which LOCK_TIMEOUT_MS would otherwise end early."""
    monkeypatch.setattr(pg_put_batch, "LOCK_TIMEOUT_MS", 20_000)
    async with PostgresStore(
        "kv", pg_dsn, schema=pg_schema, pool_max=1, server_settings=pg_settings(pg_schema)
    ) as opened:
        yield opened


class Blocked:
    """The pool's only connection busy with a PUT of scope ``blocker`` that waits for
    another session's fence row lock, until ``release``."""

    def __init__(self, store: PostgresStore, admin: asyncpg.Connection, dsn: str, schema: str):
        self.store, self.admin, self.dsn, self.schema = store, admin, dsn, schema

    async def __aenter__(self) -> Blocked:
        await self.store.put("blocker", "blocker", 1, b"first")
        self.other = await in_flight_write(self.dsn, self.schema, "blocker", 1)
        self.first = asyncio.create_task(self.store.put("blocker", "blocker", 2, b"second"))
        await wait_until_waiting_on_a_lock(self.admin, f"fg-{self.schema}")
        return self

    async def release(self) -> None:
        await self.other.execute("COMMIT")
        await self.other.close()
        await self.first

    async def __aexit__(self, *exc: object) -> None:
        if not self.other.is_closed():
            await self.other.close()


async def queued(store: PostgresStore, *puts: tuple[str, str, int, bytes]) -> list[asyncio.Task]:
    tasks = [asyncio.create_task(store.put(s, k, t, v)) for s, k, t, v in puts]
    await asyncio.sleep(0.05)
    assert not any(t.done() for t in tasks)  # all waiting behind the busy connection
    return tasks


async def test_puts_that_find_the_pool_full_go_in_one_statement(
    one: PostgresStore, admin: asyncpg.Connection, pg_dsn: str, pg_schema: str
) -> None:
    async with Blocked(one, admin, pg_dsn, pg_schema) as blocked:
        tasks = await queued(one, *((f"s{i}", f"k{i}", 10 + i, b"v%d" % i) for i in range(20)))
        await blocked.release()
        assert await asyncio.gather(*tasks) == [10 + i for i in range(20)]
    assert (one.batches.statements, one.batches.rows) == (1, 20)
    for i in range(20):
        record = await one.get(f"s{i}", f"k{i}", None)
        assert (record.body, record.token) == (b"v%d" % i, 10 + i)


async def test_a_stale_put_in_a_batch_writes_nothing_and_gets_the_mark(
    one: PostgresStore, admin: asyncpg.Connection, pg_dsn: str, pg_schema: str
) -> None:
    await one.put("s1", "k1", 50, b"kept")
    await one.put("s3", "k3", 7, b"kept too")
    async with Blocked(one, admin, pg_dsn, pg_schema) as blocked:
        tasks = await queued(
            one, ("s1", "k1", 40, b"late"), ("s2", "k2", 1, b"new"), ("s3", "k3", 7, b"same")
        )
        await blocked.release()
        results = await asyncio.gather(*tasks, return_exceptions=True)
    assert one.batches.statements == 1
    assert isinstance(results[0], StaleToken)
    assert (results[0].token, results[0].high_water, results[0].scope) == (40, 50, "s1")
    assert results[1:] == [1, 7]  # an equal token is accepted, as for a single PUT
    assert (await one.get("s1", "k1", None)).body == b"kept"
    assert (await one.get("s2", "k2", None)).body == b"new"
    assert (await one.get("s3", "k3", None)).body == b"same"


async def test_one_scope_or_key_twice_goes_in_successive_batches_in_order(
    one: PostgresStore, admin: asyncpg.Connection, pg_dsn: str, pg_schema: str
) -> None:
    """ON CONFLICT DO UPDATE may not touch a row twice in one statement: the second PUT of
    a scope or of a key waits for the next batch, so the queue's order is kept."""
    async with Blocked(one, admin, pg_dsn, pg_schema) as blocked:
        tasks = await queued(
            one,
            ("s", "a", 5, b"s5"),
            ("s", "b", 6, b"s6"),
            ("t", "x", 1, b"t1"),
            ("u", "x", 2, b"u2"),
            ("s", "c", 4, b"s4"),
        )
        await blocked.release()
        results = await asyncio.gather(*tasks, return_exceptions=True)
    assert results[:4] == [5, 6, 1, 2]
    assert isinstance(results[4], StaleToken)
    assert results[4].high_water == 6
    assert (one.batches.statements, one.batches.rows) == (3, 5)
    assert (await one.get("u", "x", None)).body == b"u2"
    assert (await one.get("s", "b", None)).token == 6


async def test_a_put_left_for_a_later_batch_keeps_its_place_for_its_scope(
    one: PostgresStore, admin: asyncpg.Connection, pg_dsn: str, pg_schema: str
) -> None:
    """B waits for A's key; C, of B's scope, must not go ahead of B: B's older token
    would then be stale, where in the queue's order both are accepted."""
    async with Blocked(one, admin, pg_dsn, pg_schema) as blocked:
        tasks = await queued(
            one, ("s1", "k1", 1, b"a"), ("s2", "k1", 5, b"b"), ("s2", "k2", 6, b"c")
        )
        await blocked.release()
        assert await asyncio.gather(*tasks) == [1, 5, 6]
    assert (one.batches.statements, one.batches.rows) == (3, 3)


async def test_a_batch_the_server_refuses_is_rerun_one_put_at_a_time(
    one: PostgresStore, admin: asyncpg.Connection, pg_dsn: str, pg_schema: str
) -> None:
    """A content type with NUL is refused by the server (text cannot hold it): the whole
    statement fails, so each PUT of it runs again alone and gets its own answer."""
    async with Blocked(one, admin, pg_dsn, pg_schema) as blocked:
        good = await queued(one, ("s1", "k1", 1, b"one"), ("s2", "k2", 2, b"two"))
        bad = asyncio.create_task(one.put("s3", "k3", 3, b"three", content_type="text/\x00"))
        await asyncio.sleep(0.05)
        await blocked.release()
        assert await asyncio.gather(*good) == [1, 2]
        with pytest.raises(BadValue):
            await bad
    assert one.batches.statements == 1
    assert (await one.get("s2", "k2", None)).body == b"two"
    assert (
        await admin.fetchval(
            f'SELECT token FROM "{pg_schema}".fencegate_fence WHERE scope = $1', "s3"
        )
        is None
    )


async def test_a_put_cancelled_while_queued_is_not_written(
    one: PostgresStore, admin: asyncpg.Connection, pg_dsn: str, pg_schema: str
) -> None:
    async with Blocked(one, admin, pg_dsn, pg_schema) as blocked:
        kept, dropped = await queued(one, ("s1", "k1", 1, b"kept"), ("s2", "k2", 2, b"dropped"))
        dropped.cancel()
        await blocked.release()
        assert await kept == 1
    assert (one.batches.statements, one.batches.rows) == (1, 1)
    assert (
        await admin.fetchval(
            f'SELECT count(*) FROM "{pg_schema}".fencegate_kv WHERE key = $1', "k2"
        )
        == 0
    )


async def test_a_batch_whose_connection_dies_fails_each_put_then_the_store_recovers(
    patient: PostgresStore, admin: asyncpg.Connection, pg_dsn: str, pg_schema: str
) -> None:
    """The batch waits on a fence row lock of another session when its backend is ended."""
    await patient.put("s2", "k0", 1, b"")  # the fence row exists, so another session can lock it
    holder = await in_flight_write(pg_dsn, pg_schema, "s2", 1)
    try:
        async with Blocked(patient, admin, pg_dsn, pg_schema) as blocked:
            tasks = await queued(patient, ("s1", "k1", 1, b"x"), ("s2", "k2", 2, b"y"))
            await blocked.release()
            await wait_until_waiting_on_a_lock(admin, f"fg-{pg_schema}")
            ended = await admin.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE application_name = $1",
                f"fg-{pg_schema}",
            )
            assert ended == 1
            results = await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        await holder.close()
    assert [type(r) for r in results] == [StorageUnavailable, StorageUnavailable]
    assert patient.batches.statements == 1
    assert await patient.put("s2", "k2", 3, b"after") == 3  # a new connection
    with pytest.raises(NotFound):  # nothing of the batch was committed
        await patient.get("s1", "k1", None)


async def test_a_batch_takes_every_fence_row_before_any_kv_row(
    patient: PostgresStore, admin: asyncpg.Connection, pg_dsn: str, pg_schema: str
) -> None:
    """Another session holding fence row s2 and then updating kv row k1 (fence rows
    first, as every writer) must not wait for a batch of (s1, k1), (s2, k2) that waits
    for s2: had the batch locked k1 before asking for s2, the two would deadlock."""
    await patient.put("s1", "k1", 1, b"k1")
    await patient.put("s2", "k2", 1, b"k2")
    other = await in_flight_write(pg_dsn, pg_schema, "s2", 1)
    try:
        async with Blocked(patient, admin, pg_dsn, pg_schema) as blocked:
            tasks = await queued(patient, ("s1", "k1", 2, b"b1"), ("s2", "k2", 2, b"b2"))
            await blocked.release()
            await wait_until_waiting_on_a_lock(admin, f"fg-{pg_schema}")  # on s2
            update = f'UPDATE "{pg_schema}".fencegate_kv SET value = $1 WHERE key = $2'
            await asyncio.wait_for(other.execute(update, b"other", "k1"), 0.5)
            await other.execute("COMMIT")
            assert await asyncio.gather(*tasks) == [2, 2]
    finally:
        await other.close()
    assert patient.batches.statements == 1
    assert (await patient.get("s1", "k1", None)).body == b"b1"  # after the other session's


async def test_a_scope_held_elsewhere_does_not_hold_up_the_other_puts_of_its_batch(
    one: PostgresStore, admin: asyncpg.Connection, pg_dsn: str, pg_schema: str
) -> None:
    """Another session holds fence row s2 for long (a trigger-fenced writer's transaction):
    the batch gives up its lock wait after LOCK_TIMEOUT_MS and each PUT runs alone, so the
    PUT of s1 is written while the one of s2 waits for its own scope only."""
    await one.put("s2", "k0", 1, b"")
    holder = await in_flight_write(pg_dsn, pg_schema, "s2", 1)
    try:
        async with Blocked(one, admin, pg_dsn, pg_schema) as blocked:
            s1, s2 = await queued(one, ("s1", "k1", 1, b"x"), ("s2", "k2", 2, b"y"))
            await blocked.release()
            assert await asyncio.wait_for(s1, 10 * LOCK_TIMEOUT_MS / 1000) == 1
            assert not s2.done()
            await holder.execute("COMMIT")
            assert await s2 == 2
    finally:
        await holder.close()
    assert one.batches.statements == 1


async def test_puts_one_at_a_time_are_never_batched(one: PostgresStore) -> None:
    for token in range(1, 6):
        await one.put("s", "k", token, b"v")
    assert one.batches.statements == 0


async def test_random_concurrent_puts_keep_the_fencing_order(pg_dsn: str, pg_schema: str) -> None:
    """Many PUTs with random tokens over a few scopes through a small pool, so that most
    go in batches: per scope the mark ends at the largest token, a refused PUT's token is
    below the mark it was shown, and each key holds its largest accepted write."""
    rng = random.Random(7)
    puts = [(f"s{i % 4}", f"s{i % 4}-k{i % 3}", rng.randrange(1, 10_000)) for i in range(300)]
    async with PostgresStore(
        "kv", pg_dsn, schema=pg_schema, pool_max=2, server_settings=pg_settings(pg_schema)
    ) as store:
        results = await asyncio.gather(
            *(store.put(s, k, t, b"%d" % t) for s, k, t in puts), return_exceptions=True
        )
        assert store.batches.rows > 100  # most went in batches
        best: dict[str, int] = {}
        for (_, key, token), result in zip(puts, results, strict=True):
            if isinstance(result, StaleToken):
                assert result.token < result.high_water
            else:
                assert result == token
                best[key] = max(best.get(key, 0), token)
        for scope in {s for s, _, _ in puts}:
            top = max((t, k) for s, k, t in puts if s == scope)
            assert best[top[1]] == top[0]  # the scope's largest token is always accepted
        for key, token in best.items():
            record = await store.get(key.split("-")[0], key, None)
            assert (record.body, record.token) == (b"%d" % token, token)
