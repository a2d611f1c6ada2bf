"""A node SIGSTOPped: quorum decides without it, its connection is recycled, it rejoins."""

from __future__ import annotations

import asyncio
import contextlib
import statistics
from collections.abc import Awaitable
from typing import TypeVar

import pytest

from lockservice import QuorumUnavailable, scripts
from lockservice.cleanup import release_args
from lockservice.protocol import SYNCED_KEY, fence_key, lock_keys
from tests._servers import RedisNode
from tests.faults.conftest import (
    NODE_TIMEOUT,
    Connect,
    cut_off,
    lock_key,
    node_connected,
    redlock,
    reply_bulk,
    reply_int,
    wait_until,
)

pytestmark = pytest.mark.faults

BOUND = NODE_TIMEOUT + 0.1  # no single call may wait longer than one node timeout
EARLY = NODE_TIMEOUT / 4  # the typical call does not wait for the paused node at all
STALL_WINDOW = 1.0  # Node: max(1.0, 5 * node_timeout)

T = TypeVar("T")


class LoopLag:
    """How late this event loop ran, as a task waking every ``TICK`` seconds sees it.

    On a loaded machine the process is not scheduled for a while: every call that
    spans such a stall takes that much longer for no fault of the code under test.
    A call that waits on a paused node does not delay the ticks (the loop keeps
    running), so subtracting the ticks' lateness keeps that wait in the latency.
    """

    TICK = 0.005
    STALL = 0.01  # later than this is a stall; less is a timer's usual jitter

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.late: list[tuple[float, float]] = []  # (woke at, seconds late)
        self.task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while True:
            due = self.loop.time() + self.TICK
            await asyncio.sleep(self.TICK)
            now = self.loop.time()
            if now - due > self.STALL:
                self.late.append((now, now - due))

    def within(self, start: float, end: float) -> float:
        """Seconds of ``[start, end]`` in which the loop ran late."""
        return sum(max(0.0, min(woke, end) - max(woke - late, start)) for woke, late in self.late)

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


async def test_latency_stays_bounded_with_one_node_paused(
    own_redis3: list[RedisNode], connect: Connect
) -> None:
    mgr = await connect(own_redis3)
    loop = asyncio.get_running_loop()
    own_redis3[1].pause()
    calls: list[tuple[float, float]] = []  # (start, end) of each call
    tokens: list[int] = []
    lag = LoopLag()
    end = loop.time() + 0.6  # inside the stall window: the node's connection is still up
    while loop.time() < end:
        start = loop.time()
        lease = await mgr.acquire("paused/latency", ttl=1.0)
        calls.append((start, loop.time()))
        tokens.append(lease.token)
        start = loop.time()
        lease = await mgr.extend(lease, ttl=1.0)
        calls.append((start, loop.time()))
        start = loop.time()
        await mgr.release(lease)
        calls.append((start, loop.time()))
    await asyncio.sleep(2 * LoopLag.TICK)  # a tick that woke late after the last call
    await lag.stop()
    # Each call's latency less the time the machine did not run this process meanwhile.
    latencies = [e - s - lag.within(s, e) for s, e in calls]
    stalled = lag.within(calls[0][0], calls[-1][1])
    assert node_connected(mgr, 1)  # the calls above all went to the paused node too
    assert len(latencies) >= 30 or stalled > 0.1, (len(latencies), stalled)
    assert max(latencies) < BOUND, (max(latencies), stalled)
    assert statistics.median(latencies) < EARLY, statistics.median(latencies)
    assert tokens == sorted(set(tokens))

    own_redis3[1].resume()  # it works through the backlog the pause left on its socket
    own_redis3[0].kill()  # now no quorum exists without the resumed node
    lease = await mgr.acquire("paused/latency", ttl=1.0, wait=1.0)
    assert lease.token > tokens[-1]
    await mgr.release(lease)


async def test_node_paused_past_stall_window_is_reconnected_and_rejoins(
    own_redis3: list[RedisNode], connect: Connect
) -> None:
    mgr = await connect(own_redis3)
    loop = asyncio.get_running_loop()
    paused = own_redis3[1]
    paused.pause()
    start = loop.time()
    latencies: list[float] = []
    while node_connected(mgr, 1):
        assert loop.time() - start < STALL_WINDOW + 1.0, "stalled connection never dropped"
        t = loop.time()
        lease = await mgr.acquire("paused/stall", ttl=1.0)
        await mgr.release(lease)
        latencies.append(loop.time() - t)
        await asyncio.sleep(0.02)
    assert loop.time() - start >= STALL_WINDOW * 0.9  # not dropped for being a little slow
    assert max(latencies) < BOUND

    for _ in range(10):  # dropped: calls fail at once on it, quorum decides on the others
        t = loop.time()
        lease = await mgr.acquire("paused/stall", ttl=1.0)
        await mgr.release(lease)
        assert loop.time() - t < EARLY

    paused.resume()
    await wait_until(lambda: node_connected(mgr, 1), 3.0, "resumed node reconnected")
    own_redis3[0].kill()  # only a quorum with the resumed node is left
    lease = await mgr.acquire("paused/stall", ttl=1.0, wait=1.0)
    assert reply_int(paused.command("EXISTS", lock_key("paused/stall"))) == 1
    await mgr.release(lease)


