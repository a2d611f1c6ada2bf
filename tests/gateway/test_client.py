"""The Python client against a running gateway (aiohttp test server, real stores)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway import client as fg
from gateway.client import FencegateClient
from tests._servers import free_port
from tests.gateway.conftest import (
    API_KEYS,
    Client,
    Start,
    assert_lease_token,
    auth_section,
    make_config,
)


@pytest.fixture
async def server(start: Start, files_root: Path, lock_urls: list[str]) -> Client:
    stores = {"files": {"type": "files", "root": str(files_root)}}
    return await start(make_config(lock_urls=lock_urls, stores=stores))


def url_of(server: Client) -> str:
    return str(server.make_url("")).rstrip("/")


@pytest.fixture
async def gateway(server: Client) -> AsyncIterator[FencegateClient]:
    async with FencegateClient(url_of(server)) as client:
        yield client


async def test_lock_put_get_delete(gateway: FencegateClient) -> None:
    async with gateway.lock("files/a:b~c.d_e-f/g", ttl=5.0) as lease:
        assert lease.token > 0
        assert len(lease.lease_id) == 32
        stored = await gateway.put("files", "a:b~c.d_e-f/g", b"\x00\xffdata", token=lease.token)
        assert stored == lease.token
        body, token = await gateway.get("files", "a:b~c.d_e-f/g")
        assert (body, token) == (b"\x00\xffdata", lease.token)
        body, _ = await gateway.get("files", "a:b~c.d_e-f/g", token=lease.token)  # fenced
        await gateway.delete("files", "a:b~c.d_e-f/g", token=lease.token)
        with pytest.raises(fg.NotFound) as info:
            await gateway.get("files", "a:b~c.d_e-f/g")
        assert info.value.status == 404
        assert info.value.code == "not_found"
    assert not (await gateway.status("files/a:b~c.d_e-f/g")).held


async def test_auto_renew_keeps_the_lease_past_its_ttl(
    gateway: FencegateClient, lock_urls: list[str]
) -> None:
    async with gateway.lock("renewed", ttl=0.3) as lease:
        await asyncio.sleep(0.7)
        status = await gateway.status("renewed")
        assert status.held
        assert_lease_token(status.token, lease.token, lock_urls)
    assert not (await gateway.status("renewed")).held


async def test_a_lost_lease_cancels_the_body_and_raises_lease_lost(
    gateway: FencegateClient,
) -> None:
    started = asyncio.get_running_loop().time()
    reached_end = False

    async def hold() -> None:
        nonlocal reached_end
        async with gateway.lock("stolen", ttl=0.3) as lease:
            await gateway.release(lease)  # someone (an operator) released it behind our back
            await asyncio.sleep(5)
            reached_end = True

    with pytest.raises(fg.LeaseLost):
        await hold()
    assert not reached_end
    assert asyncio.get_running_loop().time() - started < 1.0


async def test_body_errors_release_the_lock(gateway: FencegateClient) -> None:
    with pytest.raises(RuntimeError):
        async with gateway.lock("oops", ttl=5.0):
            raise RuntimeError("boom")
    assert not (await gateway.status("oops")).held


async def test_typed_errors(gateway: FencegateClient) -> None:
    first = await gateway.acquire("files/k", ttl=5.0)
    with pytest.raises(fg.LockHeld) as held:
        await gateway.acquire("files/k", ttl=1.0)
    assert 0 < held.value.retry_after <= 5.0
    assert held.value.status == 409
    await gateway.release(first)
    with pytest.raises(fg.LeaseLost):
        await gateway.release(first)
    with pytest.raises(fg.LeaseLost):
        await gateway.renew(first)
    second = await gateway.acquire("files/k", ttl=5.0)
    await gateway.put("files", "k", "new", token=second.token)
    with pytest.raises(fg.StaleToken) as stale:
        await gateway.put("files", "k", "old", token=first.token)
    assert (stale.value.token, stale.value.high_water) == (first.token, second.token)
    with pytest.raises(fg.TokenNotIssued):
        await gateway.put("files", "k", "forged", token=second.token + 10**6)
    with pytest.raises(fg.TokenRequired):
        await gateway.put("files", "k", "none", token=None)
    with pytest.raises(fg.BadToken):
        await gateway.put("files", "k", "zero", token=0)
    with pytest.raises(fg.UnknownStore):
        await gateway.get("nope", "k")
    with pytest.raises(fg.BadRequest):
        await gateway.acquire("bad name")
    renewed = await gateway.renew(second, ttl=2.0)
    assert renewed.token == second.token
    assert 1.0 < renewed.remaining() <= 2.0


async def test_auth_errors_and_key(start: Start, files_root: Path) -> None:
    stores = {"files": {"type": "files", "root": str(files_root)}}
    server = await start(make_config(stores=stores, auth=auth_section()))
    async with FencegateClient(url_of(server)) as anonymous:
        with pytest.raises(fg.Unauthorized):
            await anonymous.status("x")
    async with FencegateClient(url_of(server), api_key=API_KEYS["billing"]) as billing:
        with pytest.raises(fg.Forbidden):
            await billing.acquire("orders/1")
        async with billing.lock("billing/1", ttl=5.0) as lease:
            assert lease.token > 0


async def test_unreachable_gateway(lock_urls: list[str]) -> None:
    if lock_urls:
        pytest.skip("one backend is enough")
    async with FencegateClient(f"http://127.0.0.1:{free_port()}", timeout=2.0) as client:
        with pytest.raises(fg.GatewayUnavailable) as info:
            await client.status("x")
    assert info.value.code == "gateway_unavailable"
