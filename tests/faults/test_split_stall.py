"""R33: two waiters that split the two live nodes (a node down) are resolved in a retry.

With node A dead, W1 (the earlier ticket) holds B's grant and W2 holds C's; each
is queued on the other node behind the other's grant (R8, R15: a waiter that two
nodes answer keeps its grant). R15's tie-break resolves the split in W2's undo on
C: it gives the grant up because W1, an earlier waiter, is queued there, and the
hand-over (R9) gives C to W1.

Before R33 that undo did not happen when W2's retry decided before C answered: the
decider counted C (whose grant W2 holds) as granted, so B's "held" decided the
round; then ``usable`` counted only the answers (B), fewer than Q, so the undo gave
up (no ticket) and named the grant W2 knew. But the retry's acquire had already
re-issued C's grant with a new token (R12), so that undo found another token and
did nothing (R13), and the re-issued grant, answered late, was W2's again. Every
retry re-issued both grants with a fresh ttl, so none expired: the split lasted
until a retry of W2 happened to hear C before it decided - not bounded by the ttl
(these tests failed so; the model's liveness check, ``tests/model/liveness.py``,
prints that schedule with R33 off). With R33, "held" waits for C's answer, which
counts as usable, and the undo names the re-issued token.

Fault proxies order it deterministically (``split``): W2's link to B is a little
slow, its link to C slower (every retry of W2 hears B's "held" first), W1's link
to C slowest (W1 reaches C after W2's grant and W2's first undo there). Node
states are read on the nodes themselves (lock:, fence: and waitq: keys).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from lockservice import Lease, LockManager
from tests._servers import RedisNode
from tests.campaign.proxy import FaultProxy
from tests.faults.conftest import Connect, node_connected, reply_bulk, wait_until

pytestmark = pytest.mark.faults

NAME = "split/stall"
TTL = 2.0  # above a queued waiter's longest poll (1.5 s): no grant lapses between retries
# A hand-over counts from the waiter's last try that node answered (R10), and a queued
# waiter polls up to 1.5 s apart: with a ttl near that, a handed-over grant may be
# (nearly) over when it arrives. R33's bound is checked with this one.
LONG_TTL = 3.0
NODE_TIMEOUT = 1.0  # above the slowed links' round trip, so no node counts as stalled
SLOW_B = 0.01  # W2 -> B, each way (the other links answer within a ms or so)
SLOW_C = 0.05  # W2 -> C, each way
SLOW_W1 = 0.3  # W1 -> C, each way: after W2's first round (about 2 * SLOW_C) and undo

Gateways = tuple[list[LockManager], list[list[FaultProxy]]]


def owner(node: RedisNode) -> str:
    value = reply_bulk(node.command("GET", f"lock:{{{NAME}}}"))
    return "" if value is None else value.decode().split(":", 1)[0]


def queued(node: RedisNode) -> list[str]:
    """The lease ids in the node's wait queue, in ticket order."""
    raw = node.command("ZRANGE", f"waitq:{{{NAME}}}", "0", "-1")
    lines = raw.split(b"\r\n")
    assert lines[0].startswith(b"*"), raw
    members = [lines[i].decode() for i in range(2, 2 * int(lines[0][1:]) + 1, 2)]
    return [m.split("@", 1)[0] for m in members]


def is_split(b: RedisNode, c: RedisNode) -> bool:
    ob, oc = owner(b), owner(c)
    return bool(ob and oc and ob != oc and queued(b) == [oc] and queued(c) == [ob])


@pytest.fixture
async def gateways(own_redis3: list[RedisNode], connect: Connect) -> AsyncIterator[Gateways]:
    """Two gateways, each through a fault proxy per node; node A killed."""
    await connect(own_redis3, max_ttl=2 * LONG_TTL)  # a settled cluster; stops the nodes after
    proxies = [[FaultProxy(n.port) for n in own_redis3] for _ in range(2)]
    managers: list[LockManager] = []
    try:
        for links in proxies:
            for proxy in links:
                await proxy.start()
            managers.append(
                await LockManager.connect(
                    [p.url for p in links], node_timeout=NODE_TIMEOUT, max_ttl=2 * LONG_TTL
                )
            )
        for i, mgr in enumerate(managers):  # connected, scripts loaded
            await mgr.release(await mgr.acquire(f"{NAME}/warm{i}", ttl=TTL))
        own_redis3[0].kill()
        await wait_until(lambda: not any(node_connected(m, 0) for m in managers), 3.0, "A dropped")
        yield managers, proxies
    finally:
        for mgr in managers:
            await mgr.close()
        for links in proxies:
            for proxy in links:
                await proxy.close()


