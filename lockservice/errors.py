"""Errors of the lock service, one class per condition, each with its API code."""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["LeaseLost", "LockHeld", "LockServiceError", "PermitsMismatch", "QuorumUnavailable"]


class LockServiceError(Exception):
    """Base class for every lockservice error."""

    code = "lock_error"


class LockHeld(LockServiceError):
    """Another lease holds the lock and ``wait`` ran out."""

    code = "lock_held"

    def __init__(self, name: str, retry_after: float) -> None:
        super().__init__(f"lock {name!r} is held by another lease; retry in {retry_after:.3f} s")
        self.name = name
        self.retry_after = retry_after


class PermitsMismatch(LockServiceError):
    """A semaphore was asked for with a number of permits its holders do not share."""

    code = "permits_mismatch"

    def __init__(self, name: str, permits: int, asked: int = 0) -> None:
        wanted = f"; {asked} were asked for" if asked else ""
        super().__init__(f"semaphore {name!r} is held with {permits} permits{wanted}")
        self.name = name
        self.permits = permits  # the holders'
        self.asked = asked


class LeaseLost(LockServiceError):
    """The lease expired or another lease now holds the lock."""

    code = "lease_lost"

    def __init__(self, name: str, reason: str = "") -> None:
        detail = f": {reason}" if reason else ""
        super().__init__(f"lease on {name!r} is no longer held{detail}")
        self.name = name


class QuorumUnavailable(LockServiceError):
    """Fewer than a majority of the Redis nodes (every node, for a semaphore: R32)
    could take part: down, too slow, not resynced after a restart, quarantined, or
    refusing round 2."""

    code = "quorum_unavailable"

    def __init__(
        self,
        name: str,
        node_errors: Mapping[str, str],
        needed: int,
        nodes: int,
        retry_after: float | None = None,
        *,
        majority: bool = False,
    ) -> None:
        summary = "; ".join(f"{node}: {err}" for node, err in node_errors.items())
        every = " (a semaphore needs every node)" if needed == nodes > nodes // 2 + 1 else ""
        super().__init__(
            f"no quorum for {name!r}: {needed} of {nodes} nodes needed{every}; {summary}"
        )
        self.name = name
        self.node_errors = dict(node_errors)
        self.needed = needed
        self.nodes = nodes
        # seconds until enough quarantined nodes count again, when that is the cause
        self.retry_after = retry_after
        # a majority answered: only a semaphore's need of every node was missed (R32),
        # so a waiting acquire tries again until its wait runs out (``manager``)
        self.majority = majority
