"""Distributed locks with strictly increasing fencing tokens (Redlock over 1, 3 or 5 nodes).

Names are imported on first use, so the HTTP clients can import the lease and
its renewal watchdog (``lockservice.lease``, ``lockservice.renew``, standard
library only) without loading the Redis side (redis, hiredis).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

_WHERE = {
    "Lease": "lockservice.lease",
    "LeaseLost": "lockservice.errors",
    "LockEvents": "lockservice.events",
    "LockHeld": "lockservice.errors",
    "LockInfo": "lockservice.lease",
    "LockManager": "lockservice.manager",
    "LockServiceError": "lockservice.errors",
    "NoEvents": "lockservice.events",
    "PermitsMismatch": "lockservice.errors",
    "QuorumUnavailable": "lockservice.errors",
    "validate_name": "lockservice.lease",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'lockservice' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
