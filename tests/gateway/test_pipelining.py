"""HTTP/1.1 pipelining: several requests in one write on a keep-alive connection.

A client may send requests without waiting for the answers (RFC 9112, 9.3.2);
the server must answer them in the order they came. The gateway (aiohttp) does,
one request after the other on a connection; the benchmarks' load generator
(``benchmarks/cyclegen.c --depth``) relies on it. Raw sockets here: no HTTP
client library pipelines.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tests.gateway.conftest import Client, Start, make_config, take

DEPTH = 8
HELD = 3  # the request in the middle whose name is held already


@pytest.fixture
async def client(start: Start, lock_urls: list[str]) -> Client:
    return await start(make_config(lock_urls=lock_urls))


async def _connect(client: Client) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    port = client.server.port
    assert port is not None
    return await asyncio.open_connection("127.0.0.1", port)


def _post(name: str, body: dict[str, Any]) -> bytes:
    data = json.dumps(body).encode()
    return (
        f"POST /v1/locks/{name} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    ).encode() + data


def _delete(name: str, lease_id: str) -> bytes:
    return f"DELETE /v1/locks/{name} HTTP/1.1\r\nHost: x\r\nX-Lease-Id: {lease_id}\r\n\r\n".encode()


async def _answers(reader: asyncio.StreamReader, count: int) -> list[tuple[int, Any]]:
    """The next ``count`` answers on the connection: (status, JSON body or None)."""
    answers: list[tuple[int, Any]] = []
    async with asyncio.timeout(30):
        for _ in range(count):
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            fields = dict(line.partition(":")[::2] for line in head[1:] if line)
            headers = {k.lower(): v.strip() for k, v in fields.items()}
            assert "transfer-encoding" not in headers, head
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            answers.append((int(head[0].split()[1]), json.loads(body) if body else None))
    return answers


async def test_pipelined_requests_are_answered_in_order_and_each_lease_released(
    client: Client,
) -> None:
    names = [f"pipe/{i}" for i in range(DEPTH)]
    held = await take(client, names[HELD])
    reader, writer = await _connect(client)
    try:
        writer.write(b"".join(_post(name, {"ttl_ms": 10_000}) for name in names))
        posts = await _answers(reader, DEPTH)
        assert [status for status, _ in posts] == [409 if i == HELD else 200 for i in range(DEPTH)]
        assert posts[HELD][1]["error"] == "lock_held"
        grants = {names[i]: body for i, (_, body) in enumerate(posts) if i != HELD}
        assert all(body["name"] == name for name, body in grants.items())  # in order
        assert len({body["lease_id"] for body in grants.values()}) == DEPTH - 1

        # the DELETEs in one write too, one with a lease that does not hold its lock
        leases = {name: body["lease_id"] for name, body in grants.items()}
        leases[names[HELD]] = grants[names[0]]["lease_id"]
        writer.write(b"".join(_delete(name, leases[name]) for name in names))
        deletes = await _answers(reader, DEPTH)
        assert [status for status, _ in deletes] == [
            409 if i == HELD else 204 for i in range(DEPTH)
        ]
        assert deletes[HELD][1]["error"] == "lease_lost"
    finally:
        writer.close()
        await writer.wait_closed()
    for i, name in enumerate(names):
        status = await client.get(f"/v1/locks/{name}")
        assert (await status.json())["held"] is (i == HELD), name
    released = await client.delete(
        f"/v1/locks/{names[HELD]}", headers={"X-Lease-Id": held["lease_id"]}
    )
    assert released.status == 204


async def test_a_slow_request_holds_back_the_answers_pipelined_after_it(client: Client) -> None:
    """The first request waits for a held lock (``wait_ms``); the quick ones sent after it
    on the same connection are answered after it, not before."""
    held = await take(client, "slow/first")
    reader, writer = await _connect(client)
    try:
        writer.write(
            _post("slow/first", {"ttl_ms": 10_000, "wait_ms": 300})
            + b"".join(_post(f"slow/{i}", {"ttl_ms": 10_000}) for i in range(1, 4))
        )
        answers = await _answers(reader, 4)
    finally:
        writer.close()
        await writer.wait_closed()
    assert answers[0][0] == 409
    assert answers[0][1]["error"] == "lock_held"
    assert [(status, body["name"]) for status, body in answers[1:]] == [
        (200, f"slow/{i}") for i in range(1, 4)
    ]
    released = await client.delete("/v1/locks/slow/first", headers={"X-Lease-Id": held["lease_id"]})
    assert released.status == 204
