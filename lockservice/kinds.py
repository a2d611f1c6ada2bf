"""Lock kinds in the manager: what one acquire asks for, the semaphore API, handles.

The rules are R22-R25 and R32 of ``protocol``; the scripts enforce them. This module
is the manager's side: the ``Kind`` of an acquire (mode, permits, idempotency tag),
``acquire_semaphore`` / ``semaphore`` (mixed into ``LockManager``), and the
lease of a bare handle.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Protocol

from lockservice.backend import Attempt
from lockservice.lease import (
    EXCLUSIVE,
    SEMAPHORE,
    Lease,
    idempotency_tag,
    validate_mode,
    validate_name,
    validate_permits,
)

__all__ = ["Kind", "SemaphoreAPI", "handle_lease"]


@dataclass(slots=True, unsafe_hash=True)  # never changed; frozen, its __init__ costs 4x
class Kind:
    """What one acquire asks for: its mode, a semaphore's permits, its idempotency tag."""

    mode: str
    permits: int
    tag: str

    @classmethod
    def of(cls, mode: str, permits: int, key: str | None) -> Kind:
        """The kind of an acquire with idempotency ``key`` (None: no tag, R26)."""
        return cls(mode, permits, "" if key is None else idempotency_tag(key, mode, permits))

    def lease(self, name: str, lease_id: str, attempt: Attempt, issuer: object) -> Lease:
        token, valid_until = attempt.token, attempt.valid_until
        return Lease(name, token, lease_id, valid_until, issuer, self.mode, self.permits)


def handle_lease(name: str, lease_id: str, mode: str = EXCLUSIVE, permits: int = 0) -> Lease:
    """A lease known only by name and id (``LockManager.handle``), validated."""
    validate_name(name)
    if not (isinstance(lease_id, str) and len(lease_id) == 32):
        raise ValueError(f"lease id {lease_id!r} is not 32 hexadecimal characters")
    try:
        int(lease_id, 16)
    except ValueError:
        raise ValueError(f"lease id {lease_id!r} is not 32 hexadecimal characters") from None
    if mode == SEMAPHORE:
        permits = validate_permits(permits)
    else:
        mode, permits = validate_mode(mode), 0
    return Lease(name, 0, lease_id, float("inf"), mode=mode, permits=permits)


class _Acquires(Protocol):
    async def _acquire(
        self, name: str, ttl: float, wait: float, mode: str, permits: int, key: str | None
    ) -> Lease: ...

    def _hold(
        self, lease: Lease, ttl: float, auto_renew: bool
    ) -> AbstractAsyncContextManager[Lease]: ...


class SemaphoreAPI:
    """``acquire_semaphore`` and ``semaphore`` of ``LockManager`` (R24, R32)."""

    async def acquire_semaphore(
        self: _Acquires,
        name: str,
        permits: int,
        ttl: float = 10.0,
        wait: float = 0.0,
        *,
        idempotency_key: str | None = None,
    ) -> Lease:
        """Take one of ``permits`` leases of the semaphore ``name`` (R24).

        Every grant gets a token above every earlier grant's of ``name``.

        Raises:
            PermitsMismatch: semaphore leases of another ``permits`` hold it.
            LockHeld, QuorumUnavailable, ValueError: as ``acquire``.
        """
        permits = validate_permits(permits)
        return await self._acquire(name, ttl, wait, SEMAPHORE, permits, idempotency_key)

    @asynccontextmanager
    async def semaphore(
        self: _Acquires,
        name: str,
        permits: int,
        ttl: float = 10.0,
        wait: float = 0.0,
        *,
        auto_renew: bool = False,
    ) -> AsyncIterator[Lease]:
        """Hold one lease of the semaphore ``name`` for the body, as ``lock()`` does."""
        permits = validate_permits(permits)
        lease = await self._acquire(name, ttl, wait, SEMAPHORE, permits, None)
        async with self._hold(lease, ttl, auto_renew) as held:
            yield held
