"""Waiting without polling storms: push wake-ups, FIFO turns, bounded commands."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis

from lockservice import LockHeld, LockManager
from lockservice.backend import Attempt
from lockservice.turns import TRY_GRACE, Turns
from tests._servers import RedisNode


def script_calls(node: RedisNode) -> int:
    with redis.Redis.from_url(node.url) as r:
        stats = r.info("commandstats")
    return sum(
        int(stats.get(k, {}).get("calls", 0))
        for k in ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_fcall")
    )


async def test_release_wakes_a_waiter_of_another_manager_at_once(
    redis3: list[RedisNode],
) -> None:
    holder_mgr = await LockManager.connect([n.url for n in redis3])
    waiter_mgr = await LockManager.connect([n.url for n in redis3])
    try:
        lease = await holder_mgr.acquire("wait/push", ttl=20.0)
        loop = asyncio.get_running_loop()
        waiter = asyncio.create_task(waiter_mgr.acquire("wait/push", ttl=5.0, wait=10.0))
        await asyncio.sleep(1.5)  # its back-off timer is now long (up to 1.5 s)
        released_at = loop.time()
        await holder_mgr.release(lease)
        got = await waiter
        latency = loop.time() - released_at
        assert got.token > lease.token
        assert latency < 0.1, f"woken after {latency * 1000:.0f} ms: polled, not pushed"
        await waiter_mgr.release(got)
    finally:
        await holder_mgr.close()
        await waiter_mgr.close()


async def test_fifty_waiters_one_release_no_stampede(redis3: list[RedisNode]) -> None:
    managers = [await LockManager.connect([n.url for n in redis3]) for _ in range(2)]
    try:
        lease = await managers[0].acquire("wait/herd", ttl=30.0)
        tasks = [
            asyncio.create_task(managers[i % 2].acquire("wait/herd", ttl=30.0, wait=20.0))
            for i in range(50)
        ]
        await asyncio.sleep(2.0)  # every contender's back-off is at its 1 s ceiling
        for node in redis3:
            node.command("CONFIG", "RESETSTAT")
        await managers[0].release(lease)
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        await asyncio.sleep(0.05)
        calls = [script_calls(node) for node in redis3]
        assert len(done) == 1
        # the release, the winner's grant, the other manager's one contender, a poll or two
        assert max(calls) <= 8, f"script calls per node after one release: {calls}"
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        for mgr in managers:
            await mgr.close()


async def test_local_waiters_are_served_in_arrival_order() -> None:
    mgr = await LockManager.connect([])
    try:
        lease = await mgr.acquire("wait/fifo", ttl=10.0)
        order: list[int] = []

        async def waiter(i: int) -> None:
            got = await mgr.acquire("wait/fifo", ttl=10.0, wait=10.0)
            order.append(i)
            await mgr.release(got)

        tasks = []
        for i in range(10):
            tasks.append(asyncio.create_task(waiter(i)))
            await asyncio.sleep(0.01)
        await mgr.release(lease)
        await asyncio.gather(*tasks)
        assert order == list(range(10))
    finally:
        await mgr.close()


async def test_release_between_failed_try_and_sleep_is_not_missed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A waiter that subscribed after its failed try would sleep its whole back-off."""
    monkeypatch.setattr("lockservice.manager._BACKOFF_FIRST", 5.0)
    mgr = await LockManager.connect([])
    try:
        holder = await mgr.acquire("wait/race", ttl=30.0)
        backend = mgr.backend
        real_try = backend.try_acquire
        released = False

        async def try_then_release(
            name: str, lease_id: str, ttl: float, ticket: str, **kind: Any
        ) -> Attempt:
            nonlocal released
            attempt = await real_try(name, lease_id, ttl, ticket, **kind)
            if not attempt.token and not released:
                released = True
                await mgr.release(holder)  # lands after the try, before the sleep
            return attempt

        monkeypatch.setattr(backend, "try_acquire", try_then_release)
        loop = asyncio.get_running_loop()
        start = loop.time()
        lease = await mgr.acquire("wait/race", ttl=1.0, wait=20.0)
        assert loop.time() - start < 1.0
        assert lease.token > holder.token
    finally:
        await mgr.close()


