"""Fault-test helpers: lock managers over the test's own nodes, polling, raw node reads.

Every fault test runs against redis-server processes of its own (``own_redis3``
or ``persistent_redis3``), because it pauses, kills or restarts them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Protocol

import pytest

from lockservice import LockManager
from lockservice.protocol import QUARANTINE_KEY
from lockservice.redlock import Redlock
from tests._servers import RedisNode

NODE_TIMEOUT = 0.2
MAX_TTL = 2.0


class Connect(Protocol):
    async def __call__(
        self, nodes: Sequence[RedisNode], *, max_ttl: float = MAX_TTL
    ) -> LockManager: ...


@pytest.fixture
def persistent_redis3(tmp_path: Path) -> Iterator[list[RedisNode]]:
    """Three nodes of this test's own that keep their data (AOF, fsync always) on restart."""
    nodes = [RedisNode(tmp_path / f"pnode{i}", persist=True) for i in range(3)]
    for node in nodes:
        node.start()
    yield nodes
    for node in nodes:
        node.stop()


@pytest.fixture
async def connect() -> AsyncIterator[Connect]:
    """Build LockManagers (one per gateway replica); all are closed after the test.

    Then the nodes are stopped while the test's loop still runs, so that every
    socket to them sees EOF and closes: a node that was paused past the stall
    window leaves sockets behind that ``close()`` does not close (see
    ``test_paused_node_reconnects_without_leaking_connections``), and their
    ResourceWarning would otherwise fail whichever test collects them.
    """
    managers: list[LockManager] = []
    used: list[RedisNode] = []

    async def make(nodes: Sequence[RedisNode], *, max_ttl: float = MAX_TTL) -> LockManager:
        mgr = await LockManager.connect(
            [n.url for n in nodes], node_timeout=NODE_TIMEOUT, max_ttl=max_ttl
        )
        if not managers:
            # Nodes synced concurrently at first start may leave one quarantined (see
            # test_node_joining_a_new_cluster_is_not_quarantined): start from a settled
            # cluster, as every fault test assumes.
            await wait_until(
                lambda: not any(quarantined(n) for n in nodes if n.alive), max_ttl + 1.0,
                "a new cluster without quarantined nodes",
            )  # fmt: skip
        managers.append(mgr)
        used.extend(n for n in nodes if n not in used)
        return mgr

    yield make
    for mgr in managers:
        await mgr.close()
    for node in used:
        node.kill()
    await asyncio.sleep(0.05)


async def wait_until(
    predicate: Callable[[], bool | Awaitable[bool]], within: float, what: str
) -> float:
    """Poll ``predicate`` every 10 ms; return the seconds it took, fail after ``within``."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while True:
        result = predicate()
        if not isinstance(result, bool):
            result = await result
        if result:
            return loop.time() - start
        if loop.time() - start > within:
            pytest.fail(f"not within {within} s: {what}")
        await asyncio.sleep(0.01)


def redlock(mgr: LockManager) -> Redlock:
    backend = mgr.backend
    assert isinstance(backend, Redlock)
    return backend


def node_connected(mgr: LockManager, index: int) -> bool:
    """Whether ``mgr`` has a live command connection to node ``index``."""
    return redlock(mgr).nodes[index].connected


async def cut_off(mgr: LockManager, node: RedisNode, index: int) -> None:
    """Pause ``node`` and wait until ``mgr`` drops it as stalled.

    A PING is left unanswered so that the stall detector fires; from then on
    ``mgr`` sends nothing to the node (calls fail at once), so no later
    command can reach it, not even once it is resumed.
    """
    node.pause()
    await mgr.ready()
    await wait_until(lambda: not node_connected(mgr, index), 3.0, "paused node dropped")


def quarantined(node: RedisNode) -> bool:
    return reply_int(node.command("PTTL", QUARANTINE_KEY)) > 0


def reply_int(raw: bytes) -> int:
    """The value of a RESP integer reply (``:12\\r\\n``)."""
    assert raw.startswith(b":"), raw
    return int(raw[1:].split(b"\r\n", 1)[0])


def reply_bulk(raw: bytes) -> bytes | None:
    """The value of a RESP bulk string reply, None for a nil."""
    assert raw.startswith(b"$"), raw
    head, _, rest = raw.partition(b"\r\n")
    size = int(head[1:])
    return None if size < 0 else rest[:size]


def lock_key(name: str) -> str:
    return f"lock:{{{name}}}"
