"""The campaign's faults on real processes do what the nemesis claims they do."""

from __future__ import annotations

import asyncio
import email.utils
import time
from pathlib import Path

import aiohttp
import pytest

from tests.campaign.cluster import Gateway, SnapshotNode, faketime_works
from tests.campaign.nemesis import EXPIRE_SOON, JUMP_MS

pytestmark = pytest.mark.faults


def test_rollback_restarts_a_node_from_its_old_snapshot(tmp_path: Path) -> None:
    node = SnapshotNode(tmp_path / "node")
    node.start()
    try:
        node.command("SET", "fence:{a}", "5")
        node.snapshot()
        node.command("SET", "fence:{a}", "9")
        run_id = node.command("INFO", "server")
        node.rollback()
        assert node.command("GET", "fence:{a}") == b"$1\r\n5\r\n"  # back in time
        assert node.command("INFO", "server") != run_id
        node.restart_empty()
        assert node.command("GET", "fence:{a}") == b"$-1\r\n"
    finally:
        node.stop()


def test_clock_jump_expires_exactly_the_keys_it_would(tmp_path: Path) -> None:
    node = SnapshotNode(tmp_path / "node")
    node.start()
    try:
        node.command("SET", "lock:{a}", "x", "PX", "3000")  # expires within the jump
        node.command("SET", "long", "x", "PX", str(JUMP_MS * 3))  # outlives it
        node.command("SET", "fence:{a}", "7")  # no TTL: a clock never expires it
        assert node.command("EVAL", EXPIRE_SOON, "0", str(JUMP_MS)) == b":1\r\n"
        time.sleep(0.05)
        assert node.command("EXISTS", "lock:{a}") == b":0\r\n"
        assert node.command("EXISTS", "long") == b":1\r\n"
        assert node.command("GET", "fence:{a}") == b"$1\r\n7\r\n"
    finally:
        node.stop()


@pytest.mark.skipif(not faketime_works(), reason="needs the Debian package faketime")
async def test_skewed_gateway_runs_with_a_shifted_wall_clock(tmp_path: Path) -> None:
    """The gateway starts under libfaketime and its wall clock follows the skew file
    at run time (seen in its HTTP ``Date`` header), while it keeps serving."""
    raw = {"stores": {"files": {"type": "files", "root": str(tmp_path / "root")}}}
    gateway = Gateway(tmp_path / "gw", raw, skewable=True)
    gateway.start()
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:

            async def offset() -> float:
                deadline = time.monotonic() + 30
                while True:
                    try:
                        async with session.get(gateway.url + "/healthz") as response:
                            assert response.status == 200
                            date = email.utils.parsedate_to_datetime(response.headers["Date"])
                            return date.timestamp() - time.time()
                    except aiohttp.ClientConnectionError:
                        assert gateway.alive, gateway.log_tail()
                        assert time.monotonic() < deadline, gateway.log_tail()
                        await asyncio.sleep(0.1)

            assert abs(await offset()) < 5
            gateway.skew(3600)
            await asyncio.sleep(1.5)  # aiohttp caches its Date header for a second
            assert 3590 < await offset() < 3610
            gateway.skew(0)
            await asyncio.sleep(1.5)
            assert abs(await offset()) < 5
    finally:
        gateway.stop()
