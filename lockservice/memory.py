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

Kinds (rules R22-R25 of ``protocol.py``): a name is held by one exclusive
lease, or by shared leases, or by up to ``permits`` semaphore leases. FIFO
among the waiters of one process comes from the manager's per-name turns
(one process is all this backend serves), so a queued exclusive waiter is
tried before shared requests that came after it.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from lockservice.backend import Attempt, Readiness, drift
from lockservice.errors import LeaseLost, PermitsMismatch
from lockservice.lease import EXCLUSIVE, SEMAPHORE, LockInfo
from lockservice.waiters import Waiters

__all__ = ["MemoryBackend", "wall_clock_base"]


def wall_clock_base() -> int:
    """A token base above every token issued before now, at < 1000 grants/ms."""
    return time.time_ns() // 1_000_000 * 1000


@dataclass(slots=True)
class _Holder:
    token: int
    expiry: float  # loop time: the lock is held for the whole ttl
    valid_until: float  # what the lease was told: ttl - drift
    tag: str = ""  # idempotency digest, once committed


@dataclass(slots=True)
class _Held:
    mode: str
    permits: int  # semaphores only, else 0
    holders: dict[str, _Holder] = field(default_factory=dict)  # by lease id


class MemoryBackend:
    """Locks held in this process only."""

    def __init__(self, *, max_names: int = 1_000_000) -> None:
        self.waiters = Waiters()
        self._locks: dict[str, _Held] = {}
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

    def _live(self, name: str, now: float) -> _Held | None:
        """The holders of ``name`` whose lease has not expired (expired ones are dropped)."""
        held = self._locks.get(name)
        if held is None:
            return None
        for lease_id in [i for i, h in held.holders.items() if h.expiry <= now]:
            del held.holders[lease_id]
        if not held.holders:
            del self._locks[name]
            return None
        return held

    def _sweep(self) -> None:
        """Forget expired locks nobody asked about again: memory stays bounded."""
        now = asyncio.get_running_loop().time()
        for name in list(self._locks):
            self._live(name, now)

    async def try_acquire(
        self,
        name: str,
        lease_id: str,
        ttl: float,
        ticket: str,
        *,
        mode: str = EXCLUSIVE,
        permits: int = 0,
        tag: str = "",
    ) -> Attempt:
        now = asyncio.get_running_loop().time()
        held = self._live(name, now)
        others: list[_Holder] = []
        if held is not None:
            if tag and (found := _tagged(held, tag)) is not None:
                return found
            others = [h for i, h in held.holders.items() if i != lease_id]
            if others:
                if mode == SEMAPHORE == held.mode and held.permits != permits:
                    raise PermitsMismatch(name, held.permits, permits)
                if _conflicts(held, mode, permits, len(others)):
                    return Attempt(0, 0.0, min(h.expiry for h in others) - now)
        if held is None or not others:
            held = self._locks[name] = _Held(mode, permits if mode == SEMAPHORE else 0)
        token = self._token(name)
        valid_until = now + ttl - drift(ttl)
        held.holders[lease_id] = _Holder(token, now + ttl, valid_until)
        self._grants += 1
        if self._grants % 4096 == 0:
            self._sweep()
        # The lease's validity is ttl - drift, as over Redis: clients on other hosts
        # count it on their own clocks (the lock itself is held for the whole ttl).
        return Attempt(token, valid_until, 0.0)

    def _token(self, name: str) -> int:
        """A new token above every one issued for ``name``, for every kind (R23)."""
        token = max(self._issued_for(name), self._base) + 1
        self._issued[name] = token
        self._issued.move_to_end(name)
        while len(self._issued) > self._max_names:
            self._forgotten = max(self._forgotten, self._issued.popitem(last=False)[1])
        return token

    def _issued_for(self, name: str) -> int:
        """The newest token issued for ``name`` (an upper bound if it was forgotten), or 0."""
        return self._issued.get(name, self._forgotten)

    async def find(self, name: str, tag: str) -> Attempt | None:
        held = self._live(name, asyncio.get_running_loop().time())
        return None if held is None else _tagged(held, tag)

    async def commit(self, name: str, lease_id: str, token: int, tag: str) -> Attempt | None:
        held = self._live(name, asyncio.get_running_loop().time())
        mine = None if held is None else held.holders.get(lease_id)
        if held is None or mine is None:
            return None
        found = _tagged(held, tag)
        if found is not None and found.lease_id != lease_id:
            return found
        mine.tag = tag
        return None

    async def settle(self) -> bool:
        return False

    def abandon(self, name: str, lease_id: str) -> None:
        held = self._locks.get(name)
        if held is not None and held.holders.pop(lease_id, None) is not None:
            if not held.holders:
                del self._locks[name]
            self.waiters.wake(name)

    async def extend(
        self, name: str, lease_id: str, ttl: float, *, mode: str = "exclusive"
    ) -> tuple[float, int]:
        now = asyncio.get_running_loop().time()
        held = self._live(name, now)
        holder = None if held is None else held.holders.get(lease_id)
        if holder is None:
            raise LeaseLost(name, "it expired or another lease holds it")
        holder.expiry = now + ttl
        holder.valid_until = now + ttl - drift(ttl)
        return holder.valid_until, holder.token

    async def release(self, name: str, lease_id: str, *, confirm: bool = True) -> bool:
        held = self._live(name, asyncio.get_running_loop().time())
        if held is None or lease_id not in held.holders:
            return False
        self.abandon(name, lease_id)
        return True

    async def inspect(self, name: str) -> LockInfo:
        now = asyncio.get_running_loop().time()
        held = self._live(name, now)
        if held is None:
            return LockInfo(name, False, self._issued_for(name), 0.0)
        holders = held.holders.values()
        token = max(h.token for h in holders)
        ttl = max(h.expiry for h in holders) - now
        return LockInfo(name, True, token, ttl, held.mode, len(holders), held.permits)

    async def issued(self, name: str) -> int:
        return self._issued_for(name)

    async def ready(self) -> Readiness:
        return Readiness(True)


def _conflicts(held: _Held, mode: str, permits: int, others: int) -> bool:
    """Whether a ``mode`` request must wait for ``others`` holders of ``held`` (R22, R24)."""
    if mode == EXCLUSIVE or held.mode != mode:
        return True
    return mode == SEMAPHORE and others >= permits


def _tagged(held: _Held, tag: str) -> Attempt | None:
    """The lease committed with ``tag`` while its validity lasts (R26): in the lock's
    last drift(ttl) a repeat waits it out and acquires afresh."""
    now = asyncio.get_running_loop().time()
    for lease_id, holder in held.holders.items():
        if holder.tag == tag and holder.valid_until > now:
            return Attempt(holder.token, holder.valid_until, 0.0, lease_id)
    return None
