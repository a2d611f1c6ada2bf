"""Each metric moves when its event happens, with the right labels; names follow Prometheus.

Hook by hook on a fresh ``CollectorRegistry``, then through a real gateway
(``create_app`` over three real redis-server nodes, a files store and a
PostgreSQL store): a refused write, a forged token, a lost lease, contention,
a killed node, a lost quorum.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, Metric, values

import gateway.metrics as metrics_module
from gateway import metric_series
from gateway.app import create_app
from gateway.config import parse_config
from gateway.metric_defs import (
    ACQUIRE_RESULTS,
    KIND_RESULTS,
    LOCK_KINDS,
    LOST_REASONS,
    NODE_STATES,
    REJECT_REASONS,
    RENEW_RESULTS,
)
from gateway.metric_series import LeaseTracker
from gateway.metrics import Metrics
from lockservice.events import LockEvents
from storage_adapters.base import StoreHooks
from tests._gateway import Client, ServeClient
from tests._servers import RedisNode

LEASE_ID = "0123456789abcdef0123456789abcdef"
ALLOWED_LABELS = {"result", "reason", "operation", "store", "node", "state", "route", "method",
                  "status", "le", "kind", "group"}  # fmt: skip


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def families(registry: CollectorRegistry) -> list[Metric]:
    return list(registry.collect())


# names, help, labels
def test_every_metric_is_named_for_prometheus() -> None:
    registry = CollectorRegistry()
    Metrics.create(
        registry, stores=["kv"], nodes=["127.0.0.1:7101"], groups={"a": ["127.0.0.1:7101"]}
    )
    found = families(registry)
    assert len(found) == 23
    for family in found:
        assert family.name.startswith("fencegate_"), family.name
        assert family.documentation.strip(), f"{family.name} has no help text"
        if family.type == "counter":
            names = {s.name.removesuffix("_created").removesuffix("_total") for s in family.samples}
            assert names <= {family.name}, family.samples
        if family.type == "histogram":
            assert family.name.endswith("_seconds"), family.name
        for sample in family.samples:
            assert set(sample.labels) <= ALLOWED_LABELS, (family.name, sample.labels)


def test_acquire_wait_buckets_span_100_microseconds_to_30_seconds() -> None:
    registry = CollectorRegistry()
    Metrics.create(registry)
    bounds = sorted(
        float(s.labels["le"])
        for f in families(registry)
        if f.name == "fencegate_lock_acquire_wait_seconds"
        for s in f.samples
        if s.name.endswith("_bucket") and s.labels["result"] == "granted"
    )
    assert bounds[0] == 0.0001
    assert bounds[-2] == 30.0
    assert bounds[-1] == float("inf")
    assert len(bounds) >= 12  # enough resolution for p50/p95/p99 across five decades


def test_metrics_implements_every_hook_of_lockservice_and_storage() -> None:
    for protocol in (LockEvents, StoreHooks):
        for name, hook in inspect.getmembers(protocol, inspect.isfunction):
            if name.startswith("_"):
                continue
            mine = getattr(Metrics, name, None)
            assert mine is not None, f"Metrics lacks {protocol.__name__}.{name}"
            assert inspect.signature(mine) == inspect.signature(hook), name


def test_known_label_sets_are_exported_at_zero_before_any_event() -> None:
    registry = CollectorRegistry()
    urls = [f"redis://127.0.0.1:{port}" for port in (7101, 7102, 7103)]
    config = parse_config(
        {
            "locks": {"redis": urls},
            "stores": {"kv": {"type": "postgres", "dsn": "postgresql://x@127.0.0.1/db"}},
        }
    )
    Metrics.for_config(registry, config)
    get = registry.get_sample_value
    for result in ACQUIRE_RESULTS:
        assert get("fencegate_lock_acquisitions_total", {"result": result}) == 0
    for kind in LOCK_KINDS:
        for result in KIND_RESULTS:
            labels = {"kind": kind, "result": result}
            assert get("fencegate_lock_acquisitions_by_kind_total", labels) == 0
            assert get("fencegate_lock_acquire_wait_by_kind_seconds_count", labels) == 0
    for result in RENEW_RESULTS:
        assert get("fencegate_lock_renewals_total", {"result": result}) == 0
    for reason in LOST_REASONS:
        assert get("fencegate_leases_lost_total", {"reason": reason}) == 0
    for reason in REJECT_REASONS:
        assert get("fencegate_fencing_rejections_total", {"store": "kv", "reason": reason}) == 0
    assert get("fencegate_storage_writes_total", {"store": "kv", "result": "failed"}) == 0
    for port in (7101, 7102, 7103):
        node = f"127.0.0.1:{port}"
        assert get("fencegate_redis_node_errors_total", {"node": node}) == 0
        for state in NODE_STATES:
            assert get("fencegate_redis_node_state", {"node": node, "state": state}) == 0


def test_group_series_start_at_zero_and_follow_their_nodes_states() -> None:
    """[locks] groups: a group can grant while a quorum of its nodes is healthy; a
    node's errors count for its group only; every node of a group is exported."""
    registry = CollectorRegistry()
    a = [f"redis://127.0.0.1:{port}" for port in (7101, 7102, 7103)]
    b = [f"redis://127.0.0.1:{port}" for port in (7201, 7202, 7203)]
    config = parse_config({"locks": {"groups": [{"id": "a", "redis": a}, {"id": "b", "redis": b}]}})
    metrics = Metrics.for_config(registry, config)
    get = registry.get_sample_value
    for group, urls in (("a", a), ("b", b)):
        assert get("fencegate_lock_group_can_grant", {"group": group}) == 0  # not connected
        assert get("fencegate_lock_group_node_errors_total", {"group": group}) == 0
        for url in urls:
            node = url.removeprefix("redis://")
            assert get("fencegate_redis_node_group", {"node": node, "group": group}) == 1
            assert get("fencegate_redis_node_errors_total", {"node": node}) == 0
    for node in ("127.0.0.1:7101", "127.0.0.1:7102"):
        metrics.node_state(node, "healthy")
    assert get("fencegate_lock_group_nodes_healthy", {"group": "a"}) == 2
    assert get("fencegate_lock_group_can_grant", {"group": "a"}) == 1  # 2 of 3: a quorum
    assert get("fencegate_lock_group_can_grant", {"group": "b"}) == 0
    metrics.node_state("127.0.0.1:7102", "quarantined")
    assert get("fencegate_lock_group_nodes_healthy", {"group": "a"}) == 1
    assert get("fencegate_lock_group_can_grant", {"group": "a"}) == 0
    metrics.node_call("127.0.0.1:7202", 0.5, ok=False)
    metrics.node_call("127.0.0.1:7101", 0.001, ok=True)
    assert get("fencegate_lock_group_node_errors_total", {"group": "b"}) == 1
    assert get("fencegate_lock_group_node_errors_total", {"group": "a"}) == 0


