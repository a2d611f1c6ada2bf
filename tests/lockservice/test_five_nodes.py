"""Five Redis nodes (DESIGN: 1, 3 or 5): quorum 3, two nodes may be out, three may not."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from lockservice import LockHeld, LockManager, QuorumUnavailable
from tests._servers import RedisNode

NODE_TIMEOUT = 0.5  # a paused node answers nothing: each try waits this long for it


@pytest.fixture
async def five(redis5: list[RedisNode]) -> AsyncIterator[tuple[LockManager, LockManager]]:
    """Two managers (two gateways) over the same five nodes."""
    urls = [n.url for n in redis5]
    a = await LockManager.connect(urls, max_ttl=30.0, node_timeout=NODE_TIMEOUT)
    b = await LockManager.connect(urls, max_ttl=30.0, node_timeout=NODE_TIMEOUT)
    try:
        yield a, b
    finally:
        for node in redis5:
            node.resume()
        await a.close()
        await b.close()


async def test_five_nodes_exclude_and_order_tokens(
    five: tuple[LockManager, LockManager],
) -> None:
    a, b = five
    first = await a.acquire("five/x", ttl=10.0)
    with pytest.raises(LockHeld):
        await b.acquire("five/x", ttl=10.0)
    waiting = asyncio.create_task(b.acquire("five/x", ttl=10.0, wait=5.0))
    await asyncio.sleep(0.1)
    await a.release(first)
    second = await waiting
    assert second.token > first.token
    await b.release(second)
    shared = [await m.acquire("five/s", ttl=10.0, mode="shared") for m in (a, b)]
    with pytest.raises(LockHeld):
        await a.acquire("five/s", ttl=10.0)
    for lease, m in zip(shared, (a, b), strict=True):
        await m.release(lease)
    permits = [await m.acquire_semaphore("five/sem", 2, ttl=10.0) for m in (a, b)]
    with pytest.raises(LockHeld):
        await a.acquire_semaphore("five/sem", 2, ttl=10.0)
    for lease, m in zip(permits, (a, b), strict=True):
        await m.release(lease)


async def test_two_of_five_out_still_grant_three_out_do_not(
    five: tuple[LockManager, LockManager], redis5: list[RedisNode]
) -> None:
    a, b = five
    before = await a.acquire("five/q", ttl=10.0)
    await a.release(before)
    redis5[0].pause()
    redis5[1].pause()  # two of five out: a majority of three still answers
    held = await a.acquire("five/q", ttl=10.0)
    assert held.token > before.token
    with pytest.raises(LockHeld):
        await b.acquire("five/q", ttl=10.0)
    await a.release(held)
    redis5[2].pause()  # three out: no majority
    with pytest.raises(QuorumUnavailable):
        await b.acquire("five/q2", ttl=10.0)
    for node in redis5[:3]:
        node.resume()
    again = await b.acquire("five/q", ttl=10.0, wait=5.0)
    assert again.token > held.token
    await b.release(again)
