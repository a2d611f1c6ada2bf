"""A real Prometheus scrapes a real gateway under load; every dashboard and alert query has data.

One scenario for the module (about 17 s): three ``redis-server`` nodes, a
``python -m gateway serve`` process with a files store, a PostgreSQL store
(a throw-away schema) and a MySQL store (a throw-away database), and
Prometheus scraping it every second with ``grafana/prometheus/alerts.yml``
loaded. The load, bounded in time and count:

1. contention: 12 clients on 4 hot locks, each grant followed by a fenced
   write, a renewal and a release; some clients do not wait (409 lock_held);
   then lock kinds: readers and a writer on one name, semaphore holders, and
   one request with other permits (409 permits_mismatch);
2. refused writes on each store: 25 writes with an older token (409
   stale_token), 25 with a forged token (403 token_not_issued), a few without
   or with a malformed token;
3. 8 lost leases: granted for 30 ms (longer if the machine is too loaded to grant
   that), then renewed and released once expired (409);
4. one Redis node killed, traffic goes on (errors for that node only);
5. a second node killed: no quorum (503 quorum_unavailable).

Then every expression of every dashboard panel and every alert rule is
evaluated through ``/api/v1/query`` and must return a non-empty vector, so a
renamed metric fails here. The load makes every alert fire except
``FencegateRedisNodeQuarantined`` (see ``CANNOT_FIRE``), whose gauge is
checked without its comparison.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import random
import re
import time
import uuid
from collections import Counter
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import asyncpg
import pytest

from tests._servers import RedisNode
from tests.conftest import MYSQL_DSN, PG_DSN, mysql_connect
from tests.grafana._assets import (
    ALERTS,
    NO_PROMETHEUS,
    PROMETHEUS,
    Target,
    alert_names,
    targets,
    variable_queries,
    without_comparison,
)
from tests.grafana._procs import GatewayProcess, PrometheusProcess

pytestmark = [
    pytest.mark.faults,
    pytest.mark.skipif(not PROMETHEUS.exists(), reason=NO_PROMETHEUS),
]

T = TypeVar("T")

CANNOT_FIRE = {
    "FencegateDown": "the gateway is up during the load: `up` is checked without == 0",
    "FencegateRedisNodeQuarantined": (
        "the load kills redis nodes but restarts none, so none is quarantined; the gauge "
        "under the comparison is checked instead"
    ),
}
CHECK_INSTEAD = {
    # PostgreSQL stays up during the load, so no store request gets a 5xx and the series
    # does not exist; its selector without the status is checked against real data, and
    # tests/grafana/alerts_test.yml makes the alert fire.
    "FencegateStorageErrors": 'fencegate_http_requests_total{route=~"/v1/stores/.*"}',
}
FORGED = 9_000_000_000_000_000_000  # below 2**63, far above any token issued here
STALE_WRITES = 25  # per store: above the rejection-spike threshold (20 in 5 min)
LOST_LEASES = 8  # above the lease-loss threshold (5 in 5 min)


@dataclass
class Observed:
    prometheus: PrometheusProcess
    gateway: GatewayProcess
    nodes: list[RedisNode]
    statuses: Counter[str]
    rules: dict[str, dict[str, Any]]


def _in_thread(coro: Coroutine[Any, Any, T], timeout: float) -> T:
    """Run ``coro`` on its own loop in a worker thread (the test's own loop is left alone)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result(timeout=timeout)


async def _schema(action: str, schema: str) -> None:
    conn = await asyncpg.connect(PG_DSN)
    try:
        if action == "create":
            await conn.execute(f'CREATE SCHEMA "{schema}"')
        else:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


async def _database(action: str, database: str) -> None:
    conn = await mysql_connect(MYSQL_DSN)
    try:
        async with conn.cursor() as cur:
            verb = "CREATE DATABASE" if action == "create" else "DROP DATABASE IF EXISTS"
            await cur.execute(f"{verb} `{database}`")
    finally:
        conn.close()


STORES = ("files", "kv", "my")


# the load
class Load:
    def __init__(self, http: aiohttp.ClientSession) -> None:
        self.http = http
        self.statuses: Counter[str] = Counter()

    async def call(
        self, method: str, path: str, what: str, **kwargs: Any
    ) -> tuple[int, dict[str, Any]]:
        async with self.http.request(method, path, **kwargs) as response:
            body = await response.json() if response.status not in (204,) else {}
            self.statuses[f"{what} {response.status}"] += 1
            return response.status, body

    async def acquire(
        self, name: str, ttl_ms: int = 2000, wait_ms: int = 0
    ) -> dict[str, Any] | None:
        body = {"ttl_ms": ttl_ms, "wait_ms": wait_ms}
        status, grant = await self.call("POST", f"/v1/locks/{name}", "acquire", json=body)
        return grant if status == 200 else None

    async def release(self, name: str, lease_id: str) -> int:
        headers = {"X-Lease-Id": lease_id}
        return (await self.call("DELETE", f"/v1/locks/{name}", "release", headers=headers))[0]

    async def renew(self, name: str, lease_id: str) -> int:
        body = {"lease_id": lease_id, "ttl_ms": 2000}
        return (await self.call("POST", f"/v1/locks/{name}/renew", "renew", json=body))[0]

    async def put(self, store: str, key: str, token: object | None) -> int:
        headers = {} if token is None else {"X-Fencing-Token": str(token)}
        path = f"/v1/stores/{store}/{key}"
        return (await self.call("PUT", path, f"put {store}", data=b"v", headers=headers))[0]

    async def contention(self, seconds: float, clients: int = 12) -> None:
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds

        async def client(i: int) -> None:
            rnd = random.Random(i)
            store = STORES[i % len(STORES)]
            for _ in range(400):
                if loop.time() >= end:
                    return
                key = f"hot/{rnd.randrange(2)}"
                name = f"{store}/{key}"
                grant = await self.acquire(name, wait_ms=0 if i % 4 == 0 else 300)
                if grant is None:
                    await asyncio.sleep(0.005)
                    continue
                await self.put(store, key, grant["token"])
                await self.renew(name, grant["lease_id"])
                await asyncio.sleep(rnd.uniform(0.002, 0.01))
                await self.release(name, grant["lease_id"])

        await asyncio.gather(*(client(i) for i in range(clients)))

    async def kinds(self, seconds: float) -> None:
        """Readers and a writer on one name, two semaphore holders, one permits mismatch."""
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds

        async def client(i: int) -> None:
            path, body, what = "/v1/locks/kinds/report", {"mode": "shared"}, "shared"
            if i == 0:
                body, what = {"mode": "exclusive"}, "exclusive"
            elif i >= 5:
                path, body, what = "/v1/semaphores/kinds/pool", {"permits": 2}, "semaphore"
            for _ in range(200):
                if loop.time() >= end:
                    return
                status, grant = await self.call(
                    "POST", path, what, json={**body, "ttl_ms": 2000, "wait_ms": 300}
                )
                if status == 200:
                    await asyncio.sleep(0.005)
                    headers = {"X-Lease-Id": grant["lease_id"]}
                    await self.call("DELETE", path, "release", headers=headers)

        await asyncio.gather(*(client(i) for i in range(8)))
        held = await self.call(
            "POST", "/v1/semaphores/kinds/sized", "semaphore", json={"permits": 2}
        )
        await self.call("POST", "/v1/semaphores/kinds/sized", "semaphore", json={"permits": 3})
        headers = {"X-Lease-Id": held[1]["lease_id"]}
        await self.call("DELETE", "/v1/semaphores/kinds/sized", "release", headers=headers)

    async def refused_writes(self, store: str) -> None:
        name, key = f"{store}/stale", "stale"
        old = await self.acquire(name)
        assert old is not None
        await self.release(name, old["lease_id"])
        new = await self.acquire(name)
        assert new is not None
        assert await self.put(store, key, new["token"]) == 200
        await self.release(name, new["lease_id"])
        for _ in range(STALE_WRITES):
            await self.put(store, key, old["token"])  # 409 stale_token
        for _ in range(STALE_WRITES):
            await self.put(store, key, FORGED)  # 403 token_not_issued
        for _ in range(3):
            await self.put(store, key, None)  # 428 token_required
            await self.put(store, key, "twelve")  # 400 bad_token

    async def lost_lease(self, i: int) -> None:
        name = f"lost/{i}"
        # 30 ms, or longer where a loaded machine's acquire takes up that validity
        # (not granted, 503): the point is a lease that expires, not its length.
        for ttl_ms in (30, 60, 120, 240, 480):
            grant = await self.acquire(name, ttl_ms=ttl_ms)
            if grant is not None:
                break
        assert grant is not None
        await asyncio.sleep(5 * ttl_ms / 1000)
        await self.renew(name, grant["lease_id"])  # 409 lease_lost
        await self.release(name, grant["lease_id"])  # 409 lease_lost

    async def cycles(self, seconds: float, prefix: str) -> None:
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        for i in range(200):
            if loop.time() >= end:
                return
            grant = await self.acquire(f"{prefix}/{i % 3}")
            if grant is not None:
                await self.release(f"{prefix}/{i % 3}", grant["lease_id"])
            await asyncio.sleep(0.01)


async def _drive(url: str, nodes: list[RedisNode]) -> Counter[str]:
    timeout = aiohttp.ClientTimeout(total=15)
    async with aiohttp.ClientSession(base_url=url, timeout=timeout) as http:
        load = Load(http)
        await load.contention(4.0)
        await load.kinds(1.5)
        for store in STORES:
            await load.refused_writes(store)
        await asyncio.gather(*(load.lost_lease(i) for i in range(LOST_LEASES)))
        nodes[2].kill()
        await load.cycles(1.5, "down")
        nodes[1].kill()
        await load.cycles(1.0, "quorum")
        await load.call("GET", "/readyz", "readyz")
        return load.statuses


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Observed]:
    base = tmp_path_factory.mktemp("observed")
    nodes = [RedisNode(base / f"redis{i}") for i in range(3)]
    schema = f"fg_grafana_{uuid.uuid4().hex[:12]}"
    gateway: GatewayProcess | None = None
    prometheus: PrometheusProcess | None = None
    _in_thread(_schema("create", schema), 30)
    _in_thread(_database("create", schema), 30)
    my_dsn = urlunsplit(urlsplit(MYSQL_DSN)._replace(path=f"/{schema}"))
    try:
        for node in nodes:
            node.start()
        redis = ", ".join(f'"{n.url}"' for n in nodes)
        gateway = GatewayProcess(
            base,
            f"""
[locks]
redis = [{redis}]
node_timeout_ms = 500
max_ttl_ms = 5000
default_ttl_ms = 1000
[stores.files]
type = "files"
root = "{base / "files"}"
[stores.kv]
type = "postgres"
dsn = "{PG_DSN}"
schema = "{schema}"
[stores.my]
type = "mysql"
dsn = "{my_dsn}"
""",
        )
        gateway.start()
        prometheus = PrometheusProcess(
            base, [f"127.0.0.1:{gateway.port}"], rule_files=[ALERTS], interval_ms=1000
        )
        prometheus.start()
        _wait_scraped(prometheus, after=time.time() + 1.0)
        statuses = _in_thread(_drive(gateway.url, nodes), 60)
        _wait_scraped(prometheus, after=time.time() + 2.5)
        groups = prometheus.api("rules")["groups"]
        rules = {r["name"]: r for g in groups for r in g["rules"]}
        yield Observed(prometheus, gateway, nodes, statuses, rules)
    finally:
        if prometheus is not None:
            prometheus.stop()
        if gateway is not None:
            gateway.stop()
        for node in nodes:
            node.stop()
        _in_thread(_schema("drop", schema), 30)
        _in_thread(_database("drop", schema), 30)