def test_without_groups_no_group_series() -> None:
    registry = CollectorRegistry()
    config = parse_config({"locks": {"redis": ["redis://127.0.0.1:7101"]}})
    Metrics.for_config(registry, config).node_state("127.0.0.1:7101", "healthy")
    grouped = [s for f in families(registry) for s in f.samples if "group" in s.labels]
    assert grouped == []


# each hook, alone
HOOKS: list[tuple[str, Callable[[Metrics], object], str, dict[str, str]]] = [
    ("acquire", lambda m: m.acquire_done("granted", 0.002),
     "fencegate_lock_acquisitions_total", {"result": "granted"}),
    ("acquire-wait", lambda m: m.acquire_done("held", 0.3),
     "fencegate_lock_acquire_wait_seconds_count", {"result": "held"}),
    ("acquire-kind", lambda m: m.acquire_done("granted", 0.002, kind="shared"),
     "fencegate_lock_acquisitions_by_kind_total", {"kind": "shared", "result": "granted"}),
    ("acquire-kind-wait", lambda m: m.acquire_done("permits_mismatch", 0.001, kind="semaphore"),
     "fencegate_lock_acquire_wait_by_kind_seconds_count",
     {"kind": "semaphore", "result": "permits_mismatch"}),
    ("waiting", lambda m: m.waiting(+1), "fencegate_lock_waiters", {}),
    ("released", lambda m: m.released(0.0, "released"),
     "fencegate_lock_releases_total", {"result": "released"}),
    ("renewed", lambda m: m.renewed("lost"), "fencegate_lock_renewals_total", {"result": "lost"}),
    ("lease-lost", lambda m: m.lease_lost("expired"),
     "fencegate_leases_lost_total", {"reason": "expired"}),
    ("node-latency", lambda m: m.node_call("127.0.0.1:7101", 0.001, True),
     "fencegate_redis_node_latency_seconds_count", {"node": "127.0.0.1:7101"}),
    ("node-error", lambda m: m.node_call("127.0.0.1:7101", 0.2, False),
     "fencegate_redis_node_errors_total", {"node": "127.0.0.1:7101"}),
    ("quorum", lambda m: m.quorum_failed("acquire"),
     "fencegate_quorum_failures_total", {"operation": "acquire"}),
    ("node-state", lambda m: m.node_state("127.0.0.1:7101", "quarantined"),
     "fencegate_redis_node_state", {"node": "127.0.0.1:7101", "state": "quarantined"}),
    ("write", lambda m: m.write_done("kv", 0.003, True),
     "fencegate_storage_writes_total", {"store": "kv", "result": "ok"}),
    ("write-failed", lambda m: m.write_done("kv", 0.003, False),
     "fencegate_storage_writes_total", {"store": "kv", "result": "failed"}),
    ("write-latency", lambda m: m.write_done("kv", 0.003, True),
     "fencegate_storage_write_duration_seconds_count", {"store": "kv"}),
    ("rejected", lambda m: m.rejected("kv", "token_not_issued"),
     "fencegate_fencing_rejections_total", {"store": "kv", "reason": "token_not_issued"}),
    ("lease-granted", lambda m: m.lease_granted(LEASE_ID, 10.0), "fencegate_leases_held", {}),
    ("hold-time", lambda m: (m.lease_granted(LEASE_ID, 10.0), m.lease_ended(LEASE_ID)),
     "fencegate_lock_hold_seconds_count", {}),
    ("http", lambda m: m.request_done("/v1/locks/{name}", "POST", 409, 0.01),
     "fencegate_http_requests_total", {"route": "/v1/locks/{name}", "method": "POST",
                                       "status": "409"}),
    ("http-latency", lambda m: m.request_done("/v1/locks/{name}", "POST", 409, 0.01),
     "fencegate_http_request_duration_seconds_count", {"route": "/v1/locks/{name}",
                                                       "method": "POST"}),
]  # fmt: skip


