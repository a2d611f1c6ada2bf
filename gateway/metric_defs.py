"""The definitions of fencegate's Prometheus metrics: names, help texts, labels,
buckets, and the label values each hook reports (exported at 0 from the start).

``gateway/metrics.py`` builds its ``Metrics`` from ``define`` and registers them
in one ``FoldFirst`` collector (``gateway/metric_series.py``).
"""

from __future__ import annotations

from typing import Any, Final

from prometheus_client import Counter, Gauge, Histogram

from gateway.metric_series import LeaseTracker
from lockservice.protocol import NodeState

__all__ = [
    "ACQUIRE_RESULTS",
    "KIND_RESULTS",
    "LOCK_KINDS",
    "LOST_REASONS",
    "NAMESPACE",
    "NODE_STATES",
    "QUORUM_OPERATIONS",
    "REJECT_REASONS",
    "RELEASE_RESULTS",
    "RENEW_RESULTS",
    "WRITE_RESULTS",
    "define",
]

NAMESPACE: Final = "fencegate"
# The label values each hook reports (lockservice/events.py, gateway/routes.py,
# storage_adapters/base.py); a value outside these still counts, it is just not
# exported at 0 before its first event.
NODE_STATES: Final = tuple(state.value for state in NodeState)
ACQUIRE_RESULTS: Final = (
    "granted", "held", "quorum_unavailable", "permits_mismatch", "cancelled",
)  # fmt: skip
# Acquires by kind (LockEvents.acquire_done's kind): the by-kind series beside the totals.
LOCK_KINDS: Final = ("exclusive", "shared", "semaphore")
KIND_RESULTS: Final = ("granted", "held", "quorum_unavailable", "cancelled")
RENEW_RESULTS: Final = ("ok", "lost", "error")
# The gateway releases by lease id alone, so a release it cannot do is "not_held" (a
# retried DELETE, or a lease that expired or was taken): never a lost lease. The results
# "expired" (release) and "renew_failed" (lost) come only from LockManager leases of a
# Python process (LockManager.release, the lock() watchdog): not exported at 0 here.
RELEASE_RESULTS: Final = ("released", "not_held")
LOST_REASONS: Final = ("expired",)  # a renew (extend) found the lease gone
QUORUM_OPERATIONS: Final = ("acquire", "extend", "release", "inspect")
REJECT_REASONS: Final = (
    "stale_token",  # the store saw a newer token (storage_adapters)
    "token_not_issued",  # a forged token, above the lock's counter (gateway)
    "not_lease_holder",  # fencing = "lease": not the current holder's token (gateway)
    "token_required",  # no X-Fencing-Token (gateway)
    "bad_token",  # not a positive 64-bit integer (gateway)
)
WRITE_RESULTS: Final = ("ok", "failed")
_WAIT_BUCKETS: Final = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
_HOLD_BUCKETS: Final = (
    0.001, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
)  # fmt: skip
_NODE_BUCKETS: Final = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
)  # fmt: skip
_IO_BUCKETS: Final = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
_HTTP_BUCKETS: Final = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip


def define(leases: LeaseTracker, multiprocess: bool) -> dict[str, Counter | Gauge | Histogram]:
    """Every metric, by its ``Metrics`` field, made with no registry (the caller
    registers them all in one collector); ``leases_held`` reads ``leases`` at each
    scrape unless ``multiprocess`` (then ``Metrics.refresh`` sets it)."""
    # registered at the end, all in one FoldFirst, in this order
    r: dict[str, Any] = {"namespace": NAMESPACE, "registry": None}
    held = Gauge(
        "leases_held",
        "Leases granted through this gateway, not released or expired",
        multiprocess_mode="livesum",
        **r,
    )
    if not multiprocess:  # a function is read at each scrape, in this process only
        held.set_function(lambda: float(leases.held()))
    return dict(
        lock_acquisitions=Counter(
            "lock_acquisitions", "Lock acquire attempts, by result", ["result"], **r
        ),
        acquire_wait=Histogram(
            "lock_acquire_wait_seconds",
            "Time from an acquire request to its grant or refusal (contention)",
            ["result"],
            buckets=_WAIT_BUCKETS,
            **r,
        ),
        kind_acquisitions=Counter(
            "lock_acquisitions_by_kind",
            "Lock acquire attempts, by kind (exclusive, shared, semaphore) and result",
            ["kind", "result"],
            **r,
        ),
        kind_acquire_wait=Histogram(
            "lock_acquire_wait_by_kind_seconds",
            "Time from an acquire request to its grant or refusal, by kind (contention)",
            ["kind", "result"],
            buckets=_WAIT_BUCKETS,
            **r,
        ),
        hold_time=Histogram(
            "lock_hold_seconds",
            "Time from grant to release of leases granted through this gateway",
            buckets=_HOLD_BUCKETS,
            **r,
        ),
        leases_held=held,
        leases_lost=Counter(
            "leases_lost",
            "Holders that learned their lease was gone, by reason",
            ["reason"],
            **r,
        ),
        releases=Counter("lock_releases", "Lock releases, by result", ["result"], **r),
        renewals=Counter("lock_renewals", "Lease renewals, by result", ["result"], **r),
        node_latency=Histogram(
            "redis_node_latency_seconds",
            "Latency of one command to one Redis node",
            ["node"],
            buckets=_NODE_BUCKETS,
            **r,
        ),
        node_errors=Counter(
            "redis_node_errors", "Commands a Redis node failed or did not answer", ["node"], **r
        ),
        node_state_gauge=Gauge(
            "redis_node_state",
            "1 for the current state of each Redis node",
            ["node", "state"],
            multiprocess_mode="livemax",
            **r,
        ),
        quorum_failures=Counter(
            "quorum_failures", "Operations without a majority of nodes", ["operation"], **r
        ),
        waiters=Gauge(
            "lock_waiters",
            "Acquires waiting for a held lock",
            multiprocess_mode="livesum",
            **r,
        ),
        fencing_rejections=Counter(
            "fencing_rejections",
            "Writes and fenced reads refused by fencing, by store and reason",
            ["store", "reason"],
            **r,
        ),
        storage_writes=Counter(
            "storage_writes",
            "Store puts and deletes, by store and result",
            ["store", "result"],
            **r,
        ),
        storage_write_latency=Histogram(
            "storage_write_duration_seconds",
            "Duration of one store put or delete, check included",
            ["store"],
            buckets=_IO_BUCKETS,
            **r,
        ),
        http_requests=Counter(
            "http_requests",
            "HTTP requests, by route template, method and status",
            ["route", "method", "status"],
            **r,
        ),
        http_latency=Histogram(
            "http_request_duration_seconds",
            "HTTP request duration, by route template and method",
            ["route", "method"],
            buckets=_HTTP_BUCKETS,
            **r,
        ),
        node_group=Gauge(
            "redis_node_group",
            "1 for the Redlock group of each Redis node ([locks] groups)",
            ["node", "group"],
            multiprocess_mode="livemax",
            **r,
        ),
        group_nodes_healthy=Gauge(
            "lock_group_nodes_healthy",
            "Healthy nodes (counted in quorums) of each Redlock group",
            ["group"],
            multiprocess_mode="livemin",
            **r,
        ),
        group_can_grant=Gauge(
            "lock_group_can_grant",
            "1 while a quorum of a Redlock group's nodes is healthy: it can grant locks",
            ["group"],
            multiprocess_mode="livemin",
            **r,
        ),
        group_node_errors=Counter(
            "lock_group_node_errors",
            "Commands the nodes of a Redlock group failed or did not answer",
            ["group"],
            **r,
        ),
    )
