"""A lost acquire response, retried with its Idempotency-Key, returns the lease it granted.

The client sends ``POST /v1/locks/{name}`` (or a semaphore's) on a raw socket
and closes the connection without reading the answer: the grant happened,
its response was lost. The retry with the same key gets that lease back
(same ``lease_id`` and token) instead of queueing behind itself; without the
key, the retry would find the name held by its own lost lease.

Over gateway processes: one on the in-process backend, and two over three
Redis nodes with the retry sent to the other gateway. And the other side of a
dropped connection: a client gone before its body was read is no bug in the log.

Then the races of a repeat with its own first request, over LockManagers: a
repeat never answers a grant its owner may still give up (S2), and answers the
token the owner decided, not a vote of the nodes' tokens (S4); and a lease whose
tag no quorum took is never returned (a repeat would take a second permit).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest

from lockservice import Lease, LockHeld, LockManager, QuorumUnavailable, scripts
from lockservice.protocol import lock_key
from tests._servers import RedisNode
from tests.campaign.proxy import FaultProxy
from tests.faults.conftest import NODE_TIMEOUT, Connect, cut_off
from tests.faults.test_gateway_two_processes import gateways, http_session

pytestmark = pytest.mark.faults


@contextlib.asynccontextmanager
async def unread(
    url: str, path: str, body: dict[str, Any], key: str
) -> AsyncIterator[asyncio.StreamReader]:
    """The whole request on a raw socket; on exit the socket closes with the answer unread.

    (Closed before the gateway read the body, the request would not be served at
    all: aiohttp fails the body read. The lost response is the case that matters.)
    The caller may wait on the reader for the answer's first byte: then the gateway
    has decided the grant (no later round raises its token) and sent it.
    """
    parts = urlsplit(url)
    data = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\nIdempotency-Key: {key}\r\n\r\n"
    ).encode()
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        writer.write(head + data)
        await writer.drain()
        yield reader
    finally:
        writer.transport.abort()  # a reset, and the response is never read


async def held_state(session: aiohttp.ClientSession, url: str, name: str) -> dict[str, Any]:
    """The lock's state once it is held (the dropped request was served), within 10 s."""
    deadline = time.monotonic() + 10.0
    while True:
        async with session.get(f"{url}/v1/locks/{name}") as response:
            state: dict[str, Any] = await response.json()
        if state["held"] or time.monotonic() > deadline:
            return state
        await asyncio.sleep(0.02)


async def post(
    session: aiohttp.ClientSession, url: str, path: str, body: dict[str, Any], key: str | None
) -> tuple[int, dict[str, Any]]:
    headers = {} if key is None else {"Idempotency-Key": key}
    async with session.post(url + path, json=body, headers=headers) as response:
        return response.status, await response.json()


@pytest.fixture(params=["memory-1gw", "redis3-2gw"])
async def urls(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[list[str]]:
    """Gateway URLs: the retry goes to the last one, the dropped request to the first."""
    raw: dict[str, Any] = {"stores": {"files": {"type": "files", "root": str(tmp_path / "f")}}}
    count = 1
    if request.param.startswith("redis3"):
        nodes: list[RedisNode] = request.getfixturevalue("redis3")
        raw["locks"] = {"redis": [n.url for n in nodes], "node_timeout_ms": 500}
        count = 2
    with gateways(tmp_path, raw, count) as procs:
        async with http_session() as session:
            await asyncio.gather(*(p.wait_ready(session) for p in procs))
        yield [p.url for p in procs]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/locks/jobs/lost-answer", {"ttl_ms": 10_000}),
        ("/v1/locks/jobs/lost-answer", {"ttl_ms": 10_000, "mode": "shared"}),
        ("/v1/semaphores/jobs/lost-answer", {"ttl_ms": 10_000, "permits": 1}),
    ],
    ids=["exclusive", "shared", "semaphore"],
)
async def test_a_retry_after_a_dropped_response_gets_the_same_lease(
    urls: list[str], path: str, body: dict[str, Any]
) -> None:
    first, last = urls[0], urls[-1]
    name = "jobs/lost-answer"
    key = "cron-2026-11-24T01:00:lost"
    async with http_session() as session:
        async with unread(first, path, body, key) as answer:
            # Read while the grant is decided, the state could show a token that round 2
            # (R4) raises afterwards: wait until the answer is on its way, then lose it.
            async with asyncio.timeout(10):
                assert await answer.read(1) == b"H"  # "HTTP/1.1 200 OK", not read further
            state = await held_state(session, last, name)
        assert state["held"], "the dropped acquire was never granted"
        assert state["holders"] == 1

        status, lease = await post(session, last, path, {**body, "wait_ms": 2000}, key)
        assert status == 200, lease
        assert lease["token"] == state["token"]  # the grant the lost response carried
        assert (await held_state(session, last, name))["holders"] == 1  # not a second lease
        status, again = await post(session, first, path, body, key)
        assert status == 200, again
        assert (again["lease_id"], again["token"]) == (lease["lease_id"], lease["token"])

        if "permits" in body or body.get("mode") != "shared":
            # Without the key, a retry finds the name held by its own lost lease.
            status, refused = await post(session, last, path, body, None)
            assert (status, refused["error"]) == (409, "lock_held"), refused

        headers = {"X-Lease-Id": lease["lease_id"]}
        async with session.delete(last + path, headers=headers) as response:
            assert response.status == 204
        async with session.get(f"{last}/v1/locks/{name}") as response:
            assert not (await response.json())["held"]