async def test_paused_node_reconnects_without_leaking_connections(
    own_redis3: list[RedisNode], connect: Connect
) -> None:
    mgr = await connect(own_redis3)
    paused = own_redis3[1]
    paused.pause()
    await mgr.ready()  # leaves a PING unanswered: the stall detector drops the connection
    await asyncio.sleep(STALL_WINDOW + 2.0)  # a reconnect attempt times out (INFO: 0.8 s)
    paused.resume()
    await wait_until(lambda: node_connected(mgr, 1), 3.0, "resumed node reconnected")
    await mgr.close()

    def clients() -> int:  # connected_clients counts the connection asking, too
        info = paused.command("INFO", "clients").decode()
        return int(info.split("connected_clients:")[1].split("\r\n")[0]) - 1

    try:
        await wait_until(lambda: clients() == 0, 1.0, "every connection of the closed manager gone")
    finally:
        paused.kill()  # closes the leaked sockets while this test's loop still runs
        await asyncio.sleep(0.05)


async def test_slow_node_with_a_higher_counter_never_makes_two_holders_share_a_token(
    own_redis3: list[RedisNode], connect: Connect
) -> None:
    a, b, c = own_redis3
    mgr = await connect(own_redis3)
    name = "paused/token"
    lease = await mgr.acquire(name, ttl=1.0)
    await mgr.release(lease)
    # An attempt that only C could answer: C counts one grant more than A and B.
    await cut_off(mgr, a, 0)
    await cut_off(mgr, b, 1)
    with pytest.raises(QuorumUnavailable):
        await mgr.acquire(name, ttl=1.0)
    a.resume()
    b.resume()
    await wait_until(lambda: node_connected(mgr, 0) and node_connected(mgr, 1), 3.0, "A, B back")

    async def slow(node: RedisNode, call: Awaitable[T]) -> T:
        """``call`` while ``node`` answers 50 ms late (inside the node timeout)."""
        node.pause()
        task = asyncio.ensure_future(call)
        await asyncio.sleep(0.05)
        node.resume()
        return await task

    first = await slow(c, mgr.acquire(name, ttl=1.0))  # A and B decide; C grants late
    handed = {first.token}
    renewed = await slow(b, mgr.extend(first, ttl=1.0))  # A and C answer the extend
    handed.add(renewed.token)
    handed.add((await mgr.inspect(name)).token)  # GET /v1/locks shows it as the holder's
    await mgr.release(renewed)
    second = await slow(c, mgr.acquire(name, ttl=1.0))  # A and B decide again
    await mgr.release(second)
    # Invariant 2, for every token a holder was given: the next grant is above all.
    assert second.token > max(handed), (first.token, renewed.token, second.token)


async def test_a_grant_handed_over_after_the_decision_gets_the_leases_token(
    own_redis3: list[RedisNode], connect: Connect
) -> None:
    """R16 for a lease a slow node queued only after it was decided: that node's
    "queued" answer comes late, the waiter stays queued there, and its next release
    hands the lock to the lease, which must record the lease's real token there."""
    c = own_redis3[2]
    mgr = await connect(own_redis3)
    name = "paused/late-queue"
    other = "f" * 32  # a lease of another gateway holds the name on C alone
    base = int((reply_bulk(c.command("GET", SYNCED_KEY)) or b"0").split()[0])
    c.command("SET", fence_key(name), str(base + 1000))  # C's next token is not the lease's
    c.command("SET", lock_key(name), f"{other}:1", "PX", "5000")
    c.pause()  # the waiter's try: A and B grant and decide; C answers "queued" late
    task = asyncio.ensure_future(mgr.acquire(name, ttl=2.0, wait=2.0))
    await asyncio.sleep(0.05)
    c.resume()
    lease = await task
    await wait_until(lambda: reply_int(c.command("EXISTS", f"waitq:{{{name}}}")) == 1,
                     2.0, "the lease queued on C")  # fmt: skip
    run_id = redlock(mgr).nodes[2].run_id or ""
    args = release_args(other, name, "elsewhere", run_id)
    source = scripts.RELEASE.source
    script = source.decode() if isinstance(source, bytes) else source
    c.command("EVAL", script, str(len(lock_keys(name))), *lock_keys(name), *args)  # hands over
    want = f"{lease.lease_id}:{lease.token}".encode()
    await wait_until(lambda: reply_bulk(c.command("GET", lock_key(name))) == want, 2.0,
                     f"C holding {want!r} (the lease's token)")  # fmt: skip
    await mgr.release(lease)
