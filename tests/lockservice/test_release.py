"""A release of a lease that is not held is refused alike on every backend, and is no loss."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from lockservice import LeaseLost, LockManager
from lockservice.events import NoEvents
from tests._servers import RedisNode


class Recorder(NoEvents):
    def __init__(self) -> None:
        self.releases: list[str] = []
        self.lost: list[str] = []

    def released(self, hold_seconds: float, result: str) -> None:
        self.releases.append(result)

    def lease_lost(self, reason: str) -> None:
        self.lost.append(reason)


@pytest.fixture(params=["memory", "redis3"])
async def recorded(
    request: pytest.FixtureRequest, redis_pool: list[RedisNode]
) -> AsyncIterator[tuple[LockManager, Recorder]]:
    urls: list[str] = []
    if request.param == "redis3":
        urls = [n.url for n in request.getfixturevalue("redis3")]
    events = Recorder()
    mgr = await LockManager.connect(urls, events=events)
    yield mgr, events
    await mgr.close()


async def test_second_release_raises_lease_lost_and_is_not_a_lost_lease(
    recorded: tuple[LockManager, Recorder],
) -> None:
    mgr, events = recorded
    lease = await mgr.acquire("twice", ttl=10.0)
    await mgr.release(lease)
    with pytest.raises(LeaseLost, match="released already"):
        await mgr.release(lease)
    assert events.releases == ["released", "not_held"]
    assert events.lost == []
    # the lock is free: the second release took nothing from a new holder
    again = await mgr.acquire("twice", ttl=10.0)
    with pytest.raises(LeaseLost):
        await mgr.release(lease)
    assert (await mgr.inspect("twice")).held
    await mgr.release(again)


async def test_release_of_a_handle_not_held_is_refused_and_not_a_lost_lease(
    recorded: tuple[LockManager, Recorder],
) -> None:
    mgr, events = recorded
    lease = await mgr.acquire("handle", ttl=10.0)
    handle = LockManager.handle("handle", lease.lease_id)  # what the HTTP API releases
    await mgr.release(handle)
    with pytest.raises(LeaseLost, match="not held"):
        await mgr.release(handle)
    assert events.releases == ["released", "not_held"]
    assert events.lost == []


async def test_release_after_the_lease_expired_is_a_lost_lease(
    recorded: tuple[LockManager, Recorder],
) -> None:
    mgr, events = recorded
    lease = await mgr.acquire("short", ttl=0.05)
    await asyncio.sleep(0.1)
    with pytest.raises(LeaseLost, match="expired"):
        await mgr.release(lease)
    assert events.releases == ["expired"]
    assert events.lost == ["expired"]
