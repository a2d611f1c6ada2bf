"""Every Prometheus metric of fencegate, in one frozen ``Metrics``.

``Metrics`` implements lockservice's ``LockEvents`` and storage_adapters'
``StoreHooks``, so neither package imports prometheus. Labels come from
small fixed sets (``result``, ``reason``, ``operation``, ``kind`` of lease,
``store``, ``node`` as host:port, ``group`` as a configured Redlock group's
id, the route template, the method, the status); a lock name, key, token,
lease_id or idempotency key is never a label. Hot lock *names* are served by
``GET /v1/stats/hot`` (``gateway/hotlocks.py``), not here.

Every label value known in advance (each result and reason, each configured
store, Redis node and group) is exported at 0 from the start (``Metrics.for_config``),
so that ``rate()`` and ``increase()`` see the first event too and a dashboard
shows 0 rather than "no data".

Redlock groups (``[locks] groups``): ``redis_node_group`` says which group
each node is in (1 per node and group), ``lock_group_nodes_healthy`` and
``lock_group_can_grant`` (1 while a quorum of its nodes is healthy) say which
group is unhealthy in this gateway's view, and ``lock_group_node_errors``
sums its nodes' errors. With workers, the two group gauges are the minimum
over the live workers (a group is shown able to grant when every worker sees
it so).

Several gateways (replicas): each is its own exporter, scraped as its own
target, so Prometheus tells them apart by the ``instance`` label and
dashboards sum over it. Several workers of one gateway (``fencegate serve
--workers N``, one port): prometheus-client's multiprocess mode, and any
worker's ``/metrics`` describes the whole server (``gateway/shared.py``):
counters and histograms are summed over the workers, ``leases_held`` and
``lock_waiters`` too (over the live ones), and ``redis_node_state`` is the
maximum over the live workers: 1 for every state that some worker sees a node
in. ``leases_held`` is then refreshed every second (``refresh``) rather than at
each scrape. ``process_*`` are summed over the supervisor and its workers, and
``fencegate_workers`` counts the live workers and ``fencegate_worker_restarts_total``
the workers started again; ``python_gc_*`` are per process and not exported then.

The hooks add nothing to a value themselves: they append each amount to the
pending list of each series it moves, and a scrape adds them first
(``gateway/metric_series.py``): the same values, without a lock per event.

Hold time and leases held are what this gateway replica saw: a lease granted
here and released here (hold time), or granted here and neither released
nor expired yet (leases held). The gateway keeps no lock state, so a lease
renewed or released through another replica counts there; with workers, the
same holds per worker (README "All cores of a host").
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Final, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, values

from gateway.metric_defs import (
    ACQUIRE_RESULTS,
    KIND_RESULTS,
    LOCK_KINDS,
    LOST_REASONS,
    NODE_STATES,
    QUORUM_OPERATIONS,
    REJECT_REASONS,
    RELEASE_RESULTS,
    RENEW_RESULTS,
    WRITE_RESULTS,
    define,
)
from gateway.metric_series import (
    PENDING_LIMIT,
    FoldFirst,
    LeaseTracker,
    Series,
    WriteThrough,
    fold_all,
)
from lockservice.node import parse_node_url
from lockservice.protocol import NodeState

if TYPE_CHECKING:
    from gateway.config import Config

__all__ = ["MULTIPROCESS", "Metrics", "node_groups"]

K = TypeVar("K")
V = TypeVar("V")
_Pair = tuple[list[float], list[float]]  # the lists of a hook that moves two series
MULTIPROCESS: Final = bool(getattr(values.ValueClass, "_multiprocess", False))
"""prometheus-client keeps values in ``PROMETHEUS_MULTIPROC_DIR`` (a worker of several)."""
_PID: list[int] = [os.getpid()]


def _own_pid() -> int:
    """This process's pid, as last set at start or by a fork (no system call)."""
    return _PID[0]


if MULTIPROCESS:
    # prometheus-client calls os.getpid() (a system call: glibc keeps no cache) on every
    # metric update to notice a fork, which would need files of the child's own: ~16 calls
    # a lock cycle. A fork hook notices it as well. The gateway makes every metric here,
    # after this line, so no value was made with the default class (two classes would map
    # the same file twice).
    os.register_at_fork(after_in_child=lambda: _PID.__setitem__(0, os.getpid()))
    values.ValueClass = values.MultiProcessValue(process_identifier=_own_pid)  # type: ignore[no-untyped-call]  # untyped upstream


