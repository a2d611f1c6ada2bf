"""The lease value handed to a lock holder, and lock-name validation."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field

__all__ = ["Lease", "LockInfo", "validate_name", "validate_ttl"]

_NAME = re.compile(r"[A-Za-z0-9._~:/-]{1,512}")


@dataclass(frozen=True, slots=True)
class Lease:
    """A granted lock: its fencing token, its owner id and its deadline.

    ``valid_until`` is on the event loop's monotonic clock
    (``asyncio.get_running_loop().time()``), never the wall clock: a lease is
    valid while that clock is below it. ``token`` is greater than the token of
    every earlier grant of ``name``; hand it to storage with every write.
    """

    name: str
    token: int
    lease_id: str
    valid_until: float
    # The LockManager that granted it; a lease built by hand is confirmed with Redis.
    issuer: object = field(default=None, repr=False, compare=False)

    def remaining(self) -> float:
        """Seconds of validity left (negative once expired)."""
        return self.valid_until - asyncio.get_running_loop().time()

    @property
    def expired(self) -> bool:
        return self.remaining() <= 0


@dataclass(frozen=True, slots=True)
class LockInfo:
    """What anyone may know of a lock: held or not, the token, time left."""

    name: str
    held: bool
    token: int
    ttl: float


def validate_name(name: object) -> str:
    """Return ``name`` if it is a valid lock name, else raise ``ValueError``."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(
            f"lock name {name!r} is invalid: use 1-512 characters of A-Z a-z 0-9 . _ ~ : / -"
        )
    return name


def validate_ttl(ttl: object, low: float, high: float, what: str = "ttl") -> float:
    """Return ``ttl`` as float seconds if ``low <= ttl <= high``, else raise ``ValueError``."""
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or ttl != ttl:
        raise ValueError(f"{what} {ttl!r} is not a number of seconds")
    if not low <= ttl <= high:
        raise ValueError(f"{what} {ttl!r} is outside [{low}, {high}] seconds")
    return float(ttl)
