"""The lock routes over the in-process backend and three real redis-server nodes."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest

from tests._servers import RedisNode
from tests.gateway.conftest import Client, Start, assert_lease_token, make_config

HEX32 = re.compile(r"[0-9a-f]{32}")


@pytest.fixture
async def client(start: Start, lock_urls: list[str]) -> Client:
    return await start(make_config(lock_urls=lock_urls))


async def acquire(client: Client, name: str, **body: Any) -> dict[str, Any]:
    response = await client.post(f"/v1/locks/{name}", json=body)
    assert response.status == 200, await response.text()
    data: dict[str, Any] = await response.json()
    return data


def drift_ms(ttl_ms: int) -> int:
    """The clock drift allowance the lock service subtracts: 1 % of ttl + 2 ms."""
    return ttl_ms // 100 + 2


async def test_acquire_returns_token_lease_id_ttl_and_validity(client: Client) -> None:
    grant = await acquire(client, "orders/42", ttl_ms=5000)
    assert set(grant) == {"name", "token", "lease_id", "ttl_ms", "valid_ms", "mode"}
    assert grant["mode"] == "exclusive"
    assert grant["name"] == "orders/42"
    assert isinstance(grant["token"], int)
    assert grant["token"] > 0
    assert HEX32.fullmatch(grant["lease_id"])
    assert grant["ttl_ms"] == 5000
    # ttl - elapsed - drift, as the gateway computed it: never more than ttl - drift
    assert 4000 < grant["valid_ms"] <= 5000 - drift_ms(5000)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/locks/a:b/c_d.e~f-9", {"ttl_ms": 5000}),
        ("/v1/locks/read/me", {"mode": "shared"}),
        ("/v1/semaphores/pool/1", {"permits": 3, "ttl_ms": 2500}),
    ],
)
async def test_a_grant_is_the_bytes_json_dumps_writes(
    client: Client, path: str, body: dict[str, Any]
) -> None:
    """The grant is written out by hand (gateway/lock_routes.py ``_grant_json``): it must
    stay what ``json.dumps`` makes of the same object, and the header json_answer's."""
    response = await client.post(path, json=body)
    assert response.status == 200
    raw = await response.read()
    assert raw == json.dumps(json.loads(raw)).encode()
    assert list(json.loads(raw))[:5] == ["name", "token", "lease_id", "ttl_ms", "valid_ms"]
    assert response.headers["Content-Type"] == "application/json; charset=utf-8"


@pytest.mark.parametrize("size", [17, 70_000])
async def test_a_body_that_comes_in_pieces_is_read_to_its_end(
    start: Start, lock_urls: list[str], size: int
) -> None:
    """A body not all in when the route starts (chunked, its second piece late) is
    waited for, and held to max_body_bytes as one that came at once."""
    client = await start(make_config(lock_urls=lock_urls, max_body_bytes=65_536))
    pad = b" " * (size - len(b'{"ttl_ms": 4321}'))

    async def pieces() -> Any:
        yield b'{"ttl_ms": '
        await asyncio.sleep(0.05)
        yield b"4321}" + pad

    response = await client.post("/v1/locks/slow/body", data=pieces())
    if size > 65_536:
        assert response.status == 413
        assert (await response.json())["error"] == "too_large"
    else:
        assert response.status == 200, await response.text()
        assert (await response.json())["ttl_ms"] == 4321


async def test_acquire_without_body_uses_defaults(client: Client) -> None:
    response = await client.post("/v1/locks/plain")
    assert response.status == 200
    grant = await response.json()
    assert grant["ttl_ms"] == 10_000
    assert 9000 < grant["valid_ms"] <= 10_000 - drift_ms(10_000)


async def test_held_lock_answers_409_lock_held_with_retry_after(client: Client) -> None:
    await acquire(client, "busy", ttl_ms=3000)
    response = await client.post("/v1/locks/busy", json={"ttl_ms": 1000})
    assert response.status == 409
    body = await response.json()
    assert body["error"] == "lock_held"
    assert 1000 < body["retry_after_ms"] <= 3000
    assert body["message"]
    retry_after = response.headers["Retry-After"]
    assert retry_after.isdigit()
    assert 1 <= int(retry_after) <= 3


async def test_retry_after_is_at_least_one_second(client: Client) -> None:
    await acquire(client, "short", ttl_ms=300)
    response = await client.post("/v1/locks/short")
    assert response.status == 409
    assert response.headers["Retry-After"] == "1"
    assert (await response.json())["retry_after_ms"] >= 1


async def test_waiting_acquire_gets_the_lock_when_released(client: Client) -> None:
    first = await acquire(client, "queue", ttl_ms=10_000)
    waiter = asyncio.create_task(client.post("/v1/locks/queue", json={"wait_ms": 5000}))
    await asyncio.sleep(0.1)
    released = await client.delete("/v1/locks/queue", headers={"X-Lease-Id": first["lease_id"]})
    assert released.status == 204
    response = await waiter
    assert response.status == 200
    assert (await response.json())["token"] > first["token"]


