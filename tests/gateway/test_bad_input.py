"""Malformed requests beyond the contract suite: repeated headers, HEAD, nested JSON."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from multidict import CIMultiDict

from tests._servers import RedisNode, free_port
from tests.gateway.conftest import (
    API_KEYS,
    Client,
    Start,
    auth_section,
    error,
    make_config,
    take,
)


@pytest.fixture
async def client(start: Start, files_root: Path) -> Client:
    return await start(make_config(stores={"files": {"type": "files", "root": str(files_root)}}))


def twice(name: str, first: str, second: str, **more: str) -> CIMultiDict[str]:
    headers = CIMultiDict([(name, first), (name, second)])
    headers.update(more)
    return headers


# -- a header sent twice is refused, never one copy taken -----------------------------------


async def test_two_fencing_tokens_are_400_bad_token_and_nothing_written(
    client: Client, files_root: Path
) -> None:
    first = await take(client, "files/doc")
    response = await client.put(
        "/v1/stores/files/doc",
        data=b"v",
        headers=twice("X-Fencing-Token", str(first["token"]), "1"),
    )
    body = await error(response, 400, "bad_token")
    assert "2 times" in body["message"]
    assert (await client.get("/v1/stores/files/doc")).status == 404
    assert not (files_root / "doc").exists()


async def test_two_fencing_tokens_on_a_fenced_read_raise_no_mark(client: Client) -> None:
    grant = await take(client, "files/doc")
    token = str(grant["token"])
    written = await client.put(
        "/v1/stores/files/doc", data=b"v", headers={"X-Fencing-Token": token}
    )
    assert written.status == 200
    read = await client.get(
        "/v1/stores/files/doc", headers=twice("X-Fencing-Token", str(grant["token"] + 5), token)
    )
    await error(read, 400, "bad_token")
    again = await client.put("/v1/stores/files/doc", data=b"w", headers={"X-Fencing-Token": token})
    assert again.status == 200  # no mark was raised above the holder's token


async def test_two_fencing_locks_are_400(client: Client) -> None:
    grant = await take(client, "files/doc")
    headers = twice(
        "X-Fencing-Lock", "files/doc", "other", **{"X-Fencing-Token": str(grant["token"])}
    )
    await error(
        await client.put("/v1/stores/files/doc", data=b"v", headers=headers), 400, "bad_request"
    )
    assert (await client.get("/v1/stores/files/doc")).status == 404


async def test_two_lease_ids_are_400_and_the_lease_stays(client: Client) -> None:
    grant = await take(client, "held")
    headers = twice("X-Lease-Id", grant["lease_id"], "someone-else")
    await error(await client.delete("/v1/locks/held", headers=headers), 400, "bad_request")
    state = await (await client.get("/v1/locks/held")).json()
    assert state["held"] is True


async def test_two_idempotency_keys_are_400_and_nothing_taken(client: Client) -> None:
    headers = twice("Idempotency-Key", "a", "b")
    response = await client.post("/v1/locks/idem", json={"ttl_ms": 5000}, headers=headers)
    await error(response, 400, "bad_request")
    assert (await (await client.get("/v1/locks/idem")).json())["held"] is False


async def test_two_authorization_headers_are_400(start: Start) -> None:
    client = await start(make_config(auth=auth_section()))
    good = f"Bearer {API_KEYS['admin']}"
    headers = twice("Authorization", good, f"Bearer {API_KEYS['reader']}")
    await error(await client.get("/v1/locks/a", headers=headers), 400, "bad_request")
    assert (await client.get("/v1/locks/a", headers={"Authorization": good})).status == 200


# -- HEAD where GET is a probe or a lock's state ---------------------------------------------


@pytest.mark.parametrize(
    "path",
    ["/healthz", "/readyz", "/metrics", "/v1/openapi.json", "/v1/stats/hot", "/v1/locks/a/b",
     "/v1/semaphores/s"],
)  # fmt: skip
async def test_head_answers_as_get_without_a_body(client: Client, path: str) -> None:
    get = await client.get(path)
    head = await client.head(path)
    assert head.status == get.status == 200
    assert await head.read() == b""
    assert head.headers["Content-Type"] == get.headers["Content-Type"]


async def test_head_on_a_store_key_is_405_and_raises_no_mark(client: Client) -> None:
    grant = await take(client, "files/doc")
    token = str(grant["token"])
    headers = {"X-Fencing-Token": str(grant["token"] + 1)}
    head = await client.head("/v1/stores/files/doc", headers=headers)
    assert head.status == 405
    assert set(head.headers["Allow"].split(", ")) == {"GET", "PUT", "DELETE"}
    written = await client.put(
        "/v1/stores/files/doc", data=b"v", headers={"X-Fencing-Token": token}
    )
    assert written.status == 200


async def test_allow_of_a_get_route_names_head(client: Client) -> None:
    response = await client.post("/healthz")
    await error(response, 405, "method_not_allowed")
    assert set(response.headers["Allow"].split(", ")) == {"GET", "HEAD"}


# -- JSON nested past the parser's recursion limit -------------------------------------------


@pytest.mark.parametrize("path", ["/v1/locks/deep", "/v1/semaphores/deep", "/v1/locks/deep/renew"])
async def test_deeply_nested_lock_bodies_are_400(client: Client, path: str) -> None:
    for raw in (b"[" * 3000 + b"]" * 3000, b'{"ttl_ms": ' + b"[" * 3000 + b"]" * 3000 + b"}"):
        response = await client.post(path, data=raw, headers={"Content-Type": "application/json"})
        await error(response, 400, "bad_request")


# -- a refused request says when to retry ---------------------------------------------------


async def test_shared_refused_behind_a_queued_exclusive_waiter_says_the_holders_ttl(
    start: Start, lock_urls: list[str]
) -> None:
    client = await start(make_config(lock_urls=lock_urls))
    held = await client.post("/v1/locks/q", json={"mode": "shared", "ttl_ms": 5000})
    assert held.status == 200
    waiter = asyncio.create_task(client.post("/v1/locks/q", json={"ttl_ms": 5000, "wait_ms": 8000}))
    try:
        await asyncio.sleep(0.3)  # the exclusive request is queued behind the shared holder
        refused = await client.post("/v1/locks/q", json={"mode": "shared", "wait_ms": 0})
        body = await error(refused, 409, "lock_held")
        assert 3000 <= body["retry_after_ms"] <= 5000, body
        assert int(refused.headers["Retry-After"]) >= 3, refused.headers
    finally:
        waiter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiter


async def test_shared_refused_behind_another_gateways_waiter_says_the_holders_ttl(
    start: Start, redis3: list[RedisNode]
) -> None:
    config = make_config(lock_urls=[n.url for n in redis3])
    first, second = await start(config), await start(config)
    held = await first.post("/v1/locks/q", json={"mode": "shared", "ttl_ms": 5000})
    assert held.status == 200
    waiter = asyncio.create_task(first.post("/v1/locks/q", json={"ttl_ms": 5000, "wait_ms": 8000}))
    try:
        await asyncio.sleep(0.3)  # queued on the nodes, not in the second gateway
        refused = await second.post("/v1/locks/q", json={"mode": "shared", "wait_ms": 0})
        body = await error(refused, 409, "lock_held")
        assert 3000 <= body["retry_after_ms"] <= 5000, body
    finally:
        waiter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiter


# -- a body that cannot be decoded (Content-Encoding) -----------------------------------------


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/v1/locks/enc"), ("POST", "/v1/semaphores/enc"), ("POST", "/v1/locks/enc/renew"),
     ("PUT", "/v1/stores/files/enc")],
)  # fmt: skip
async def test_a_body_not_in_its_content_encoding_is_400_and_nothing_taken_or_written(
    client: Client,
    files_root: Path,
    caplog: pytest.LogCaptureFixture,
    encoding: str,
    method: str,
    path: str,
) -> None:
    grant = await take(client, "files/enc")
    headers = {"Content-Encoding": encoding, "X-Fencing-Token": str(grant["token"])}
    response = await client.request(method, path, data=b'{"ttl_ms": 1000}', headers=headers)
    body = await error(response, 400, "bad_request")
    assert encoding in body["message"], body
    assert "Traceback" not in caplog.text
    assert "unhandled" not in caplog.text.lower()
    state = await client.get("/v1/locks/enc")
    assert (await state.json())["held"] is False
    assert not (files_root / "enc").exists()


# -- requests aiohttp's parser refuses before the app sees them ------------------------------


def test_a_request_the_http_parser_refuses_is_400_without_a_logged_traceback(
    tmp_path: Path,
) -> None:
    """A header above aiohttp's 8190 bytes, a bad request line: the client's mistakes.

    aiohttp answers them itself (400) and logs each at ERROR with a traceback by
    default; the gateway's log keeps them out above DEBUG.
    """
    port = free_port()
    config = tmp_path / "fencegate.toml"
    config.write_text(f'listen = "127.0.0.1:{port}"\n')
    gateway = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--config", str(config)],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in range(400):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            time.sleep(0.05)
        for request in (
            b"DELETE /v1/locks/x HTTP/1.1\r\nHost: h\r\nX-Lease-Id: " + b"a" * 9000 + b"\r\n\r\n",
            b"POST /v1/locks/x HTTP/1.1\r\nHost: h\r\nContent-Length: x\r\n\r\n",
        ):
            with socket.create_connection(("127.0.0.1", port), 5) as conn:
                conn.sendall(request)
                conn.settimeout(5)
                status_line = conn.recv(4096).split(b"\r\n", 1)[0]
                assert status_line.split()[1] == b"400", status_line
    finally:
        gateway.send_signal(signal.SIGINT)
        _, stderr = gateway.communicate(timeout=60)
    assert "stopped" in stderr, stderr
    assert "Traceback" not in stderr, stderr
    assert "Error handling request" not in stderr, stderr


@pytest.mark.parametrize(
    "head",
    [
        b"BREW /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
        b"POST /v1/locks/a HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
        b"PUT /v1/stores/files/k HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n"
        b"Content-Type: text/html\r\nContent-Length: 1\r\n\r\nx",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 9000 + b"\r\n\r\n",
    ],
    ids=["unknown-method", "negative-length", "two-content-types", "header-too-long"],
)
async def test_a_request_the_http_parser_refuses_gets_a_json_error(
    client: Client, head: bytes
) -> None:
    """DESIGN: errors are JSON. aiohttp answers these before any route or middleware,
    in text/plain of its own; the gateway's server answers them as its errors."""
    reader, writer = await asyncio.open_connection("127.0.0.1", client.server.port)
    try:
        writer.write(head)
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), 10)  # it closes the connection
    finally:
        writer.close()
    status_line, _, rest = raw.partition(b"\r\n")
    headers, _, body = rest.partition(b"\r\n\r\n")
    assert status_line.split()[1] == b"400", raw[:300]
    assert b"content-type: application/json" in headers.lower(), raw[:300]
    data = json.loads(body)
    assert data["error"] == "bad_request"
    assert data["message"]
    assert "Traceback" not in data["message"]
