"""The interface both lock backends (Redlock over Redis, in-process memory) provide."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from lockservice.lease import LockInfo
from lockservice.protocol import drift
from lockservice.waiters import Waiters

__all__ = ["Attempt", "Backend", "Readiness", "drift"]


@dataclass(frozen=True, slots=True)
class Readiness:
    """Whether a lock could be granted now; if not, why and for how long at least.

    ``semaphores`` says the same for a semaphore lease, which needs every node of
    its Redlock (R32), not a quorum: ``"ok"`` or why not.
    """

    ready: bool
    reason: str = ""
    retry_after: float | None = None  # seconds until quarantines end, when that is the cause
    groups: tuple[tuple[str, str], ...] = ()  # per Redlock group: (id, "ok" or why not)
    semaphores: str = "ok"


@dataclass(slots=True, unsafe_hash=True)  # never changed; frozen, its __init__ costs 4x
class Attempt:
    """One try at a lock: granted (``token > 0``) or not (``retry_after`` seconds hint).

    ``lease_id`` is set when the try's idempotency tag found a lease already
    held with it: the attempt is that lease (its id, token and validity).
    """

    token: int
    valid_until: float
    retry_after: float
    lease_id: str = ""


class Backend(Protocol):
    """What ``LockManager`` needs from a backend; every method validates nothing."""

    waiters: Waiters

    def describe(self) -> str: ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def try_acquire(
        self,
        name: str,
        lease_id: str,
        ttl: float,
        ticket: str,
        *,
        mode: str = "exclusive",
        permits: int = 0,
        tag: str = "",
    ) -> Attempt:
        """One attempt; raises ``QuorumUnavailable`` when a majority cannot answer.

        ``ticket`` is empty for a try that will not wait, else the waiter's place
        in the queue of ``name`` (its arrival time), the same on every attempt.
        ``mode``: ``"exclusive"``, ``"shared"`` or ``"semaphore"`` (``permits`` > 0).
        ``tag``: an idempotency digest; a lease already holding the lock with it
        committed (``commit``) is answered instead (``Attempt.lease_id``). Raises
        ``PermitsMismatch`` when semaphore holders of other ``permits`` hold it.
        """
        ...

    async def find(self, name: str, tag: str) -> Attempt | None:
        """The lease of ``name`` held with idempotency ``tag`` committed, if any
        (``Attempt.lease_id``)."""
        ...

    async def commit(self, name: str, lease_id: str, token: int, tag: str) -> Attempt | None:
        """Record ``tag`` for the decided lease ``lease_id`` (token ``token``) while it
        holds the lock; the other lease that committed ``tag`` first and still holds
        it, if any (the caller then gives its own up). Raises ``QuorumUnavailable``
        when fewer than a quorum took the tag (the caller gives its lease up: R26)."""
        ...

    async def settle(self) -> bool:
        """Wait, bounded, for nodes being resynced; False when none was (no retry)."""
        ...

    def abandon(self, name: str, lease_id: str) -> None:
        """Undo any partial grant or queue place of ``lease_id``; synchronous, so safe
        under cancellation."""
        ...

    async def extend(
        self, name: str, lease_id: str, ttl: float, *, mode: str = "exclusive"
    ) -> tuple[float, int]:
        """Return the new ``valid_until`` and the lease's token; raise ``LeaseLost`` or
        ``QuorumUnavailable`` (a semaphore lease extends on every node: R32)."""
        ...

    async def release(self, name: str, lease_id: str, *, confirm: bool = True) -> bool:
        """True when released, False when the lease no longer held the lock.

        With ``confirm=False`` the release is sent and True returned at once: for a
        lease this process was granted and that is still valid, a majority holds
        it, so the answer is known.
        """
        ...

    async def inspect(self, name: str) -> LockInfo: ...

    async def issued(self, name: str) -> int:
        """An upper bound of every token ever issued for ``name``."""
        ...

    async def ready(self) -> Readiness:
        """Whether a lock could be granted now: a quorum of nodes that answer, are
        synced and are not quarantined."""
        ...
