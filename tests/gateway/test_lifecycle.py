"""Request timeout, graceful shutdown with a write in flight, and what a start logs."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import asyncpg
import pytest

from gateway.state import STATE
from tests.gateway.conftest import Client, Start, TcpProxy, make_config, via_proxy


def kv(pg_dsn: str, pg_schema: str, proxy: TcpProxy, **options: int) -> dict[str, object]:
    return {
        "kv": {"type": "postgres", "dsn": via_proxy(pg_dsn, proxy), "schema": pg_schema, **options}
    }


async def take(client: Client, name: str) -> int:
    response = await client.post(f"/v1/locks/{name}")
    assert response.status == 200
    token: int = (await response.json())["token"]
    return token


async def test_a_hung_storage_answers_503_request_timeout(
    start: Start, pg_dsn: str, pg_schema: str, pg_proxy: TcpProxy
) -> None:
    config = make_config(
        stores=kv(pg_dsn, pg_schema, pg_proxy, acquire_timeout_ms=500),
        locks={"max_wait_ms": 0},
        request_timeout_ms=300,
    )
    client = await start(config)
    token = await take(client, "kv/k")
    # The answer comes once the store gives up on the hung connection (asyncpg's release
    # timeout, acquire_timeout_ms); the gateway still reports the cut-off as request_timeout.
    pg_proxy.stall()
    try:
        response = await client.put(
            "/v1/stores/kv/k", data=b"v", headers={"X-Fencing-Token": str(token)}
        )
        assert response.status == 503
        assert (await response.json())["error"] == "request_timeout"
    finally:
        pg_proxy.resume()
    # The store answers again (GET /readyz pings it through its pool): the write below
    # is not timed against a loaded machine's reconnect to PostgreSQL.
    deadline = asyncio.get_running_loop().time() + 10.0
    while (await client.get("/readyz")).status != 200:
        assert asyncio.get_running_loop().time() < deadline, "the store did not answer again"
        await asyncio.sleep(0.05)
    response = await client.put(
        "/v1/stores/kv/k", data=b"w", headers={"X-Fencing-Token": str(token)}
    )
    assert response.status == 200


async def test_shutdown_lets_a_write_in_flight_finish(
    start: Start, pg_dsn: str, pg_schema: str, pg_proxy: TcpProxy
) -> None:
    client = await start(make_config(stores=kv(pg_dsn, pg_schema, pg_proxy)))
    token = await take(client, "kv/inflight")
    pg_proxy.stall()
    write = asyncio.create_task(
        client.put("/v1/stores/kv/inflight", data=b"done", headers={"X-Fencing-Token": str(token)})
    )
    await asyncio.sleep(0.2)  # the write waits on the storage
    closing = asyncio.create_task(client.server.close())
    await asyncio.sleep(0.2)
    assert client.app is not None
    assert client.app[STATE].draining
    assert not write.done()
    assert not closing.done()
    pg_proxy.resume()
    response = await write
    assert response.status == 200
    await closing
    conn = await asyncpg.connect(pg_dsn)
    try:
        value = await conn.fetchval(
            f'SELECT value FROM "{pg_schema}".fencegate_kv WHERE key = $1', "inflight"
        )
    finally:
        await conn.close()
    assert value == b"done"


async def test_fencing_none_is_announced_loudly(
    start: Start, files_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stores = {"raw": {"type": "files", "root": str(files_root), "fencing": "none"}}
    with caplog.at_level(logging.WARNING):
        await start(make_config(stores=stores))
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("fencing = 'none'" in m and "raw" in m for m in warnings)
    assert any("in this process only" in m for m in warnings)


async def test_a_cancelled_store_call_on_a_hung_server_stays_cancelled(
    pg_dsn: str, pg_schema: str, pg_proxy: TcpProxy
) -> None:
    """The cancellation wins over the storage error its cleanup raises."""
    from storage_adapters import PostgresStore

    store = PostgresStore("kv", via_proxy(pg_dsn, pg_proxy), schema=pg_schema, acquire_timeout=0.5)
    await store.start()
    try:
        await store.put("kv/c", "c", 1, b"v")
        pg_proxy.stall()
        task = asyncio.create_task(store.put("kv/c", "c", 2, b"w"))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        pg_proxy.resume()
        await store.close()
