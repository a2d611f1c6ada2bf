"""Distributed locks with strictly increasing fencing tokens (Redlock over 1, 3 or 5 nodes)."""

from lockservice.errors import (
    LeaseLost,
    LockHeld,
    LockServiceError,
    PermitsMismatch,
    QuorumUnavailable,
)
from lockservice.events import LockEvents, NoEvents
from lockservice.lease import Lease, LockInfo, validate_name
from lockservice.manager import LockManager

__all__ = [
    "Lease",
    "LeaseLost",
    "LockEvents",
    "LockHeld",
    "LockInfo",
    "LockManager",
    "LockServiceError",
    "NoEvents",
    "PermitsMismatch",
    "QuorumUnavailable",
    "validate_name",
]
