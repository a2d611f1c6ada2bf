"""Two gateways contend while a node dies, comes back empty, rejoins; then another dies."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
from dataclasses import dataclass

import pytest

from lockservice import LeaseLost, LockHeld, LockManager, QuorumUnavailable
from lockservice.protocol import QUARANTINE_KEY, RECOPY_KEY
from tests._servers import RedisNode
from tests.faults.conftest import Connect, reply_int, wait_until

pytestmark = pytest.mark.faults

NAMES = ("gw/orders", "gw/stock")
TTL = 0.5
MAX_TTL = 1.0  # the restarted node's quarantine
MIN_GRANTS = 10  # in each phase
GRANTS_WITHIN = 20 * TTL  # after a phase's least time: a bound, generous for a loaded machine


@dataclass(frozen=True)
class Held:
    """One lease as its holder saw it, on the loop's monotonic clock."""

    name: str
    token: int
    granted: float  # when acquire returned
    valid_until: float
    released: float  # when release was called
    gateway: int

    @property
    def end(self) -> float:
        return min(self.valid_until, self.released)


async def test_tokens_increase_across_two_gateways_while_a_node_restarts_with_data_loss(
    own_redis3: list[RedisNode], connect: Connect
) -> None:
    a, _, c = own_redis3
    gateways = [await connect(own_redis3, max_ttl=MAX_TTL) for _ in range(2)]
    loop = asyncio.get_running_loop()
    held: list[Held] = []
    refused: list[BaseException] = []
    running = True

    async def worker(gateway: int, mgr: LockManager, name: str) -> None:
        while running:
            try:
                lease = await mgr.acquire(name, ttl=TTL, wait=1.0)
            except (LockHeld, QuorumUnavailable) as exc:
                refused.append(exc)  # QuorumUnavailable while a majority is being restored
                await asyncio.sleep(0.01)
                continue
            granted = loop.time()
            await asyncio.sleep(random.uniform(0, 0.005))
            released = loop.time()
            held.append(Held(name, lease.token, granted, lease.valid_until, released, gateway))
            with contextlib.suppress(LeaseLost):  # ran out first: it ends at valid_until
                await mgr.release(lease)

    workers = [
        asyncio.create_task(worker(g, gateways[g], name))
        for g, name, _ in itertools.product(range(2), NAMES, range(3))
    ]
    phases: dict[str, int] = {}  # grants so far, at the end of each phase

    async def phase(label: str, seconds: float) -> None:
        """At least ``seconds`` of contention, and MIN_GRANTS grants: a phase counts in
        grants, not time, since a loaded machine can grant few in a fixed time (once A is
        down, two gateways' waiters can split B and C and stall a name for up to a ttl)."""
        start = max(phases.values(), default=0)
        await asyncio.sleep(seconds)
        await wait_until(
            lambda: len(held) - start >= MIN_GRANTS, GRANTS_WITHIN, f"{MIN_GRANTS} grants: {label}"
        )
        phases[label] = len(held)

    await phase("all up", 0.4)
    c.kill()
    await phase("C down", 0.4)
    c.restart(lose_data=True)
    await wait_until(lambda: reply_int(c.command("PTTL", QUARANTINE_KEY)) > 0, 3.0, "C resynced")
    phases["C back, resyncing"] = len(held)
    # R21: C rejoins once its quarantine is over *and* its counters were copied again
    await wait_until(
        lambda: (
            reply_int(c.command("PTTL", QUARANTINE_KEY)) < 0
            and reply_int(c.command("EXISTS", RECOPY_KEY)) == 0
        ),
        3.0,
        "C rejoined",
    )
    await phase("C quarantined", 0.0)
    a.kill()  # from now on every grant needs the restarted node
    await phase("A down", 0.6)
    running = False
    await asyncio.gather(*workers)

    per_phase = dict(
        zip(phases, (y - x for x, y in itertools.pairwise([0, *phases.values()])), strict=True)
    )
    del per_phase["C back, resyncing"]  # may be short
    assert all(n >= MIN_GRANTS for n in per_phase.values()), per_phase
    assert {h.gateway for h in held} == {0, 1}
    for name in NAMES:
        leases = sorted((h for h in held if h.name == name), key=lambda h: h.granted)
        tokens = [h.token for h in leases]
        assert all(x < y for x, y in itertools.pairwise(tokens)), f"{name}: tokens not increasing"
        latest_end = float("-inf")
        for lease in leases:
            assert lease.granted >= latest_end, f"{name}: two leases valid at once: {lease}"
            latest_end = max(latest_end, lease.end)
