"""Which locks are hot: top names by contended acquisitions and by wait time.

Lock names must never be Prometheus labels (unbounded), yet operators need to
see the hot ones. ``HotLocks`` keeps, per slice of a sliding window, at most
``capacity`` names with their counts; when a slice overflows it keeps the
heaviest half (amortised O(log capacity) per event), so memory stays bounded
whatever the number of distinct names, and a name that is truly hot is never
pruned. Counts of pruned names are lost, so counts are lower bounds.

Several workers (``fencegate serve --workers N``): each worker writes a
``snapshot()`` of its own window (its top names) to the server's shared
directory every second (``gateway/shared.py``), and the worker that answers
``GET /v1/stats/hot`` adds the snapshots of the others to its own counts
(``top(others=...)``). The others' counts are up to a second old, and a name
outside a worker's snapshot is missing from its share: still lower bounds.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

__all__ = ["SNAPSHOT_SIZE", "HotLock", "HotLocks"]

SNAPSHOT_SIZE: Final = 100
"""Names per ordering in a worker's snapshot: the largest ``n`` the route serves."""


@dataclass(slots=True)
class _Entry:
    waits: int = 0
    wait_seconds: float = 0.0
    timeouts: int = 0


@dataclass(frozen=True, slots=True)
class HotLock:
    """One line of ``GET /v1/stats/hot``."""

    name: str
    waits: int
    wait_seconds: float
    timeouts: int
    waiting_now: int

    def as_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "waits": self.waits,
            "wait_ms": round(self.wait_seconds * 1000, 3),
            "timeouts": self.timeouts,
            "waiting_now": self.waiting_now,
        }


class HotLocks:
    """Bounded top-N of contended lock names over a sliding window."""

    def __init__(
        self,
        *,
        window: float = 60.0,
        slices: int = 6,
        capacity: int = 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window = window
        self._slice_length = window / slices
        self._capacity = capacity
        self._clock = clock
        self._slices: list[tuple[float, dict[str, _Entry]]] = []
        self._waiting: dict[str, int] = {}

    # feeding
    def started_waiting(self, name: str) -> None:
        self._waiting[name] = self._waiting.get(name, 0) + 1

    def stopped_waiting(self, name: str) -> None:
        left = self._waiting.get(name, 0) - 1
        if left > 0:
            self._waiting[name] = left
        else:
            self._waiting.pop(name, None)

    def record(self, name: str, wait_seconds: float, *, timed_out: bool = False) -> None:
        """An acquire of ``name`` had to wait ``wait_seconds`` (and got it unless timed out)."""
        current = self._current()
        entry = current.get(name)
        if entry is None:
            if len(current) >= 2 * self._capacity:
                self._prune(current)
            entry = current[name] = _Entry()
        entry.waits += 1
        entry.wait_seconds += wait_seconds
        if timed_out:
            entry.timeouts += 1

    def _current(self) -> dict[str, _Entry]:
        now = self._clock()
        start = now - now % self._slice_length
        if not self._slices or self._slices[-1][0] != start:
            self._slices.append((start, {}))
        horizon = now - self.window
        while self._slices and self._slices[0][0] + self._slice_length <= horizon:
            self._slices.pop(0)
        return self._slices[-1][1]

    def _prune(self, entries: dict[str, _Entry]) -> None:
        keep = heapq.nlargest(
            self._capacity, entries.items(), key=lambda kv: (kv[1].wait_seconds, kv[1].waits)
        )
        entries.clear()
        entries.update(keep)

    # reading
    def top(
        self, n: int = 10, *, by: str = "wait_time", others: Iterable[Mapping[str, Any]] = ()
    ) -> list[HotLock]:
        """The ``n`` hottest names of the window, by ``wait_time`` or ``waits``.

        Args:
            others: ``snapshot()`` s of other workers of the same server, added in.
        """
        merged = self._merged()
        waiting = dict(self._waiting)
        for snapshot in others:
            for name, waits, wait_seconds, timeouts in snapshot["entries"]:
                _add(merged, name, int(waits), float(wait_seconds), int(timeouts))
            for name, count in snapshot["waiting"].items():
                waiting[name] = waiting.get(name, 0) + int(count)
        for name in waiting:
            merged.setdefault(name, _Entry())
        if by == "waits":

            def key(kv: tuple[str, _Entry]) -> tuple[float, ...]:
                return (kv[1].waits + waiting.get(kv[0], 0), kv[1].wait_seconds)
        else:

            def key(kv: tuple[str, _Entry]) -> tuple[float, ...]:
                return (kv[1].wait_seconds, kv[1].waits)

        best = heapq.nlargest(n, merged.items(), key=key)
        return [
            HotLock(name, e.waits, e.wait_seconds, e.timeouts, waiting.get(name, 0))
            for name, e in best
        ]

    def snapshot(self, size: int = SNAPSHOT_SIZE) -> dict[str, Any]:
        """This process's window as JSON: its ``size`` top names by wait time and by waits."""
        merged = self._merged()
        by_time = heapq.nlargest(size, merged.items(), key=lambda kv: kv[1].wait_seconds)
        by_waits = heapq.nlargest(size, merged.items(), key=lambda kv: kv[1].waits)
        chosen = dict(by_time + by_waits)
        return {
            "entries": [[k, e.waits, e.wait_seconds, e.timeouts] for k, e in chosen.items()],
            "waiting": dict(self._waiting),
        }

    def _merged(self) -> dict[str, _Entry]:
        self._current()  # drop slices that left the window
        merged: dict[str, _Entry] = {}
        for _, entries in self._slices:
            for name, entry in entries.items():
                _add(merged, name, entry.waits, entry.wait_seconds, entry.timeouts)
        return merged

    def size(self) -> int:
        """Entries held (the memory bound is ``2 * capacity`` per slice)."""
        return sum(len(entries) for _, entries in self._slices) + len(self._waiting)


def _add(merged: dict[str, _Entry], name: str, waits: int, seconds: float, timeouts: int) -> None:
    total = merged.get(name)
    if total is None:
        total = merged[name] = _Entry()
    total.waits += waits
    total.wait_seconds += seconds
    total.timeouts += timeouts