async def test_a_client_gone_before_its_body_is_read_is_not_logged_as_a_bug(
    tmp_path: Path,
) -> None:
    # The whole request, then close at once: the gateway loses the connection before
    # the handler reads the body, and aiohttp fails that read (ConnectionResetError).
    raw: dict[str, Any] = {"stores": {"files": {"type": "files", "root": str(tmp_path / "f")}}}
    with gateways(tmp_path, raw, 1) as (gateway,):
        async with http_session() as session:
            await gateway.wait_ready(session)
            for _ in range(5):
                _, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
                writer.write(b"POST /v1/locks/gone HTTP/1.1\r\nHost: x\r\n"
                             b"Content-Length: 17\r\n\r\n{\"ttl_ms\": 10000}")  # fmt: skip
                writer.close()
                await writer.wait_closed()
            await asyncio.sleep(0.3)
            async with session.get(f"{gateway.url}/metrics") as response:
                text = await response.text()
        log = gateway.log_text()
    assert "unhandled error" not in log, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    counted = 'fencegate_http_requests_total{method="POST",route="/v1/locks/{name}",status='
    statuses = {line[len(counted) :].split("}")[0] for line in text.splitlines()
                if line.startswith(counted)}  # fmt: skip
    assert '"499"' in statuses, statuses  # counted as the client going away
    assert not {s for s in statuses if s.startswith('"5')}, statuses


async def test_a_repeat_never_returns_a_grant_its_owner_then_gives_up(
    own_redis3: list[RedisNode], connect: Connect
) -> None:
    """S2: W's acquire (through slow links) is handed the lock by a release, but its
    deadline comes before it hears so, and it gives the grant up; X, queued after
    it, then takes the lock. A repeat of W's request sent meanwhile through another
    gateway must not be answered with W's grant, or two valid leases exist."""
    loop = asyncio.get_running_loop()
    proxies = [FaultProxy(n.port) for n in own_redis3]
    for proxy in proxies:
        await proxy.start()
    g0 = await connect(own_redis3, max_ttl=30.0)
    g2 = await connect(own_redis3, max_ttl=30.0)
    g1 = await LockManager.connect([p.url for p in proxies], max_ttl=30.0)
    try:
        holder = await g0.acquire("s2", ttl=10.0)
        w = asyncio.create_task(g1.acquire("s2", ttl=10.0, wait=0.6, idempotency_key="K"))
        await asyncio.sleep(0.4)
        x = asyncio.create_task(g0.acquire("s2", ttl=10.0, wait=5.0))  # queued after W
        await asyncio.sleep(0.1)
        for proxy in proxies:
            proxy.set("delay", 0.4)  # W's links slow: it misses its hand-over in time
        await g0.release(holder)  # the nodes hand the lock to W
        await asyncio.sleep(0.05)
        repeat: Lease | None = None
        with contextlib.suppress(LockHeld):
            repeat = await g2.acquire("s2", ttl=10.0, idempotency_key="K")  # the retry
        owner: Lease | None = None
        with contextlib.suppress(LockHeld, QuorumUnavailable):
            owner = await w  # it gives up: its undo of the grant is on the way
        for proxy in proxies:
            proxy.set("pass")
        if repeat is not None:  # answered only with the lease its owner kept
            assert owner is not None
            assert (repeat.lease_id, repeat.token) == (owner.lease_id, owner.token)
        got_x: Lease | None = None
        with contextlib.suppress(LockHeld):
            got_x = await x
        if got_x is not None and repeat is not None:
            assert repeat.valid_until <= loop.time(), "X and the repeat's lease both valid"
    finally:
        await g1.close()
        for proxy in proxies:
            await proxy.close()