async def split(
    gw: Gateways, b: RedisNode, c: RedisNode, ttl: float = TTL
) -> tuple[asyncio.Task[Lease], asyncio.Task[Lease]]:
    """W1 (gateway 1, earlier ticket) holds B, W2 (gateway 2) holds C, each queued on
    the other node. W2's link to B is a little slow (it reaches B after W1's grant),
    its link to C slower (so each retry of W2 hears B's "held" before C), and W1's
    link to C slowest (it reaches C after W2's grant and W2's first undo there)."""
    (g1, g2), (links1, links2) = gw
    links2[1].set("delay", SLOW_B)
    links2[2].set("delay", SLOW_C)
    links1[2].set("delay", SLOW_W1)
    w1 = asyncio.create_task(g1.acquire(NAME, ttl=ttl, wait=6 * TTL))
    await asyncio.sleep(0.005)  # W1's ticket is the earlier one
    w2 = asyncio.create_task(g2.acquire(NAME, ttl=ttl, wait=6 * TTL))
    await wait_until(lambda: is_split(b, c) or w1.done() or w2.done(), 2 * TTL, "a split")
    assert is_split(b, c), "no split: the proxies' delays did not order the tries"
    links1[2].heal()
    return w1, w2


async def granted_within(
    tasks: tuple[asyncio.Task[Lease], asyncio.Task[Lease]], within: float
) -> set[asyncio.Task[Lease]]:
    """The acquires done within ``within`` s; both are cancelled unless that is W1's
    alone (the split lasted, or W2 got ahead of an earlier waiter)."""
    done, _ = await asyncio.wait(set(tasks), timeout=within, return_when=asyncio.FIRST_COMPLETED)
    if done != {tasks[0]}:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return done


async def test_the_later_waiters_retry_gives_its_minority_grant_up(
    own_redis3: list[RedisNode], gateways: Gateways
) -> None:
    """W2's first retry waits for C's answer (R33), its undo names the re-issued grant
    and gives it up, as W1 is queued there (R15); C goes to W1 (R9), W2 stays queued
    on C. Before R33 neither got a lease for over a ttl (both re-issued their grants
    at every retry, each node's counter rising)."""
    _, b, c = own_redis3
    (g1, g2), _ = gateways
    w1, w2 = await split(gateways, b, c)
    first = (owner(b), owner(c))
    done = await granted_within((w1, w2), 0.5 * TTL)
    assert done == {w1}, f"no lease within 0.5 ttl of the split {first}: {is_split(b, c)=}"
    lease = w1.result()
    assert lease.lease_id == first[0]
    assert not w2.done()
    # W2's undo gave C up and queued it again there (R15), and C holds W1's grant (R9)
    assert (owner(b), owner(c)) == (first[0], first[0])
    assert queued(c) == [first[1]]
    await g1.release(lease)
    await g2.release(await asyncio.wait_for(w2, 4 * TTL))  # handed over by the release


async def test_a_split_resolves_within_half_a_ttl(
    own_redis3: list[RedisNode], gateways: Gateways
) -> None:
    """The bound: the later waiter's first retry gives its minority grant up (R15, R33),
    so the earlier waiter is granted within about one poll, well inside one ttl,
    whatever order the answers of a retry come in."""
    _, b, c = own_redis3
    (g1, g2), _ = gateways
    w1, w2 = await split(gateways, b, c, LONG_TTL)
    assert await granted_within((w1, w2), 0.5 * LONG_TTL) == {w1}
    await g1.release(w1.result())
    await g2.release(await asyncio.wait_for(w2, 2 * LONG_TTL))
