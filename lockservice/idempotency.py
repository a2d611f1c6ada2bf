"""The manager's side of idempotent acquires (R26): the look-up before queueing, and
the commit of the tag once the acquire decided its lease."""

from __future__ import annotations

import time

from lockservice.backend import Attempt, Backend
from lockservice.errors import QuorumUnavailable
from lockservice.events import LockEvents
from lockservice.kinds import Kind
from lockservice.lease import Lease

__all__ = ["commit_tag", "find_held"]


async def find_held(
    backend: Backend, events: LockEvents, name: str, kind: Kind, start: float, issuer: object
) -> Lease | None:
    """A repeat: the lease a quorum names committed with the tag, answered before
    queueing behind anyone (R26); None when there is none. ``start``: the acquire's
    ``time.perf_counter()``, for the metrics."""
    try:
        found = await backend.find(name, kind.tag)
    except QuorumUnavailable:
        events.quorum_failed("acquire")
        events.acquire_done("quorum_unavailable", 0.0, kind=kind.mode)
        raise
    if found is None:
        return None
    events.acquire_done("granted", time.perf_counter() - start, kind=kind.mode)
    return kind.lease(name, found.lease_id, found, issuer)


async def commit_tag(
    backend: Backend, name: str, lease_id: str, attempt: Attempt, kind: Kind
) -> Attempt:
    """R26: the try decided ``lease_id``'s lease; from now on the tag names it. Two
    requests with one key that both got a lease keep the first committed: the other
    lease is returned and the caller gives its own up. ``QuorumUnavailable`` when no
    quorum took the tag: the caller gives its lease up (a lease no quorum names
    would let a repeat take a second one)."""
    if not (attempt.token and kind.tag and attempt.lease_id in ("", lease_id)):
        return attempt
    other = await backend.commit(name, lease_id, attempt.token, kind.tag)
    return other or attempt
