"""A gateway started while PostgreSQL is down serves locks and other stores, and that store
once PostgreSQL is up; ``strict_start`` keeps the old refusal. Reconnect noise is one line."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from gateway.app import create_app
from gateway.errors import StartupError
from gateway.serve import app_runner
from storage_adapters._pg import RECONNECT_LOG
from tests._pg_server import PgServer, pg_bin_dir
from tests.gateway.conftest import Client, Start, make_config


@pytest.fixture
def own_pg() -> Iterator[PgServer]:
    """A PostgreSQL cluster of this test's own, initialised but not started."""
    bin_dir = pg_bin_dir()
    if bin_dir is None:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) not found")
    server = PgServer(bin_dir)
    try:
        server.init()
        yield server
    finally:
        server.cleanup()


def stores(own_pg: PgServer, files_root: Path) -> dict[str, object]:
    return {
        "kv": {"type": "postgres", "dsn": own_pg.dsn, "acquire_timeout_ms": 1000},
        "files": {"type": "files", "root": str(files_root)},
    }


async def put(client: Client, store: str, key: str) -> tuple[int, dict[str, object]]:
    lock = await client.post(f"/v1/locks/{store}/{key}", json={"ttl_ms": 5000})
    assert lock.status == 200
    token = (await lock.json())["token"]
    response = await client.put(
        f"/v1/stores/{store}/{key}", data=b"v", headers={"X-Fencing-Token": str(token)}
    )
    body = await response.json()
    release = await client.delete(
        f"/v1/locks/{store}/{key}", headers={"X-Lease-Id": (await lock.json())["lease_id"]}
    )
    assert release.status == 204
    return response.status, body


async def test_a_store_whose_server_is_down_answers_503_until_it_is_up(
    start: Start, own_pg: PgServer, files_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    client = await start(make_config(stores=stores(own_pg, files_root)))
    assert (await put(client, "files", "a"))[0] == 200
    status, body = await put(client, "kv", "k")
    assert (status, body["error"]) == (503, "storage_unavailable")
    response = await client.get("/readyz")
    assert response.status == 503
    ready = await response.json()
    assert ready["stores"]["files"] == "ok"
    assert ready["stores"]["kv"] != "ok"

    await asyncio.sleep(2.0)  # a few retries in the background: none of them logged
    down = [r for r in caplog.records if "store 'kv'" in r.getMessage() and r.levelno >= 30]
    assert len(down) == 1, [r.getMessage() for r in down]
    assert "cannot start yet" in down[0].getMessage()

    await asyncio.to_thread(own_pg.start)
    deadline = time.monotonic() + 30
    while (await put(client, "kv", "k"))[0] != 200:
        assert time.monotonic() < deadline, "the store did not start after PostgreSQL came up"
        await asyncio.sleep(0.2)
    assert (await client.get("/readyz")).status == 200
    assert any("is reachable now and started" in r.getMessage() for r in caplog.records)


async def test_strict_start_refuses_to_start_while_the_server_is_down(
    own_pg: PgServer, files_root: Path
) -> None:
    config = make_config(stores=stores(own_pg, files_root), strict_start=True)
    runner = app_runner(create_app(config, registry=CollectorRegistry()))
    try:
        with pytest.raises(StartupError, match=r"store 'kv' could not start: .*\(strict_start\)"):
            await runner.setup()
    finally:
        await runner.cleanup()


def test_pool_reconnect_tracebacks_become_one_line_per_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pool_log = logging.getLogger("storage_adapters.pg_pool")  # the logger the pool writes to
    caplog.set_level(logging.WARNING)
    RECONNECT_LOG.reason = None
    for errno_, text in [(111, "refused")] * 4 + [(113, "no route")] * 3:
        try:
            raise ConnectionRefusedError(errno_, text)
        except OSError:  # what PgPool._restore_floor does on each failed attempt
            pool_log.warning("Failed to restore the pool connection floor; retrying", exc_info=True)
    lines = [r for r in caplog.records if r.name == "storage_adapters.pg_pool"]
    assert len(lines) == 2
    assert all(r.exc_info is None and r.exc_text is None for r in lines)
    assert "refused" in lines[0].getMessage()
    assert "no route" in lines[1].getMessage()
    assert "Traceback" not in caplog.text
    RECONNECT_LOG.recovered("kv")
    assert RECONNECT_LOG.reason is None
    assert "store 'kv' reaches PostgreSQL again" in caplog.text