def _plain(value: Any) -> bool:
    """An in-process value (no multiprocess file behind it) whose float we may add to."""
    return type(value) is values.MutexValue


def _in_process(counters: Sequence[Any], histogram: Any | None) -> bool:
    """Whether every value of a series is a plain float here (then it may wait for a fold)."""
    found = [getattr(c, "_value", None) for c in counters]
    if histogram is not None:
        bounds = getattr(histogram, "_upper_bounds", ())
        buckets = getattr(histogram, "_buckets", ())
        if not bounds or len(bounds) != len(buckets):
            return False
        found += [getattr(histogram, "_sum", None), *buckets]
    return all(_plain(v) for v in found)


@dataclass(frozen=True, slots=True)
class Metrics:
    """Every metric; build with ``Metrics.create(registry)``."""

    lock_acquisitions: Counter
    acquire_wait: Histogram
    kind_acquisitions: Counter
    kind_acquire_wait: Histogram
    hold_time: Histogram
    leases_held: Gauge
    leases_lost: Counter
    releases: Counter
    renewals: Counter
    node_latency: Histogram
    node_errors: Counter
    node_state_gauge: Gauge
    quorum_failures: Counter
    waiters: Gauge
    fencing_rejections: Counter
    storage_writes: Counter
    storage_write_latency: Histogram
    http_requests: Counter
    http_latency: Histogram
    node_group: Gauge
    group_nodes_healthy: Gauge
    group_can_grant: Gauge
    group_node_errors: Counter
    leases: LeaseTracker = field(default_factory=LeaseTracker)
    # Redlock groups: node label -> group id, group id -> (its nodes, quorum); the
    # nodes' last states, to count each group's healthy ones
    _groups_of: dict[str, str] = field(default_factory=dict)
    _group_nodes: dict[str, tuple[tuple[str, ...], int]] = field(default_factory=dict)
    _states: dict[str, str] = field(default_factory=dict)
    # The lists each hook appends to, by its labels (``gateway/metric_series.py``): .labels() and
    # the checks of inc() and observe() cost more than the update itself, and some hooks
    # run several times a request (node_call: once per Redis node and command).
    _acquires: dict[tuple[str, str], _Pair] = field(default_factory=dict)
    _node_latency: dict[str, list[float]] = field(default_factory=dict)
    _node_errors: dict[str, list[float]] = field(default_factory=dict)
    _releases: dict[str, list[float]] = field(default_factory=dict)
    _writes: dict[tuple[str, bool], _Pair] = field(default_factory=dict)
    _requests: dict[tuple[str, str, int], _Pair] = field(default_factory=dict)
    _hold: dict[None, list[float]] = field(default_factory=dict)
    # every series (its children, as a key) and those with pending amounts, to fold
    _sinks: dict[tuple[Any, ...], list[float]] = field(default_factory=dict)
    _series: list[Series] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)  # creates and folds series

    @classmethod
    def for_config(cls, registry: CollectorRegistry, config: Config) -> Metrics:
        """``create`` with the configured stores, Redis nodes and groups exported at 0."""
        groups = node_groups(config)
        nodes = [parse_node_url(url).label for url in config.locks.redis]
        nodes += [n for labels in groups.values() for n in labels if n not in nodes]
        return cls.create(registry, stores=config.stores, nodes=nodes, groups=groups)

    @classmethod
    def create(
        cls,
        registry: CollectorRegistry,
        *,
        stores: Iterable[str] = (),
        nodes: Iterable[str] = (),
        groups: Mapping[str, Sequence[str]] | None = None,
    ) -> Metrics:
        """Register every metric in ``registry`` (tests pass a fresh ``CollectorRegistry()``).

        Args:
            stores: store names whose series start at 0.
            nodes: Redis node labels (host:port) whose series start at 0.
            groups: Redlock group id -> its node labels (``node_groups``): the
                per-group series (none without groups).
        """
        leases = LeaseTracker()
        metrics = cls(**define(leases, MULTIPROCESS), leases=leases)  # type: ignore[arg-type]
        held = metrics.leases_held
        exported: list[Counter | Gauge | Histogram] = [held]
        for one in fields(metrics):
            metric = getattr(metrics, one.name)
            if isinstance(metric, Counter | Gauge | Histogram) and metric is not held:
                exported.append(metric)
        registry.register(FoldFirst(exported, metrics.fold))
        metrics._start_at_zero(stores, nodes)
        metrics._add_groups(groups or {})
        return metrics

    def _add_groups(self, groups: Mapping[str, Sequence[str]]) -> None:
        """Each group's series: its nodes, none healthy yet (not connected), no errors."""
        for gid, labels in groups.items():
            self._group_nodes[gid] = (tuple(labels), len(labels) // 2 + 1)
            for node in labels:
                self._groups_of[node] = gid
                self.node_group.labels(node, gid).set(1.0)
            self.group_nodes_healthy.labels(gid).set(0.0)
            self.group_can_grant.labels(gid).set(0.0)
            self.group_node_errors.labels(gid)

    def _start_at_zero(self, stores: Iterable[str], nodes: Iterable[str]) -> None:
        """Export every known label set before its first event (see the module doc)."""
        for result in ACQUIRE_RESULTS:
            self.lock_acquisitions.labels(result)
            self.acquire_wait.labels(result)
        for kind in LOCK_KINDS:
            for result in KIND_RESULTS:
                self.kind_acquisitions.labels(kind, result)
                self.kind_acquire_wait.labels(kind, result)
        self.kind_acquisitions.labels("semaphore", "permits_mismatch")
        for result in RENEW_RESULTS:
            self.renewals.labels(result)
        for result in RELEASE_RESULTS:
            self.releases.labels(result)
        for reason in LOST_REASONS:
            self.leases_lost.labels(reason)
        for operation in QUORUM_OPERATIONS:
            self.quorum_failures.labels(operation)
        for store in stores:
            for reason in REJECT_REASONS:
                self.fencing_rejections.labels(store, reason)
            for result in WRITE_RESULTS:
                self.storage_writes.labels(store, result)
            self.storage_write_latency.labels(store)
        for node in nodes:
            self.node_errors.labels(node)
            self.node_latency.labels(node)
            for state in NODE_STATES:  # all 0: not connected yet, state unknown
                self.node_state_gauge.labels(node, state)

    def refresh(self) -> None:
        """Set the gauges that depend on time alone (multiprocess mode: every second)."""
        if MULTIPROCESS:
            self.leases_held.set(self.leases.held())

    def fold(self) -> None:
        """Add every pending amount to its values (a scrape does, first: ``FoldFirst``)."""
        fold_all(self._lock, self._series)

    def _sink(self, counters: Sequence[Any], histogram: Any | None = None) -> list[float]:
        """The list a hook appends to for one series (children of our metrics): its
        pending amounts, or a ``WriteThrough``; call under ``self._lock``.

        One series per set of children: every amount of a histogram child goes
        to one list, in order.
        """
        key = (histogram, *counters)
        sink = self._sinks.get(key)
        if sink is None:
            if _in_process(counters, histogram):
                series = Series(counters, histogram)
                self._series.append(series)
                sink = series.pending
            else:
                sink = WriteThrough(counters, histogram)
            self._sinks[key] = sink
        return sink

    def _slow(self, table: dict[K, V], key: K, make: Callable[[], V]) -> V:
        """A hook's first event with ``key`` (its sinks are made), or a full pending list."""
        with self._lock:
            found = table.get(key)
            if found is None:
                found = table[key] = make()
            else:  # bounded: a gateway never scraped folds here
                for series in self._series:
                    series.fold()
        return found

    # lockservice.LockEvents
    def acquire_done(self, result: str, wait_seconds: float, *, kind: str = "exclusive") -> None:
        sinks = self._acquires.get((result, kind))
        if sinks is None or len(sinks[0]) >= PENDING_LIMIT:  # [0]: every kind's
            sinks = self._slow(
                self._acquires,
                (result, kind),
                lambda: (
                    self._sink(
                        (self.lock_acquisitions.labels(result),), self.acquire_wait.labels(result)
                    ),
                    self._sink(
                        (self.kind_acquisitions.labels(kind, result),),
                        self.kind_acquire_wait.labels(kind, result),
                    ),
                ),
            )
        sinks[0].append(wait_seconds)
        sinks[1].append(wait_seconds)

    def waiting(self, delta: int, *, kind: str = "exclusive") -> None:
        self.waiters.inc(delta)

    def released(self, hold_seconds: float, result: str) -> None:
        # hold_seconds is not known to the lock service for HTTP leases: see lease_ended.
        sink = self._releases.get(result)
        if sink is None or len(sink) >= PENDING_LIMIT:
            sink = self._slow(
                self._releases, result, lambda: self._sink((self.releases.labels(result),))
            )
        sink.append(hold_seconds)

    def renewed(self, result: str) -> None:
        self.renewals.labels(result).inc()

    def lease_lost(self, reason: str) -> None:
        self.leases_lost.labels(reason).inc()

    def node_call(self, node: str, seconds: float, ok: bool) -> None:
        sink = self._node_latency.get(node)
        if sink is None or len(sink) >= PENDING_LIMIT:
            sink = self._slow(
                self._node_latency, node, lambda: self._sink((), self.node_latency.labels(node))
            )
        sink.append(seconds)
        if not ok:
            self._node_error(node, seconds)

    def _node_error(self, node: str, seconds: float) -> None:
        errors = self._node_errors.get(node)
        if errors is None or len(errors) >= PENDING_LIMIT:
            errors = self._slow(
                self._node_errors, node, lambda: self._sink((self.node_errors.labels(node),))
            )
        errors.append(seconds)
        group = self._groups_of.get(node)
        if group is not None:
            self.group_node_errors.labels(group).inc()  # rare: no cache

    def quorum_failed(self, operation: str) -> None:
        self.quorum_failures.labels(operation).inc()

    def node_state(self, node: str, state: str) -> None:
        for known in {*NODE_STATES, state}:
            self.node_state_gauge.labels(node, known).set(1.0 if known == state else 0.0)
        group = self._groups_of.get(node)
        if group is not None:
            self._states[node] = state
            labels, quorum = self._group_nodes[group]
            healthy = sum(self._states.get(n) == NodeState.HEALTHY.value for n in labels)
            self.group_nodes_healthy.labels(group).set(float(healthy))
            self.group_can_grant.labels(group).set(1.0 if healthy >= quorum else 0.0)

    # storage_adapters.StoreHooks
    def write_done(self, store: str, seconds: float, ok: bool) -> None:
        sinks = self._writes.get((store, ok))
        if sinks is None or len(sinks[1]) >= PENDING_LIMIT:  # [1]: both results'
            sinks = self._slow(
                self._writes,
                (store, ok),
                lambda: (
                    self._sink((self.storage_writes.labels(store, "ok" if ok else "failed"),)),
                    self._sink((), self.storage_write_latency.labels(store)),
                ),
            )
        sinks[0].append(seconds)
        sinks[1].append(seconds)

    def rejected(self, store: str, reason: str) -> None:
        self.fencing_rejections.labels(store, reason).inc()

    # the gateway's own
    def lease_granted(self, lease_id: str, ttl: float) -> None:
        self.leases.granted(lease_id, ttl)

    def lease_renewed(self, lease_id: str, ttl: float) -> None:
        self.leases.renewed(lease_id, ttl)

    def lease_ended(self, lease_id: str) -> None:
        held = self.leases.ended(lease_id)
        if held is not None:
            sink = self._hold.get(None)
            if sink is None or len(sink) >= PENDING_LIMIT:
                sink = self._slow(self._hold, None, lambda: self._sink((), self.hold_time))
            sink.append(held)

    def request_done(self, route: str, method: str, status: int, seconds: float) -> None:
        sinks = self._requests.get((route, method, status))
        if sinks is None or len(sinks[1]) >= PENDING_LIMIT:  # [1]: every status'
            sinks = self._slow(
                self._requests,
                (route, method, status),
                lambda: (
                    self._sink((self.http_requests.labels(route, method, str(status)),)),
                    self._sink((), self.http_latency.labels(route, method)),
                ),
            )
        sinks[0].append(seconds)
        sinks[1].append(seconds)


def node_groups(config: Config) -> dict[str, tuple[str, ...]]:
    """Each configured Redlock group (``groups`` and ``previous_groups``): id -> node labels.
    Empty for a plain ``redis`` list: no group label then."""
    specs = (*config.locks.groups, *config.locks.previous_groups)
    return {s.id: tuple(parse_node_url(u).label for u in s.urls) for s in specs}
