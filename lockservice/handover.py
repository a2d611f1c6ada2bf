"""Grants that releases hand to a queued waiter, collected until they make a lease.

The waiter's side of the hand-over (R9, ``protocol.py``): each node hands
over alone, so a waiter's grants arrive one by one, and only a quorum of
grants that are still valid makes a lease (R3, R5). ``Pending`` applies the
rules that keep an old or given-up grant from counting: validity from the
last refused try (R10), messages older than an answer (R11) or a confirmation
(R12) ignored, nothing counted from a node while an undo to it is unanswered
(R14). ``Handovers`` routes this process's messages and late answers to them.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from dataclasses import dataclass

from lockservice.cleanup import Cleanups
from lockservice.protocol import ATTEMPT_TRANSITIONS, AttemptState, drift
from lockservice.replies import Granted, Held, parse_acquire, parse_count
from lockservice.resp import Reply
from lockservice.waiters import Waiters

__all__ = ["Grant", "Handovers", "Pending"]

log = logging.getLogger(__name__)

_RECENT = 4096  # granted leases remembered, for grants handed over after the decision


@dataclass(slots=True, unsafe_hash=True)  # never changed; frozen, its __init__ costs 4x
class Grant:
    """One node's grant: its token, and a loop time no later than the grant."""

    token: int
    since: float


