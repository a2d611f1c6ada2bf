"""Lock managers over each backend: memory, one real Redis node, three real nodes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from lockservice import LockManager
from tests._servers import RedisNode

MakeManager = Callable[[], Awaitable[LockManager]]
NODE_TIMEOUT = 1.0


@pytest.fixture(params=["memory", "redis1", "redis3"])
async def make_manager(
    request: pytest.FixtureRequest, redis_pool: list[RedisNode]
) -> AsyncIterator[MakeManager]:
    """Build LockManagers sharing one backend (several managers = several gateways)."""
    managers: list[LockManager] = []
    if request.param == "memory":
        shared: LockManager | None = None

        async def make() -> LockManager:
            nonlocal shared
            if shared is None:  # the memory backend lives in one process: share it
                shared = await LockManager.connect([])
                managers.append(shared)
            return shared
    else:
        count = 1 if request.param == "redis1" else 3
        nodes = redis_pool[:count]
        for node in nodes:
            if not node.alive:
                node.start()
            node.resume()
            node.flushall()

        async def make() -> LockManager:
            # No test here is about a slow node; on a loaded machine one may answer
            # after the default 0.2 s, and a semaphore's try needs every node (R32).
            mgr = await LockManager.connect(
                [n.url for n in nodes], max_ttl=30.0, node_timeout=NODE_TIMEOUT
            )
            managers.append(mgr)
            return mgr

    yield make
    for mgr in managers:
        await mgr.close()


@pytest.fixture
async def mgr3(redis3: list[RedisNode]) -> AsyncIterator[LockManager]:
    mgr = await LockManager.connect([n.url for n in redis3], max_ttl=30.0)
    yield mgr
    await mgr.close()