async def test_tokens_strictly_increase(client: Client) -> None:
    tokens = []
    for _ in range(5):
        grant = await acquire(client, "counter")
        tokens.append(grant["token"])
        response = await client.delete(
            "/v1/locks/counter", headers={"X-Lease-Id": grant["lease_id"]}
        )
        assert response.status == 204
    assert tokens == sorted(set(tokens))


async def test_renew_extends_and_returns_the_token(client: Client, lock_urls: list[str]) -> None:
    grant = await acquire(client, "jobs/1", ttl_ms=400)
    response = await client.post(
        "/v1/locks/jobs/1/renew", json={"lease_id": grant["lease_id"], "ttl_ms": 5000}
    )
    assert response.status == 200
    body = await response.json()
    assert body["name"] == "jobs/1"
    assert_lease_token(body["token"], grant["token"], lock_urls)
    assert set(body) == {"name", "token", "ttl_ms", "valid_ms"}
    assert body["ttl_ms"] == 5000
    assert 4000 < body["valid_ms"] <= 5000 - drift_ms(5000)
    await asyncio.sleep(0.5)  # past the first ttl: still held thanks to the renew
    status = await (await client.get("/v1/locks/jobs/1")).json()
    assert status["held"] is True
    assert_lease_token(status["token"], grant["token"], lock_urls)


async def test_renew_of_another_lease_id_is_lease_lost(client: Client) -> None:
    await acquire(client, "mine")
    response = await client.post("/v1/locks/mine/renew", json={"lease_id": "0" * 32})
    assert response.status == 409
    assert (await response.json())["error"] == "lease_lost"


async def test_renew_after_expiry_is_lease_lost(client: Client) -> None:
    grant = await acquire(client, "gone", ttl_ms=50)
    await asyncio.sleep(0.1)
    response = await client.post("/v1/locks/gone/renew", json={"lease_id": grant["lease_id"]})
    assert response.status == 409
    assert (await response.json())["error"] == "lease_lost"


async def test_release_then_release_again_is_lease_lost(client: Client) -> None:
    grant = await acquire(client, "twice")
    headers = {"X-Lease-Id": grant["lease_id"]}
    assert (await client.delete("/v1/locks/twice", headers=headers)).status == 204
    again = await client.delete("/v1/locks/twice", headers=headers)
    assert again.status == 409
    assert (await again.json())["error"] == "lease_lost"


async def test_release_needs_the_lease_id_header(client: Client) -> None:
    await acquire(client, "hdr")
    response = await client.delete("/v1/locks/hdr")
    assert response.status == 400
    assert (await response.json())["error"] == "bad_request"


async def test_status_never_shows_the_lease_id(client: Client, lock_urls: list[str]) -> None:
    free = await (await client.get("/v1/locks/never/taken")).json()
    assert free["held"] is False
    assert free["ttl_ms"] == 0
    grant = await acquire(client, "shown", ttl_ms=2000)
    response = await client.get("/v1/locks/shown")
    body = await response.json()
    assert response.status == 200
    assert set(body) == {"name", "held", "token", "ttl_ms", "mode", "holders", "permits"}
    assert body["held"] is True
    assert_lease_token(body["token"], grant["token"], lock_urls)
    assert 0 < body["ttl_ms"] <= 2000
    assert grant["lease_id"] not in await response.text()


@pytest.mark.parametrize(
    ("path", "body", "why"),
    [
        ("/v1/locks/x", b"{not json", "garbled JSON"),
        ("/v1/locks/x", b"[1, 2]", "not an object"),
        ("/v1/locks/x", b'{"ttl_ms": "100"}', "string ttl"),
        ("/v1/locks/x", b'{"ttl_ms": true}', "bool ttl"),
        ("/v1/locks/x", b'{"ttl_ms": -5}', "negative ttl"),
        ("/v1/locks/x", b'{"ttl_ms": 0}', "zero ttl"),
        ("/v1/locks/x", b'{"ttl_ms": 300001}', "ttl above max"),
        ("/v1/locks/x", b'{"ttl_ms": 1e400}', "overflowing ttl"),
        ("/v1/locks/x", b'{"ttl_ms": NaN}', "NaN ttl"),
        ("/v1/locks/x", b'{"wait_ms": 30001}', "wait above max"),
        ("/v1/locks/x", b'{"wait_ms": -1}', "negative wait"),
        ("/v1/locks/x", b'{"ttl": 100}', "unknown field"),
        ("/v1/locks/x", b"\xff\xfe", "not UTF-8"),
        ("/v1/locks/a%20b", b"", "space in name"),
        ("/v1/locks/" + "n" * 513, b"", "name too long"),
        ("/v1/locks/a%00b", b"", "NUL in name"),
        ("/v1/locks/renew", b"", "name is renew"),
        ("/v1/locks/x/renew", b'{"lease_id": "nope"}', "renew with a malformed lease_id"),
        ("/v1/locks/x/renew", b"{}", "renew without lease_id"),
        ("/v1/locks/x/renew", b'{"lease_id": 5}', "renew with a number as lease_id"),
    ],
)
async def test_bad_lock_requests_are_400(client: Client, path: str, body: bytes, why: str) -> None:
    response = await client.post(path, data=body)
    assert response.status == 400, why
    data = await response.json()
    assert data["error"] == "bad_request", why
    assert data["message"], why


