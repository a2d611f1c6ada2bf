"""The hooks' side of the metrics: amounts pending until a scrape, and the leases held.

A lock cycle calls the hooks of ``gateway/metrics.py`` about 14 times (each Redis
node and command, each request, the acquire, the release, the hold time). Adding
to prometheus-client's values there, under a lock each time, cost more than the
rest of the hook: a hook appends its amount to the pending list of each
series it moves (a ``list.append``, atomic under the GIL, no lock), and
``Series.fold`` adds a list's amounts to the values later, under the
``Metrics``' lock: when a scrape collects (``FoldFirst`` folds every series
before it reads a value) or when a list reaches ``PENDING_LIMIT`` amounts (the
hook folds then, so that a gateway that is never scraped does not grow).

A scrape sees what it did before: every counter, bucket and sum as if each
event had been added when it happened. A counter adds the number of amounts;
a histogram adds them to its sum one by one, in the order they came (the same
float additions as ``observe``), and counts each bucket with the amounts sorted
(an amount goes to the first bucket whose bound is >= it, as ``observe`` does;
durations only, never NaN). Each series is one histogram child (and the
counters that count exactly its events), so the amounts of one sum are in one
list, in their order.

Values kept elsewhere (prometheus-client's multiprocess mode: a file per worker,
read by any worker's scrape) cannot wait for this process's scrape: their series
write each amount through at once (``WriteThrough``).
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Final

from prometheus_client.metrics_core import Metric

__all__ = ["PENDING_LIMIT", "FoldFirst", "LeaseTracker", "Series", "WriteThrough"]

PENDING_LIMIT: Final = 1024
"""Amounts a series keeps before the hook that would add one more folds them."""


class Series:
    """One histogram child and the counters that count its events, or counters alone.

    ``pending`` holds the amounts not added yet; hooks append to it from any
    thread. ``fold`` runs under the ``Metrics``' lock only (one folder at a time).
    """

    __slots__ = ("_buckets", "_counters", "_sum", "_upper_bounds", "pending")

    def __init__(self, counters: Sequence[Any], histogram: Any | None = None) -> None:
        """``counters`` and ``histogram`` are children (``.labels(...)``) with plain values."""
        self.pending: list[float] = []
        self._counters = tuple(c._value for c in counters)
        self._upper_bounds: tuple[float, ...] = ()
        self._buckets: tuple[Any, ...] = ()
        self._sum: Any = None
        if histogram is not None:
            self._upper_bounds = tuple(histogram._upper_bounds)
            self._buckets = tuple(histogram._buckets)
            self._sum = histogram._sum

    def fold(self) -> None:
        """Add the pending amounts to the values; amounts appended meanwhile stay pending.

        The slice and its deletion are each one operation under the GIL, and appends
        only go to the end: an amount is folded exactly once.
        """
        pending = self.pending
        n = len(pending)
        if not n:
            return
        amounts = pending[:n]
        del pending[:n]
        for value in self._counters:
            value._value += n  # n times += 1.0: exact below 2**53
        if self._sum is None:
            return
        total = self._sum._value
        for amount in amounts:  # one by one, in their order: observe's additions
            total += amount
        self._sum._value = total
        amounts.sort()
        counted = 0
        for bound, bucket in zip(self._upper_bounds, self._buckets, strict=True):
            upto = bisect_right(amounts, bound, counted)  # amounts <= bound
            if upto != counted:
                bucket._value += upto - counted
                counted = upto
                if counted == n:
                    return


class WriteThrough(list[float]):
    """A series whose values are kept elsewhere: each amount goes to them at once.

    Each value's own ``inc`` (a file write in multiprocess mode). A list that
    stays empty, so that a hook treats it as any pending list (its ``len`` is 0,
    never full); its ``append`` (an attribute of its own) writes instead.
    """

    def __init__(self, counters: Sequence[Any], histogram: Any | None = None) -> None:
        super().__init__()
        incs = tuple(getattr(c, "_value", c).inc for c in counters)  # the value's: no checks
        bounds = tuple(getattr(histogram, "_upper_bounds", ()))
        buckets = tuple(getattr(histogram, "_buckets", ()))
        total = getattr(histogram, "_sum", None)

        def count(amount: float) -> None:
            for inc in incs:
                inc(1.0)

        self.append: Callable[[float], None] = count
        if histogram is None:
            return
        if not (bounds and len(bounds) == len(buckets) and total is not None):
            observe = histogram.observe

            def count_and_observe(amount: float) -> None:
                for inc in incs:
                    inc(1.0)
                observe(amount)

            self.append = count_and_observe
            return
        bucket_incs = tuple(b.inc for b in buckets)
        total_inc = total.inc

        def count_and_add(amount: float) -> None:  # observe's additions, without its checks
            for inc in incs:
                inc(1.0)
            total_inc(amount)
            bucket_incs[bisect_left(bounds, amount)](1.0)

        self.append = count_and_add


class FoldFirst:
    """A collector of ``metrics`` that folds the pending amounts before it reads them.

    Registered in place of the metrics themselves, so that every scrape of the
    registry (also one restricted to some names, and ``get_sample_value``) folds.
    """

    def __init__(self, metrics: Sequence[Any], fold: Callable[[], None]) -> None:
        self._metrics = tuple(metrics)
        self._fold = fold

    def describe(self) -> list[Metric]:
        """The metrics' own descriptions: the registry learns every name from them."""
        return [d for m in self._metrics for d in m.describe()]

    def collect(self) -> Iterator[Metric]:
        self._fold()
        for metric in self._metrics:
            yield from metric.collect()