async def test_only_a_try_that_may_wait_registers_for_wake_ups(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A try without waiting never sleeps: nothing to wake; one with a wait registers
    before it tries (see above), and leaves no registration behind."""
    mgr = await LockManager.connect([])
    try:
        backend = mgr.backend
        real_try = backend.try_acquire
        registered: list[int] = []

        async def counting(
            name: str, lease_id: str, ttl: float, ticket: str, **kind: Any
        ) -> Attempt:
            registered.append(len(backend.waiters))
            return await real_try(name, lease_id, ttl, ticket, **kind)

        monkeypatch.setattr(backend, "try_acquire", counting)
        holder = await mgr.acquire("wait/reg", ttl=30.0)
        with pytest.raises(LockHeld):
            await mgr.acquire("wait/reg", ttl=1.0)
        with pytest.raises(LockHeld):
            await mgr.acquire("wait/reg", ttl=1.0, wait=0.05)
        assert registered[:2] == [0, 0]
        assert registered[2:]
        assert all(n == 1 for n in registered[2:])
        assert len(backend.waiters) == 0
        await mgr.release(holder)
    finally:
        await mgr.close()


async def test_wait_bounds_the_total_time(redis3: list[RedisNode]) -> None:
    mgr = await LockManager.connect([n.url for n in redis3])
    try:
        await mgr.acquire("wait/bound", ttl=10.0)
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(LockHeld) as info:
            await mgr.acquire("wait/bound", ttl=1.0, wait=0.4)
        elapsed = loop.time() - start
        assert 0.35 < elapsed < 0.7
        assert 8.0 < info.value.retry_after <= 10.0
    finally:
        await mgr.close()


async def test_waiter_takes_over_when_the_holder_expires(redis3: list[RedisNode]) -> None:
    """No release is published on expiry: the waiter sleeps until the holder's TTL ends."""
    mgr = await LockManager.connect([n.url for n in redis3])
    try:
        holder = await mgr.acquire("wait/expiry", ttl=0.5)
        loop = asyncio.get_running_loop()
        lease = await mgr.acquire("wait/expiry", ttl=1.0, wait=5.0)
        late = loop.time() - holder.valid_until
        assert late < 0.15, f"took over {late * 1000:.0f} ms after the holder expired"
        assert lease.token > holder.token
    finally:
        await mgr.close()


async def test_a_release_right_before_close_still_goes_out(redis3: list[RedisNode]) -> None:
    """A release nobody awaits rides with the next write; close() must still send it."""
    urls = [n.url for n in redis3]
    first, second = await LockManager.connect(urls), await LockManager.connect(urls)
    try:
        lease = await first.acquire("wait/close", ttl=30.0)
        await first.release(lease)  # not awaited on the nodes: a valid lease of ours
        await first.close()
        got = await second.acquire("wait/close", ttl=1.0)  # no wait: free at once
        assert got.token > lease.token
    finally:
        await second.close()


async def test_a_turn_taken_free_queues_later_tasks_in_order() -> None:
    """A free name's turn is taken without a lock; the tasks that come while it is held
    queue on a lock made in the holder's place, a timed-out one drops out, and the
    turn ends with its last user."""
    turns = Turns()
    first = turns.join("t")
    assert first.users == 1
    assert first.lock is None
    order: list[str] = []

    async def queued(label: str) -> None:
        turn = turns.join("t")
        assert turn is first
        assert turn.users > 1
        try:
            await Turns.wait(turn, asyncio.get_running_loop().time() + 10)
            order.append(label)
            await asyncio.sleep(0)
            turn.release()
        finally:
            turns.leave("t", turn)

    async def gives_up() -> None:
        turn = turns.join("t")
        try:
            async with asyncio.timeout(0.01):
                await Turns.wait(turn, asyncio.get_running_loop().time() + 10)
        finally:
            turns.leave("t", turn)

    second = asyncio.create_task(queued("second"))
    await asyncio.sleep(0)
    assert first.lock is not None
    assert first.lock.locked()
    with pytest.raises(TimeoutError):
        await gives_up()
    third = asyncio.create_task(queued("third"))
    await asyncio.sleep(0.01)
    assert order == []  # the first task still holds the turn
    first.release()
    turns.leave("t", first)
    await asyncio.gather(second, third)
    assert order == ["second", "third"]
    assert turns.join("u").lock is None  # "t" is forgotten; a new name starts free


async def test_a_task_without_a_wait_waits_for_a_try_ahead_but_not_for_a_waiting_holder() -> None:
    """``Turns.wait`` past its deadline: TRY_GRACE while the holder tries, none while
    it waits for the lock between tries (``Turn.sleeping``)."""
    turns = Turns()
    holder = turns.join("t")
    loop = asyncio.get_running_loop()
    behind = turns.join("t")
    start = loop.time()
    with pytest.raises(TimeoutError):
        await Turns.wait(behind, start)  # the holder tries and never ends its turn
    assert loop.time() - start >= TRY_GRACE * 0.9
    holder.sleeping = True
    start = loop.time()
    with pytest.raises(TimeoutError):
        await Turns.wait(behind, start)
    assert loop.time() - start < TRY_GRACE / 2
    holder.sleeping = False
    waiting = asyncio.create_task(Turns.wait(behind, loop.time()))
    await asyncio.sleep(0.01)
    holder.release()  # the try ahead ended within the grace: the turn is its
    await waiting
