"""A node that lost its script cache (SCRIPT FLUSH, a restart) still runs every script.

EVALSHA answers NOSCRIPT there; the connection sends EVAL with the source in its
place and the caller's one future gets EVAL's reply, in order with the commands
sent around it, whether or not anyone still waits for it (a release). The nodes run
the scripts by EVALSHA for a Redis user without FUNCTION and FCALL (on Redis 7 they
are functions otherwise: test_functions.py).
"""

from __future__ import annotations

import asyncio

import pytest

from lockservice import LockManager
from tests._servers import RedisNode
from tests.faults.conftest import redlock


def evalsha_url(node: RedisNode) -> str:
    """A user of ``node`` allowed everything but FUNCTION and FCALL."""
    node.command("ACL", "SETUSER", "fg_evalsha", "on", ">pw", "~*", "&*", "+@all",
                 "-function", "-fcall")  # fmt: skip
    return f"redis://fg_evalsha:pw@127.0.0.1:{node.port}/0"


@pytest.mark.parametrize("batch_writes", [False, True])
async def test_scripts_run_after_the_script_cache_is_flushed(
    own_redis3: list[RedisNode], batch_writes: bool
) -> None:
    redis3 = own_redis3
    mgr = await LockManager.connect([evalsha_url(n) for n in redis3], batch_writes=batch_writes)
    try:
        assert not any(node.functions for node in redlock(mgr).nodes)
        first = await mgr.acquire("ns/a", ttl=10.0)
        await mgr.release(first)
        for node in redis3:
            assert node.command("SCRIPT", "FLUSH").startswith(b"+OK")
            node.command("CONFIG", "RESETSTAT")

        # Several calls in one burst: each NOSCRIPT is retried in its place in the stream.
        leases = await asyncio.gather(*(mgr.acquire(f"ns/{i}", ttl=10.0) for i in range(5)))
        assert [lease.name for lease in leases] == [f"ns/{i}" for i in range(5)]
        again = await mgr.acquire("ns/a", ttl=10.0)
        assert again.token > first.token

        for node in redis3:
            node.command("SCRIPT", "FLUSH")
        await mgr.release(LockManager.handle(again.name, again.lease_id))  # awaits the nodes
        for lease in leases:
            await mgr.release(lease)  # not awaited: the release script must run all the same
        await asyncio.sleep(0.2)
        for node in redis3:
            assert node.command("KEYS", "lock:*") == b"*0\r\n"  # every release ran
        assert (await mgr.acquire("ns/a", ttl=10.0, wait=0.0)).token > again.token
        for node in redis3:
            assert b"cmdstat_eval:calls=" in node.command("INFO", "commandstats")  # resent
    finally:
        await mgr.close()
