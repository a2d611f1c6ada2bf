"""In-process tests serve the gateway as ``fencegate serve`` does (``tests/_gateway.py``).

aiohttp's own ``TestServer`` turns ``handler_cancellation`` on (a client that
disconnects cancels its handler), logs every request and waits 60 s for requests
in flight at shutdown; ``fencegate serve`` does none of these. These tests fail if
the two drift apart: the runner the in-process fixtures serve with is compared
with the one a real ``_serve_until_signal`` builds, and a store write whose client
disconnects must finish in-process as it does in production.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from gateway import serve
from gateway.config import parse_config
from tests.gateway.conftest import Client, Start, TcpProxy, make_config, via_proxy


def _settings(runner: web.AppRunner) -> dict[str, Any]:
    """What a runner serves with (aiohttp keeps it in private attributes)."""
    return {
        "type": type(runner),
        "server_kwargs": runner._kwargs,
        "shutdown_timeout": runner._shutdown_timeout,
        "handle_signals": runner._handle_signals,
    }


async def _runner_of_fencegate_serve(
    raw: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> web.AppRunner:
    """The runner of the gateway app that a real ``_serve_until_signal`` builds for ``raw``
    (it is then stopped: cancelled while it waits for a signal)."""
    built: list[web.AppRunner] = []
    setup = web.AppRunner.setup

    async def record(runner: web.AppRunner) -> None:
        built.append(runner)
        await setup(runner)

    config = parse_config({**raw, "listen": "127.0.0.1:0"})
    with monkeypatch.context() as patch:
        patch.setattr(web.AppRunner, "setup", record)
        patch.setattr(serve, "_tune_garbage_collection", lambda: None)  # not in the test process
        task = asyncio.create_task(serve._serve_until_signal(config, None))
        try:
            for _ in range(500):
                if built and built[0].addresses:
                    break
                assert not task.done(), task.result()
                await asyncio.sleep(0.01)
            else:
                raise AssertionError("fencegate serve did not start listening")
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
    return built[0]


@pytest.mark.parametrize(
    ("raw", "in_flight"),
    [({}, 30.0 - 5.0 - 1.0), ({"shutdown_timeout_ms": 4000, "shutdown_grace_ms": 1000}, 2.0)],
    ids=["defaults", "shutdown-settings"],
)
async def test_the_in_process_gateway_runs_under_the_runner_of_fencegate_serve(
    raw: dict[str, Any], in_flight: float, start: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    production = await _runner_of_fencegate_serve(raw, monkeypatch)
    client = await start(parse_config(raw))
    runner = client.server.runner
    assert isinstance(runner, web.AppRunner)
    assert _settings(runner) == _settings(production)
    # and what those are: a disconnect cancels no handler, no access log, and requests
    # in flight at shutdown get shutdown_timeout_ms less the grace and 1 s for closing
    assert runner._kwargs["handler_cancellation"] is False
    assert runner._kwargs["access_log"] is None
    assert runner._shutdown_timeout == in_flight


async def _put_and_hang_up(client: Client, path: str, token: int, body: bytes) -> None:
    """Send a PUT on a connection of its own and close it before the answer comes."""
    port, served = client.server.port, client.server.handler
    assert port is not None
    before = served.requests_count
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"PUT {path} HTTP/1.1\r\nHost: x\r\nX-Fencing-Token: {token}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    for _ in range(500):  # until the gateway handles it
        if served.requests_count > before:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)  # the handler waits on the storage
    assert not await _answered(reader)
    writer.close()
    await writer.wait_closed()


async def _answered(reader: asyncio.StreamReader) -> bool:
    try:
        return bool(await asyncio.wait_for(reader.read(1), 0.01))
    except TimeoutError:
        return False


async def test_a_store_write_whose_client_disconnects_is_finished(
    start: Start, pg_dsn: str, pg_schema: str, pg_proxy: TcpProxy
) -> None:
    """As under ``fencegate serve``: a disconnect never cuts a write half-way; under
    aiohttp's ``TestServer`` the handler is cancelled and the write is lost (499)."""
    registry = CollectorRegistry()
    kv = {"type": "postgres", "dsn": via_proxy(pg_dsn, pg_proxy), "schema": pg_schema}
    client = await start(make_config(stores={"kv": kv}), registry)
    grant = await (await client.post("/v1/locks/kv/k", json={"ttl_ms": 10_000})).json()
    headers = {"X-Fencing-Token": str(grant["token"])}
    assert (await client.put("/v1/stores/kv/k", data=b"before", headers=headers)).status == 200
    pg_proxy.stall()
    try:
        await _put_and_hang_up(client, "/v1/stores/kv/k", grant["token"], b"after")
        await asyncio.sleep(0.2)  # the client is gone; the write still waits on the storage
    finally:
        pg_proxy.resume()

    def puts(status: str) -> float:
        labels = {"route": "/v1/stores/{store}/{key}", "method": "PUT", "status": status}
        return registry.get_sample_value("fencegate_http_requests_total", labels) or 0.0

    for _ in range(250):  # the write finishes once the storage answers
        if puts("200") == 2 or puts("499"):
            break
        await asyncio.sleep(0.02)
    assert (puts("200"), puts("499")) == (2, 0)
    response = await client.get("/v1/stores/kv/k")
    assert response.status == 200
    assert await response.read() == b"after"
