"""A gateway that stops answering (SIGSTOP) while a client renews through it.

The renewal watchdog must cut the holder off when the lease's validity runs
out, not when the HTTP request's own timeout (30 s by default) gives up: a
renew that hangs past the validity would let the holder (and ``fencegate
run``'s command) work on without a lease while another client takes the lock.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import aiohttp
import pytest

from gateway.client import FencegateClient, LeaseLost
from gateway.sync_client import SyncFencegateClient
from tests._servers import RedisNode
from tests.faults.test_gateway_two_processes import GatewayProcess

pytestmark = pytest.mark.faults


async def test_a_holder_is_cut_off_when_its_lease_runs_out_while_the_gateway_is_paused(
    tmp_path: Path, redis3: list[RedisNode]
) -> None:
    gateway = GatewayProcess(tmp_path / "gw", {"locks": {"redis": [n.url for n in redis3]}})
    gateway.start()
    assert gateway.proc is not None
    try:
        async with aiohttp.ClientSession() as session:
            await gateway.wait_ready(session)
        validity_end = 0.0

        async def hold_while_the_gateway_is_paused(client: FencegateClient) -> None:
            nonlocal validity_end
            async with client.lock("paused/holder", ttl=1.0, auto_renew=True) as lease:
                validity_end = time.monotonic() + lease.remaining()
                assert gateway.proc is not None
                gateway.proc.send_signal(signal.SIGSTOP)
                await asyncio.sleep(15)

        async with FencegateClient(gateway.url, timeout=20.0) as client:
            with pytest.raises(LeaseLost):
                await hold_while_the_gateway_is_paused(client)
            late = time.monotonic() - validity_end
            assert late < 0.5, f"the holder ran {late:.2f} s past its lease's validity"
    finally:
        gateway.proc.send_signal(signal.SIGCONT)
        gateway.stop()


async def test_the_sync_client_logs_the_loss_when_the_lease_runs_out_while_the_gateway_is_paused(
    tmp_path: Path, redis3: list[RedisNode], caplog: pytest.LogCaptureFixture
) -> None:
    """The sync client cannot interrupt its block; it must still learn the loss on time
    (logged at once) and end the block without waiting for the hung renew."""
    gateway = GatewayProcess(tmp_path / "gw", {"locks": {"redis": [n.url for n in redis3]}})
    gateway.start()
    assert gateway.proc is not None
    proc = gateway.proc
    validity_end = 0.0

    def hold_while_the_gateway_is_paused() -> None:
        nonlocal validity_end
        with (
            SyncFencegateClient(gateway.url, timeout=20.0) as client,
            client.lock("paused/sync", ttl=1.0) as lease,
        ):
            validity_end = time.monotonic() + lease.remaining()
            proc.send_signal(signal.SIGSTOP)
            time.sleep(4)

    try:
        async with aiohttp.ClientSession() as session:
            await gateway.wait_ready(session)
        with pytest.raises(LeaseLost):
            await asyncio.to_thread(hold_while_the_gateway_is_paused)
        ended = time.monotonic()
        assert ended - validity_end < 4.5, "the block's end waited for the hung renew"
        [record] = [r for r in caplog.records if r.name == "gateway.sync_client"
                    and "lease_lost" in r.getMessage()]  # fmt: skip
        logged = record.created - (time.time() - time.monotonic())  # on the monotonic clock
        assert logged - validity_end < 0.5, (
            f"the loss was logged {logged - validity_end:.2f} s late"
        )
    finally:
        proc.send_signal(signal.SIGCONT)
        gateway.stop()
