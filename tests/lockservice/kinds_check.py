"""A mixed workload of exclusive, shared and semaphore leases on one name, and the
checks of their invariants at every grant (protocol.py: I1, I2, I5).

Every manager of a test runs in one event loop, so every lease's ``valid_until``
is on one clock: at a grant, any other lease still inside its validity and not
yet given up by its holder is *valid together* with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from collections.abc import Sequence

from lockservice import Lease, LeaseLost, LockHeld, LockManager, QuorumUnavailable

__all__ = ["KindsCheck", "run_workload"]

KINDS = ("exclusive", "shared", "shared", "semaphore")


class KindsCheck:
    """The leases held now, and what every grant broke, if anything."""

    def __init__(self, permits: int) -> None:
        self.permits = permits
        self.active: dict[str, Lease] = {}
        self.completed = 0  # the largest token of a grant completed so far
        self.violations: list[str] = []
        self.grants: Counter[str] = Counter()
        self.most_together: Counter[str] = Counter()

    def begin(self) -> int:
        """Call before an acquire: its token must exceed what this returns (I2)."""
        return self.completed

    def granted(self, lease: Lease, floor: int) -> None:
        now = asyncio.get_running_loop().time()
        live = [other for other in self.active.values() if other.valid_until > now]
        if live and (lease.mode == "exclusive" or any(o.mode == "exclusive" for o in live)):
            self.violations.append(f"I1: {lease.mode} {lease.token} granted while {live} valid")
        together = 1 + sum(o.mode == lease.mode for o in live)
        if lease.mode == "semaphore" and together > self.permits:
            self.violations.append(f"I5: {together} semaphore leases valid at once")
        if lease.token <= floor:
            self.violations.append(f"I2: {lease.mode} token {lease.token} <= {floor}")
        self.completed = max(self.completed, lease.token)
        self.active[lease.lease_id] = lease
        self.grants[lease.mode] += 1
        self.most_together[lease.mode] = max(self.most_together[lease.mode], together)

    def ending(self, lease: Lease) -> None:
        """Call before a release: the holder no longer counts on the lease."""
        self.active.pop(lease.lease_id, None)


async def run_workload(
    managers: Sequence[LockManager],
    name: str,
    *,
    tasks: int = 12,
    rounds: int = 15,
    permits: int = 2,
    ttl: float = 2.0,
    wait: float = 5.0,
    seed: int = 1,
) -> KindsCheck:
    """``tasks`` tasks over ``managers`` take ``rounds`` leases each, of random kinds."""
    check = KindsCheck(permits)

    async def worker(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        mgr = managers[i % len(managers)]
        for _ in range(rounds):
            kind = rng.choice(KINDS)
            floor = check.begin()
            try:
                if kind == "semaphore":
                    lease = await mgr.acquire_semaphore(name, permits, ttl=ttl, wait=wait)
                else:
                    lease = await mgr.acquire(name, ttl=ttl, wait=wait, mode=kind)
            except (LockHeld, QuorumUnavailable):
                await asyncio.sleep(0.01)
                continue
            check.granted(lease, floor)
            await asyncio.sleep(rng.uniform(0, 0.01))
            check.ending(lease)
            with contextlib.suppress(LeaseLost, QuorumUnavailable):
                await mgr.release(lease)

    await asyncio.gather(*(worker(i) for i in range(tasks)))
    return check
