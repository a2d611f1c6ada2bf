"""Readiness means grantability: 503 while no lock could be granted, with why and how long."""

from __future__ import annotations

import asyncio

import pytest

from lockservice.protocol import QUARANTINE_KEY
from tests._servers import RedisNode
from tests.faults.conftest import reply_int, wait_until
from tests.gateway.conftest import Start, make_config

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
