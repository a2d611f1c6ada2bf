"""Hooks leave amounts pending; a scrape folds them first and sees what ``inc``/``observe`` give.

The reference is prometheus-client's own ``inc`` and ``observe`` on a second
registry, event by event: every counter, bucket and sum must be equal (sums
too, to the last bit), whenever the scrape comes, also from another thread.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gateway.metric_series import PENDING_LIMIT, LeaseTracker, Series, WriteThrough
from gateway.metrics import Metrics

NODES = ("127.0.0.1:7101", "127.0.0.1:7102")


def _samples(registry: Any) -> dict[tuple[Any, ...], float]:
    return {
        (s.name, *sorted(s.labels.items())): s.value
        for family in registry.collect()
        for s in family.samples
        if not s.name.endswith("_created") and family.name != "fencegate_leases_held"
    }


class _Reference:
    """The same hooks through prometheus-client's inc() and observe(), at once."""

    def __init__(self, metrics: Metrics) -> None:
        self.m = metrics

    def node_call(self, node: str, seconds: float, ok: bool) -> None:
        self.m.node_latency.labels(node).observe(seconds)
        if not ok:
            self.m.node_errors.labels(node).inc()

    def acquire_done(self, result: str, wait: float, *, kind: str = "exclusive") -> None:
        self.m.lock_acquisitions.labels(result).inc()
        self.m.kind_acquisitions.labels(kind, result).inc()
        self.m.acquire_wait.labels(result).observe(wait)
        self.m.kind_acquire_wait.labels(kind, result).observe(wait)

    def released(self, hold_seconds: float, result: str) -> None:
        self.m.releases.labels(result).inc()

    def write_done(self, store: str, seconds: float, ok: bool) -> None:
        self.m.storage_writes.labels(store, "ok" if ok else "failed").inc()
        self.m.storage_write_latency.labels(store).observe(seconds)

    def request_done(self, route: str, method: str, status: int, seconds: float) -> None:
        self.m.http_requests.labels(route, method, str(status)).inc()
        self.m.http_latency.labels(route, method).observe(seconds)


def _events(seed: int, n: int) -> list[Callable[[Any], None]]:
    """``n`` random hook calls (amounts over many buckets, on bounds, huge)."""
    rng = random.Random(seed)

    def amount() -> float:
        return rng.choice([rng.random() * 10 ** rng.randint(-6, 2), 0.0, 0.001, 0.25, 1e9])

    found: list[Callable[[Any], None]] = []
    for _ in range(n):
        r, a = rng.random(), amount()
        node, ok = rng.choice(NODES), rng.random() < 0.9
        result, kind = rng.choice(["granted", "held"]), rng.choice(["exclusive", "shared"])
        route, status = rng.choice(["/v1/locks/{name}", "/v1/kv/{key}"]), rng.choice([200, 409])
        if r < 0.4:
            found.append(lambda m, node=node, a=a, ok=ok: m.node_call(node, a, ok))
        elif r < 0.6:
            found.append(lambda m, res=result, a=a, k=kind: m.acquire_done(res, a, kind=k))
        elif r < 0.8:
            found.append(lambda m, rt=route, a=a, s=status: m.request_done(rt, "POST", s, a))
        elif r < 0.9:
            found.append(lambda m, a=a, ok=ok: m.write_done("kv", a, ok))
        else:
            found.append(lambda m, result=result: m.released(0.0, result))
    return found


def test_a_scrape_folds_what_is_pending_and_sees_what_inc_and_observe_give() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    mine = Metrics.create(ours, stores=["kv"], nodes=NODES)
    reference = _Reference(Metrics.create(theirs, stores=["kv"], nodes=NODES))
    rng = random.Random(7)
    for event in _events(1, 3 * PENDING_LIMIT):
        event(mine)
        event(reference)
        if rng.random() < 0.002:  # now and then a scrape, with amounts pending
            assert any(s.pending for s in mine._series)
            assert _samples(ours) == _samples(theirs)
    assert _samples(ours) == _samples(theirs)
    assert generate_latest(ours).count(b"\n") == generate_latest(theirs).count(b"\n")


def test_a_scrape_of_some_names_folds_too() -> None:
    registry = CollectorRegistry()
    metrics = Metrics.create(registry)
    metrics.request_done("/v1/locks/{name}", "POST", 200, 0.003)
    restricted = registry.restricted_registry(["fencegate_http_request_duration_seconds_count"])
    samples = [s for family in restricted.collect() for s in family.samples]
    assert [s.value for s in samples] == [1.0]