@pytest.mark.parametrize(("event", "sample", "labels"), [h[:1] + h[2:] for h in HOOKS],
                         ids=[h[0] for h in HOOKS])  # fmt: skip
def test_each_hook_moves_its_metric_by_one(event: str, sample: str, labels: dict[str, str]) -> None:
    registry = CollectorRegistry()
    metrics = Metrics.create(registry)
    call = next(h[1] for h in HOOKS if h[0] == event)
    before = value(registry, sample, **labels)
    call(metrics)
    assert value(registry, sample, **labels) == before + 1


def _bucket_samples(registry: CollectorRegistry, name: str) -> dict[tuple[Any, ...], float]:
    return {
        (s.name, *sorted(s.labels.items())): s.value
        for family in registry.collect()
        if family.name == name
        for s in family.samples
        if not s.name.endswith("_created")
    }


# Each histogram hook: the Metrics field it observes, a call with a value, the labels.
HISTOGRAM_HOOKS: list[tuple[str, Callable[[Metrics, float], None], tuple[str, ...]]] = [
    ("acquire_wait", lambda m, v: m.acquire_done("granted", v, kind="shared"), ("granted",)),
    ("kind_acquire_wait", lambda m, v: m.acquire_done("granted", v, kind="shared"),
     ("shared", "granted")),
    ("node_latency", lambda m, v: m.node_call("127.0.0.1:7101", v, True), ("127.0.0.1:7101",)),
    ("storage_write_latency", lambda m, v: m.write_done("kv", v, True), ("kv",)),
    ("http_latency", lambda m, v: m.request_done("/v1/locks/{name}", "POST", 200, v),
     ("/v1/locks/{name}", "POST")),
]  # fmt: skip


