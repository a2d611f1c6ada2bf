"""Redlock over N independent Redis nodes, with quorum-monotonic fencing tokens.

The rules are in ``protocol.py``. This module wires the parts of the Redis
backend together and runs release, extend and the reads (R6); the tries are
``acquire.Acquirer``'s. It owns the parts below it and is the only reader of
their inbox: node reconnects, release-channel messages and replay times come
here as events, and nothing below calls back into it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections import Counter
from collections.abc import Sequence

from lockservice import scripts
from lockservice.acquire import Acquirer, found_lease
from lockservice.backend import Attempt, Readiness
from lockservice.cleanup import Cleanups
from lockservice.errors import LeaseLost, PermitsMismatch, QuorumUnavailable
from lockservice.events import LockEvents
from lockservice.fanout import Decider, Rounds
from lockservice.handover import Handovers
from lockservice.health import Health
from lockservice.lease import LockInfo
from lockservice.node import Connected, Inbox, Message, Node, Replay, parse_node_url
from lockservice.protocol import (
    QUARANTINE_KEY,
    RELEASE_CHANNEL,
    SYNCED_KEY,
    NodeState,
    drift,
    extend_keys,
    grants_needed,
    inspect_keys,
    lock_keys,
)
from lockservice.replies import (
    Failure,
    Inspected,
    Quarantined,
    StateReply,
    Tagged,
    Unsynced,
    parse_count,
    parse_extend,
    parse_find,
    parse_inspect,
    parse_state,
    parse_tag,
)
from lockservice.resp import Reply
from lockservice.resync import Resyncer
from lockservice.waiters import Waiters

__all__ = ["RELEASE_CHANNEL", "Redlock"]

log = logging.getLogger(__name__)

# A hand-over from some nodes but not a quorum within this long: try the others (a
# node the previous holder did not hold has nothing to hand over, though it is free).
_HANDOVER_GRACE = 0.01  # at least; a tenth of the node timeout when that is longer


class Redlock:
    """The Redis backend of ``LockManager``."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        node_timeout: float,
        max_ttl: float,
        events: LockEvents,
        waiters: Waiters | None = None,
        batch_writes: bool = False,
    ) -> None:
        if len(urls) not in (1, 3, 5):
            raise ValueError(f"redis nodes: {len(urls)} given, use 1, 3 or 5 independent nodes")
        addresses = [parse_node_url(url) for url in urls]
        labels = tuple(a.label for a in addresses)
        if len(set(labels)) != len(labels):
            raise ValueError(f"redis nodes: the same node is listed twice in {list(labels)}")
        self.waiters = Waiters() if waiters is None else waiters  # shared by groups
        # Releases that name one of this process's waiters come on its own channel.
        self._process = secrets.token_hex(8)
        self._timeout = node_timeout
        self._labels = labels
        self._inbox: Inbox = asyncio.Queue()
        channel = (f"{RELEASE_CHANNEL}:{self._process}",)
        self.nodes = [
            Node(
                a,
                i,
                timeout=node_timeout,
                channels=channel,
                inbox=self._inbox,
                batch_writes=batch_writes,
            )
            for i, a in enumerate(addresses)
        ]
        self._rounds = Rounds(labels, node_timeout=node_timeout, events=events)
        self.quorum = self._rounds.quorum
        self._released: Decider[int | Failure] = self._rounds.decider(_one)  # every release
        self.health = Health(labels, events)
        self._cleanups = Cleanups(self.nodes, self._process, horizon=max_ttl)
        grace = max(_HANDOVER_GRACE, node_timeout / 10)
        self._handovers = Handovers(grace, self.waiters, self._cleanups)
        self.resyncer = Resyncer(
            self.nodes, self.quorum, max_ttl=max_ttl, timeout=node_timeout, health=self.health
        )
        self._acquirer = Acquirer(
            self.nodes,
            self._rounds,
            process=self._process,
            handovers=self._handovers,
            cleanups=self._cleanups,
            resyncer=self.resyncer,
            health=self.health,
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
        """The events of the nodes below, in the order they happened.

        One event that fails to be handled (a malformed message on the channel)
        is logged and skipped: the reader must outlive it, or replays, resyncs
        and hand-overs of this process would stop for good.
        """
        while True:
            event = await self._inbox.get()
            try:
                if isinstance(event, Message):
                    self._handovers.message(event.index, event.payload)
                elif isinstance(event, Connected):
                    self._cleanups.replay(event.index)
                    self.resyncer.check_soon(self.nodes[event.index], restarted=event.restarted)
                elif isinstance(event, Replay):
                    self._cleanups.replay(event.index)
            except Exception:
                log.exception("event %r from redis node %s could not be handled", event,
                              self._labels[event.index])  # fmt: skip

    async def try_acquire(
        self,
        name: str,
        lease_id: str,
        ttl: float,
        ticket: str,
        *,
        mode: str = "exclusive",
        permits: int = 0,
        tag: str = "",
    ) -> Attempt:
        attempt = await self._acquirer.attempt(
            name, lease_id, ttl, ticket, mode=mode, permits=permits, tag=tag
        )
        if isinstance(attempt, QuorumUnavailable | PermitsMismatch):
            raise attempt
        return attempt

    async def find(self, name: str, tag: str) -> Attempt | None:
        """R26: the lease a quorum says is held with ``tag``; None when a quorum of
        synced nodes answered and none is."""
        start = asyncio.get_running_loop().time()
        futures = [
            node.call(scripts.FIND, lock_keys(name), (tag, node.run_id or ""))
            for node in self.nodes
        ]
        rnd = await self._rounds.run(futures, parse_find, self._rounds.decider(_is_tagged))
        tagged = [r for r in rnd.replies if isinstance(r, Tagged)]
        if len(tagged) < self.quorum:
            raise self._rounds.unavailable(name, rnd, _is_tagged)
        now = asyncio.get_running_loop().time()
        return found_lease([t for t in tagged if t.token], self.quorum, start, now)

    async def commit(self, name: str, lease_id: str, token: int, tag: str) -> Attempt | None:
        """R26: record ``tag`` for the decided lease; the other lease a quorum says
        committed the tag first (the caller gives its own up), else None once a quorum
        acked. Raises ``QuorumUnavailable`` when fewer did: no quorum would name the
        lease, and a repeat would take a second one (a free permit, or joining shared
        holders); the caller gives it up."""
        start = asyncio.get_running_loop().time()
        futures = [
            node.call(scripts.TAG, lock_keys(name), (lease_id, tag, token, node.run_id or ""))
            for node in self.nodes
        ]
        rnd = await self._rounds.run(futures, parse_tag, self._rounds.decider(_committed))
        if rnd.count(_committed) >= self.quorum:
            return None
        other = [r for r in rnd.replies if isinstance(r, Tagged)]
        found = found_lease(other, self.quorum, start, asyncio.get_running_loop().time())
        if found is None:
            error = self._rounds.unavailable(name, rnd, _committed)
            log.info("lease %s of %r given up: its idempotency tag reached %d of %d nodes "
                     "(R26): %s", lease_id[:8], name, rnd.count(_committed), len(self.nodes),
                     "; ".join(f"{k}: {v}" for k, v in error.node_errors.items()))  # fmt: skip
            raise error
        return found

    def abandon(self, name: str, lease_id: str) -> None:
        self._handovers.close(lease_id)
        self._cleanups.release(name, lease_id, later=False)  # R7: out at once

    async def settle(self) -> bool:
        """Wait (bounded) for the resyncs under way; False when there were none."""
        if not self.resyncer.pending():
            return False
        await self.resyncer.settle(max(self._timeout * 10, 2.0))
        return True

    # extend, release, reading
    async def extend(
        self, name: str, lease_id: str, ttl: float, *, mode: str = "exclusive"
    ) -> tuple[float, int]:
        """Extend on Q nodes, or on every node for a semaphore lease (R32): ``mode``
        says so, and so does any node that holds the lease as a semaphore permit (a
        handle, e.g. the gateway's renew, is labelled exclusive whatever its kind)."""
        start = asyncio.get_running_loop().time()
        futures = [
            node.call(scripts.EXTEND, extend_keys(name), (lease_id, int(ttl * 1000)))
            for node in self.nodes
        ]
        n, q = len(self.nodes), self.quorum
        semaphore = [mode == "semaphore"]

        def parse(reply: Reply) -> int | Failure:
            parsed = parse_extend(reply)
            if isinstance(parsed, Failure):
                return parsed
            token, permit = parsed
            semaphore[0] = semaphore[0] or permit
            return token

        def needed() -> int:
            return grants_needed("semaphore" if semaphore[0] else mode, n)

        def decided(replies: Sequence[int | Failure | None]) -> bool:
            need = needed()
            tokens = [r for r in replies if isinstance(r, int) and r > 0]
            if len(tokens) >= need and _agreed(tokens, q):
                return True
            return sum(r == 0 for r in replies) > n - need or None not in replies

        agreed = [0]  # once known: R16 for every node that answers another token

        def settle(i: int, reply: int | Failure) -> None:
            if agreed[0] and isinstance(reply, int) and 0 < reply != agreed[0]:
                self._cleanups.settle_late(i, name, lease_id, agreed[0], reply)

        rnd = await self._rounds.run(futures, parse, decided, settle)
        need = needed()
        tokens = [r for r in rnd.replies if isinstance(r, int) and r > 0]
        if len(tokens) >= need:
            # R26: the token Q nodes hold is the decided one: it is on a quorum (all
            # grants agreed, or round 2 wrote it: R4) and only the other N - Q < Q
            # nodes may hold another (a lower round-1 grant round 2 missed, or a
            # grant after the decision, higher until R16 settles it). Neither the
            # largest nor a most-common vote of fewer nodes is (S4).
            token = agreed[0] = _agreed(tokens, q)
            if token:
                for i, reply in enumerate(rnd.replies):  # later answers: settle
                    if reply is not None:
                        settle(i, reply)
                return start + ttl - drift(ttl), token
            # Extended, but the nodes that answered do not show the token (one that
            # holds it did not answer): the caller keeps the lease's old validity,
            # which is safe (the nodes hold it longer), and retries.
            errors = rnd.errors(_positive)
            errors.update({self._labels[i]: f"holds token {r}" for i, r in enumerate(rnd.replies)
                           if isinstance(r, int) and r > 0})  # fmt: skip
            errors["token"] = f"fewer than {q} of the nodes that answered agree on it"
            raise QuorumUnavailable(name, errors, q, n)
        if rnd.count(_zero) > len(self.nodes) - need:
            raise LeaseLost(name, "it expired or another lease holds it")
        raise self._rounds.unavailable(name, rnd, _positive, need)

    async def release(self, name: str, lease_id: str, *, confirm: bool = True) -> bool:
        if not confirm:
            # A lease that was queued for is contended: its release likely hands the
            # lock to a waiter, whose wait it ends; it goes out at once instead of
            # riding with this loop turn's next command (the holder's next acquire).
            contended = self._handovers.contended(lease_id)
            self._cleanups.release(name, lease_id, later=not contended, alone=contended)
            return True
        futures, remember = self._cleanups.release_confirmed(name, lease_id)
        rnd = await self._rounds.run(futures, parse_count, self._released, remember)
        if rnd.count(_zero) > len(self.nodes) - self.quorum:
            return False
        if rnd.count(_answered) < self.quorum:
            raise self._rounds.unavailable(name, rnd, _one)
        return True

    async def _inspect(self, name: str, *, early: bool) -> list[Inspected]:
        keys = inspect_keys(name)
        futures = [node.call(scripts.INSPECT, keys, (node.run_id or "",)) for node in self.nodes]
        n, q = len(self.nodes), self.quorum

        def decided(replies: Sequence[Inspected | Unsynced | Failure | None]) -> bool:
            answered = sum(r is not None for r in replies)
            good = sum(isinstance(r, Inspected) for r in replies)
            return answered == n or (early and good >= q)

        rnd = await self._rounds.run(futures, parse_inspect, decided)
        good = [r for r in rnd.replies if isinstance(r, Inspected)]
        if len(good) < self.quorum:
            raise self._rounds.unavailable(name, rnd, lambda r: isinstance(r, Inspected))
        return good

    async def inspect(self, name: str) -> LockInfo:
        replies = await self._inspect(name, early=False)
        counter = max(r.counter for r in replies)
        holders = [r for r in replies if r.token > 0]
        if len(holders) >= self.quorum:
            token = Counter(r.token for r in holders).most_common(1)[0][0]
            ttl = sorted(r.pttl for r in holders)[len(holders) - self.quorum] / 1000
            mode = Counter(r.mode or "exclusive" for r in holders).most_common(1)[0][0]
            count = sorted((r.holders for r in holders), reverse=True)[self.quorum - 1]
            permits = Counter(r.permits for r in holders).most_common(1)[0][0]
            return LockInfo(name, True, token, ttl, mode, max(count, 1), permits)
        return LockInfo(name, False, counter, 0.0)

    async def issued(self, name: str) -> int:
        return max(r.counter for r in await self._inspect(name, early=True))

    async def ready(self) -> Readiness:
        """Readiness: can Q nodes grant now (answer, synced, not quarantined)?"""
        futures = [
            node.call(scripts.STATE, (SYNCED_KEY, QUARANTINE_KEY), (node.run_id or "",))
            for node in self.nodes
        ]
        rnd = await self._rounds.run(futures, parse_state, _all_answered)
        for node, reply in zip(self.nodes, rnd.replies, strict=True):
            self.health.observe(node.index, reply, refused=node.refused is not None)
        able = rnd.count(_can_grant)
        n = len(self.nodes)
        causes = "; ".join(f"{k}: {v}" for k, v in rnd.errors(_can_grant).items())
        semaphores = (
            "ok"
            if able == n
            else f"{able} of {n} nodes can grant, a semaphore needs every node: {causes}"
        )
        if able >= self.quorum:
            return Readiness(True, semaphores=semaphores)
        waits = sorted(r.pttl / 1000 for r in rnd.replies if isinstance(r, Quarantined))
        short = self.quorum - able
        retry = waits[short - 1] if len(waits) >= short else None
        need = f"{self.quorum} needed ({n} for a semaphore)"
        reason = f"{able} of {n} nodes can grant, {need}: {causes}"
        return Readiness(False, reason, retry, semaphores=semaphores)


def _agreed(tokens: Sequence[int], quorum: int) -> int:
    """The token ``quorum`` of ``tokens`` agree on, or 0."""
    token, votes = Counter(tokens).most_common(1)[0]
    return token if votes >= quorum else 0


def _is_tagged(reply: object) -> bool:
    return isinstance(reply, Tagged)


def _committed(reply: object) -> bool:
    return reply is True


def _positive(reply: int | Failure) -> bool:
    return isinstance(reply, int) and reply > 0


def _one(reply: object) -> bool:
    return reply == 1


def _zero(reply: int | Failure) -> bool:
    return reply == 0


def _answered(reply: int | Failure) -> bool:
    return isinstance(reply, int)


def _can_grant(reply: StateReply) -> bool:
    return reply is True


def _all_answered(replies: Sequence[StateReply | None]) -> bool:
    return None not in replies
