"""A node that lost its scripts (SCRIPT FLUSH or FUNCTION FLUSH, a restart) still
runs every script.

By EVALSHA (a Redis user without FUNCTION and FCALL) the node answers NOSCRIPT and
the connection sends EVAL with the source in its place; by FCALL (Redis 7) it
answers "Function not found" and the connection loads the library and calls again.
Either way the caller's one future gets the reply, in order with the commands sent
around it, whether or not anyone still waits for it (a release).
"""

from __future__ import annotations

import asyncio

import pytest

from lockservice import LockManager, scripts
from tests._servers import RedisNode
from tests.faults.conftest import redlock, wait_until
from tests.lockservice.test_functions import FUNCTIONS, calls, libraries


def evalsha_url(node: RedisNode) -> str:
    """A user of ``node`` allowed everything but FUNCTION and FCALL."""
    node.command("ACL", "SETUSER", "fg_evalsha", "on", ">pw", "~*", "&*", "+@all",
                 "-function", "-fcall")  # fmt: skip
    return f"redis://fg_evalsha:pw@127.0.0.1:{node.port}/0"


@pytest.mark.parametrize("batch_writes", [False, True])
@pytest.mark.parametrize("path", ["evalsha", "fcall"])
async def test_every_call_runs_after_the_node_lost_its_scripts(
    own_redis3: list[RedisNode], path: str, batch_writes: bool
) -> None:
    redis3 = own_redis3
    by_evalsha = path == "evalsha"
    urls = [evalsha_url(n) if by_evalsha else n.url for n in redis3]
    flush = ("SCRIPT", "FLUSH") if by_evalsha else ("FUNCTION", "FLUSH")
    mgr = await LockManager.connect(urls, batch_writes=batch_writes)
    try:
        assert [node.functions for node in redlock(mgr).nodes] == [not by_evalsha] * 3
        first = await mgr.acquire("ns/a", ttl=10.0)
        await mgr.release(first)
        for node in redis3:
            assert node.command(*flush).startswith(b"+OK")
            node.command("CONFIG", "RESETSTAT")

        # Several calls in one burst: each miss is retried in its place in the stream.
        leases = await asyncio.gather(*(mgr.acquire(f"ns/{i}", ttl=10.0) for i in range(5)))
        assert [lease.name for lease in leases] == [f"ns/{i}" for i in range(5)]
        again = await mgr.acquire("ns/a", ttl=10.0)
        assert again.token > first.token

        for node in redis3:
            node.command(*flush)
        await mgr.release(LockManager.handle(again.name, again.lease_id))  # awaits the nodes
        for lease in leases:
            await mgr.release(lease)  # not awaited: the release must run all the same

        def released() -> bool:
            return all(node.command("KEYS", "lock:*") == b"*0\r\n" for node in redis3)

        await wait_until(released, 5.0, "every release ran")
        assert (await mgr.acquire("ns/a", ttl=10.0, wait=0.0)).token > again.token
        for node in redis3:
            done = calls(node)
            if by_evalsha:
                assert done.get("eval", 0) >= 1  # the source resent
            else:
                assert libraries(node) == {scripts.LIBRARY_NAME: FUNCTIONS}
                assert done.get("function|load", 0) >= 1
                assert [done.get(c, 0) for c in ("evalsha", "eval")] == [0, 0]  # FCALL only
    finally:
        await mgr.close()