def _wait_scraped(prometheus: PrometheusProcess, *, after: float, limit: float = 20.0) -> None:
    """Until the last scrape of the gateway happened after the wall-clock time ``after``."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if prometheus.value('max(timestamp(up{job="fencegate"} == 1))') >= after:
            return
        time.sleep(0.2)
    raise AssertionError(f"prometheus did not scrape the gateway in time:\n{prometheus.log}")


# the tests
def test_the_load_did_what_it_says(observed: Observed) -> None:
    s = observed.statuses
    assert s["acquire 200"] > 50, s
    assert s["acquire 409"] > 0, s
    for store in STORES:
        assert s[f"put {store} 200"] > 10, s
        assert s[f"put {store} 409"] == STALE_WRITES, s
        assert s[f"put {store} 403"] == STALE_WRITES, s
        assert s[f"put {store} 428"] == s[f"put {store} 400"] == 3, s
    assert s["renew 409"] == s["release 409"] == LOST_LEASES, s
    assert s["acquire 503"] > 0, s
    assert s["shared 200"] > 10, s
    assert s["exclusive 200"] > 0, s
    assert s["semaphore 200"] > 10, s
    assert s["semaphore 409"] >= 1, s  # permits_mismatch at least
    assert s["readyz 503"] == 1, s


def test_prometheus_scrapes_the_gateway(observed: Observed) -> None:
    up = observed.prometheus.query('up{job="fencegate"}')
    assert [s["metric"]["instance"] for s in up] == [f"127.0.0.1:{observed.gateway.port}"]
    assert up[0]["value"][1] == "1"


# Series a gateway has only with [locks] groups; the load's gateway has a redis list.
# tests/gateway/test_readiness.py reads them from /metrics of a gateway with groups.
GROUPS_ONLY = ("fencegate_lock_group_",)


@pytest.mark.parametrize("target", targets(), ids=lambda t: t.id)
def test_dashboard_expression_returns_data(observed: Observed, target: Target) -> None:
    result = observed.prometheus.query(target.promql)  # a bad query fails here
    if any(name in target.promql for name in GROUPS_ONLY):
        return  # no data without groups
    assert result, f"{target.row} / {target.id}: empty vector for {target.promql}"


@pytest.mark.parametrize(
    "target", [t for t in targets() if "by (store" in t.promql], ids=lambda t: t.id
)
def test_per_store_panels_show_every_store(observed: Observed, target: Target) -> None:
    """Write latency, writes and rejections by store: a series with data for each store type.

    Every store's series exist at 0 from the start, so the check is that each one moved.
    """
    moved = {
        sample["metric"].get("store")
        for sample in observed.prometheus.query(target.promql)
        if float(sample["value"][1]) > 0  # NaN (a quantile of no data) is not > 0
    }
    assert moved >= set(STORES), f"{target.row} / {target.id}: {moved} for {target.promql}"


@pytest.mark.parametrize("variable", sorted(variable_queries()))
def test_dashboard_variable_has_values(observed: Observed, variable: str) -> None:
    definition = variable_queries()[variable]
    match = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", definition)
    assert match, f"${variable}: {definition!r} is not label_values(metric, label)"
    metric, label = match.groups()
    values = observed.prometheus.api(f"label/{label}/values", **{"match[]": metric})
    assert f"127.0.0.1:{observed.gateway.port}" in values, (variable, values)


def test_prometheus_loaded_every_alert_rule(observed: Observed) -> None:
    assert sorted(observed.rules) == sorted(alert_names())
    for name, rule in observed.rules.items():
        assert rule["health"] == "ok", (name, rule.get("lastError"))


@pytest.mark.parametrize("name", alert_names())
def test_alert_expression_returns_data(observed: Observed, name: str) -> None:
    expr = observed.rules[name]["query"]
    if name in CANNOT_FIRE:
        expr = without_comparison(expr)
    if name in CHECK_INSTEAD:
        assert CHECK_INSTEAD[name].split("{")[0] in expr
        expr = CHECK_INSTEAD[name]
    assert observed.prometheus.query(expr), f"{name}: empty vector for {expr}"


def _node(observed: Observed, i: int) -> str:
    return f"127.0.0.1:{observed.nodes[i].port}"


def test_each_event_of_the_load_is_seen_by_prometheus(observed: Observed) -> None:
    def inc(selector: str) -> float:
        return observed.prometheus.value(f"sum(increase({selector}[5m]))")

    moved = {
        "granted": inc('fencegate_lock_acquisitions_total{result="granted"}'),
        "held": inc('fencegate_lock_acquisitions_total{result="held"}'),
        "no quorum": inc('fencegate_lock_acquisitions_total{result="quorum_unavailable"}'),
        "waited": inc('fencegate_lock_acquire_wait_seconds_bucket{le="+Inf"}'),
        "shared granted": inc(
            'fencegate_lock_acquisitions_by_kind_total{kind="shared",result="granted"}'
        ),
        "semaphore granted": inc(
            'fencegate_lock_acquisitions_by_kind_total{kind="semaphore",result="granted"}'
        ),
        "permits mismatch": inc(
            'fencegate_lock_acquisitions_by_kind_total{kind="semaphore",result="permits_mismatch"}'
        ),
        "shared waited": inc(
            'fencegate_lock_acquire_wait_by_kind_seconds_bucket{kind="shared",le="+Inf"}'
        ),
        "waiters": observed.prometheus.value("max(max_over_time(fencegate_lock_waiters[5m]))"),
        "hold": inc("fencegate_lock_hold_seconds_count"),
        "renewed": inc('fencegate_lock_renewals_total{result="ok"}'),
        "renew lost": inc('fencegate_lock_renewals_total{result="lost"}'),
        "released": inc('fencegate_lock_releases_total{result="released"}'),
        "release not held": inc('fencegate_lock_releases_total{result="not_held"}'),
        "lease lost": inc('fencegate_leases_lost_total{reason="expired"}'),
        "quorum failures": inc('fencegate_quorum_failures_total{operation="acquire"}'),
        "http 5xx": inc('fencegate_http_requests_total{status="503"}'),
        "killed node errors": inc(
            f'fencegate_redis_node_errors_total{{node="{_node(observed, 2)}"}}'
        ),
        "live node latency": inc(
            f'fencegate_redis_node_latency_seconds_count{{node="{_node(observed, 0)}"}}'
        ),
    }
    for store in STORES:
        for reason in ("stale_token", "token_not_issued", "token_required", "bad_token"):
            selector = f'fencegate_fencing_rejections_total{{store="{store}",reason="{reason}"}}'
            moved[f"{store} {reason}"] = inc(selector)
        moved[f"{store} writes"] = inc(f'fencegate_storage_writes_total{{store="{store}"}}')
        moved[f"{store} latency"] = inc(
            f'fencegate_storage_write_duration_seconds_count{{store="{store}"}}'
        )
    assert not [what for what, value in moved.items() if not value > 0], moved
    # every waiter stopped waiting, and node 0 (up all along) had no errors
    assert observed.prometheus.value("sum(fencegate_lock_waiters)") == 0
    assert inc(f'fencegate_redis_node_errors_total{{node="{_node(observed, 0)}"}}') == 0
