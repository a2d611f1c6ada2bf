"""SyncFencegateClient against a running gateway, and what ``import gateway.client`` loads.

The gateway runs in the test's event loop; the synchronous client runs in a
worker thread (``asyncio.to_thread``), as it would in a WSGI app or a script.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from gateway import client as fg
from gateway.client import FencegateClient, SyncFencegateClient
from tests._servers import free_port
from tests.gateway.conftest import Client, Start, make_config

ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")


@pytest.fixture
async def url(start: Start, files_root: Path, lock_urls: list[str]) -> str:
    stores = {"files": {"type": "files", "root": str(files_root)}}
    server: Client = await start(make_config(lock_urls=lock_urls, stores=stores))
    return str(server.make_url("")).rstrip("/")


async def in_thread(url: str, work: Callable[[SyncFencegateClient], T]) -> T:
    def run() -> T:
        with SyncFencegateClient(url, timeout=10.0) as client:
            return work(client)

    return await asyncio.to_thread(run)


def test_import_gateway_client_loads_no_server_dependency() -> None:
    code = (
        "import sys, gateway.client\n"
        "server = ('asyncpg', 'prometheus_client', 'aiohttp.web', 'storage_adapters', 'redis',\n"
        "          'gateway.app', 'gateway.routes', 'gateway.config')\n"
        "print(' '.join(m for m in server if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == []


async def test_lock_put_get_delete_and_typed_errors(url: str) -> None:
    def work(client: SyncFencegateClient) -> None:
        with client.lock("files/sync/a", ttl=5.0) as lease:
            assert lease.token > 0
            assert client.put("files", "sync/a", b"\x00\xffdata", token=lease.token) == lease.token
            assert client.get("files", "sync/a") == (b"\x00\xffdata", lease.token)
            assert client.get("files", "sync/a", token=lease.token)[0] == b"\x00\xffdata"
            with pytest.raises(fg.LockHeld) as held:
                client.acquire("files/sync/a", ttl=1.0)
            assert 0 < held.value.retry_after <= 5.0
            status = client.inspect("files/sync/a")
            assert status.held
            assert status.token == lease.token
            client.delete("files", "sync/a", token=lease.token)
            with pytest.raises(fg.NotFound):
                client.get("files", "sync/a")
        assert not client.status("files/sync/a").held
        first = client.acquire("files/sync/b", ttl=5.0)
        client.release(first)
        with pytest.raises(fg.LeaseLost):
            client.extend(first)
        second = client.acquire("files/sync/b", ttl=5.0)
        client.put("files", "sync/b", "new", token=second.token)
        with pytest.raises(fg.StaleToken) as stale:
            client.put("files", "sync/b", "old", token=first.token)
        assert (stale.value.token, stale.value.high_water) == (first.token, second.token)
        with pytest.raises(fg.TokenRequired):
            client.put("files", "sync/b", "none", token=None)
        with pytest.raises(fg.UnknownStore):
            client.get("nope", "k")
        assert second.valid_ms is not None
        assert 0 < second.valid_ms <= 5000
        renewed = client.renew(second, ttl=2.0)
        assert renewed.token == second.token
        assert renewed.valid_ms is not None
        assert 0 < renewed.valid_ms <= 2000
        assert 1.0 < renewed.remaining() <= 2.0
        client.release(renewed)

    await in_thread(url, work)


async def test_lock_renews_past_its_ttl_and_releases(url: str) -> None:
    def work(client: SyncFencegateClient) -> tuple[bool, bool]:
        with client.lock("sync-renewed", ttl=0.3) as lease:
            time.sleep(0.8)  # more than twice the ttl
            held = client.inspect("sync-renewed")
            assert held.token == lease.token
        return held.held, client.inspect("sync-renewed").held

    assert await in_thread(url, work) == (True, False)


async def test_a_lease_lost_during_the_block_raises_lease_lost_after_it(url: str) -> None:
    def work(client: SyncFencegateClient) -> None:
        def hold() -> None:
            with client.lock("sync-stolen", ttl=0.3) as lease:
                client.release(lease)  # an operator released it behind our back
                time.sleep(1.5)  # the renewer (every ttl/3) finds out, also on a busy machine

        with pytest.raises(fg.LeaseLost):
            hold()
        assert not client.inspect("sync-stolen").held

    await in_thread(url, work)


async def test_body_errors_release_the_lock(url: str) -> None:
    def work(client: SyncFencegateClient) -> bool:
        with pytest.raises(RuntimeError), client.lock("sync-oops", ttl=5.0):
            raise RuntimeError("boom")
        return client.inspect("sync-oops").held

    assert await in_thread(url, work) is False


async def test_one_client_shared_by_threads(url: str) -> None:
    with SyncFencegateClient(url) as client:

        def take(i: int) -> int:
            lease = client.acquire(f"sync-shared/{i}", ttl=5.0)
            client.release(lease)
            return lease.token

        tokens = await asyncio.gather(*(asyncio.to_thread(take, i) for i in range(8)))
    assert all(t > 0 for t in tokens)


async def test_both_clients_name_the_same_calls_alike() -> None:
    calls = ("acquire", "extend", "renew", "release", "inspect", "status", "lock", "put", "get")
    for name in (*calls, "delete", "close"):
        assert hasattr(SyncFencegateClient, name)
        assert hasattr(FencegateClient, name)
    assert FencegateClient.renew is FencegateClient.extend
    assert FencegateClient.status is FencegateClient.inspect


def test_bad_urls_and_names_are_refused_before_any_request(lock_urls: list[str]) -> None:
    if lock_urls:
        pytest.skip("no gateway needed")
    for make in (FencegateClient, SyncFencegateClient):
        with pytest.raises(ValueError, match=r"did you mean 'http://localhost:8080'"):
            make("localhost:8080")
    with SyncFencegateClient(f"http://127.0.0.1:{free_port()}", timeout=2.0) as client:
        with pytest.raises(ValueError, match="may not be 'renew'"):
            client.acquire("a/renew")
        with pytest.raises(fg.GatewayUnavailable) as info:
            client.inspect("x")
    assert info.value.code == "gateway_unavailable"


def test_valid_ms_of_a_reply_sets_the_deadline() -> None:
    from gateway._client_base import lease_from

    reply = {"name": "n", "token": 7, "lease_id": "l", "ttl_ms": 10_000}
    with_valid = lease_from({**reply, "valid_ms": 9_000}, started=100.0)
    assert (with_valid.valid_until, with_valid.valid_ms) == (109.0, 9_000)
    without = lease_from(reply, started=100.0)  # a gateway that does not send valid_ms yet
    assert (without.valid_until, without.valid_ms) == (110.0, None)
    renewed = lease_from({**reply, "token": 0, "valid_ms": 4_000}, started=200.0, lease=without)
    assert (renewed.token, renewed.valid_until) == (7, 204.0)
