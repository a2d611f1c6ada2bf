"""Readiness means grantability: 503 while no lock could be granted, with why and how long."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client.parser import text_string_to_metric_families

from lockservice.placement import owner
from lockservice.protocol import QUARANTINE_KEY
from tests._servers import RedisNode
from tests.faults.conftest import reply_int, wait_until
from tests.gateway.conftest import Client, Start, make_config

pytestmark = pytest.mark.faults


async def test_readiness_is_503_while_a_majority_is_quarantined_and_says_how_long(
    own_redis3: list[RedisNode], start: Start
) -> None:
    """Every node answers PING, yet no lock can be granted: readiness says so."""
    urls = [n.url for n in own_redis3]
    client = await start(
        make_config(lock_urls=urls, locks={"max_ttl_ms": 3000, "default_ttl_ms": 1000})
    )
    assert (await client.get("/readyz")).status == 200
    for node in own_redis3[:2]:
        node.restart(lose_data=True)  # a majority lost its data: resynced, quarantined
    for node in own_redis3[:2]:
        for _ in range(200):
            if reply_int(node.command("PTTL", QUARANTINE_KEY)) > 0:
                break
            await client.get("/readyz")  # nothing else is sent: the probe notices
            await asyncio.sleep(0.02)
    response = await client.get("/readyz")
    body = await response.json()
    assert response.status == 503, body
    assert "1 of 3 nodes can grant, 2 needed" in body["locks"], body
    assert body["locks"].count("quarantined for") == 2, body
    assert 0 < body["locks_ready_in_s"] <= 3.0, body
    assert 1 <= int(response.headers["Retry-After"]) <= 3

    async def ready() -> bool:
        return (await client.get("/readyz")).status == 200

    refused = await client.post("/v1/locks/r/q", json={"ttl_ms": 1000})
    data = await refused.json()
    assert refused.status == 503, data
    assert data["error"] == "quorum_unavailable"
    assert 0 < data["retry_after_ms"] <= 3000, data  # when the quarantines end
    assert 1 <= int(refused.headers["Retry-After"]) <= 3

    await wait_until(ready, 5.0, "ready once the quarantines end")
    assert (await client.post("/v1/locks/r/q", json={"ttl_ms": 1000})).status == 200


async def _group_series(client: Client) -> dict[str, float]:
    """The per-group samples of ``/metrics``: ``"<sample> <group>"`` -> value."""
    text = await (await client.get("/metrics")).text()
    return {
        f"{s.name.removeprefix('fencegate_')} {s.labels['group']}": s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if "group" in s.labels and not s.name.endswith("_created")
    }


async def test_readiness_names_each_lock_group_and_a_dead_group_fails_only_its_names(
    own_redis3: list[RedisNode], start: Start
) -> None:
    """[locks] groups: /readyz is 503 while any group cannot grant and says which; a
    name of a live group is still granted."""
    a, b = own_redis3[0], own_redis3[1]
    groups = [{"id": "a", "redis": [a.url]}, {"id": "b", "redis": [b.url]}]
    client = await start(make_config(locks={"groups": groups, "default_ttl_ms": 1000}))
    body = await (await client.get("/readyz")).json()
    assert body["lock_groups"] == {"a": "ok", "b": "ok"}, body
    series = await _group_series(client)
    assert series["redis_node_group a"] == series["redis_node_group b"] == 1, series
    for group in "ab":
        assert series[f"lock_group_can_grant {group}"] == 1, series
        assert series[f"lock_group_nodes_healthy {group}"] == 1, series
        assert series[f"lock_group_node_errors_total {group}"] == 0, series
    b.kill()
    response = await client.get("/readyz")
    body = await response.json()
    assert response.status == 503, body
    assert body["lock_groups"]["a"] == "ok", body
    assert "0 of 1 nodes can grant" in body["lock_groups"]["b"], body
    assert body["locks"].startswith("group b: "), body
    assert body["semaphores"]["reason"].startswith("group b: 0 of 1 nodes can grant"), body
    names = [f"r/{i}" for i in range(20)]
    of_a = next(n for n in names if owner(n, ["a", "b"]) == "a")
    of_b = next(n for n in names if owner(n, ["a", "b"]) == "b")
    assert (await client.post(f"/v1/locks/{of_a}", json={})).status == 200
    refused = await client.post(f"/v1/locks/{of_b}", json={})
    assert refused.status == 503
    assert (await refused.json())["error"] == "quorum_unavailable"
    # the metrics say which group is unhealthy, and only that one
    series = await _group_series(client)
    assert series["lock_group_can_grant a"] == 1, series
    assert series["lock_group_can_grant b"] == 0, series
    assert series["lock_group_nodes_healthy b"] == 0, series
    assert series["lock_group_node_errors_total b"] >= 1, series
    assert series["lock_group_node_errors_total a"] == 0, series


async def test_readiness_stays_200_with_a_node_down_but_says_semaphores_cannot_be_granted(
    own_redis3: list[RedisNode], start: Start
) -> None:
    """A semaphore needs every node (R32): with 1 of 3 down, locks still grant (200), and
    the JSON says semaphores do not, and why; they are ready again once the node is back."""
    urls = [n.url for n in own_redis3]
    locks = {"default_ttl_ms": 1000, "max_ttl_ms": 3000}  # a restart's quarantine is short
    client = await start(make_config(lock_urls=urls, locks=locks))
    body = await (await client.get("/readyz")).json()
    assert body["semaphores"] == {"ready": True}, body
    own_redis3[2].kill()
    response = await client.get("/readyz")
    body = await response.json()
    assert response.status == 200, body
    assert body["locks"] == "ok", body
    assert body["semaphores"]["ready"] is False, body
    reason = body["semaphores"]["reason"]
    assert "2 of 3 nodes can grant, a semaphore needs every node" in reason, body
    assert f":{own_redis3[2].port}" in reason, body
    # what it says is what the routes do
    assert (await client.post("/v1/locks/r/s", json={})).status == 200
    refused = await client.post("/v1/semaphores/r/t", json={"permits": 2})
    assert refused.status == 503, await refused.text()
    own_redis3[2].start()

    async def semaphores_ready() -> bool:
        return bool((await (await client.get("/readyz")).json())["semaphores"]["ready"])

    await wait_until(semaphores_ready, 10.0, "semaphores ready once the node is back")
    assert (await client.post("/v1/semaphores/r/t", json={"permits": 2})).status == 200
