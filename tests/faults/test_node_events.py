"""The lock service tells its hooks what happens to nodes and leases (metrics feed on it)."""

from __future__ import annotations

import asyncio
import contextlib
import re

import pytest

from lockservice import LeaseLost, LockManager, NoEvents, QuorumUnavailable
from lockservice.protocol import QUARANTINE_KEY
from tests._servers import RedisNode
from tests.faults.conftest import node_connected, reply_int, wait_until

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


async def test_inspecting_never_marks_a_quarantined_node_healthy(
    own_redis3: list[RedisNode],
) -> None:
    """The node-state gauge moves on acquires and resyncs only: every GET /v1/locks
    (inspect) and forged-token guard miss must not reset a quarantine alert."""
    events = Recorder()
    mgr = await LockManager.connect(
        [n.url for n in own_redis3], node_timeout=0.2, max_ttl=30.0, events=events
    )
    try:
        label = f"127.0.0.1:{own_redis3[2].port}"
        await mgr.release(await mgr.acquire("ev/q", ttl=1.0))
        own_redis3[2].restart(lose_data=True)
        for _ in range(100):
            if (label, "quarantined") in events.states:
                break
            with contextlib.suppress(QuorumUnavailable):
                await mgr.release(await mgr.acquire("ev/q", ttl=1.0))
            await asyncio.sleep(0.05)
        assert [s for n, s in events.states if n == label][-1] == "quarantined"
        for _ in range(5):
            await mgr.inspect("ev/q")
            await mgr.issued("ev/q")
        assert [s for n, s in events.states if n == label][-1] == "quarantined"
    finally:
        await mgr.close()


async def test_quorum_errors_name_each_node_and_its_own_cause(
    own_redis3: list[RedisNode],
) -> None:
    """Down, quarantined, and the count of nodes: from the round that failed."""
    mgr = await LockManager.connect([n.url for n in own_redis3], node_timeout=0.2, max_ttl=30.0)
    labels = [f"127.0.0.1:{n.port}" for n in own_redis3]
    try:
        await mgr.release(await mgr.acquire("ev/e", ttl=1.0))
        own_redis3[1].restart(lose_data=True)  # resynced, then quarantined for 30 s
        await wait_until(
            lambda: reply_int(own_redis3[1].command("PTTL", QUARANTINE_KEY)) > 0,
            10.0,
            "node 1 resynced and quarantined",
        )
        own_redis3[2].kill()
        await wait_until(lambda: not node_connected(mgr, 2), 5.0, "node 2 seen down")
        with pytest.raises(QuorumUnavailable) as failed:
            await mgr.acquire("ev/e", ttl=1.0)
        message = str(failed.value)
        assert "2 of 3 nodes needed" in message, message
        errors = failed.value.node_errors
        assert set(errors) == {labels[1], labels[2]}, errors
        assert re.fullmatch(r"quarantined for \d+\.\d s more after a resync.*", errors[labels[1]])
        assert errors[labels[2]].startswith("down: "), errors
        assert "unexpected reply" not in message
    finally:
        await mgr.close()
