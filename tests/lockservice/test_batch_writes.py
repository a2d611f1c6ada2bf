"""``batch_writes``: the commands of one loop turn reach a node in one write.

By default the first command of a turn goes out at once (an application's own
call: lowest latency) and the rest of the turn follows in one write at its end;
the gateway, serving many clients at once, holds every command to the end of
its turn: one write per node per turn, fewer syscalls and wake-ups on both sides.
Either way the replies come back in order, each to its own caller.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from lockservice import LockManager, scripts
from lockservice.protocol import inspect_keys
from tests._servers import RedisNode


def _count_writes(mgr: LockManager) -> list[int]:
    """Wrap each node connection's transport.write; the list counts the writes."""
    counts: list[int] = []
    for node in mgr._backend.nodes:  # type: ignore[attr-defined]
        transport = node._conn._transport
        write = transport.write
        counts.append(0)
        index = len(counts) - 1

        def counted(data: Any, write: Any = write, index: int = index) -> None:
            counts[index] += 1
            write(data)

        node._conn._transport = _Counting(transport, counted)
    return counts


class _Counting:
    """The transport with its ``write`` counted (uvloop's transports take no new attributes)."""

    def __init__(self, transport: Any, write: Any) -> None:
        self._transport = transport
        self.write = write

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


@pytest.mark.parametrize("batch", [False, True])
async def test_the_calls_of_one_loop_turn_take_one_write_with_batch_writes(
    redis3: list[RedisNode], batch: bool
) -> None:
    mgr = await LockManager.connect([n.url for n in redis3], batch_writes=batch)
    try:
        await mgr.release(await mgr.acquire("bw/warm", ttl=10.0))  # scripts loaded
        counts = _count_writes(mgr)
        nodes = mgr._backend.nodes  # type: ignore[attr-defined]
        calls = [
            node.call(scripts.INSPECT, inspect_keys(f"bw/{i}"), (node.run_id or "",))
            for i in range(5)
            for node in nodes
        ]
        # eager: the first call of the turn went out at once; batched: nothing yet
        assert counts == [0 if batch else 1] * 3
        replies = await asyncio.gather(*calls)
        assert counts == [1 if batch else 2] * 3  # the rest: one write at the turn's end
        assert all(isinstance(r, list) for r in replies), replies  # each its own reply

        # whole acquires, started in one turn: batched, never more writes than eager
        before = list(counts)
        leases = await asyncio.gather(*(mgr.acquire(f"bw/{i}", ttl=10.0) for i in range(8)))
        assert len({lease.lease_id for lease in leases}) == 8
        assert [lease.name for lease in leases] == [f"bw/{i}" for i in range(8)]
        for lease in leases:
            await mgr.release(lease)
        await asyncio.sleep(0.05)
        for node in redis3:
            assert node.command("KEYS", "lock:*") == b"*0\r\n"  # every release ran
        assert all(c > b for c, b in zip(counts, before, strict=True))
    finally:
        await mgr.close()


async def test_the_release_of_a_lease_that_was_queued_for_goes_out_at_once(
    redis3: list[RedisNode],
) -> None:
    """A lease that was queued for is contended: its release likely hands the lock
    over, and is written before ``release`` returns, and the holder's next command
    is not held back behind it. An uncontended lease's release rides along with the
    turn's next command (one write for both)."""
    urls = [n.url for n in redis3]
    holder, waiter = await LockManager.connect(urls), await LockManager.connect(urls)
    try:
        # no wait: never queued (a try that waits counts as queued when a node answers
        # after the decision, as one may on a loaded machine: its answer may queue it)
        lease = await waiter.acquire("bw/free", ttl=10.0)
        counts = _count_writes(waiter)
        await waiter.release(lease)
        assert counts == [0, 0, 0]  # held for the turn's next command
        await asyncio.sleep(0.01)
        assert counts == [1, 1, 1]

        # the first grant of a name may find the counters apart: a round 2, and a late
        # node's message to settle (R16), would add writes below
        await holder.release(await holder.acquire("bw/hot", ttl=10.0))
        held = await holder.acquire("bw/hot", ttl=10.0)
        queued = asyncio.create_task(waiter.acquire("bw/hot", ttl=10.0, wait=5.0))
        for _ in range(200):
            if all(n.command("ZCARD", "waitq:{bw/hot}") == b":1\r\n" for n in redis3):
                break
            await asyncio.sleep(0.01)
        await holder.release(held)
        lease = await asyncio.wait_for(queued, 5.0)
        await asyncio.sleep(0.05)  # every node's message and answer is in
        before = list(counts)
        await waiter.release(lease)
        assert [c - b for c, b in zip(counts, before, strict=True)] == [1, 1, 1]  # at once
        again = asyncio.create_task(waiter.acquire("bw/hot", ttl=10.0))
        await asyncio.sleep(0)  # the task's first step: its try goes out at once too
        assert [c - b for c, b in zip(counts, before, strict=True)] == [2, 2, 2]
        await waiter.release(await again)
    finally:
        await holder.close()
        await waiter.close()
