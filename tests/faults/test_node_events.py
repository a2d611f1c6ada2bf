"""The lock service tells its hooks what happens to nodes and leases (metrics feed on it)."""

from __future__ import annotations

import asyncio

import pytest

from lockservice import LeaseLost, LockManager, NoEvents, QuorumUnavailable
from tests._servers import RedisNode

pytestmark = pytest.mark.faults


class Recorder(NoEvents):
    def __init__(self) -> None:
        self.states: list[tuple[str, str]] = []
        self.lost: list[str] = []
        self.quorum: list[str] = []

    def node_state(self, node: str, state: str) -> None:
        self.states.append((node, state))

    def lease_lost(self, reason: str) -> None:
        self.lost.append(reason)

    def quorum_failed(self, operation: str) -> None:
        self.quorum.append(operation)


async def test_node_states_follow_a_restart_with_data_loss(own_redis3: list[RedisNode]) -> None:
    events = Recorder()
    mgr = await LockManager.connect(
        [n.url for n in own_redis3], node_timeout=0.2, max_ttl=1.0, events=events
    )
    try:
        label = f"127.0.0.1:{own_redis3[2].port}"
        await mgr.release(await mgr.acquire("ev/a", ttl=1.0))
        own_redis3[2].kill()
        for _ in range(20):
            await mgr.release(await mgr.acquire("ev/a", ttl=1.0))
            if (label, "down") in events.states:
                break
            await asyncio.sleep(0.05)
        assert (label, "down") in events.states
        own_redis3[2].start()  # empty: it lost its counters
        for _ in range(100):
            await mgr.release(await mgr.acquire("ev/a", ttl=1.0))
            if (label, "quarantined") in events.states:
                break
            await asyncio.sleep(0.05)
        mine = [s for n, s in events.states if n == label]
        assert "quarantined" in mine
        assert mine.index("down") < mine.index("quarantined")
        await asyncio.sleep(1.1)  # the quarantine (max_ttl) ends
        for _ in range(40):  # its answer may come after the quorum decided
            await mgr.release(await mgr.acquire("ev/a", ttl=1.0))
            if [s for n, s in events.states if n == label][-1] == "healthy":
                break
            await asyncio.sleep(0.05)
        assert [s for n, s in events.states if n == label][-1] == "healthy"
    finally:
        await mgr.close()


async def test_lost_leases_and_quorum_failures_are_reported(own_redis3: list[RedisNode]) -> None:
    events = Recorder()
    mgr = await LockManager.connect([n.url for n in own_redis3], node_timeout=0.2, events=events)
    try:
        lease = await mgr.acquire("ev/b", ttl=0.1)
        await asyncio.sleep(0.15)
        with pytest.raises(LeaseLost):
            await mgr.extend(lease, ttl=1.0)
        with pytest.raises(LeaseLost):
            await mgr.release(lease)
        assert events.lost == ["expired", "expired"]
        own_redis3[0].kill()
        own_redis3[1].kill()
        with pytest.raises(QuorumUnavailable):
            await mgr.inspect("ev/b")
        with pytest.raises(QuorumUnavailable):
            await mgr.release(mgr.handle("ev/b", "a" * 32))
        assert events.quorum == ["inspect", "release"]
    finally:
        await mgr.close()
