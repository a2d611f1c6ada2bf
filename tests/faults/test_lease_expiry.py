"""Clients that pause or die: leases run out, the watchdog tells, queue places lapse.

Some tests run the client in a process of its own (``CLIENT`` below), so that
SIGSTOP pauses it the way a GC pause or a frozen VM would, and SIGKILL ends it
without any cleanup.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import lockservice
from lockservice import LeaseLost, LockHeld, QuorumUnavailable
from tests._servers import RedisNode
from tests.faults.conftest import NODE_TIMEOUT, Connect, reply_int, wait_until

pytestmark = pytest.mark.faults

TTL = 0.6
KEEPALIVE = 3.0  # redlock._KEEPALIVE_MS: a waiter that stops retrying loses its place
ROOT = Path(lockservice.__file__).resolve().parents[1]

CLIENT = """
import asyncio, sys
from lockservice import LeaseLost, LockManager

async def main(name, mode, ttl, urls):
    mgr = await LockManager.connect(urls, node_timeout=0.2, max_ttl=2.0)
    try:
        if mode == "hold":
            try:
                async with mgr.lock(name, ttl=ttl, auto_renew=True) as lease:
                    print("held", lease.token, flush=True)
                    await asyncio.sleep(30)
            except LeaseLost:
                print("lost", flush=True)
        else:
            print("waiting", flush=True)
            lease = await mgr.acquire(name, ttl=ttl, wait=20.0)
            print("held", lease.token, flush=True)
    finally:
        await mgr.close()

asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4:]))
"""


@contextlib.asynccontextmanager
async def client(
    nodes: list[RedisNode], name: str, mode: str, ttl: float
) -> AsyncIterator[asyncio.subprocess.Process]:
    """A lock client in a process of its own; killed on exit if it still runs."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CLIENT, name, mode, str(ttl), *(n.url for n in nodes),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGCONT)
                proc.kill()
        await proc.wait()


async def said(proc: asyncio.subprocess.Process, within: float) -> str:
    """The client's next line of output."""
    assert proc.stdout is not None
    async with asyncio.timeout(within):
        return (await proc.stdout.readline()).decode().strip()


async def test_lease_expires_while_its_holder_is_paused(
    own_redis3: list[RedisNode], connect: Connect
) -> None:
    holder, other = await connect(own_redis3), await connect(own_redis3)
    loop = asyncio.get_running_loop()
    first = await holder.acquire("expiry/paused", ttl=TTL)
    waiter = asyncio.create_task(other.acquire("expiry/paused", ttl=1.0, wait=3.0))
    await asyncio.sleep(0.05)
    # This whole process stops past the TTL (a GC pause): the holder renews nothing.
    time.sleep(TTL + 0.1)  # noqa: ASYNC251  # the pause is the fault under test
    assert first.expired
    second = await waiter
    assert loop.time() >= first.valid_until
    assert second.token > first.token

    with pytest.raises(LeaseLost):
        await holder.extend(first, ttl=1.0)
    with pytest.raises(LeaseLost):
        await holder.release(first)
    # A holder whose clock stood still during the pause (VM frozen: CLOCK_MONOTONIC
    # stops) still thinks it is valid: the nodes refuse it, and nothing is re-acquired.
    believer = dataclasses.replace(first, valid_until=loop.time() + 10)
    with pytest.raises(LeaseLost):
        await holder.extend(believer, ttl=1.0)
    with pytest.raises(LockHeld):
        await holder.acquire("expiry/paused", ttl=1.0)
    second = await other.extend(second, ttl=1.0)  # the new holder's lease is untouched
    await other.release(second)