def test_pending_amounts_are_bounded_without_a_scrape() -> None:
    """A gateway never scraped: a hook folds once a list holds PENDING_LIMIT amounts."""
    registry = CollectorRegistry()
    metrics = Metrics.create(registry)
    for _ in range(5 * PENDING_LIMIT + 3):
        metrics.node_call(NODES[0], 0.0002, True)
        metrics.acquire_done("granted", 0.0005, kind="shared")
        metrics.request_done("/v1/locks/{name}", "POST", 200, 0.001)
        metrics.write_done("kv", 0.001, False)
        metrics.released(0.0, "released")
    assert metrics._series
    assert all(len(series.pending) <= PENDING_LIMIT for series in metrics._series)
    node = {"node": NODES[0]}
    assert (
        registry.get_sample_value("fencegate_redis_node_latency_seconds_count", node)
        == 5 * PENDING_LIMIT + 3
    )


def test_a_scrape_on_another_thread_loses_and_repeats_no_amount() -> None:
    """Hooks append while a thread scrapes (and so folds) in a loop: each amount is
    folded once, and the sums are the additions in the order of the events."""
    registry, theirs = CollectorRegistry(), CollectorRegistry()
    metrics = Metrics.create(registry, stores=["kv"], nodes=NODES)
    reference = _Reference(Metrics.create(theirs, stores=["kv"], nodes=NODES))
    events = _events(2, 20 * PENDING_LIMIT)
    done = threading.Event()
    scrapes = [0]

    def scrape() -> None:
        while not done.is_set():
            generate_latest(registry)
            scrapes[0] += 1

    scraper = threading.Thread(target=scrape)
    scraper.start()
    try:
        for event in events:
            event(metrics)
    finally:
        done.set()
        scraper.join()
    for event in events:
        event(reference)
    assert scrapes[0] > 1
    assert _samples(registry) == _samples(theirs)


def test_a_series_fold_adds_its_amounts_once_and_in_order() -> None:
    registry = CollectorRegistry()
    child = Metrics.create(registry).node_latency.labels("n:1")
    series = Series((), child)
    series.pending += [0.5, 1e-17, 2.0, 0.00005]
    series.fold()
    series.pending.append(0.3)
    series.fold()
    assert series.pending == []
    assert child._sum.get() == (((0.5 + 1e-17) + 2.0) + 0.00005) + 0.3
    counts = [b.get() for b in child._buckets]
    assert counts[0] == 2  # 1e-17 and 0.00005 (le is inclusive)
    assert sum(counts) == 5


def test_lease_tracker_forgets_the_oldest_grant_beyond_its_limit() -> None:
    tracker = LeaseTracker(limit=3)
    for lease in "abcd":
        tracker.granted(lease * 32, 10.0)
    tracker.renewed("b" * 32, 20.0)  # a renewal keeps its place
    tracker.granted("e" * 32, 10.0)
    assert tracker.held() == 3
    assert tracker.ended("a" * 32) is None
    assert tracker.ended("b" * 32) is None
    assert tracker.ended("c" * 32) is not None


def test_lease_tracker_renewal_of_an_ended_lease_does_not_bring_it_back() -> None:
    tracker = LeaseTracker()
    tracker.granted("a" * 32, 10.0)
    assert tracker.ended("a" * 32) is not None
    tracker.renewed("a" * 32, 10.0)
    assert tracker.held() == 0
    assert tracker.ended("a" * 32) is None


@pytest.mark.parametrize("limit", [500, 100_000])
def test_lease_tracker_counts_while_another_thread_grants_and_ends(limit: int) -> None:
    """``held`` (the scrape) prunes while grants and ends go on without a lock: it
    never counts more than ``limit``, and counts every live lease in the end."""
    tracker = LeaseTracker(limit=limit)
    done = threading.Event()
    seen: list[int] = []

    def scrape() -> None:
        while not done.is_set():
            seen.append(tracker.held())

    scraper = threading.Thread(target=scrape)
    scraper.start()
    try:
        for i in range(20_000):
            tracker.granted(f"{i:032x}", 0.0 if i % 3 == 0 else 10.0)  # a third expire at once
            if i % 2:
                tracker.ended(f"{i - 1:032x}")
    finally:
        done.set()
        scraper.join()
    assert seen
    assert max(seen) <= limit
    if limit > 20_000:  # none forgotten
        assert tracker.held() == sum(1 for i in range(20_000) if i % 2 == 1 and i % 3 != 0)


def test_write_through_counts_at_once_and_observes_a_histogram_it_cannot_read() -> None:
    """Values kept elsewhere: no amount waits; a histogram without the internals
    the fast path reads gets its own ``observe``."""
    registry = CollectorRegistry()
    metrics = Metrics.create(registry)
    counter = metrics.releases.labels("released")
    observed: list[float] = []

    class Opaque:
        def observe(self, amount: float) -> None:
            observed.append(amount)

    sink = WriteThrough((counter,), Opaque())
    sink.append(0.25)
    sink.append(0.5)
    assert len(sink) == 0
    assert observed == [0.25, 0.5]
    assert counter._value.get() == 2
