"""I5 over majority quorums (R32): a semaphore lease needs every node's grant.

Per-node caps of ``permits`` do not add up over majorities: with 3 nodes and
permits 2, leases granted on {n1,n2}, {n1,n3} and {n2,n3} leave every node at 2
holders and make 3 valid leases. Each manager here reaches the nodes through
its own proxies; before each grant one of its links is cut (a minority), as a
gateway that cannot reach one node. R32 makes those acquires fail; once every
link is back the semaphore grants again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from lockservice import Lease, LockHeld, LockManager, QuorumUnavailable
from lockservice.redlock import Redlock
from tests._servers import RedisNode
from tests.campaign.proxy import FaultProxy
from tests.faults.conftest import NODE_TIMEOUT, wait_until

pytestmark = pytest.mark.faults

PERMITS = 2


@pytest.fixture
async def linked(
    own_redis3: list[RedisNode],
) -> AsyncIterator[list[tuple[LockManager, list[FaultProxy]]]]:
    """Two managers (gateways), each over its own proxy to each of the 3 nodes."""
    made: list[tuple[LockManager, list[FaultProxy]]] = []
    try:
        for _ in range(2):
            proxies = [FaultProxy(int(n.url.rsplit(":", 1)[1].split("/")[0])) for n in own_redis3]
            for proxy in proxies:
                await proxy.start()
            mgr = await LockManager.connect(
                [p.url for p in proxies], node_timeout=NODE_TIMEOUT, max_ttl=30.0
            )
            made.append((mgr, proxies))
        yield made
    finally:
        for mgr, proxies in made:
            await mgr.close()
            for proxy in proxies:
                await proxy.close()


def _nodes(mgr: LockManager) -> list[bool]:
    backend = mgr.backend
    assert isinstance(backend, Redlock)
    return [node.connected for node in backend.nodes]


async def _reach(mgr: LockManager, proxies: list[FaultProxy], cut: int | None) -> None:
    """Every link of ``mgr`` passes but ``cut``; return once the manager sees it so."""
    for i, proxy in enumerate(proxies):
        if i == cut:
            proxy.set("cut")
        else:
            proxy.heal()
    want = [i != cut for i in range(len(proxies))]
    await wait_until(lambda: _nodes(mgr) == want, 10.0, f"links as {want}")


async def test_a_semaphore_never_has_more_valid_leases_than_permits_over_majorities(
    linked: list[tuple[LockManager, list[FaultProxy]]],
) -> None:
    name = "sem/every-node"
    leases: list[Lease] = []
    refusals: list[Exception] = []
    for g, cut in ((0, 2), (1, 1), (0, 0)):  # L1 on {n0,n1}, L2 on {n0,n2}, L3 on {n1,n2}
        mgr, proxies = linked[g]
        await _reach(mgr, proxies, cut)
        try:
            leases.append(await mgr.acquire_semaphore(name, PERMITS, ttl=20.0, wait=0.0))
        except (QuorumUnavailable, LockHeld) as exc:
            refusals.append(exc)
        valid = [lease for lease in leases if not lease.expired]
        assert len(valid) <= PERMITS, f"{len(valid)} valid leases of a {PERMITS}-permit semaphore"
    # every link back: the semaphore grants again, up to its permits and no more
    for mgr, proxies in linked:
        await _reach(mgr, proxies, None)
    got = [lease for lease in leases if not lease.expired]
    for g in range(PERMITS + 1):
        mgr = linked[g % 2][0]
        with contextlib.suppress(LockHeld):
            got.append(await mgr.acquire_semaphore(name, PERMITS, ttl=20.0, wait=0.0))
    assert len(refusals) == 3
    for exc in refusals:
        assert isinstance(exc, QuorumUnavailable)
        assert exc.needed == 3
        assert "a semaphore needs every node" in str(exc)
    assert len([lease for lease in got if not lease.expired]) == PERMITS
    await asyncio.sleep(0)


async def test_a_semaphore_extend_that_misses_a_node_does_not_extend(
    linked: list[tuple[LockManager, list[FaultProxy]]],
) -> None:
    """Extended on a majority only, a lease would outlive its grant on the other node,
    whose slot a new lease could take: an extend counts only on every node (R32)."""
    mgr, proxies = linked[0]
    lease = await mgr.acquire_semaphore("sem/extend", PERMITS, ttl=5.0, wait=0.0)
    await _reach(mgr, proxies, 1)
    with pytest.raises(QuorumUnavailable) as raised:
        await mgr.extend(lease, ttl=20.0)
    assert raised.value.needed == 3
    await _reach(mgr, proxies, None)
    extended = await mgr.extend(lease, ttl=20.0)
    assert extended.valid_until > lease.valid_until + 10.0


async def test_a_semaphore_extend_through_a_handle_that_misses_a_node_does_not_extend(
    linked: list[tuple[LockManager, list[FaultProxy]]],
) -> None:
    """The gateway's renew routes extend a handle (name and lease id, labelled
    exclusive: ``LockManager.handle``), whatever the lease's kind. A semaphore lease
    renewed that way must still count every node (R32), not a majority."""
    mgr, proxies = linked[0]
    lease = await mgr.acquire_semaphore("sem/extend-handle", PERMITS, ttl=5.0, wait=0.0)
    await _reach(mgr, proxies, 1)
    handle = LockManager.handle(lease.name, lease.lease_id)  # as gateway.lock_routes does
    with pytest.raises(QuorumUnavailable) as raised:
        await mgr.extend(handle, ttl=20.0)
    assert raised.value.needed == 3
    assert "a semaphore needs every node" in str(raised.value)  # the gateway's 503 says so
    await _reach(mgr, proxies, None)
    extended = await mgr.extend(handle, ttl=20.0)
    assert extended.valid_until > lease.valid_until + 10.0
