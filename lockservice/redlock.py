"""Redlock over N independent Redis nodes, with quorum-monotonic fencing tokens.

The rules are in ``protocol.py``; this module runs them: round 1 (R1, R3,
R5), round 2 (R4), the undo of a try that did not make a lease (R7, R13-R15),
release and extend (R6). It owns the parts below it and is the only reader
of their inbox: node reconnects, release-channel messages and replay times
come here as events, and nothing below calls back into it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import secrets
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TypeVar

from lockservice import scripts
from lockservice.backend import Attempt
from lockservice.cleanup import Cleanups
from lockservice.errors import LeaseLost, QuorumUnavailable
from lockservice.events import LockEvents
from lockservice.fanout import Round, fan_out
from lockservice.handover import Handovers, Pending
from lockservice.health import Health
from lockservice.lease import LockInfo
from lockservice.node import Connected, Inbox, Message, Node, Replay, parse_node_url
from lockservice.protocol import (
    KEEPALIVE_MS,
    RELEASE_CHANNEL,
    SYNCED_KEY,
    NodeState,
    drift,
    fence_key,
    lock_key,
    lock_keys,
)
from lockservice.replies import (
    AcquireReply,
    Failure,
    Granted,
    Held,
    Inspected,
    Unsynced,
    parse_acquire,
    parse_count,
    parse_inspect,
    parse_pong,
)
from lockservice.resp import Reply
from lockservice.resync import Resyncer
from lockservice.waiters import Waiters

__all__ = ["RELEASE_CHANNEL", "Redlock"]

log = logging.getLogger(__name__)

# A hand-over from some nodes but not a quorum within this long: try the others (a
# node the previous holder did not hold has nothing to hand over, though it is free).
_HANDOVER_GRACE = 0.01  # at least; a tenth of the node timeout when that is longer
_AGAIN = 0.001  # "try again at once" (the grants ran out on the way)

T = TypeVar("T")
Decider = Callable[[Sequence[T | None]], bool]


class Redlock:
    """The Redis backend of ``LockManager``."""

    def __init__(
        self, urls: Sequence[str], *, node_timeout: float, max_ttl: float, events: LockEvents
    ) -> None:
        if len(urls) not in (1, 3, 5):
            raise ValueError(f"redis nodes: {len(urls)} given, use 1, 3 or 5 independent nodes")
        addresses = [parse_node_url(url) for url in urls]
        labels = tuple(a.label for a in addresses)
        if len(set(labels)) != len(labels):
            raise ValueError(f"redis nodes: the same node is listed twice in {list(labels)}")
        self.waiters = Waiters()
        # Releases that name one of this process's waiters come on its own channel.
        self._process = secrets.token_hex(8)
        self._events = events
        self._timeout = node_timeout
        self._labels = labels
        self._inbox: Inbox = asyncio.Queue()
        channel = (f"{RELEASE_CHANNEL}:{self._process}",)
        self.nodes = [
            Node(a, i, timeout=node_timeout, channels=channel, inbox=self._inbox)
            for i, a in enumerate(addresses)
        ]
        self.quorum = len(self.nodes) // 2 + 1
        self.health = Health(labels, events)
        self._cleanups = Cleanups(self.nodes, self._process, horizon=max_ttl)
        grace = max(_HANDOVER_GRACE, node_timeout / 10)
        self._handovers = Handovers(self.quorum, grace, self.waiters, self._cleanups)
        self.resyncer = Resyncer(
            self.nodes, self.quorum, max_ttl=max_ttl, timeout=node_timeout, health=self.health
        )
        self._reader: asyncio.Task[None] | None = None

    def describe(self) -> str:
        return f"Redlock over {len(self.nodes)} redis node(s), quorum {self.quorum}: " + ", ".join(
            self._labels
        )

    async def start(self) -> None:
        up = await asyncio.gather(*(node.start() for node in self.nodes))
        for node, connected in zip(self.nodes, up, strict=True):
            if connected:
                await self.resyncer.check(node, restarted=False)
            else:
                self.health.set(node.index, NodeState.DOWN)
        self._reader = asyncio.create_task(self._read_inbox(), name="fencegate-redlock-inbox")
        await self.resyncer.settle(max(self._timeout * 10, 2.0))

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        await self.resyncer.close()
        await asyncio.gather(*(node.close() for node in self.nodes))

    async def _read_inbox(self) -> None:
        """The events of the nodes below, in the order they happened."""
        while True:
            event = await self._inbox.get()
            if isinstance(event, Message):
                self._handovers.message(event.index, event.payload)
            elif isinstance(event, Connected):
                self._cleanups.replay(event.index)
                self.resyncer.check_soon(self.nodes[event.index], restarted=event.restarted)
            elif isinstance(event, Replay):
                self._cleanups.replay(event.index)

    async def _round(
        self,
        futures: Sequence[asyncio.Future[Reply]],
        parse: Callable[[Reply], T],
        decided: Decider[T],
        on_reply: Callable[[int, T], None] | None = None,
    ) -> Round[T]:
        return await fan_out(
            futures,
            parse,
            decided,
            labels=self._labels,
            node_timeout=self._timeout,
            events=self._events,
            on_reply=on_reply,
        )

    def _decider(self, good: Callable[[T], bool]) -> Decider[T]:
        """Decided once Q replies are good, or so many are not that Q cannot be reached."""
        n, q = len(self.nodes), self.quorum

        def decided(replies: Sequence[T | None]) -> bool:
            ok = sum(r is not None and good(r) for r in replies)
            bad = sum(r is not None and not good(r) for r in replies)
            return ok >= q or bad > n - q or ok + bad == n

        return decided

    def _acquire_decider(self, before: frozenset[int]) -> Decider[AcquireReply]:
        """Granted, held or unavailable: decided only once the class is certain.

        A held lock must not be reported as a lost quorum because the node that
        would have said "held" had not answered yet. ``before``: nodes whose
        grant this waiter already holds (handed over by a release).
        """
        q = self.quorum

        def decided(replies: Sequence[AcquireReply | None]) -> bool:
            granted = held = pending = 0
            for i, reply in enumerate(replies):
                if i in before or isinstance(reply, Granted):
                    granted += 1
                elif reply is None:
                    pending += 1
                elif isinstance(reply, Held):
                    held += 1
            if granted >= q:
                return True
            if granted + pending >= q:
                return False  # still grantable
            return granted + held >= q or granted + held + pending < q or pending == 0

        return decided

    def _unavailable(
        self, name: str, rnd: Round[T], good: Callable[[T], bool]
    ) -> QuorumUnavailable:
        """The error of a round without quorum: each node's own reason (of this round)."""
        return QuorumUnavailable(name, rnd.errors(good), self.quorum, len(self.nodes))

    # acquire
    async def try_acquire(self, name: str, lease_id: str, ttl: float, ticket: str) -> Attempt:
        attempt = await self._attempt(name, lease_id, ttl, ticket)
        if isinstance(attempt, QuorumUnavailable) and self.resyncer.pending():
            # Nodes that restarted or are new may be in the middle of a resync: wait once.
            await self.resyncer.settle(max(self._timeout * 10, 2.0))
            self._cleanups.forget(lease_id)  # a late replay of the first try's undo would
            attempt = await self._attempt(name, lease_id, ttl, ticket)  # take this one's grant
        if isinstance(attempt, QuorumUnavailable):
            raise attempt
        return attempt

    async def _attempt(
        self, name: str, lease_id: str, ttl: float, ticket: str
    ) -> Attempt | QuorumUnavailable:
        """One try (R3): a lease, a hint to wait, or why there was no quorum."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        pending = self._handovers.get(lease_id) if ticket else None
        if pending is not None:
            ready = pending.lease(self.quorum, start)
            if ready is not None:  # releases handed it over: no round trip (R9)
                return await self._grant(name, lease_id, ticket, pending, ready)
        elif ticket:
            pending = self._handovers.open(lease_id, Pending(name, len(self.nodes), ttl, start))
        else:  # a try without waiting: this try's grants alone
            pending = Pending(name, len(self.nodes), ttl, start)
        pending.nudge_due = False  # this try asks every node anyway
        args = (lease_id, max(1, int(ttl * 1000)), ticket, KEEPALIVE_MS)
        futures = [
            node.call(scripts.ACQUIRE, lock_keys(name), (*args, node.run_id or "", self._process))
            for node in self.nodes
        ]
        before = pending.valid(start) if pending.grants else frozenset()
        decided = self._acquire_decider(before)
        rnd = await self._round(futures, parse_acquire, decided, self.health.note)
        busy = []
        for i, reply in enumerate(rnd.replies):
            if isinstance(reply, Granted):
                pending.granted(i, reply.token, start)
            elif isinstance(reply, Held):
                busy.append(reply.pttl)
                pending.refused(i, start, reply.counter)
            elif isinstance(reply, Unsynced):
                self.resyncer.schedule(self.nodes[i])
        ready = pending.lease(self.quorum, loop.time())
        if ready is not None:
            for i, fut in enumerate(futures):  # R16 for nodes that have not answered
                if rnd.replies[i] is None:
                    settle = functools.partial(self._cleanups.settle_if_granted, i, name, lease_id)
                    fut.add_done_callback(functools.partial(settle, ready[0]))
            return await self._grant(name, lease_id, ticket, pending, ready)
        granted = len(pending.grants)
        if ticket:  # a node still to answer may yet grant: that grant is the waiter's
            for i, fut in enumerate(futures):
                if rnd.replies[i] is None:
                    late = functools.partial(self._handovers.late_reply, i, name, lease_id, start)
                    fut.add_done_callback(late)
        usable = rnd.count(lambda r: isinstance(r, Granted | Held))
        if granted or (not ticket and None in rnd.replies):
            # R15: a queued waiter keeps grants it is owed while others hold the rest;
            # one that too few nodes answer gives them up, or it would block the lock.
            self._undo(name, lease_id, ticket, pending, give_up=usable < self.quorum)
        if granted >= self.quorum:
            return Attempt(0, 0.0, _AGAIN)  # took longer than the ttl: try again
        if busy and granted + len(busy) >= self.quorum:
            # 0 ms: the lock is free but earlier waiters are queued; sleep until woken.
            return Attempt(0, 0.0, max(busy) / 1000)
        return self._unavailable(name, rnd, _is_granted)

    async def _grant(
        self,
        name: str,
        lease_id: str,
        ticket: str,
        pending: Pending,
        ready: tuple[int, float, bool],
    ) -> Attempt | QuorumUnavailable:
        """A quorum of valid grants: round 2 if their tokens differ (R4), then the lease."""
        token, valid_until, agreed = ready
        if not agreed:
            failed = await self._raise_fence(name, lease_id, token)
            if failed is not None:
                self._undo(name, lease_id, ticket, pending, give_up=True)
                return failed
            pending.retoken(token)  # so that an undo below names what the nodes hold
        if valid_until <= asyncio.get_running_loop().time():
            self._undo(name, lease_id, ticket, pending)
            return Attempt(0, 0.0, _AGAIN)  # took longer than the ttl: try again
        self._handovers.close(lease_id, token)
        return Attempt(token, valid_until, 0.0)

    async def _raise_fence(self, name: str, lease_id: str, token: int) -> QuorumUnavailable | None:
        """Round 2 (R4); None when Q nodes acked, else why not."""
        keys = (fence_key(name), lock_key(name))
        futures = [node.call(scripts.RAISE_FENCE, keys, (token, lease_id)) for node in self.nodes]

        def good(reply: int | Failure) -> bool:
            return isinstance(reply, int) and reply >= token

        decided = self._decider(good)
        rnd = await self._round(futures, parse_count, decided)
        return None if rnd.count(good) >= self.quorum else self._unavailable(name, rnd, good)

    def abandon(self, name: str, lease_id: str) -> None:
        self._handovers.close(lease_id)
        self._cleanups.release(name, lease_id, later=False)  # R7: out at once

    def _undo(
        self, name: str, lease_id: str, ticket: str, pending: Pending, *, give_up: bool = False
    ) -> None:
        """Give back the grants of a failed try (R7); a queued waiter keeps those it is
        owed unless ``give_up`` (R15), names each by its token (R13), and counts
        nothing from a node until its undo answered (R14)."""
        named = pending.park()
        ttl_ms = max(1, int(pending.ttl * 1000))
        if not ticket:
            self._cleanups.undo_any(name, lease_id, ttl_ms)
            return
        sent = "" if give_up else ticket
        futures = self._cleanups.undo_named(name, lease_id, sent, ttl_ms, named)
        for i, fut in futures.items():
            fut.add_done_callback(
                functools.partial(self._handovers.undo_reply, i, lease_id, named[i])
            )

    # extend, release, reading
    async def extend(self, name: str, lease_id: str, ttl: float) -> tuple[float, int]:
        start = asyncio.get_running_loop().time()
        futures = [
            node.call(scripts.EXTEND, (lock_key(name),), (lease_id, int(ttl * 1000)))
            for node in self.nodes
        ]
        decided = self._decider(_positive)
        rnd = await self._round(futures, parse_count, decided)
        tokens = [r for r in rnd.replies if isinstance(r, int) and r > 0]
        if len(tokens) >= self.quorum:
            # the token a majority recorded for this lease (a late grant may differ)
            return start + ttl - drift(ttl), Counter(tokens).most_common(1)[0][0]
        if rnd.count(_zero) > len(self.nodes) - self.quorum:
            raise LeaseLost(name, "it expired or another lease holds it")
        raise self._unavailable(name, rnd, _positive)

    async def release(self, name: str, lease_id: str, *, confirm: bool = True) -> bool:
        futures = self._cleanups.release(name, lease_id, later=not confirm)
        if not confirm:
            return True
        decided = self._decider(_one)
        rnd = await self._round(futures, parse_count, decided)
        if rnd.count(_zero) > len(self.nodes) - self.quorum:
            return False
        if rnd.count(_answered) < self.quorum:
            raise self._unavailable(name, rnd, _one)
        return True

    async def _inspect(self, name: str, *, early: bool) -> list[Inspected]:
        keys = (lock_key(name), fence_key(name), SYNCED_KEY)
        futures = [node.call(scripts.INSPECT, keys, (node.run_id or "",)) for node in self.nodes]
        n, q = len(self.nodes), self.quorum

        def decided(replies: Sequence[Inspected | Unsynced | Failure | None]) -> bool:
            answered = sum(r is not None for r in replies)
            good = sum(isinstance(r, Inspected) for r in replies)
            return answered == n or (early and good >= q)

        rnd = await self._round(futures, parse_inspect, decided)
        good = [r for r in rnd.replies if isinstance(r, Inspected)]
        if len(good) < self.quorum:
            raise self._unavailable(name, rnd, lambda r: isinstance(r, Inspected))
        return good

    async def inspect(self, name: str) -> LockInfo:
        replies = await self._inspect(name, early=False)
        counter = max(r.counter for r in replies)
        holders = [r for r in replies if r.token > 0]
        if len(holders) >= self.quorum:
            token = Counter(r.token for r in holders).most_common(1)[0][0]
            ttl = sorted(r.pttl for r in holders)[len(holders) - self.quorum] / 1000
            return LockInfo(name, True, token, ttl)
        return LockInfo(name, False, counter, 0.0)

    async def issued(self, name: str) -> int:
        return max(r.counter for r in await self._inspect(name, early=True))

    async def ready(self) -> bool:
        futures = [node.command("PING") for node in self.nodes]
        decided = self._decider(_pong)
        rnd = await self._round(futures, parse_pong, decided)
        return rnd.count(_pong) >= self.quorum


def _is_granted(reply: AcquireReply) -> bool:
    return isinstance(reply, Granted)


def _positive(reply: int | Failure) -> bool:
    return isinstance(reply, int) and reply > 0


def _one(reply: int | Failure) -> bool:
    return reply == 1


def _zero(reply: int | Failure) -> bool:
    return reply == 0


def _answered(reply: int | Failure) -> bool:
    return isinstance(reply, int)


def _pong(reply: bool | Failure) -> bool:
    return reply is True
