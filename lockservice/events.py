"""Hooks through which the lock service reports what happens (metrics live elsewhere).

``gateway/metrics.py`` implements ``LockEvents``; the lock service itself
never imports prometheus. Every method must be cheap and must not raise.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["ContentionObserver", "LockEvents", "NoEvents"]


class LockEvents(Protocol):
    def acquire_done(self, result: str, wait_seconds: float, *, kind: str = "exclusive") -> None:
        """An acquire ended: result is granted, held, quorum_unavailable,
        permits_mismatch or cancelled; kind is exclusive, shared or semaphore."""

    def waiting(self, delta: int, *, kind: str = "exclusive") -> None:
        """A task started (+1) or stopped (-1) waiting for a held lock of ``kind``."""

    def released(self, hold_seconds: float, result: str) -> None:
        """A release ended: result is released, expired (a lost lease, see lease_lost) or
        not_held (released already, e.g. a retried request, or another lease holds it)."""

    def renewed(self, result: str) -> None:
        """An extend ended: result is ok, lost or error."""

    def lease_lost(self, reason: str) -> None:
        """A holder learned its lease is gone: ``expired`` (an extend that found it gone,
        or a release after its validity ran out) or ``renew_failed`` (the auto-renew
        watchdog of ``LockManager.lock`` ran out of retries). A release of a lease that
        is not held (a second release) is not a lost lease."""

    def node_call(self, node: str, seconds: float, ok: bool) -> None:
        """One command to one node answered (ok) or failed (error reply, timeout, down)."""

    def quorum_failed(self, operation: str) -> None:
        """Fewer than a majority answered for an acquire, extend, release or inspect."""

    def node_state(self, node: str, state: str) -> None:
        """A node became healthy, unsynced, quarantined or down."""


class NoEvents:
    """The default: report nothing."""

    def acquire_done(self, result: str, wait_seconds: float, *, kind: str = "exclusive") -> None:
        pass

    def waiting(self, delta: int, *, kind: str = "exclusive") -> None:
        pass

    def released(self, hold_seconds: float, result: str) -> None:
        pass

    def renewed(self, result: str) -> None:
        pass

    def lease_lost(self, reason: str) -> None:
        pass

    def node_call(self, node: str, seconds: float, ok: bool) -> None:
        pass

    def quorum_failed(self, operation: str) -> None:
        pass

    def node_state(self, node: str, state: str) -> None:
        pass


class ContentionObserver(Protocol):
    """Sees contention per lock *name* (metrics never may: names are unbounded).

    ``gateway.hotlocks.HotLocks`` implements it for ``GET /v1/stats/hot``.
    """

    def started_waiting(self, name: str) -> None:
        """A task found ``name`` held and starts waiting for it."""

    def stopped_waiting(self, name: str) -> None:
        """That task stopped waiting (granted, timed out, cancelled or failed)."""

    def record(self, name: str, wait_seconds: float, *, timed_out: bool = False) -> None:
        """An acquire of ``name`` that had to wait ended after ``wait_seconds``."""
