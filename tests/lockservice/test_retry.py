"""The acquire that is retried once after a resync wait (manager policy, R7).

A try without waiting undoes its grants with an undo that names no grant: it
may still run late (replayed after a reconnect, or stuck in a dropped socket).
Its retry therefore goes on as a new lease, so that no such undo can take the
retry's grant; a queued waiter names the grants it undoes (R13) and keeps its
lease id and its place in the queue.
"""

from __future__ import annotations

from typing import Any

import pytest

from lockservice import LockManager, QuorumUnavailable
from lockservice.backend import Attempt
from lockservice.memory import MemoryBackend


class FailsOnceThenResyncs(MemoryBackend):
    """The in-process backend, except that its first try finds no quorum while a
    resync is under way (as Redlock's does when restarted nodes are being synced)."""

    def __init__(self) -> None:
        super().__init__()
        self.tries: list[str] = []
        self.abandoned: list[str] = []
        self.settled = 0

    async def try_acquire(
        self, name: str, lease_id: str, ttl: float, ticket: str, **kind: Any
    ) -> Attempt:
        self.tries.append(lease_id)
        if len(self.tries) == 1:
            raise QuorumUnavailable(name, {"n1": "restarted or new, not resynced yet"}, 2, 3)
        return await super().try_acquire(name, lease_id, ttl, ticket, **kind)

    async def settle(self) -> bool:
        self.settled += 1
        return True

    def abandon(self, name: str, lease_id: str) -> None:
        self.abandoned.append(lease_id)
        super().abandon(name, lease_id)


@pytest.mark.parametrize("wait", [0.0, 1.0], ids=["no-wait", "queued"])
async def test_a_retry_after_a_resync_wait_is_a_new_lease_unless_queued(wait: float) -> None:
    backend = FailsOnceThenResyncs()
    mgr = LockManager(backend)
    lease = await mgr.acquire("retry/x", ttl=1.0, wait=wait)
    first, second = backend.tries
    assert backend.settled == 1
    if wait:  # named undos: the waiter keeps its id and its place
        assert second == first == lease.lease_id
        assert backend.abandoned == []
    else:
        assert second == lease.lease_id != first
        assert backend.abandoned == [first]
    await mgr.release(lease)


async def test_no_second_retry_when_the_retry_fails_too() -> None:
    class AlwaysFails(FailsOnceThenResyncs):
        async def try_acquire(
            self, name: str, lease_id: str, ttl: float, ticket: str, **kind: Any
        ) -> Attempt:
            self.tries.append(lease_id)
            raise QuorumUnavailable(name, {"n1": "down: connection refused"}, 2, 3)

    backend = AlwaysFails()
    with pytest.raises(QuorumUnavailable, match="2 of 3 nodes needed"):
        await LockManager(backend).acquire("retry/y", ttl=1.0)
    assert len(backend.tries) == 2
