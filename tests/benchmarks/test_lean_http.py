"""benchmarks/_lean_http.py: the benchmarks' lean HTTP/1.1 client, against real servers.

A real gateway process (``benchmarks.gateway.start_gateway``, as benchmarks/etcd.py
starts it) on three real redis-server nodes; a real 3-member etcd when ``etcd`` is
installed; and, for the answers neither sends on purpose (a truncated body, bytes
that are not HTTP, chunks split across reads), a loopback socket server that
writes exactly the bytes under test.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest

from benchmarks._lean_http import BadResponse, Connection, Pool, ServerClosed, header
from benchmarks.etcd import (
    JSON,
    EtcdCluster,
    _b64,
    etcd_lock_case,
    fencegate_lock_case,
    fencegate_put_case,
)
from benchmarks.gateway import Gateway, Refused, start_gateway
from tests._servers import RedisNode

LOCK = b'{"ttl_ms": 10000}'


@pytest.fixture
async def gateway(redis3: list[RedisNode], tmp_path: Path) -> AsyncIterator[Gateway]:
    """A gateway process on three real Redis nodes, with a files store."""
    stores = {"files": {"type": "files", "root": str(tmp_path / "data")}}
    async with aiohttp.ClientSession() as http:
        gw = await start_gateway(http, tmp_path, "lean", [n.url for n in redis3], stores)
    try:
        yield gw
    finally:
        await gw.stop(grace=10)


async def test_lock_cycles_on_one_kept_connection(gateway: Gateway) -> None:
    conn = Pool.for_url(gateway.url, 2)[1]
    tokens = []
    for _ in range(5):
        r = await conn.request("POST", "/v1/locks/lean/a", LOCK, JSON)
        assert r.status == 200, r
        assert (header(r.head, "content-type") or "").startswith("application/json")
        assert header(r.head, "Content-Length") == str(len(r.body))
        grant = json.loads(r.body)
        tokens.append(grant["token"])
        r = await conn.request(
            "DELETE", "/v1/locks/lean/a", headers=[("X-Lease-Id", grant["lease_id"])]
        )
        assert (r.status, r.body) == (204, b"")
    assert tokens == sorted(set(tokens))
    assert len(tokens) == 5
    assert conn.connects == 1  # ten requests, one keep-alive connection
    conn.close()


async def test_a_4xx_answer_comes_with_its_body(gateway: Gateway) -> None:
    conn = Connection("127.0.0.1", int(gateway.url.rpartition(":")[2]))
    r = await conn.request("POST", "/v1/locks/lean/b", LOCK, JSON)
    assert r.status == 200
    lease_id = json.loads(r.body)["lease_id"]
    # a release with another lease id, then an acquire with no wait while held
    r = await conn.request("DELETE", "/v1/locks/lean/b", headers=[("X-Lease-Id", "0" * 32)])
    assert 400 <= r.status < 500, r
    assert json.loads(r.body)["error"], r.body
    r = await conn.request("POST", "/v1/locks/lean/b", LOCK, JSON)
    assert r.status == 409, r
    assert json.loads(r.body)["error"] == "lock_held"
    r = await conn.request("DELETE", "/v1/locks/lean/b", headers=[("X-Lease-Id", lease_id)])
    assert r.status == 204
    assert conn.connects == 1  # a refusal does not cost the connection
    conn.close()


async def test_the_benchmark_cases_run_through_it(gateway: Gateway) -> None:
    """The fencegate side of benchmarks/etcd.py, a few ops each."""
    pool = Pool.for_url(gateway.url, 32)
    lock = fencegate_lock_case("lock", pool, gateway, 4)
    put = fencegate_put_case("put", pool, gateway, "files", b"x" * 256, ttl_ms=30_000)
    other = Pool.for_url(gateway.url, 1)[0]
    try:
        for i in range(4):
            await lock.op(i)
            await lock.op(i)
        assert put.setup is not None
        assert put.teardown is not None
        await put.setup()
        held = json.loads((await other.request("GET", "/v1/locks/files/bench/c31")).body)
        assert held["held"] is True
        for i in (0, 31):
            await put.op(i)
        r = await other.request("GET", "/v1/stores/files/bench/c31")
        assert (r.status, r.body) == (200, b"x" * 256)
        assert header(r.head, "x-fencing-token") == str(held["token"])
        await put.teardown()
        r = await other.request("GET", "/v1/locks/files/bench/c31")
        assert json.loads(r.body)["held"] is False
    finally:
        pool.close()
        other.close()
    assert [c.connects for c in pool.conns[:4]] == [1, 1, 1, 1]


async def test_a_connection_closed_by_the_server_mid_request_raises(gateway: Gateway) -> None:
    holder = Pool.for_url(gateway.url, 2)
    r = await holder[0].request("POST", "/v1/locks/lean/c", LOCK, JSON)
    assert r.status == 200
    wait = json.dumps({"ttl_ms": 10_000, "wait_ms": 20_000}).encode()
    waiting = asyncio.create_task(holder[1].request("POST", "/v1/locks/lean/c", wait, JSON))
    await asyncio.sleep(0.3)  # the acquire waits on the server for the holder's release
    assert not waiting.done()
    t0 = time.monotonic()
    gateway.proc.kill()  # the gateway's end of every connection closes, an answer unsent
    with pytest.raises(ServerClosed, match="closed the connection"):
        await asyncio.wait_for(waiting, 10)
    assert time.monotonic() - t0 < 10
    await asyncio.to_thread(gateway.proc.wait, 10)  # its listening socket closed as well
    with pytest.raises(ConnectionRefusedError):  # nothing listens any more: no reconnect
        await holder[1].request("POST", "/v1/locks/lean/c", LOCK, JSON)
    holder.close()


# ---------------------------------------------------------------- exact bytes
Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _served(script: Script) -> tuple[asyncio.Server, Connection]:
    """A loopback server running ``script`` on each connection, and a client for it."""

    async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await script(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(run, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, Connection("127.0.0.1", port, timeout=10)


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    size = int(header(head[:-2], "content-length") or 0)
    return head + await reader.readexactly(size)


async def test_a_truncated_body_raises_and_the_next_request_reconnects() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789")
        await writer.drain()

    server, conn = await _served(script)
    async with server:
        with pytest.raises(ServerClosed, match="with 50 bytes of the answer read"):
            await conn.request("GET", "/x")
        with pytest.raises(ServerClosed):
            await conn.request("GET", "/x")
        assert conn.connects == 2


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (b"SSH-2.0-OpenSSH_9.2\r\n\r\n", "not an HTTP/1.x status line"),
        (b"HTTP/1.1 2x0 OK\r\nContent-Length: 0\r\n\r\n", "no status code"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\n", "invalid literal"),
        (b"HTTP/1.1 200 OK\r\nServer: x\r\n\r\nbody", "neither content-length nor chunked"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", "transfer-encoding"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "chunk size"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA", "5 bytes after the answer"),
    ],
)
async def test_a_malformed_answer_raises(answer: bytes, why: str) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(answer)
        await writer.drain()
        await reader.read()  # keep the connection open: the client is the one to drop it

    server, conn = await _served(script)
    async with server:
        with pytest.raises(BadResponse, match=why):
            await conn.request("GET", "/x")


async def test_chunked_with_a_trailer_and_answers_split_anywhere() -> None:
    """etcd's error answers, byte by byte: every split of the stream parses the same."""
    body = b'{"error":"etcdserver: requested lease not found","code":5}'
    chunked = (
        b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\n"
        b"Trailer: Grpc-Trailer-Content-Type\r\nTransfer-Encoding: chunked\r\n\r\n"
        + f"{len(body) - 10:x}\r\n".encode() + body[:-10] + b"\r\n"
        + b"a;ext=1\r\n" + body[-10:] + b"\r\n"
        + b"0\r\nGrpc-Trailer-Content-Type: application/grpc\r\n\r\n"
    )  # fmt: skip
    plain = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
    empty = b"HTTP/1.1 204 No Content\r\n\r\n"
    sent: list[bytes] = []

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for answer in (chunked, plain, empty, chunked):
            sent.append(await _read_request(reader))
            for i in range(len(answer)):
                writer.write(answer[i : i + 1])
                await writer.drain()
        await reader.read()

    server, conn = await _served(script)
    async with server:
        r = await conn.request("POST", "/v3/lease/revoke", b'{"ID":"1"}', JSON)
        assert (r.status, r.body) == (404, body)
        assert header(r.head, "transfer-encoding") == "chunked"
        assert (await conn.request("GET", "/a")).body == b"hello"
        assert (await conn.request("DELETE", "/b")).status == 204
        assert (await conn.request("GET", "/c")).body == body
    assert conn.connects == 1
    assert sent[0] == (
        b"POST /v3/lease/revoke HTTP/1.1\r\nHost: " + conn.where.encode() + b"\r\n"
        b'Content-Type: application/json\r\nContent-Length: 10\r\n\r\n{"ID":"1"}'
    )
    conn.close()