async def test_extend_returns_the_decided_token_when_round_2_missed_a_node(
    own_redis3: list[RedisNode], connect: Connect
) -> None:
    """S4: round 2 (R4) wrote the decided token on nodes 0 and 2 only; node 1 still
    has its round-1 token, and node 0 is then cut off. Nodes 1 and 2 are a quorum
    with one vote each: the extend must answer the decided (largest) token."""
    mgr = await connect(own_redis3, max_ttl=30.0)
    lease = await mgr.acquire("s4", ttl=10.0, idempotency_key="K")
    stale = f"{lease.lease_id}:{lease.token - 1}"
    assert own_redis3[1].command("SET", lock_key("s4"), stale, "KEEPTTL") == b"+OK\r\n"
    await cut_off(mgr, own_redis3[0], 0)
    renewed = await mgr.extend(mgr.handle("s4", lease.lease_id), ttl=10.0)
    assert renewed.token == lease.token
    own_redis3[0].resume()


# tag.lua's function as FCALL names it (a bulk string of its own; the library's text
# has it in quotes)
TAG_CALL = b"$%d\r\n%s\r\n" % (len(scripts.TAG.function), scripts.TAG.function)


class LosesTheCommit(FaultProxy):
    """A link that, once ``lose`` is set, loses the chunk carrying the commit of an
    idempotency tag (tag.lua's FCALL or EVALSHA) and ends its connection, as a link that
    breaks between a try and its commit does; every other chunk passes."""

    lose = False
    lost = 0  # chunks lost so far: the fault did strike

    def loses(self, data: bytes, direction: str) -> bool:
        if self.lose and direction == "up" and (scripts.TAG.sha in data or TAG_CALL in data):
            self.lost += 1
            return True
        return False


@pytest.mark.parametrize("mode", ["semaphore", "shared"])
async def test_a_lease_whose_tag_no_quorum_took_is_not_returned(
    own_redis3: list[RedisNode], connect: Connect, mode: str
) -> None:
    """A keyed acquire decides its lease (every node granted it), then the commit of
    its tag reaches no node: its links break in between (the campaign's gateway whose
    node connections were aborted right after a pause). Returned anyway, no node
    names that lease: a repeat through another gateway while it is held finds
    nothing and, a permit being free (or shared holders joinable), takes a second
    lease for the same key (R26). The acquire gives its lease up and fails instead,
    and the repeat then acquires afresh: one lease per key, and no permit left
    behind by the lease given up."""
    proxies = [LosesTheCommit(n.port) for n in own_redis3]
    for proxy in proxies:
        await proxy.start()
    other = await connect(own_redis3, max_ttl=30.0)
    lossy = await LockManager.connect(
        [p.url for p in proxies], node_timeout=NODE_TIMEOUT, max_ttl=30.0
    )

    async def keyed(mgr: LockManager) -> Lease:
        if mode == "semaphore":
            return await mgr.acquire_semaphore("sk", 2, ttl=10.0, idempotency_key="K")
        return await mgr.acquire("sk", ttl=10.0, mode="shared", idempotency_key="K")

    try:
        for proxy in proxies:
            proxy.lose = True
        first: Lease | None = None
        with contextlib.suppress(QuorumUnavailable):
            first = await keyed(lossy)
        repeat = await keyed(other)  # the client lost the answer: it asks again
        assert sum(p.lost for p in proxies) >= 2, "the commit reached a quorum: no fault"
        if first is not None:
            assert (repeat.lease_id, repeat.token) == (first.lease_id, first.token), (
                f"two valid leases for one key: {first.lease_id} and {repeat.lease_id}"
            )
        assert first is None  # given up, not returned with a tag no quorum took (R26)
        # the lease given up is released: one permit is left besides the repeat's
        assert mode != "semaphore" or await other.acquire_semaphore("sk", 2, 10.0, 2.0)
    finally:
        await lossy.close()
        for proxy in proxies:
            await proxy.close()
