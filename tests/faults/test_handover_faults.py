"""Hand-over under faults: nodes paused past the stall window and killed mid-contention.

A paused node leaves commands in sockets that the client aborts; the server may
run them after it resumes (late undos, late releases), and hand-over messages
arrive out of order with the answers. Whatever happens, two leases are never
valid at once, tokens increase in grant order, and the lock keeps moving.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from dataclasses import dataclass

import pytest

from lockservice import LeaseLost, LockHeld, LockManager, QuorumUnavailable
from tests._servers import RedisNode
from tests.faults.conftest import Connect

pytestmark = pytest.mark.faults

NAME = "handover/faults"
TTL = 1.0


@dataclass(frozen=True)
class Held:
    token: int
    granted: float
    end: float  # min(valid_until, when the holder let go)


async def contend(
    managers: list[LockManager], fault: asyncio.Task[None], held: list[Held], workers: int = 8
) -> None:
    """``workers`` tasks per manager take the lock in turn until ``fault`` is done."""
    loop = asyncio.get_running_loop()

    async def worker(mgr: LockManager) -> None:
        while not fault.done():
            try:
                lease = await mgr.acquire(NAME, ttl=TTL, wait=2.0)
            except (LockHeld, QuorumUnavailable):
                await asyncio.sleep(0.01)
                continue
            granted = loop.time()
            await asyncio.sleep(0.002)
            held.append(Held(lease.token, granted, min(lease.valid_until, loop.time())))
            with contextlib.suppress(LeaseLost, QuorumUnavailable):
                await mgr.release(lease)

    tasks = [asyncio.create_task(worker(m)) for m in managers for _ in range(workers)]
    await fault
    await asyncio.wait_for(asyncio.gather(*tasks), 30.0)


def check(held: list[Held]) -> None:
    ordered = sorted(held, key=lambda h: h.granted)
    tokens = [h.token for h in ordered]
    assert all(a < b for a, b in itertools.pairwise(tokens)), "tokens not increasing"
    for a, b in itertools.pairwise(ordered):
        assert b.granted >= a.end, f"two leases valid at once: {a} and {b}"


@pytest.mark.parametrize("victim", [0, 2])
async def test_contention_through_a_node_paused_past_the_stall_window(
    own_redis3: list[RedisNode], connect: Connect, victim: int
) -> None:
    managers = [await connect(own_redis3) for _ in range(2)]
    phases: list[int] = []
    held: list[Held] = []

    async def fault() -> None:
        await asyncio.sleep(0.5)
        phases.append(len(held))
        own_redis3[victim].pause()
        await asyncio.sleep(1.6)  # past the stall window: its sockets are aborted
        phases.append(len(held))
        own_redis3[victim].resume()  # it runs what was stuck in them, late
        await asyncio.sleep(1.5)
        phases.append(len(held))

    await contend(managers, asyncio.create_task(fault()), held)
    check(held)
    before, paused, after = phases[0], phases[1] - phases[0], len(held) - phases[1]
    assert min(before, paused, after) >= 20, (before, paused, after)


async def test_contention_through_a_node_killed_and_restarted(
    own_redis3: list[RedisNode], connect: Connect
) -> None:
    managers = [await connect(own_redis3) for _ in range(2)]
    held: list[Held] = []
    phases: list[int] = []

    async def fault() -> None:
        await asyncio.sleep(0.5)
        own_redis3[1].kill()
        await asyncio.sleep(0.5)
        phases.append(len(held))
        own_redis3[1].restart(lose_data=True)
        await asyncio.sleep(2.0)  # resync, quarantine (max_ttl of the fixture)
        phases.append(len(held))
        await asyncio.sleep(1.0)

    await contend(managers, asyncio.create_task(fault()), held)
    check(held)
    assert len(held) - phases[1] >= 20, "the lock stopped moving after the restart"