async def test_paused_holder_process_loses_lease_and_learns_it_on_resume(
    own_redis3: list[RedisNode], connect: Connect
) -> None:
    mgr = await connect(own_redis3)
    loop = asyncio.get_running_loop()
    async with client(own_redis3, "expiry/process", "hold", TTL) as proc:
        line = await said(proc, 10.0)
        assert line.startswith("held "), line
        first_token = int(line.split()[1])
        await asyncio.sleep(TTL)  # its watchdog renews: still held after its first TTL
        with pytest.raises(LockHeld):
            await mgr.acquire("expiry/process", ttl=1.0)

        proc.send_signal(signal.SIGSTOP)
        start = loop.time()
        left = (await mgr.inspect("expiry/process")).ttl
        assert 0 < left <= TTL  # at most one TTL left, and a stopped process renews nothing
        # Granted while the holder is still stopped (its renewals would keep it for good:
        # LockHeld after wait): the lease ran out on its own, within one TTL of the stop
        # plus the waiter's wake-up, which a loaded machine (CI: 3 workers on 2 cores)
        # stretches by up to a second; the timing bound is a sanity check, not the proof.
        second = await mgr.acquire("expiry/process", ttl=2.0, wait=3.0)
        assert loop.time() - start <= TTL + 1.0
        assert second.token > first_token

        proc.send_signal(signal.SIGCONT)
        start = loop.time()
        assert await said(proc, 2.0) == "lost"  # body cancelled, LeaseLost from async with
        assert loop.time() - start < TTL / 3 + NODE_TIMEOUT + 0.3
        assert await proc.wait() == 0
    second = await mgr.extend(second, ttl=1.0)  # the resumed client took nothing from us
    await mgr.release(second)


async def test_auto_renew_cancels_body_when_quorum_is_killed(
    own_redis3: list[RedisNode], connect: Connect
) -> None:
    mgr = await connect(own_redis3)
    loop = asyncio.get_running_loop()
    cancelled_at = killed_at = valid_until = 0.0

    async def holder() -> None:
        nonlocal cancelled_at, killed_at, valid_until
        async with mgr.lock("expiry/renew", ttl=TTL, auto_renew=True) as lease:
            valid_until = lease.valid_until
            own_redis3[1].kill()
            own_redis3[2].kill()
            killed_at = loop.time()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled_at = loop.time()
                raise

    with pytest.raises(LeaseLost):
        await holder()
    assert cancelled_at, "the body was never cancelled"
    # Renewal failed from the start, so the lease ends at its first deadline; the
    # body must hear of it then (give or take one node timeout), not run on.
    assert cancelled_at - killed_at < TTL + NODE_TIMEOUT
    assert cancelled_at <= valid_until + NODE_TIMEOUT + 0.05
    with pytest.raises(QuorumUnavailable):
        await mgr.acquire("expiry/renew", ttl=1.0)


async def test_auto_renew_keeps_lease_with_one_node_killed(
    own_redis3: list[RedisNode], connect: Connect
) -> None:
    mgr, other = await connect(own_redis3), await connect(own_redis3)
    async with mgr.lock("expiry/minority", ttl=TTL, auto_renew=True) as lease:
        own_redis3[2].kill()
        await asyncio.sleep(3 * TTL)  # three TTLs: only renewals keep it
        with pytest.raises(LockHeld):
            await other.acquire("expiry/minority", ttl=1.0)
        assert (await other.inspect("expiry/minority")).held
    after = await other.acquire("expiry/minority", ttl=1.0, wait=0.5)
    assert after.token > lease.token
    await other.release(after)


async def test_waiter_process_killed_in_queue_holds_up_others_only_until_keepalive(
    own_redis3: list[RedisNode], connect: Connect
) -> None:
    holder, patient = await connect(own_redis3), await connect(own_redis3)
    loop = asyncio.get_running_loop()
    first = await holder.acquire("expiry/queue", ttl=2.0)
    async with client(own_redis3, "expiry/queue", "wait", 1.0) as proc:
        assert await said(proc, 10.0) == "waiting"

        def queued(count: int) -> bool:
            return all(
                reply_int(n.command("ZCARD", "waitq:{expiry/queue}")) == count for n in own_redis3
            )

        await wait_until(lambda: queued(1), 3.0, "the client queued on every node")
        proc.kill()  # its gateway dies: nobody takes its place out of the queue
        await proc.wait()
    waiter = asyncio.create_task(patient.acquire("expiry/queue", ttl=1.0, wait=10.0))
    await wait_until(lambda: queued(2), 3.0, "the second waiter queued behind it")
    released = loop.time()
    await holder.release(first)
    second = await waiter
    assert loop.time() - released < KEEPALIVE + 1.5  # its place lapsed, no deadlock
    assert second.token > first.token
    await patient.release(second)
