"""The lease value handed to a lock holder, and lock-name validation."""

from __future__ import annotations

import asyncio
import hashlib
import re
from dataclasses import dataclass, field
from typing import Final

__all__ = [
    "EXCLUSIVE",
    "MAX_PERMITS",
    "MODES",
    "SEMAPHORE",
    "SHARED",
    "Lease",
    "LockInfo",
    "idempotency_tag",
    "validate_mode",
    "validate_name",
    "validate_permits",
    "validate_ttl",
]

_NAME = re.compile(r"[A-Za-z0-9._~:/-]{1,512}")

EXCLUSIVE: Final = "exclusive"
SHARED: Final = "shared"
SEMAPHORE: Final = "semaphore"
MODES: Final = (EXCLUSIVE, SHARED)  # what ``acquire(mode=...)`` takes; semaphores have their own
MAX_PERMITS: Final = 10_000
_MAX_KEY = 4096  # characters of an idempotency key, scope included


@dataclass(frozen=True, slots=True)
class Lease:
    """A granted lock: its fencing token, its owner id and its deadline.

    ``valid_until`` is on the event loop's monotonic clock
    (``asyncio.get_running_loop().time()``), never the wall clock: a lease is
    valid while that clock is below it. ``token`` is greater than the token of
    every earlier grant of ``name``; hand it to storage with every write.

    ``mode`` is ``"exclusive"``, ``"shared"`` or ``"semaphore"`` (then ``permits``
    is the semaphore's size, else 0). A shared lease's token is the newest token
    issued for the name when it was granted, not a new one: only exclusive and
    semaphore grants get a token above every earlier grant's.
    """

    name: str
    token: int
    lease_id: str
    valid_until: float
    # The LockManager that granted it; a lease built by hand is confirmed with Redis.
    issuer: object = field(default=None, repr=False, compare=False)
    mode: str = EXCLUSIVE
    permits: int = 0

    def remaining(self) -> float:
        """Seconds of validity left (negative once expired)."""
        return self.valid_until - asyncio.get_running_loop().time()

    @property
    def expired(self) -> bool:
        return self.remaining() <= 0


@dataclass(frozen=True, slots=True)
class LockInfo:
    """What anyone may know of a lock: held or not, the token, time left.

    ``token``: the newest token issued to a current holder (when free, the newest
    issued); ``ttl``: seconds until the last current holder's lease ends;
    ``mode``: ``""`` when free, else the holders' mode; ``holders``: how many
    leases hold it; ``permits``: the semaphore's size, else 0.
    """

    name: str
    held: bool
    token: int
    ttl: float
    mode: str = ""
    holders: int = 0
    permits: int = 0


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


def validate_mode(mode: object) -> str:
    """Return ``mode`` if it is ``"exclusive"`` or ``"shared"``, else raise ``ValueError``."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is invalid: use 'exclusive' or 'shared'")
    return str(mode)


def validate_permits(permits: object) -> int:
    """Return ``permits`` if it is an int in [1, MAX_PERMITS], else raise ``ValueError``."""
    if isinstance(permits, bool) or not isinstance(permits, int):
        raise ValueError(f"permits {permits!r} is not a whole number")
    if not 1 <= permits <= MAX_PERMITS:
        raise ValueError(f"permits {permits!r} is outside [1, {MAX_PERMITS}]")
    return permits


def idempotency_tag(key: object, mode: str, permits: int) -> str:
    """The digest stored with a lease taken with idempotency ``key`` (never the key).

    It covers the kind too, so a key reused for another kind of lease of the
    same name finds nothing and acquires normally. Raises ``ValueError`` for a
    key that is not a non-empty str of at most 4096 characters.
    """
    if not isinstance(key, str) or not 1 <= len(key) <= _MAX_KEY:
        raise ValueError(f"idempotency key must be 1-{_MAX_KEY} characters")
    material = f"{mode}\n{permits}\n{key}".encode()
    return hashlib.sha256(material).hexdigest()[:32]
