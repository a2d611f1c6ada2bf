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
from prometheus_client import CollectorRegistry

from gateway.app import create_app
from lockservice import LockManager, QuorumUnavailable
from tests._gateway import ServeClient
from tests._servers import RedisNode
from tests.faults.conftest import Connect, node_connected, wait_until
from tests.gateway.conftest import make_config

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


async def test_over_http_the_wait_is_kept_then_the_answer_is_200_or_503(
    own_redis3: list[RedisNode], gateway_client: ServeClient
) -> None:
    """The routes as a client sees them: with one node paused, ``POST /v1/semaphores``
    with ``wait_ms`` answers 200 once the node is back within it, and 503
    ``quorum_unavailable`` after about ``wait_ms`` when it is not."""
    config = make_config(lock_urls=[n.url for n in own_redis3])
    client = await gateway_client(create_app(config, registry=CollectorRegistry()))
    loop = asyncio.get_running_loop()
    url = "/v1/semaphores/sem/http"

    async def free() -> bool:  # a new cluster may hold a node in quarantine at first
        response = await client.post(url, json={"permits": PERMITS, "ttl_ms": 1500})
        if response.status != 200:
            return False
        lease = await response.json()
        gone = await client.delete(url, headers={"X-Lease-Id": lease["lease_id"]})
        return gone.status == 204

    await wait_until(free, 10.0, "semaphores granted")
    wait_ms = 2000
    own_redis3[0].pause()
    try:
        start = loop.time()
        body = {"permits": PERMITS, "ttl_ms": 1500, "wait_ms": wait_ms}
        refused = await client.post(url, json=body)
        took = loop.time() - start
    finally:
        own_redis3[0].resume()
    answer = await refused.json()
    assert (refused.status, answer["error"]) == (503, "quorum_unavailable"), answer
    assert "a semaphore needs every node" in answer["message"]
    assert 1.0 <= took / (wait_ms / 1000) < 1.75, took
    await wait_until(free, 10.0, "the resumed node counts again")
    own_redis3[0].pause()
    try:
        pending = asyncio.create_task(client.post(url, json={**body, "wait_ms": 8000}))
        await asyncio.sleep(1.0)
        assert not pending.done()
    finally:
        own_redis3[0].resume()
    granted = await pending
    assert granted.status == 200, await granted.text()
    assert (await granted.json())["permits"] == PERMITS
