"""Redlock groups are independent: a group that loses its quorum takes only its own
names with it (protocol R27)."""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lockservice import LockHeld, LockManager, QuorumUnavailable
from lockservice.groups import Groups
from lockservice.placement import GroupSpec, owner
from tests._servers import RedisNode
from tests.campaign.proxy import FaultProxy
from tests.faults.conftest import MAX_TTL, NODE_TIMEOUT, wait_until

pytestmark = pytest.mark.faults


@pytest.fixture
def two_groups(tmp_path: Path) -> Iterator[tuple[list[RedisNode], list[RedisNode]]]:
    nodes = [RedisNode(tmp_path / f"node{i}") for i in range(6)]
    for node in nodes:
        node.start()
    yield nodes[:3], nodes[3:]
    for node in nodes:
        node.stop()


async def test_a_group_that_loses_its_quorum_leaves_the_other_groups_names_alone(
    two_groups: tuple[list[RedisNode], list[RedisNode]],
) -> None:
    a_nodes, b_nodes = two_groups
    a = GroupSpec.of([n.url for n in a_nodes], "a")
    b = GroupSpec.of([n.url for n in b_nodes], "b")
    names = [f"indep/{i}" for i in range(40)]
    of_a = [n for n in names if owner(n, ["a", "b"]) == "a"]
    of_b = [n for n in names if owner(n, ["a", "b"]) == "b"]
    assert of_a
    assert of_b
    mgr = await LockManager.connect(groups=[a, b], node_timeout=NODE_TIMEOUT, max_ttl=MAX_TTL)
    try:
        assert (await mgr.ready()).ready
        held = await mgr.acquire(of_a[0], ttl=MAX_TTL)
        b_nodes[0].kill()
        b_nodes[1].kill()
        took = []
        for name in of_a[1:]:  # no node of b is waited for: under one node timeout each
            start = time.perf_counter()
            await mgr.release(await mgr.acquire(name, ttl=1.0))
            took.append(time.perf_counter() - start)
        assert statistics.median(took) < NODE_TIMEOUT
        for name in of_b:
            with pytest.raises(QuorumUnavailable) as info:
                await mgr.acquire(name, ttl=1.0)
            assert set(info.value.node_errors) <= {n.url.split("/")[2] for n in b_nodes}
        held = await mgr.extend(held, ttl=MAX_TTL)  # a lease of group a lives on
        await mgr.release(held)
        readiness = await mgr.ready()
        states = dict(readiness.groups)
        assert not readiness.ready
        assert "group b" in readiness.reason
        assert states["a"] == "ok"
        assert states["b"] != "ok"
    finally:
        await mgr.close()


async def test_a_slow_group_does_not_delay_another_groups_acquires(
    two_groups: tuple[list[RedisNode], list[RedisNode]],
) -> None:
    """Two of group b's nodes paused: b's acquires wait out the node timeout and fail,
    while group a's, in the same process at the same time, do not wait behind them (no
    connection, lock or timeout is shared between groups)."""
    a_nodes, b_nodes = two_groups
    a = GroupSpec.of([n.url for n in a_nodes], "a")
    b = GroupSpec.of([n.url for n in b_nodes], "b")
    names = [f"slow/{i}" for i in range(60)]
    of_a = [n for n in names if owner(n, ["a", "b"]) == "a"]
    of_b = [n for n in names if owner(n, ["a", "b"]) == "b"]
    mgr = await LockManager.connect(groups=[a, b], node_timeout=NODE_TIMEOUT, max_ttl=MAX_TTL)
    stop = asyncio.Event()
    refused: list[str] = []

    async def keep_b_busy(name: str) -> None:
        while not stop.is_set():
            try:
                await mgr.release(await mgr.acquire(name, ttl=1.0))
            except QuorumUnavailable as exc:
                refused.extend(exc.node_errors.values())

    try:
        b_nodes[0].pause()
        b_nodes[1].pause()
        busy = [asyncio.create_task(keep_b_busy(name)) for name in of_b[:8]]
        await asyncio.sleep(NODE_TIMEOUT / 2)  # b's acquires are in flight, waiting
        took = []
        end = time.perf_counter() + 3 * NODE_TIMEOUT  # while b waits out three node timeouts
        for name in itertools.cycle(of_a):
            if (start := time.perf_counter()) > end:
                break
            await mgr.release(await mgr.acquire(name, ttl=1.0))
            took.append(time.perf_counter() - start)
        stop.set()
        await asyncio.gather(*busy)
        assert len(refused) >= 2 * 8, refused  # each of b's tasks was refused twice or more
        assert statistics.median(took) < NODE_TIMEOUT / 4, took
        # b's nodes did not answer in time (or, overdue, were dropped and are down)
        assert all(r.startswith(("no reply within the node timeout", "down")) for r in refused)
    finally:
        b_nodes[0].resume()
        b_nodes[1].resume()
        await mgr.close()


