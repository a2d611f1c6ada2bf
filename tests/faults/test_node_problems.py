"""What an operator sees of node trouble: a WARNING naming the node and the cause,
once per change, and errors that say the same."""

from __future__ import annotations

import asyncio
import logging

import pytest

from lockservice import LockManager, QuorumUnavailable
from tests._servers import RedisNode

pytestmark = pytest.mark.faults


def _warnings(caplog: pytest.LogCaptureFixture, label: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and label in r.getMessage()
    ]


async def test_a_node_down_at_start_is_logged_once_with_its_cause(
    own_redis3: list[RedisNode], caplog: pytest.LogCaptureFixture
) -> None:
    own_redis3[2].kill()
    label = f"127.0.0.1:{own_redis3[2].port}"
    mgr = await LockManager.connect([n.url for n in own_redis3], node_timeout=0.2)
    try:
        for _ in range(20):
            await mgr.release(await mgr.acquire("p/down", ttl=1.0))
        await asyncio.sleep(0.5)  # reconnect attempts go on meanwhile
        warnings = _warnings(caplog, label)
        assert len(warnings) == 1, warnings
        assert "is down: cannot connect" in warnings[0]
        own_redis3[0].kill()  # killed while serving: one warning, not one per retry
        for _ in range(10):
            with pytest.raises(QuorumUnavailable):
                await mgr.acquire("p/down", ttl=1.0)
            await asyncio.sleep(0.05)
        first = f"127.0.0.1:{own_redis3[0].port}"
        assert len(_warnings(caplog, first)) == 1, _warnings(caplog, first)
    finally:
        await mgr.close()


@pytest.mark.parametrize("password", [None, "wrong"], ids=["none", "wrong"])
async def test_a_refused_login_says_authentication_failed(
    own_redis3: list[RedisNode], caplog: pytest.LogCaptureFixture, password: str | None
) -> None:
    node = own_redis3[0]
    node.command("CONFIG", "SET", "requirepass", "right")
    credentials = f":{password}@" if password else ""
    url = f"redis://{credentials}127.0.0.1:{node.port}"
    mgr = await LockManager.connect([url], node_timeout=0.2)
    try:
        with pytest.raises(QuorumUnavailable, match="authentication failed") as failed:
            await mgr.acquire("p/auth", ttl=1.0)
        assert "wrong" not in str(failed.value)  # never the password
        warnings = _warnings(caplog, f"127.0.0.1:{node.port}")
        assert len(warnings) == 1, warnings
        assert "authentication failed" in warnings[0]
    finally:
        await mgr.close()
        node.command("AUTH", "right")


async def test_a_node_that_may_evict_keys_never_counts(
    own_redis3: list[RedisNode], caplog: pytest.LogCaptureFixture
) -> None:
    """R20: an evicting node could drop fence:* counters or live locks."""
    for node in own_redis3[:2]:
        node.command("CONFIG", "SET", "maxmemory-policy", "allkeys-lru")
    mgr = await LockManager.connect([n.url for n in own_redis3], node_timeout=0.2)
    try:
        with pytest.raises(QuorumUnavailable, match="evicts keys") as failed:
            await mgr.acquire("p/evict", ttl=1.0)
        assert len(failed.value.node_errors) == 2
        readiness = await mgr.ready()
        assert not readiness.ready
        assert readiness.reason.count("evicts keys (maxmemory-policy allkeys-lru)") == 2
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 2, errors
        assert all("maxmemory-policy allkeys-lru" in e for e in errors)
    finally:
        await mgr.close()
