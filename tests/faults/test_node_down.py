"""Nodes killed: a minority down changes nothing, a majority down fails fast."""

from __future__ import annotations

import asyncio
import contextlib
import itertools

import pytest

from lockservice import LockHeld, LockManager, QuorumUnavailable
from tests._servers import RedisNode
from tests.faults.conftest import (
    MAX_TTL,
    Connect,
    cut_off,
    lock_key,
    node_connected,
    reply_int,
    wait_until,
)

pytestmark = pytest.mark.faults

FAST = 0.5  # well under a second, with node_timeout = 0.2


async def test_acquire_and_release_succeed_with_one_node_killed(
    own_redis3: list[RedisNode], connect: Connect
) -> None:
    mgr = await connect(own_redis3)
    own_redis3[2].kill()
    tokens = []
    for _ in range(20):
        lease = await mgr.acquire("down/one", ttl=2.0)
        tokens.append(lease.token)
        lease = await mgr.extend(lease, ttl=2.0)
        await mgr.release(lease)
    assert all(a < b for a, b in itertools.pairwise(tokens))
    # A replica started while the node is down works too, and the releases
    # above really freed the lock on a majority: it is free at once.
    other = await connect(own_redis3)
    loop = asyncio.get_running_loop()
    start = loop.time()
    lease = await other.acquire("down/one", ttl=2.0, wait=1.0)
    assert loop.time() - start < FAST
    assert lease.token > tokens[-1]
    await other.release(lease)


async def test_a_confirmed_release_a_node_missed_is_replayed_when_it_reconnects(
    own_redis3: list[RedisNode], connect: Connect
) -> None:
    """R7: a release answered by a quorum (a handle's, as the gateway's DELETE) that
    could not reach a node frees the lock there too once the node is back."""
    mgr = await connect(own_redis3, max_ttl=30.0)
    lease = await mgr.acquire("down/replayed", ttl=30.0)  # no expiry frees it in the test
    node = own_redis3[2]
    await cut_off(mgr, node, 2)  # its grant stays: nothing reaches it now
    await mgr.release(LockManager.handle(lease.name, lease.lease_id))
    node.resume()
    assert reply_int(node.command("EXISTS", lock_key(lease.name))) == 1
    await wait_until(lambda: node_connected(mgr, 2), 5.0, "node reconnected")
    await wait_until(
        lambda: reply_int(node.command("EXISTS", lock_key(lease.name))) == 0,
        5.0,
        "release replayed",
    )


async def test_quorum_unavailable_at_once_with_two_nodes_killed(
    own_redis3: list[RedisNode], connect: Connect
) -> None:
    mgr, other = await connect(own_redis3), await connect(own_redis3)
    held = await mgr.acquire("down/two", ttl=MAX_TTL)
    own_redis3[1].kill()
    own_redis3[2].kill()
    loop = asyncio.get_running_loop()
    for wait in (0.0, 5.0, 0.0):
        start = loop.time()
        with pytest.raises(QuorumUnavailable) as info:
            await mgr.acquire("down/other", ttl=1.0, wait=wait)  # no waiting on a dead quorum
        assert loop.time() - start < FAST
        assert info.value.needed == 2
        assert len(info.value.node_errors) >= 2
    start = loop.time()
    with pytest.raises(QuorumUnavailable):
        await mgr.extend(held, ttl=MAX_TTL)
    with pytest.raises(QuorumUnavailable):
        await other.release(held)  # through another replica: it must ask the nodes
    with contextlib.suppress(QuorumUnavailable):
        await mgr.release(held)  # its own valid lease: sent without waiting for answers
    assert not (await mgr.ready()).ready
    assert loop.time() - start < 2 * FAST


async def test_waiter_on_held_lock_with_one_node_killed_waits_for_it(
    own_redis3: list[RedisNode], connect: Connect
) -> None:
    _, b, c = own_redis3
    holder, other = await connect(own_redis3), await connect(own_redis3)
    loop = asyncio.get_running_loop()
    c.kill()
    first = await holder.acquire("down/held", ttl=1.0)  # held on A and B: a majority
    b.pause()  # B is merely slow: it answers 50 ms late, well inside the node timeout
    waiter = asyncio.create_task(other.acquire("down/held", ttl=1.0, wait=MAX_TTL))
    await asyncio.sleep(0.05)
    b.resume()
    done, _ = await asyncio.wait({waiter}, timeout=0.2)
    assert not done, waiter.result()  # still waiting; else raise what ended the wait
    released = loop.time()
    await holder.release(first)
    second = await waiter
    assert loop.time() - released < FAST
    assert second.token > first.token


async def test_service_resumes_after_two_killed_nodes_restart_with_their_data(
    persistent_redis3: list[RedisNode], connect: Connect
) -> None:
    nodes = persistent_redis3
    mgr = await connect(nodes)
    before = await mgr.acquire("down/resume", ttl=1.0)
    await mgr.release(before)
    await asyncio.sleep(0.05)  # the release is sent, not awaited: let it reach the nodes
    nodes[1].kill()
    nodes[2].kill()
    with pytest.raises(QuorumUnavailable):
        await mgr.acquire("down/resume", ttl=1.0)
    nodes[1].start()  # AOF with fsync always: every counter and marker survives
    nodes[2].start()

    async def granted() -> bool:
        try:
            lease = await mgr.acquire("down/resume", ttl=1.0)
        except (QuorumUnavailable, LockHeld):
            return False
        assert lease.token > before.token
        await mgr.release(lease)
        return True

    # resync, then at most one quarantine of max_ttl: the same LockManager serves again
    await wait_until(granted, MAX_TTL + 4.0, "service resumed")