@pytest.mark.parametrize(("field", "call", "labels"), HISTOGRAM_HOOKS)
def test_each_histogram_hook_counts_as_prometheus_observe_does(
    field: str, call: Callable[[Metrics, float], None], labels: tuple[str, ...]
) -> None:
    """The hooks skip observe()'s checks and bisect the bounds: the same buckets and sum,
    on a bound (le is inclusive), between bounds, below the first and above the last."""
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    mine, reference = Metrics.create(ours), Metrics.create(theirs)
    histogram = getattr(reference, field)
    bounds = [b for b in histogram._upper_bounds if b != float("inf")]
    amounts = [0.0, bounds[0] / 2, *bounds, *((a + b) / 2 for a, b in itertools.pairwise(bounds))]
    amounts += [bounds[-1] * 2, 1e9]
    for amount in amounts:
        call(mine, amount)
        histogram.labels(*labels).observe(amount)
    name = histogram._name
    assert _bucket_samples(ours, name) == _bucket_samples(theirs, name)
    by_name = dict(zip(histogram._labelnames, labels, strict=True))
    assert value(ours, f"{name}_count", **by_name) == len(amounts)


def _one_lock_cycle(metrics: Metrics) -> None:
    """The hooks a gateway calls for one HTTP acquire + release over three nodes."""
    nodes = ("127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7103")
    for node in nodes:
        metrics.node_call(node, 0.0002, True)
    metrics.acquire_done("granted", 0.0005)
    metrics.lease_granted(LEASE_ID, 10.0)
    metrics.request_done("/v1/locks/{name}", "POST", 200, 0.001)
    for node in nodes:
        metrics.node_call(node, 0.0002, True)
    metrics.released(0.0, "released")
    metrics.lease_ended(LEASE_ID)
    metrics.request_done("/v1/locks/{name}", "DELETE", 204, 0.001)


class _CountingLock:
    """A value's lock that counts how often it is taken."""

    taken = 0

    def __init__(self, lock: Any) -> None:
        self._lock = lock

    def __enter__(self) -> None:
        _CountingLock.taken += 1
        self._lock.__enter__()

    def __exit__(self, *exc: object) -> None:
        self._lock.__exit__(*exc)


def _plain_values(metrics: Metrics) -> list[Any]:
    """Every in-process value of every counter and histogram child of ``metrics``."""
    found: list[Any] = []
    for name in Metrics.__dataclass_fields__:
        metric: Any = getattr(metrics, name)
        if not isinstance(metric, Counter | Histogram):
            continue
        children: list[Any] = list(metric._metrics.values()) if metric._labelnames else [metric]
        for child in children:
            if isinstance(metric, Counter):
                found.append(child._value)
            else:
                found += [child._sum, *child._buckets]
    return [v for v in found if type(v) is values.MutexValue]