class Pending:
    """One queued acquire: what each node granted it, and since when at the latest.

    Answers come on the command connection in order; hand-over messages on
    another connection, in no fixed order with them: a message is checked
    against what the answers said (R11, R12, R14).
    """

    __slots__ = (
        "floors",
        "given_up",
        "grants",
        "name",
        "need",
        "nudge_due",
        "parked",
        "queued",
        "seen",
        "spec",
        "state",
        "suspect",
        "ttl",
        "undoing",
        "waited",
    )

    def __init__(
        self, name: str, nodes: int, ttl: float, start: float, spec: str = "", *, need: int = 0
    ) -> None:
        self.name = name
        self.need = need or nodes // 2 + 1  # grants that make a lease (R3; every node: R32)
        self.ttl = ttl
        self.spec = spec or str(max(1, int(ttl * 1000)))  # protocol.waiter_spec
        self.floors = [start] * nodes  # per node: no grant there is older than this
        self.grants: dict[int, Grant] = {}  # the grants that count
        self.parked: dict[int, Grant] = {}  # held back until the node's undos answer
        self.undoing = [0] * nodes  # per node: undos sent and not answered yet
        self.given_up: set[tuple[int, int]] = set()  # (node, token) an undo gave away
        self.queued = False  # a node queued it: hand-overs may come even after the lease
        self.waited = False  # a node said "held" or "queued", or handed it over: contended
        self.seen = [0] * nodes  # per node: its counter when it last said "queued"
        self.suspect: set[int] = set()  # nodes an undo may have reached unseen
        self.nudge_due = False  # a try is due if the rest of a hand-over does not come
        self.state = AttemptState.TRYING

    def move(self, to: AttemptState) -> None:
        """Enter state ``to``; a move ``ATTEMPT_TRANSITIONS`` does not allow is a bug."""
        if to is not self.state and to not in ATTEMPT_TRANSITIONS[self.state]:
            log.error("lock protocol bug: attempt on %r moved %s -> %s", self.name,
                      self.state.value, to.value)  # fmt: skip
        self.state = to

    def _record(self, node: int, grant: Grant) -> None:
        if self.undoing[node]:
            known = self.parked.get(node)
            if known is None or (grant.token, grant.since) > (known.token, known.since):
                self.parked[node] = grant
        else:
            self.grants[node] = grant

    def refused(self, node: int, sent: float, counter: int) -> None:
        """R10, R11: the node answered "held" or "queued" to a try sent at ``sent``.

        It holds nothing for this waiter now, and any hand-over it makes later
        counts above ``counter``: a message with a token up to it is older.
        """
        self.queued = self.waited = True
        for held in (self.grants, self.parked):
            known = held.get(node)
            if known is not None and known.token <= counter:
                del held[node]  # a newer token is a hand-over after this answer
        self.suspect.discard(node)
        if sent > self.floors[node]:
            self.floors[node] = sent
        if counter > self.seen[node]:
            self.seen[node] = counter

    def granted(self, node: int, token: int, sent: float) -> None:
        """R12: the node granted (or confirmed a hand-over) to a try sent at ``sent``.

        A confirmation issues the grant anew: any message with a lower token is older.
        """
        self.suspect.discard(node)
        self.seen[node] = max(self.seen[node], token - 1)
        self._record(node, Grant(token, max(sent, self.floors[node])))

    def handed(self, node: int, token: int) -> None:
        """R9-R11, R14: a release on the node handed the lock over with ``token``."""
        self.queued = self.waited = True
        if (node, token) in self.given_up or token <= self.seen[node] or node in self.suspect:
            return  # older than an answer that said it is given away, or may be
        since = self.floors[node]
        known = self.grants.get(node) or self.parked.get(node)
        if known is not None:
            if known.token > token:
                return  # a try of ours has since confirmed it anew, with a new token
            if known.token == token:
                since = max(since, known.since)
        self._record(node, Grant(token, since))

    def park(self) -> dict[int, int]:
        """R14: undos are on their way to the nodes that granted: none of those grants
        counts until its node answers. Returns the grants to undo, node → token."""
        named = {node: grant.token for node, grant in self.grants.items()}
        for node, grant in self.grants.items():
            self.parked[node] = grant
            self.undoing[node] += 1
        self.grants.clear()
        return named

    def undone(self, node: int, named: int, reply: int | None) -> None:
        """The answer to an undo of grant ``named``: its token when kept, minus it when
        given up, 0 when the node no longer held it, or None when the answer was lost
        (the undo may still run: nothing the node says counts until one of our tries
        gets an answer from it)."""
        self.undoing[node] -= 1
        parked = self.parked.pop(node, None)
        if reply is None:
            self.suspect.add(node)
            return
        # the node held ``named`` or a later grant when the undo ran: a message with a
        # lower token (or that one, unless kept) is older and no longer holds
        self.seen[node] = max(self.seen[node], named - 1 if reply > 0 else named)
        if reply > 0:
            since = self.floors[node]
            if parked is not None and parked.token == reply:
                since = max(since, parked.since)
            parked = Grant(reply, since)
        else:
            self.given_up.add((node, named))
            if parked is not None and parked.token <= named:
                parked = None  # gone; a later grant would count above it
        if parked is not None:
            self._record(node, parked)

    def retoken(self, token: int) -> None:
        """Round 2 wrote ``token`` into this lease's lock value on the nodes it holds."""
        for node, grant in self.grants.items():
            self.grants[node] = Grant(token, grant.since)

    def valid(self, now: float) -> frozenset[int]:
        """The nodes whose grant still counts at ``now``."""
        cut = self.ttl - drift(self.ttl)
        return frozenset(n for n, g in self.grants.items() if g.since + cut > now)

    def lease(self, now: float) -> tuple[int, float, bool] | None:
        """``(token, valid_until, all tokens agree)`` once ``need`` grants are valid."""
        cut = self.ttl - drift(self.ttl)
        valid = [g for g in self.grants.values() if g.since + cut > now]
        if len(valid) < self.need:
            return None
        ends = sorted((g.since + cut for g in valid), reverse=True)
        tokens = {g.token for g in valid}
        return max(tokens), ends[self.need - 1], len(tokens) == 1


