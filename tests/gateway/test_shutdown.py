"""What a client and a load balancer see when a real ``fencegate serve`` gets SIGTERM.

With ``shutdown_timeout_ms = 3000`` and ``shutdown_grace_ms = 1000``: an acquire
waiting for a lock (``wait_ms`` 25000) is answered 503 ``shutting_down`` at once;
``/readyz`` answers 503 while the listener stays open for the grace period
(new acquires get 503, a holder can still renew); then connections are
refused; the process exits 0 within the timeout.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests._servers import free_port

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT, GRACE = 3.0, 1.0


class Gateway:
    def __init__(self, tmp_path: Path, **settings: int) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = tmp_path / "fencegate.toml"
        lines = [f'listen = "127.0.0.1:{self.port}"']
        lines += [f"{key} = {value}" for key, value in settings.items()]
        lines += ["[stores.files]", 'type = "files"', f'root = "{tmp_path / "data"}"']
        config.write_text("\n".join(lines) + "\n")
        self.log = tmp_path / "gateway.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("FENCEGATE_")}
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gateway", "serve", "--config", str(config)],
                cwd=tmp_path, env={**env, "PYTHONPATH": str(ROOT)}, stdout=log, stderr=log,
            )  # fmt: skip

    async def started(self, session: aiohttp.ClientSession) -> None:
        deadline = time.monotonic() + 30
        while True:
            try:
                async with session.get(self.url + "/healthz") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientConnectionError:
                pass
            assert self.proc.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, "the gateway did not start"
            await asyncio.sleep(0.05)

    async def exited(self) -> int:
        return await asyncio.to_thread(self.proc.wait, 30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    # A fresh connection per request: what a load balancer's health check does.
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=40)
    ) as session:
        yield session


async def post(session: aiohttp.ClientSession, url: str, body: object) -> tuple[int, Any]:
    async with session.post(url, json=body) as response:
        return response.status, await response.json()


async def test_sigterm_answers_waiters_then_readiness_503_then_grace_then_close(
    tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    gateway = Gateway(
        tmp_path, shutdown_timeout_ms=int(TIMEOUT * 1000), shutdown_grace_ms=int(GRACE * 1000)
    )
    try:
        await gateway.started(session)
        lock = gateway.url + "/v1/locks/files/x"
        status, holder = await post(session, lock, {"ttl_ms": 20_000})
        assert status == 200
        waiter = asyncio.create_task(post(session, lock, {"ttl_ms": 5000, "wait_ms": 25_000}))
        await asyncio.sleep(0.3)
        assert not waiter.done()

        signalled = time.monotonic()
        gateway.proc.send_signal(signal.SIGTERM)
        status, refusal = await waiter
        answered = time.monotonic() - signalled
        assert (status, refusal["error"]) == (503, "shutting_down"), refusal
        assert answered < TIMEOUT

        async with session.get(gateway.url + "/readyz") as response:  # the listener is open
            assert response.status == 503
            assert (await response.json())["draining"] is True
        async with session.get(gateway.url + "/healthz") as response:
            assert response.status == 200
        status, refusal = await post(session, gateway.url + "/v1/locks/y", {"ttl_ms": 1000})
        assert (status, refusal["error"]) == (503, "shutting_down")
        renew = lock + "/renew"
        status, renewed = await post(session, renew, {"lease_id": holder["lease_id"]})
        assert status == 200, renewed  # a holder finishing its work may still renew

        while True:  # readiness stays 503 until the listener closes
            try:
                async with session.get(gateway.url + "/readyz") as response:
                    assert response.status == 503
            except aiohttp.ClientConnectionError:
                break
            await asyncio.sleep(0.05)
        closed = time.monotonic() - signalled
        assert closed >= GRACE * 0.9, closed  # not before the grace period is over
        assert await gateway.exited() == 0
        total = time.monotonic() - signalled
        assert total < TIMEOUT + 2.0, total  # the limit, plus the start-up noise of a busy host
    finally:
        gateway.stop()
    log = gateway.log.read_text()
    assert (
        log.index("draining") < log.index("closing the listener") < log.index("fencegate: stopped")
    )
    assert "Traceback" not in log


async def test_an_idle_gateway_exits_promptly_after_stopped(
    tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    gateway = Gateway(tmp_path, shutdown_grace_ms=0)
    try:
        await gateway.started(session)
        signalled = time.monotonic()
        gateway.proc.send_signal(signal.SIGTERM)
        assert await gateway.exited() == 0
        took = time.monotonic() - signalled
    finally:
        gateway.stop()
    assert "stopped" in gateway.log.read_text()
    assert took < 1.5, took  # default shutdown_timeout_ms is 30 s: nothing waits on it