async def test_a_repeat_through_a_changing_gateway_never_reuses_a_lease_id_it_gave_up(
    two_groups: tuple[list[RedisNode], list[RedisNode]],
) -> None:
    """R7, R28: a lease id whose release may still be replayed is never tried again.

    A changing gateway's repeat of a key whose lease an old-configuration gateway
    holds finds that lease in the old group alone and tries again, keeping its own
    grants there (R28). Giving them up instead (``abandon``: a release, replayed on a
    node it could not reach) and trying again with the same lease id would let the
    replay that comes once the node's stuck commands surely ran (``Replay``,
    ``stall_after`` after the reconnect) free a grant of the lease decided in
    between: a third gateway would take the name in the old group while the lease
    is valid (I1)."""
    a_nodes, b_nodes = two_groups
    a = GroupSpec.of([n.url for n in a_nodes], "a")
    b = GroupSpec.of([n.url for n in b_nodes], "b")
    name = next(f"moved/{i}" for i in itertools.count() if owner(f"moved/{i}", ["a", "b"]) == "b")
    proxies = [FaultProxy(int(n.url.rsplit(":", 1)[1].split("/")[0])) for n in a_nodes]
    made: list[LockManager] = []
    try:
        for proxy in proxies:
            await proxy.start()
        via = GroupSpec.of([p.url for p in proxies], "a")  # the changing gateway's links

        async def make(groups: list[GroupSpec], previous: list[GroupSpec]) -> LockManager:
            mgr = await LockManager.connect(
                groups=groups, previous_groups=previous, node_timeout=NODE_TIMEOUT, max_ttl=10.0
            )
            made.append(mgr)
            return mgr

        old = await make([a], [])
        changing = await make([via, b], [via])
        backend = changing.backend
        assert isinstance(backend, Groups)
        links = backend.groups["a"].nodes

        async def link(i: int, up: bool) -> None:
            proxies[i].heal() if up else proxies[i].set("cut")
            await wait_until(lambda: links[i].connected == up, 5.0, f"link {i} {up}")

        keyed = await old.acquire(name, ttl=10.0, idempotency_key="K")
        await link(2, False)
        repeat = asyncio.create_task(
            changing.acquire(name, ttl=10.0, wait=8.0, idempotency_key="K")
        )
        await asyncio.sleep(0.2)  # it finds the old gateway's lease in group a alone
        assert not repeat.done()
        await link(2, True)  # reconnected: its give-ups are replayed, and again later
        await link(0, False)
        await old.release(keyed)
        lease = await asyncio.wait_for(repeat, 5.0)  # granted by a1 and a2 of group a
        await asyncio.sleep(links[2].stall_after + 0.3)  # the second replay ran
        third = await make([a], [])
        with pytest.raises(LockHeld):
            await third.acquire(name, ttl=1.0)
        assert not lease.expired
    finally:
        for mgr in made:
            await mgr.close()
        for proxy in proxies:
            await proxy.close()
