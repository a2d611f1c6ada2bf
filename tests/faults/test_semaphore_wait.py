"""A waiting semaphore acquire that meets a paused node waits for it within its wait.

A semaphore lease needs every node (R32), so one node paused (SIGSTOP) stops new
semaphore leases while exclusive and shared locks go on with a majority. An
acquire with ``wait`` > 0 that a majority answered keeps trying until its wait is
spent: granted once the node is back, else ``QuorumUnavailable`` (503) when the
wait ran out with the node still missing. A dead quorum (fewer than a majority
answering) still fails at once, as for every kind.
"""

from __future__ import annotations

import asyncio

import pytest

from lockservice import LockManager, QuorumUnavailable
from tests._servers import RedisNode
from tests.faults.conftest import Connect, node_connected, wait_until

pytestmark = pytest.mark.faults

PERMITS = 2


async def _fill_and_free(mgr: LockManager, name: str) -> None:
    """Every permit of ``name`` is free: no grant of a failed wait was left behind."""
    leases = [await mgr.acquire_semaphore(name, PERMITS, ttl=1.5) for _ in range(PERMITS)]
    assert len({lease.lease_id for lease in leases}) == PERMITS
    for lease in leases:
        await mgr.release(lease)


async def test_semaphore_acquire_waits_for_a_paused_node_and_is_granted_once_it_resumes(
    own_redis3: list[RedisNode], connect: Connect
) -> None:
    mgr = await connect(own_redis3)
    exclusive = await connect(own_redis3)
    loop = asyncio.get_running_loop()
    wait = 8.0
    paused = own_redis3[2]
    paused.pause()
    try:
        start = loop.time()
        task = asyncio.create_task(mgr.acquire_semaphore("sem/wait", PERMITS, ttl=1.5, wait=wait))
        # a lock goes on with the majority meanwhile (R32: only semaphores need every node)
        other = await exclusive.acquire("sem/other", ttl=2.0, wait=1.0)
        await exclusive.release(other)
        await asyncio.sleep(1.0)
        assert not task.done(), task.result()  # still waiting, not failed at once
    finally:
        paused.resume()
    resumed = loop.time()
    lease = await task
    got = loop.time()
    assert lease.permits == PERMITS
    assert lease.valid_until > got
    # granted after the node came back, well before the wait ran out
    assert (got - start) / wait < 0.75, (resumed - start, got - start)
    second = await mgr.acquire_semaphore("sem/wait", PERMITS, ttl=1.5)
    assert second.token > lease.token
    for held in (lease, second):
        await mgr.release(held)
    await _fill_and_free(mgr, "sem/wait")


async def test_semaphore_acquire_with_a_node_paused_past_its_wait_answers_quorum_unavailable(
    own_redis3: list[RedisNode], connect: Connect
) -> None:
    mgr = await connect(own_redis3)
    loop = asyncio.get_running_loop()
    wait = 2.0
    own_redis3[1].pause()
    try:
        start = loop.time()
        with pytest.raises(QuorumUnavailable) as failed:
            await mgr.acquire_semaphore("sem/past", PERMITS, ttl=1.5, wait=wait)
        took = loop.time() - start
    finally:
        own_redis3[1].resume()
    assert failed.value.needed == 3
    assert failed.value.majority
    assert "a semaphore needs every node" in str(failed.value)
    # it kept trying for the whole wait, and not much longer (one last try)
    assert 1.0 <= took / wait < 1.75, took
    await wait_until(lambda: node_connected(mgr, 1), 10.0, "the resumed node reconnected")
    await _fill_and_free(mgr, "sem/past")


async def test_semaphore_acquire_without_a_majority_fails_at_once_whatever_its_wait(
    own_redis3: list[RedisNode], connect: Connect
) -> None:
    """Two of three nodes down is a dead quorum for every kind: no waiting on it
    (as test_node_down's exclusive acquire)."""
    mgr = await connect(own_redis3)
    loop = asyncio.get_running_loop()
    wait = 8.0
    own_redis3[1].kill()
    own_redis3[2].kill()
    await wait_until(
        lambda: not node_connected(mgr, 1) and not node_connected(mgr, 2), 10.0, "nodes down"
    )
    start = loop.time()
    with pytest.raises(QuorumUnavailable) as failed:
        await mgr.acquire_semaphore("sem/dead", PERMITS, ttl=1.5, wait=wait)
    took = loop.time() - start
    assert not failed.value.majority
    assert took / wait < 0.1, took
