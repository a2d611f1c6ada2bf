"""Cancelled acquires and releases: nothing is left behind, the client keeps working.

"At once" below means well inside ``SOON``, while every lease involved has a
TTL of ``LONG``: a leftover grant or queue place would show as a wait of
seconds, not milliseconds.
"""

from __future__ import annotations

import asyncio

import pytest

from lockservice import LockManager
from tests._servers import RedisNode
from tests.faults.conftest import MAX_TTL, Connect, lock_key, reply_int

pytestmark = pytest.mark.faults

LONG = MAX_TTL
SOON = 0.5


async def _free_at_once(mgr: LockManager, name: str) -> None:
    """``mgr`` gets ``name`` within ``SOON`` (waiting only for releases in flight)."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    lease = await mgr.acquire(name, ttl=1.0, wait=SOON)
    assert loop.time() - start < SOON
    await mgr.release(lease)


async def test_acquire_cancelled_by_timeout_mid_round_leaves_no_grant(
    own_redis3: list[RedisNode], connect: Connect
) -> None:
    mgr, other = await connect(own_redis3), await connect(own_redis3)
    a, b, c = own_redis3
    b.pause()  # A grants at once; the outcome hangs on B and C for a node timeout
    c.pause()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await mgr.acquire("cancel/timeout", ttl=LONG)
    await asyncio.sleep(0.02)  # the undo is on its way, not awaited by anyone
    assert reply_int(a.command("EXISTS", lock_key("cancel/timeout"))) == 0
    b.resume()  # both run the acquire, then the undo queued behind it
    c.resume()
    await _free_at_once(other, "cancel/timeout")
    await _free_at_once(mgr, "cancel/timeout")  # the cancelled client still works


@pytest.mark.parametrize("steps", range(8))
async def test_acquire_cancelled_right_after_sending_leaves_no_grant(
    own_redis3: list[RedisNode], connect: Connect, steps: int
) -> None:
    """Cancel after ``steps`` loop iterations: before, during and after the replies."""
    mgr, other = await connect(own_redis3), await connect(own_redis3)
    task = asyncio.create_task(mgr.acquire("cancel/task", ttl=LONG))
    for _ in range(steps):
        await asyncio.sleep(0)
    task.cancel()
    (outcome,) = await asyncio.gather(task, return_exceptions=True)
    if not isinstance(outcome, asyncio.CancelledError):
        await mgr.release(outcome)  # it finished before the cancel: a normal lease
    await _free_at_once(other, "cancel/task")


async def test_waiter_cancelled_in_queue_leaves_no_queue_place(
    own_redis3: list[RedisNode], connect: Connect
) -> None:
    holder, quitter, patient = [await connect(own_redis3) for _ in range(3)]
    lease = await holder.acquire("cancel/queue", ttl=LONG)
    waiter = asyncio.create_task(quitter.acquire("cancel/queue", ttl=1.0, wait=5.0))
    await asyncio.sleep(0.1)  # queued first, on every node
    assert all(reply_int(n.command("ZCARD", "waitq:{cancel/queue}")) == 1 for n in own_redis3)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    queued = asyncio.create_task(patient.acquire("cancel/queue", ttl=1.0, wait=5.0))
    await asyncio.sleep(0.1)
    await holder.release(lease)
    loop = asyncio.get_running_loop()
    start = loop.time()
    second = await queued  # not behind a dead place until its keepalive runs out
    assert loop.time() - start < SOON
    assert second.token > lease.token
    await patient.release(second)


@pytest.mark.parametrize("how", ["cancel", "timeout"])
async def test_release_cancelled_in_flight_still_releases(
    own_redis3: list[RedisNode], connect: Connect, how: str
) -> None:
    """A release through another replica waits for answers; cancel it while it does."""
    mgr, other, third = [await connect(own_redis3) for _ in range(3)]
    _, b, c = own_redis3
    lease = await mgr.acquire("cancel/release", ttl=LONG)
    b.pause()  # the release cannot decide until B and C answer
    c.pause()
    if how == "cancel":
        task = asyncio.create_task(other.release(lease))
        await asyncio.sleep(0.02)
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    else:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.02):
                await other.release(lease)
    b.resume()
    c.resume()
    await _free_at_once(third, "cancel/release")
    await _free_at_once(other, "cancel/release")


async def test_lock_body_cancelled_releases_the_lock(
    own_redis3: list[RedisNode], connect: Connect
) -> None:
    mgr, other = await connect(own_redis3), await connect(own_redis3)
    inside = asyncio.Event()

    async def holder() -> None:
        async with mgr.lock("cancel/body", ttl=LONG, auto_renew=True):
            inside.set()
            await asyncio.sleep(60)

    task = asyncio.create_task(holder())
    await inside.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await _free_at_once(other, "cancel/body")