def test_a_lock_cycle_updates_its_metrics_without_a_lock_per_value() -> None:
    """27 values move in a lock cycle (counters, sums, buckets); each hook appends its
    amount to the pending lists of its series, and the scrape folds them in, not
    through ``inc`` (a lock and a call) per value."""
    registry = CollectorRegistry()
    metrics = Metrics.create(registry)
    _one_lock_cycle(metrics)  # creates each label set's children
    plain = _plain_values(metrics)
    assert plain  # in-process values (no multiprocess dir in the tests)
    for v in plain:
        v._lock = _CountingLock(v._lock)
    _CountingLock.taken = 0
    _one_lock_cycle(metrics)
    assert _CountingLock.taken == 0
    assert value(registry, "fencegate_lock_acquisitions_total", result="granted") == 2
    assert value(registry, "fencegate_lock_releases_total", result="released") == 2
    assert value(registry, "fencegate_lock_hold_seconds_count") == 2
    node = {"node": "127.0.0.1:7102"}
    assert value(registry, "fencegate_redis_node_latency_seconds_count", **node) == 4
    assert value(registry, "fencegate_redis_node_latency_seconds_sum", **node) == pytest.approx(
        0.0008
    )
    post = {"route": "/v1/locks/{name}", "method": "POST"}
    assert value(registry, "fencegate_http_requests_total", status="200", **post) == 2
    assert value(registry, "fencegate_http_request_duration_seconds_count", **post) == 2


def _samples(registry: CollectorRegistry) -> dict[tuple[Any, ...], float]:
    return {
        (s.name, *sorted(s.labels.items())): s.value
        for family in registry.collect()
        for s in family.samples
        if not s.name.endswith("_created")
        and s.name != "fencegate_lock_hold_seconds_sum"  # a measured time
        and family.name != "fencegate_leases_held"
    }


