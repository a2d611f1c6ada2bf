"""The in-process backend counts tokens per lock name, as Redis does with ``fence:{name}``."""

from __future__ import annotations

import asyncio
import time

from lockservice import LockManager
from lockservice.memory import MemoryBackend


async def test_issued_is_per_name_and_zero_for_a_name_never_locked() -> None:
    mgr = LockManager(MemoryBackend())
    first = await mgr.acquire("a", ttl=5.0)
    await mgr.release(first)
    second = await mgr.acquire("a", ttl=5.0)
    other = await mgr.acquire("b", ttl=5.0)
    assert second.token > first.token
    assert await mgr.issued("a") == second.token
    assert await mgr.issued("b") == other.token
    assert await mgr.issued("never-locked") == 0
    # the guard refuses a token above issued(name): a's token is not one of c's
    assert await mgr.issued("c") < second.token
    await mgr.release(second)
    info = await mgr.inspect("a")
    assert (info.held, info.token) == (False, second.token)
    assert (await mgr.inspect("never-locked")).token == 0


async def test_tokens_start_above_the_wall_clock_so_a_restart_issues_larger_ones() -> None:
    before = time.time_ns() // 1_000_000 * 1000
    old = LockManager(MemoryBackend())
    old_token = (await old.acquire("a", ttl=5.0)).token
    assert old_token > before
    await asyncio.sleep(0.002)  # a restarted gateway: a new backend at least a millisecond later
    new = LockManager(MemoryBackend())
    assert (await new.acquire("a", ttl=5.0)).token > old_token


async def test_a_forgotten_name_keeps_increasing_and_its_bound_stays_above_its_tokens() -> None:
    mgr = LockManager(MemoryBackend(max_names=2))
    tokens = []
    for _ in range(3):
        lease = await mgr.acquire("a", ttl=5.0)
        tokens.append(lease.token)
        await mgr.release(lease)
    for name in ("b", "c"):  # push "a" out of the two names remembered
        await mgr.release(await mgr.acquire(name, ttl=5.0))
    assert await mgr.issued("a") >= tokens[-1]  # an upper bound: the guard still accepts it
    again = await mgr.acquire("a", ttl=5.0)
    assert again.token > tokens[-1]
    assert await mgr.issued("a") == again.token


async def test_idempotency_digests_go_with_their_leases() -> None:
    backend = MemoryBackend()
    mgr = LockManager(backend)
    for i in range(50):
        lease = await mgr.acquire(f"idem/{i}", ttl=5.0, idempotency_key=f"key {i}")
        await mgr.release(lease)
    for i in range(50):
        await mgr.acquire_semaphore("idem/sem", 100, ttl=0.05, idempotency_key=f"key {i}")
    await asyncio.sleep(0.06)
    backend._sweep()
    assert backend._locks == {}  # nothing of any key is kept once its lease is gone