class Handovers:
    """This process's queued acquires, and what nodes say of them between tries.

    ``Redlock`` owns one and feeds it hand-over messages, late answers of tries
    and undo answers. It wakes a waiter (``Waiters``) when it should look again
    and hands a grant made after its lease was decided to ``Cleanups`` (R16);
    it calls nothing above it.
    """

    def __init__(self, grace: float, waiters: Waiters, cleanups: Cleanups) -> None:
        self._grace = grace
        self._waiters = waiters
        self._cleanups = cleanups
        self._pending: dict[str, Pending] = {}
        self._recent: OrderedDict[str, int] = OrderedDict()  # tokens of recent leases
        self._contended: OrderedDict[str, None] = OrderedDict()  # granted after waiting

    def get(self, lease_id: str) -> Pending | None:
        return self._pending.get(lease_id)

    def open(self, lease_id: str, pending: Pending) -> Pending:
        self._pending[lease_id] = pending
        return pending

    def close(self, lease_id: str, token: int = 0) -> None:
        """The acquire is over: granted with ``token``, or given up (0)."""
        pending = self._pending.pop(lease_id, None)
        if pending is not None and not token:
            pending.move(AttemptState.ABANDONED)
        if token and pending is not None and pending.queued:
            # a node that queued it may still hand it over: remember the real token
            if len(self._recent) >= _RECENT:
                self._recent.popitem(last=False)
            self._recent[lease_id] = token
        if token and pending is not None and pending.waited:
            if len(self._contended) >= _RECENT:
                self._contended.popitem(last=False)
            self._contended[lease_id] = None

    def contended(self, lease_id: str) -> bool:
        """Whether a lease of this process was granted after waiting behind others (a
        node said "held" or "queued", or handed it over): its release likely hands the
        lock over. Asked once, at the release: forgotten then."""
        if lease_id in self._contended:
            del self._contended[lease_id]
            return True
        return False

    def _wake_if_ready(self, pending: Pending, lease_id: str) -> bool:
        if pending.lease(asyncio.get_running_loop().time()) is None:
            return False
        self._waiters.wake(pending.name, head=lease_id)
        return True

    def message(self, index: int, payload: bytes) -> None:
        """A message on this process's release channel from node ``index`` (R9)."""
        parts = payload.decode(errors="replace").split("\n")
        if len(parts) != 4:
            self._waiters.wake_from_message(payload)  # a wake-up: try again
            return
        name, _, lease_id, token = parts
        if not token.isdigit():
            log.warning("ignored a malformed hand-over message from node %d: %r", index, payload)
            return
        self.handed(index, name, lease_id, int(token))

    def handed(self, index: int, name: str, lease_id: str, token: int) -> None:
        """Node ``index`` handed ``name`` to ``lease_id`` with ``token``."""
        pending = self._pending.get(lease_id)
        if pending is None:
            self._granted_late(index, name, lease_id, token)
            return
        pending.handed(index, token)
        if not self._wake_if_ready(pending, lease_id) and not pending.nudge_due:
            pending.nudge_due = True
            asyncio.get_running_loop().call_later(self._grace, self._nudge, lease_id)

    def _nudge(self, lease_id: str) -> None:
        pending = self._pending.get(lease_id)
        if pending is not None and pending.nudge_due:
            pending.nudge_due = False
            self._waiters.wake(pending.name, head=lease_id)

    def late_reply(
        self, index: int, name: str, lease_id: str, sent: float, fut: asyncio.Future[Reply]
    ) -> None:
        """A queued waiter's try sent at ``sent`` answered after it was decided."""
        reply = parse_acquire(fut.result())
        pending = self._pending.get(lease_id)
        if pending is None:
            if isinstance(reply, Granted):
                self._granted_late(index, name, lease_id, reply.token)
        elif isinstance(reply, Held):
            pending.refused(index, sent, reply.counter)
        elif isinstance(reply, Granted):
            pending.granted(index, reply.token, sent)
            self._wake_if_ready(pending, lease_id)

    def undo_reply(self, index: int, lease_id: str, named: int, fut: asyncio.Future[Reply]) -> None:
        """The answer of undo.lua for grant ``named`` on node ``index`` (R14)."""
        reply = parse_count(fut.result())
        pending = self._pending.get(lease_id)
        if pending is not None:
            pending.undone(index, named, reply if isinstance(reply, int) else None)
            self._wake_if_ready(pending, lease_id)

    def _granted_late(self, index: int, name: str, lease_id: str, token: int) -> None:
        # an acquire that gave up sent a release after its tries, which frees the grant
        granted = self._recent.get(lease_id)
        if granted is not None:
            self._cleanups.settle_late(index, name, lease_id, granted, token)
