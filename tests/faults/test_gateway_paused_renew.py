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