@pytest.mark.parametrize("method", ["GET", "DELETE"])
async def test_a_name_ending_in_renew_is_refused_on_every_route(
    client: Client, method: str
) -> None:
    response = await client.request(method, "/v1/locks/a/renew", headers={"X-Lease-Id": "0" * 32})
    assert response.status == 400
    assert "renew" in (await response.json())["message"]


async def test_quorum_unavailable_is_503(start: Start, redis3: list[RedisNode]) -> None:
    client = await start(make_config(lock_urls=[n.url for n in redis3]))
    redis3[1].pause()
    redis3[2].pause()
    try:
        response = await client.post("/v1/locks/q", json={"ttl_ms": 1000})
        assert response.status == 503
        body = await response.json()
        assert body["error"] == "quorum_unavailable"
        ready = await client.get("/readyz")
        assert ready.status == 503
        assert (await ready.json())["locks"] != "ok"
    finally:
        redis3[1].resume()
        redis3[2].resume()


async def test_five_nodes_grant_with_two_out_and_answer_503_with_three_out(
    start: Start, redis5: list[RedisNode]
) -> None:
    """DESIGN: 1, 3 or 5 nodes. Over five, quorum 3: two paused nodes leave the lock
    routes and /readyz working, a third makes them 503."""
    client = await start(make_config(lock_urls=[n.url for n in redis5]))
    redis5[0].pause()
    redis5[1].pause()
    try:
        granted = await client.post("/v1/locks/five", json={"ttl_ms": 5000})
        assert granted.status == 200, await granted.text()
        lease = await granted.json()
        assert (await client.post("/v1/locks/five", json={"ttl_ms": 5000})).status == 409
        assert (await client.get("/readyz")).status == 200
        gone = await client.delete("/v1/locks/five", headers={"X-Lease-Id": lease["lease_id"]})
        assert gone.status == 204
        redis5[2].pause()
        response = await client.post("/v1/locks/five2", json={"ttl_ms": 1000})
        assert response.status == 503
        assert (await response.json())["error"] == "quorum_unavailable"
    finally:
        for node in redis5[:3]:
            node.resume()


async def test_a_5xx_that_every_request_meets_is_logged_once_a_second_not_per_request(
    start: Start, redis3: list[RedisNode], caplog: pytest.LogCaptureFixture
) -> None:
    """Two nodes down: every acquire answers 503; the log says so once, and how many
    more it held back, instead of a line per request."""
    client = await start(make_config(lock_urls=[n.url for n in redis3]))
    for node in redis3[1:]:
        node.pause()
    try:
        caplog.clear()
        loop = asyncio.get_running_loop()
        began = loop.time()
        answered = 0
        while answered < 20 and loop.time() - began < 30:
            response = await client.post(f"/v1/locks/flood{answered}", json={"ttl_ms": 1000})
            assert response.status == 503
            answered += 1
        took = loop.time() - began
        lines = [r for r in caplog.records if "quorum" in r.getMessage()
                 and r.name == "gateway.guard"]  # fmt: skip
        # one line a second at most (and the first at once), never one per request
        assert 1 <= len(lines) <= 1 + int(took), [r.getMessage() for r in lines]
        assert len(lines) < answered
    finally:
        for node in redis3[1:]:
            node.resume()


async def test_reported_token_is_the_grant_token_when_node_counters_disagree(
    start: Start, redis3: list[RedisNode]
) -> None:
    """The state a late grant leaves: one node, whose counter was ahead (it INCRed for an
    acquire that failed its quorum), ran this acquire after the other two had decided, so
    its copy of the lock carries its own, larger counter. Built here with SET, exactly as
    acquire.lua writes it, so that the test does not depend on reply order.
    """
    client = await start(make_config(lock_urls=[n.url for n in redis3]))
    grant = await (await client.post("/v1/locks/skewed", json={"ttl_ms": 5000})).json()
    late = 2**62
    redis3[2].command("SET", "fence:{skewed}", str(late))
    redis3[2].command("SET", "lock:{skewed}", f"{grant['lease_id']}:{late}", "PX", "5000")
    status = await (await client.get("/v1/locks/skewed")).json()
    assert status["token"] == grant["token"]
