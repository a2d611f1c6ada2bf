"""An acquire whose client went away while it waited leaves nothing behind.

aiohttp does not cancel a handler when its client disconnects; without the
gateway's own watch, a waiter that gave up (``curl -m 0.5``) stays queued and is
granted a lease at the next release that nobody can release. Three real
redis-server nodes (and the in-process backend), the gateway over a real socket,
the client a raw TCP connection that is closed while the acquire waits.

The gateway runs under the runner ``fencegate serve`` uses (``tests/_gateway.py``),
not under aiohttp's own ``TestServer``: that one turns ``handler_cancellation`` on,
which hides the problem.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from gateway.app import create_app
from tests._gateway import servers
from tests._servers import RedisNode
from tests.gateway.conftest import make_config

KINDS = {
    # kind: (route, the holder's body, the waiter's body)
    "exclusive": ("locks", {}, {}),
    "shared": ("locks", {}, {"mode": "shared"}),
    "semaphore": ("semaphores", {"permits": 1}, {"permits": 1}),
}


async def _give_up(port: int, path: str, body: dict[str, Any], after: float) -> bytes:
    """POST ``body`` to ``path`` on a raw connection and close it ``after`` seconds."""
    data = json.dumps(body).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(), after)
    except TimeoutError:
        return b""
    finally:
        writer.close()


def _requests(registry: CollectorRegistry, route: str, status: str) -> float:
    value = registry.get_sample_value(
        "fencegate_http_requests_total", {"route": route, "method": "POST", "status": status}
    )
    return value or 0.0


@contextlib.asynccontextmanager
async def _gateway(
    lock_urls: list[str],
) -> AsyncIterator[tuple[aiohttp.ClientSession, int, CollectorRegistry]]:
    """A gateway served as ``fencegate serve`` serves it; a session to it."""
    registry = CollectorRegistry()
    async with servers() as serve:
        server = await serve(create_app(make_config(lock_urls=lock_urls), registry=registry))
        port = server.port
        assert port is not None
        async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as client:
            yield client, port, registry


@pytest.mark.parametrize("kind", list(KINDS))
async def test_a_waiter_whose_client_went_away_is_not_granted_at_the_release(
    lock_urls: list[str], kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with _gateway(lock_urls) as (client, port, registry):
        await _schedule(client, port, kind, registry, caplog)


async def test_the_lock_goes_to_the_live_waiter_behind_one_whose_client_went_away(
    redis3: list[RedisNode],
) -> None:
    """The dead waiter is first in the queue: the release's hand-over goes to the live
    one behind it at once, not after the dead one's 8 s ttl."""
    async with _gateway([n.url for n in redis3]) as (client, port, _):
        path = "/v1/locks/cx3"
        response = await client.post(path, json={"ttl_ms": 10_000})
        holder = (await response.json())["lease_id"]
        dead = asyncio.create_task(_give_up(port, path, {"ttl_ms": 8000, "wait_ms": 5000}, 0.5))
        await asyncio.sleep(0.1)
        live = asyncio.create_task(client.post(path, json={"ttl_ms": 8000, "wait_ms": 5000}))
        assert await dead == b""
        await asyncio.sleep(0.3)
        assert not live.done()
        released = asyncio.get_running_loop().time()
        assert (await client.delete(path, headers={"X-Lease-Id": holder})).status == 204
        response = await asyncio.wait_for(live, 5.0)
        took = asyncio.get_running_loop().time() - released
        granted = await response.json()
        assert response.status == 200, granted
        assert took < 1.0, took
        status = await (await client.get(path)).json()
        assert status["held"] is True, status
        assert status["token"] == granted["token"], status
        assert status["holders"] == 1, status


async def _schedule(
    client: aiohttp.ClientSession,
    port: int,
    kind: str,
    registry: CollectorRegistry,
    caplog: pytest.LogCaptureFixture,
) -> None:
    route, holder_body, waiter_body = KINDS[kind]
    path = f"/v1/{route}/cx2"
    caplog.set_level(logging.DEBUG)

    response = await client.post(path, json={"ttl_ms": 10_000, **holder_body})
    assert response.status == 200, await response.text()
    lease_id = (await response.json())["lease_id"]

    # The waiter gives up after 0.5 s of its 5 s wait, without an answer.
    answer = await _give_up(port, path, {"ttl_ms": 8000, "wait_ms": 5000, **waiter_body}, 0.5)
    assert answer == b""
    await asyncio.sleep(0.5)

    response = await client.delete(path, headers={"X-Lease-Id": lease_id})
    assert response.status == 204
    # Nobody waits any more: the name is free at once, not held for the dead waiter's 8 s.
    deadline = asyncio.get_running_loop().time() + 1.0
    while True:
        status = await (await client.get(path)).json()
        if not status["held"] or asyncio.get_running_loop().time() > deadline:
            break
        await asyncio.sleep(0.05)
    assert status["held"] is False, status

    template = f"/v1/{route}/{{name}}"
    assert _requests(registry, template, "500") == 0
    assert _requests(registry, template, "499") == 1
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], [
        r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info
    ]
    # and the name can be taken again at once
    response = await client.post(path, json={"ttl_ms": 1000, **holder_body})
    assert response.status == 200, await response.text()


async def test_an_acquire_whose_client_closed_right_after_sending_it_takes_no_lock(
    lock_urls: list[str],
) -> None:
    """The client sent its acquire and closed at once (a load generator stopping, a
    ``curl`` killed): the gateway sees it gone before it asks the lock service, so no
    name is held for nobody until its ttl runs out. Answered (and counted) 499."""
    names = [f"cx4/{i}" for i in range(5)]
    data = json.dumps({"ttl_ms": 10_000}).encode()
    async with _gateway(lock_urls) as (client, port, registry):
        for name in names:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(
                f"POST /v1/locks/{name} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\n\r\n".encode()
                + data
            )
            writer.close()
            await writer.wait_closed()
        template = "/v1/locks/{name}"
        deadline = asyncio.get_running_loop().time() + 5.0
        while _requests(registry, template, "499") + _requests(registry, template, "200") < 5:
            assert asyncio.get_running_loop().time() < deadline, "not every acquire was answered"
            await asyncio.sleep(0.02)
        assert (_requests(registry, template, "499"), _requests(registry, template, "200")) == (
            5,
            0,
        )
        for name in names:
            status = await (await client.get(f"/v1/locks/{name}")).json()
            assert status["held"] is False, status