async def test_connection_close_is_obeyed() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        await reader.read()  # the client closes it

    server, conn = await _served(script)
    async with server:
        for _ in range(3):
            assert (await conn.request("GET", "/x")).status == 200
        assert conn.connects == 3
    conn.close()


async def test_no_answer_in_time_raises_timeout() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()

    server, conn = await _served(script)
    conn.timeout = 0.2
    async with server:
        with pytest.raises(TimeoutError, match="no answer"):
            await asyncio.wait_for(conn.request("GET", "/x"), 10)


# ---------------------------------------------------------------- etcd
@pytest.mark.skipif(shutil.which("etcd") is None, reason="etcd is not installed")
async def test_lock_and_unlock_through_etcds_json_gateway(tmp_path: Path) -> None:
    cluster = EtcdCluster(str(shutil.which("etcd")), tmp_path / "etcd", fsync=False)
    cluster.start()
    try:
        await cluster.ready()
        leader = cluster.conn(1, leader=True)  # a connection ready() did not use
        lease = (await cluster.call(leader, "/lease/grant", {"TTL": 30}))["ID"]
        lock = {"name": _b64("lean/x"), "lease": lease}
        key = (await cluster.call(leader, "/lock/lock", lock))["key"]
        got = await cluster.call(leader, "/kv/range", {"key": key})
        assert got["count"] == "1"
        await cluster.call(leader, "/lock/unlock", {"key": key})
        assert "count" not in await cluster.call(leader, "/kv/range", {"key": key})
        await cluster.call(leader, "/lease/revoke", {"ID": lease})
        # etcd answers an error chunked, with a trailer: parsed, and the connection kept
        with pytest.raises(Refused, match="404 etcdserver: requested lease not found"):
            await cluster.call(leader, "/lease/revoke", {"ID": lease})
        assert leader.connects == 1
        case = etcd_lock_case("etcd", cluster, 4)  # the benchmark's own, on three members
        assert case.setup is not None
        assert case.teardown is not None
        await case.setup()
        for i in range(4):
            await case.op(i)
        await case.teardown()
    finally:
        cluster.stop()
