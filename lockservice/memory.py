"""The embedded in-process backend: the zero-config default for one gateway.

It keeps locks in a dict of this process, so it is only correct while a single
process serves every client; ``LockManager.connect([])`` logs that loudly.

Tokens are counted per name, as Redis does with ``fence:{name}``: a token of
one lock is never "issued" for another (the gateway's forged-token guard
refuses it with 403 ``token_not_issued``). Every name's counter starts above a
base taken from the wall clock when the backend starts (milliseconds x 1000),
so a restarted gateway still issues tokens above the ones it issued before it
stopped: storage keeps refusing old holders instead of refusing everyone.

Counters are kept for the ``max_names`` names used last; a name forgotten
beyond that answers ``issued()`` with the largest counter ever forgotten
(an upper bound, so the guard stays correct but less strict for it), and its
next token starts above that bound, so tokens still increase per name.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict

from lockservice.backend import Attempt, Readiness, drift
from lockservice.errors import LeaseLost
from lockservice.lease import LockInfo
from lockservice.waiters import Waiters

__all__ = ["MemoryBackend", "wall_clock_base"]


def wall_clock_base() -> int:
    """A token base above every token issued before now, at < 1000 grants/ms."""
    return time.time_ns() // 1_000_000 * 1000


class MemoryBackend:
    """Locks held in this process only."""

    def __init__(self, *, max_names: int = 1_000_000) -> None:
        self.waiters = Waiters()
        self._locks: dict[str, tuple[str, int, float]] = {}  # name -> lease_id, token, expiry
        self._base = wall_clock_base()
        self._issued: OrderedDict[str, int] = OrderedDict()  # name -> newest token, LRU
        self._max_names = max(1, max_names)
        self._forgotten = 0  # the largest counter dropped from _issued
        self._grants = 0

    def describe(self) -> str:
        return "in-process memory backend (one gateway process only)"

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        self._locks.clear()

    def _holder(self, name: str) -> tuple[str, int, float] | None:
        held = self._locks.get(name)
        if held is not None and held[2] <= asyncio.get_running_loop().time():
            del self._locks[name]
            return None
        return held

    def _sweep(self) -> None:
        """Forget expired locks nobody asked about again: memory stays bounded."""
        now = asyncio.get_running_loop().time()
        for name in [n for n, held in self._locks.items() if held[2] <= now]:
            del self._locks[name]

    async def try_acquire(self, name: str, lease_id: str, ttl: float, ticket: str) -> Attempt:
        now = asyncio.get_running_loop().time()
        held = self._holder(name)
        if held is not None and held[0] != lease_id:
            return Attempt(0, 0.0, held[2] - now)
        token = max(self._issued_for(name), self._base) + 1
        self._issued[name] = token
        self._issued.move_to_end(name)
        while len(self._issued) > self._max_names:
            self._forgotten = max(self._forgotten, self._issued.popitem(last=False)[1])
        self._grants += 1
        if self._grants % 4096 == 0:
            self._sweep()
        self._locks[name] = (lease_id, token, now + ttl)
        # The lease's validity is ttl - drift, as over Redis: clients on other hosts
        # count it on their own clocks (the lock itself is held for the whole ttl).
        return Attempt(token, now + ttl - drift(ttl), 0.0)

    def _issued_for(self, name: str) -> int:
        """The newest token issued for ``name`` (an upper bound if it was forgotten), or 0."""
        return self._issued.get(name, self._forgotten)

    async def settle(self) -> bool:
        return False

    def abandon(self, name: str, lease_id: str) -> None:
        held = self._locks.get(name)
        if held is not None and held[0] == lease_id:
            del self._locks[name]
            self.waiters.wake(name)

    async def extend(self, name: str, lease_id: str, ttl: float) -> tuple[float, int]:
        held = self._holder(name)
        if held is None or held[0] != lease_id:
            raise LeaseLost(name, "it expired or another lease holds it")
        expiry = asyncio.get_running_loop().time() + ttl
        self._locks[name] = (lease_id, held[1], expiry)
        return expiry - drift(ttl), held[1]

    async def release(self, name: str, lease_id: str, *, confirm: bool = True) -> bool:
        held = self._holder(name)
        if held is None or held[0] != lease_id:
            return False
        del self._locks[name]
        self.waiters.wake(name)
        return True

    async def inspect(self, name: str) -> LockInfo:
        held = self._holder(name)
        if held is None:
            return LockInfo(name, False, self._issued_for(name), 0.0)
        return LockInfo(name, True, held[1], held[2] - asyncio.get_running_loop().time())

    async def issued(self, name: str) -> int:
        return self._issued_for(name)

    async def ready(self) -> Readiness:
        return Readiness(True)