def fold_all(lock: threading.Lock, series: Iterable[Series]) -> None:
    """Fold every series, under ``lock`` (the scrape and a hook may fold at once)."""
    with lock:
        for one in series:
            one.fold()


class LeaseTracker:
    """Leases granted through this replica: when, and until when (bounded, thread-safe).

    Values are on ``time.monotonic()``; the gauge reads them from the scrape thread.
    A grant, renewal and end (a lock cycle's hooks) take no lock: each is one dict
    operation (atomic under the GIL), and a renewal changes its entry in place, so
    that a lease that ended is never put back. ``held`` (the scrape) and the
    eviction of the oldest lease beyond ``limit`` take the lock, so only one
    removes at a time; ``held`` reads a copy (made at once) while grants go on.
    """

    def __init__(self, limit: int = 100_000) -> None:
        self._limit = limit
        self._leases: dict[str, list[float]] = {}  # lease_id -> [granted, until]: oldest first
        self._lock = threading.Lock()

    def granted(self, lease_id: str, ttl: float) -> None:
        now = time.monotonic()
        if len(self._leases) >= self._limit and lease_id not in self._leases:
            self._make_room()  # first: a scrape never counts more than limit
        self._leases[lease_id] = [now, now + ttl]

    def _make_room(self) -> None:
        """Forget the oldest grants, leaving room for one."""
        with self._lock:
            while len(self._leases) >= self._limit:
                self._leases.pop(next(iter(self._leases)), None)

    def renewed(self, lease_id: str, ttl: float) -> None:
        entry = self._leases.get(lease_id)
        if entry is not None:
            entry[1] = time.monotonic() + ttl

    def ended(self, lease_id: str) -> float | None:
        """Forget the lease; return how long it was held, if it was granted here."""
        entry = self._leases.pop(lease_id, None)
        return None if entry is None else time.monotonic() - entry[0]

    def held(self) -> int:
        """Leases not expired by now; the expired ones are forgotten (their end has no
        hold time)."""
        now = time.monotonic()
        with self._lock:
            for lease_id, (_, until) in self._leases.copy().items():
                if until <= now:
                    self._leases.pop(lease_id, None)
            return len(self._leases)