def test_values_kept_elsewhere_are_updated_through_their_own_inc_to_the_same_counts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Multiprocess values (a file behind each) take each value's ``inc``: the same
    counters, sums and buckets as the in-process path."""
    # Hold times on a clock that stands still: measured ones fall in other buckets on a
    # busy machine, from one registry to the other.
    monkeypatch.setattr(metric_series, "time", SimpleNamespace(monotonic=lambda: 1000.0))
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    locked = Metrics.create(ours)
    for amount in (0.0, 0.0001, 0.0003, 0.002, 0.7, 1e9):
        _one_lock_cycle(locked)
        locked.node_call("127.0.0.1:7101", amount, False)
        locked.write_done("kv", amount, True)
        locked.acquire_done("held", amount, kind="shared")
    monkeypatch.setattr(metrics_module, "_plain", lambda value: False)
    each = Metrics.create(theirs)
    for amount in (0.0, 0.0001, 0.0003, 0.002, 0.7, 1e9):
        _one_lock_cycle(each)
        each.node_call("127.0.0.1:7101", amount, False)
        each.write_done("kv", amount, True)
        each.acquire_done("held", amount, kind="shared")
    assert _samples(ours) == _samples(theirs)
    assert value(theirs, "fencegate_lock_acquisitions_total", result="granted") == 6


def test_node_state_is_one_for_the_current_state_only() -> None:
    registry = CollectorRegistry()
    metrics = Metrics.create(registry)
    metrics.node_state("127.0.0.1:7101", "unsynced")
    metrics.node_state("127.0.0.1:7101", "quarantined")
    states = {s: value(registry, "fencegate_redis_node_state", node="127.0.0.1:7101", state=s)
              for s in NODE_STATES}  # fmt: skip
    assert states == {s: 1.0 if s == "quarantined" else 0.0 for s in NODE_STATES}


def test_leases_held_drops_a_lease_at_its_expiry_and_hold_time_needs_our_grant() -> None:
    tracker = LeaseTracker()
    tracker.granted("a" * 32, 0.05)
    tracker.granted("b" * 32, 10.0)
    assert tracker.held() == 2
    time.sleep(0.06)
    assert tracker.held() == 1
    assert tracker.ended("c" * 32) is None  # granted through another replica
    held = tracker.ended("b" * 32)
    assert held is not None
    assert held >= 0.06


# through a real gateway
@pytest.fixture
def gateway(
    gateway_client: ServeClient,
    redis3: list[RedisNode],
    tmp_path: Path,
    pg_dsn: str,
    pg_schema: str,
) -> Callable[..., Awaitable[tuple[Client, CollectorRegistry]]]:
    async def start(nodes: list[RedisNode] | None = None) -> tuple[Client, CollectorRegistry]:
        raw = {
            "locks": {"redis": [n.url for n in nodes or redis3], "node_timeout_ms": 500},
            "stores": {
                "files": {"type": "files", "root": str(tmp_path / "files")},
                "kv": {"type": "postgres", "dsn": pg_dsn, "schema": pg_schema},
            },
        }
        registry = CollectorRegistry()
        client: Client = await gateway_client(create_app(parse_config(raw), registry=registry))
        return client, registry

    return start


async def _acquire(client: Client, name: str, **body: int) -> dict[str, Any]:
    response = await client.post(f"/v1/locks/{name}", json=body)
    assert response.status == 200, await response.text()
    grant: dict[str, Any] = await response.json()
    return grant


async def _release(client: Client, name: str, lease_id: str) -> int:
    return (await client.delete(f"/v1/locks/{name}", headers={"X-Lease-Id": lease_id})).status


@pytest.mark.parametrize("store", ["files", "kv"])
async def test_refused_write_increments_rejections_with_store_and_reason(
    gateway: Callable[..., Awaitable[tuple[Client, CollectorRegistry]]], store: str
) -> None:
    client, registry = await gateway()
    name = f"{store}/k"
    old = await _acquire(client, name)
    await _release(client, name, old["lease_id"])
    new = await _acquire(client, name)
    put = f"/v1/stores/{store}/k"
    written = await client.put(put, data=b"new", headers={"X-Fencing-Token": str(new["token"])})
    assert written.status == 200
    refused = await client.put(put, data=b"old", headers={"X-Fencing-Token": str(old["token"])})
    assert refused.status == 409

    def rejections(s: str, reason: str) -> float:
        return value(registry, "fencegate_fencing_rejections_total", store=s, reason=reason)

    other = "kv" if store == "files" else "files"
    assert rejections(store, "stale_token") == 1
    assert sum(rejections(store, r) for r in REJECT_REASONS) == 1
    assert sum(rejections(other, r) for r in REJECT_REASONS) == 0
    assert value(registry, "fencegate_storage_writes_total", store=store, result="ok") == 1
    assert value(registry, "fencegate_storage_writes_total", store=store, result="failed") == 1
    assert value(registry, "fencegate_storage_write_duration_seconds_count", store=store) == 2

    forged = await client.put(put, data=b"x", headers={"X-Fencing-Token": str(10**18)})
    assert forged.status == 403
    assert rejections(store, "token_not_issued") == 1
    assert value(registry, "fencegate_storage_writes_total", store=store, result="failed") == 1


def lost(registry: CollectorRegistry) -> float:
    return sum(value(registry, "fencegate_leases_lost_total", reason=r)
               for r in (*LOST_REASONS, "renew_failed", "taken"))  # fmt: skip


async def test_release_of_an_expired_lease_is_not_held_and_not_a_lost_lease(
    gateway: Callable[..., Awaitable[tuple[Client, CollectorRegistry]]],
) -> None:
    # Over HTTP a release names a lease id only: the gateway cannot tell an expired
    # lease from one released already (a retried DELETE), so neither counts as lost.
    client, registry = await gateway()
    grant = await _acquire(client, "short", ttl_ms=30)
    assert value(registry, "fencegate_leases_held") == 1
    await asyncio.sleep(0.1)
    assert value(registry, "fencegate_leases_held") == 0  # expired, though never released
    assert await _release(client, "short", grant["lease_id"]) == 409
    assert lost(registry) == 0
    assert value(registry, "fencegate_lock_releases_total", result="not_held") == 1
    assert value(registry, "fencegate_lock_releases_total", result="released") == 0


async def test_a_retried_delete_is_409_lease_lost_and_no_lost_lease(
    gateway: Callable[..., Awaitable[tuple[Client, CollectorRegistry]]],
) -> None:
    client, registry = await gateway()
    grant = await _acquire(client, "retried", ttl_ms=10_000)
    assert await _release(client, "retried", grant["lease_id"]) == 204
    again = await client.delete("/v1/locks/retried", headers={"X-Lease-Id": grant["lease_id"]})
    assert again.status == 409
    body = await again.json()
    assert body["error"] == "lease_lost"
    assert "released already" in body["message"]
    assert lost(registry) == 0
    assert value(registry, "fencegate_lock_releases_total", result="released") == 1
    assert value(registry, "fencegate_lock_releases_total", result="not_held") == 1


async def test_renewal_of_a_lost_lease_counts_as_a_lost_renewal(
    gateway: Callable[..., Awaitable[tuple[Client, CollectorRegistry]]],
) -> None:
    client, registry = await gateway()
    # 300 ms: an acquire that takes longer than its ttl (a loaded machine) is refused
    grant = await _acquire(client, "short", ttl_ms=300)
    await asyncio.sleep(0.5)
    body = {"lease_id": grant["lease_id"], "ttl_ms": 1000}
    assert (await client.post("/v1/locks/short/renew", json=body)).status == 409
    assert value(registry, "fencegate_lock_renewals_total", result="lost") == 1
    assert value(registry, "fencegate_lock_renewals_total", result="ok") == 0


async def test_renewal_of_a_lost_lease_increments_leases_lost(
    gateway: Callable[..., Awaitable[tuple[Client, CollectorRegistry]]],
) -> None:
    client, registry = await gateway()
    # 300 ms: an acquire that takes longer than its ttl (a loaded machine) is refused
    grant = await _acquire(client, "short", ttl_ms=300)
    await asyncio.sleep(0.5)
    body = {"lease_id": grant["lease_id"], "ttl_ms": 1000}
    assert (await client.post("/v1/locks/short/renew", json=body)).status == 409
    assert sum(value(registry, "fencegate_leases_lost_total", reason=r) for r in LOST_REASONS) == 1


async def test_contended_acquire_observes_its_wait_and_is_a_waiter_meanwhile(
    gateway: Callable[..., Awaitable[tuple[Client, CollectorRegistry]]],
) -> None:
    client, registry = await gateway()
    first = await _acquire(client, "hot", ttl_ms=5000)
    second = asyncio.create_task(client.post("/v1/locks/hot", json={"wait_ms": 3000}))
    for _ in range(200):  # until the second acquire waits (2 s at most)
        if value(registry, "fencegate_lock_waiters"):
            break
        await asyncio.sleep(0.01)
    assert value(registry, "fencegate_lock_waiters") == 1
    await asyncio.sleep(0.2)
    assert await _release(client, "hot", first["lease_id"]) == 204
    assert (await second).status == 200
    assert value(registry, "fencegate_lock_waiters") == 0
    assert value(registry, "fencegate_lock_acquisitions_total", result="granted") == 2
    waited = value(registry, "fencegate_lock_acquire_wait_seconds_sum", result="granted")
    assert waited >= 0.2
    assert value(registry, "fencegate_lock_acquire_wait_seconds_bucket", result="granted",
                 le="0.1") == 1  # fmt: skip
    busy = await client.post("/v1/locks/hot", json={"wait_ms": 0})
    assert busy.status == 409
    assert value(registry, "fencegate_lock_acquisitions_total", result="held") == 1


def _node_errors(registry: CollectorRegistry, nodes: list[RedisNode]) -> list[float]:
    return [value(registry, "fencegate_redis_node_errors_total", node=f"127.0.0.1:{n.port}")
            for n in nodes]  # fmt: skip


@pytest.mark.faults
async def test_killed_node_shows_errors_for_that_node_only(
    gateway: Callable[..., Awaitable[tuple[Client, CollectorRegistry]]],
    own_redis3: list[RedisNode],
) -> None:
    client, registry = await gateway(own_redis3)
    grant = await _acquire(client, "before")
    await _release(client, "before", grant["lease_id"])
    assert _node_errors(registry, own_redis3) == [0, 0, 0]
    own_redis3[1].kill()
    for i in range(5):
        grant = await _acquire(client, f"after/{i}")  # a majority still answers
        assert await _release(client, f"after/{i}", grant["lease_id"]) == 204
    errors = _node_errors(registry, own_redis3)
    assert errors[1] >= 5, errors
    assert errors[0] == errors[2] == 0, errors
    for node in (own_redis3[0], own_redis3[2]):
        latency = "fencegate_redis_node_latency_seconds_count"
        assert value(registry, latency, node=f"127.0.0.1:{node.port}") >= 10


@pytest.mark.faults
async def test_lost_quorum_counts_a_quorum_failure(
    gateway: Callable[..., Awaitable[tuple[Client, CollectorRegistry]]],
    own_redis3: list[RedisNode],
) -> None:
    client, registry = await gateway(own_redis3)
    own_redis3[0].kill()
    own_redis3[1].kill()
    response = await client.post("/v1/locks/nobody")
    assert response.status == 503
    assert value(registry, "fencegate_quorum_failures_total", operation="acquire") == 1
    assert value(registry, "fencegate_lock_acquisitions_total", result="quorum_unavailable") == 1
    route = {"route": "/v1/locks/{name}", "method": "POST", "status": "503"}
    assert value(registry, "fencegate_http_requests_total", **route) == 1


async def test_each_node_reports_up_after_start(
    gateway: Callable[..., Awaitable[tuple[Client, CollectorRegistry]]], redis3: list[RedisNode]
) -> None:
    _, registry = await gateway()
    for node in redis3:
        labels = {"node": f"127.0.0.1:{node.port}"}
        # healthy once synced: a new cluster has no quarantine
        assert value(registry, "fencegate_redis_node_state", state="healthy", **labels) == 1
        for state in ("down", "refused", "unsynced", "quarantined"):
            assert value(registry, "fencegate_redis_node_state", state=state, **labels) == 0


@pytest.mark.faults
async def test_killed_node_state_becomes_down(
    gateway: Callable[..., Awaitable[tuple[Client, CollectorRegistry]]],
    own_redis3: list[RedisNode],
) -> None:
    client, registry = await gateway(own_redis3)
    own_redis3[1].kill()
    node = f"127.0.0.1:{own_redis3[1].port}"
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        grant = await _acquire(client, "probe")
        await _release(client, "probe", grant["lease_id"])
        if value(registry, "fencegate_redis_node_state", node=node, state="down") == 1:
            break
        await asyncio.sleep(0.1)
    assert value(registry, "fencegate_redis_node_state", node=node, state="down") == 1


@pytest.mark.faults
async def test_killed_nodes_are_down_in_the_gauge_with_only_readiness_probes(
    gateway: Callable[..., Awaitable[tuple[Client, CollectorRegistry]]],
    own_redis3: list[RedisNode],
) -> None:
    """What FencegateQuorumLost's gauge part needs: no client traffic, only the /readyz
    probes a load balancer sends, and the killed nodes are down in the gauge."""
    client, registry = await gateway(own_redis3)
    killed = own_redis3[:2]
    for node in killed:
        node.kill()
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:  # no lock or store request at all meanwhile
        healthy = [
            value(
                registry, "fencegate_redis_node_state", node=f"127.0.0.1:{n.port}", state="healthy"
            )
            for n in own_redis3
        ]
        if sum(healthy) * 2 <= len(healthy):  # the alert's condition
            break
        await client.get("/readyz")
        await asyncio.sleep(0.1)
    for node in killed:
        labels = {"node": f"127.0.0.1:{node.port}"}
        assert value(registry, "fencegate_redis_node_state", state="down", **labels) == 1
