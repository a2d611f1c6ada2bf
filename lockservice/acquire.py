"""One process's tries at a lock: round 1, round 2 and the undo of a failed try.

The rules are numbered in ``protocol.py``: a try asks every node at once
(R1, R3), counts grants from the send time (R5), raises the counters when the
tokens differ (R4), and gives back what did not make a lease (R7, R13-R15).
A queued waiter's grants may also come from releases (hand-over, R9-R12):
``handover.Handovers`` collects them between tries.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence

from lockservice import scripts
from lockservice.backend import Attempt
from lockservice.cleanup import Cleanups, packed_lock_keys
from lockservice.errors import PermitsMismatch, QuorumUnavailable
from lockservice.fanout import Decider, Rounds
from lockservice.handover import Handovers, Pending
from lockservice.health import Health
from lockservice.node import Node
from lockservice.protocol import (
    KEEPALIVE_MS,
    AttemptState,
    drift,
    grants_needed,
    raise_keys,
    waiter_spec,
)
from lockservice.replies import (
    AcquireReply,
    Failure,
    Granted,
    Held,
    Mismatch,
    Quarantined,
    Tagged,
    Unsynced,
    parse_acquire,
    parse_count,
)
from lockservice.resp import Packed, pack_args, pack_str
from lockservice.resync import Resyncer

__all__ = ["Acquirer", "found_lease", "try_decider"]

_AGAIN = 0.001  # "try again at once" (the grants ran out on the way)
_MISMATCH_RETRY_MS = 50  # a minority says "other permits": look again soon
_REFUSALS = (Held, Mismatch, Tagged)  # a tuple: isinstance with a union is slower


class Acquirer:
    """Tries, raises and undos for the leases of one process."""

    def __init__(
        self,
        nodes: Sequence[Node],
        rounds: Rounds,
        *,
        process: str,
        handovers: Handovers,
        cleanups: Cleanups,
        resyncer: Resyncer,
        health: Health,
    ) -> None:
        self.nodes = list(nodes)
        self.quorum = rounds.quorum
        self._rounds = rounds
        self._process = pack_args(process)  # ARGV[6] of acquire.lua, packed once
        self._handovers = handovers
        self._cleanups = cleanups
        self._resyncer = resyncer
        self._health = health

    async def attempt(
        self,
        name: str,
        lease_id: str,
        ttl: float,
        ticket: str,
        *,
        mode: str = "exclusive",
        permits: int = 0,
        tag: str = "",
    ) -> Attempt | QuorumUnavailable | PermitsMismatch:
        """One try (R3): a lease, a hint to wait, or why there was no quorum; or the
        lease held with ``tag`` (R26), or that holders of other permits hold it (R22)."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        ttl_ms = max(1, int(ttl * 1000))
        spec = waiter_spec(ttl_ms, mode, permits)
        need = grants_needed(mode, len(self.nodes))
        pending = self._handovers.get(lease_id) if ticket else None
        if pending is not None:
            ready = pending.lease(start)
            if ready is not None:  # releases handed it over: no round trip (R9)
                return await self._grant(name, lease_id, ticket, pending, ready)
            pending.move(AttemptState.TRYING)
        elif ticket:
            pending = Pending(name, len(self.nodes), ttl, start, spec, need=need)
            pending = self._handovers.open(lease_id, pending)
        else:  # a try without waiting: this try's grants alone
            pending = Pending(name, len(self.nodes), ttl, start, spec, need=need)
        pending.nudge_due = False  # this try asks every node anyway
        # ARGV of acquire.lua: the lease id, ttl, ticket and keep-alive, the node's run
        # id, the process and (ARGV[7..9], whose defaults are an exclusive lease without
        # a tag) the lease's kind; what the nodes share is packed once for all of them
        lease = pack_str(lease_id)
        timing = pack_args(ttl_ms, ticket, KEEPALIVE_MS) if ticket else _try_args(ttl_ms)
        kind = (pack_args(mode, permits, tag),) if mode != "exclusive" or tag else ()
        keys, process = packed_lock_keys(name), self._process
        futures = [
            node.call_packed(scripts.ACQUIRE, keys, lease, timing, node.run_arg, process, *kind)
            for node in self.nodes
        ]
        before = pending.valid(start) if pending.grants else frozenset()
        decided = try_decider(before, need)
        rnd = await self._rounds.run(futures, parse_acquire, decided, self._health.note)
        busy = []
        tagged: list[Tagged] = []
        mismatched: list[int] = []
        for i, reply in enumerate(rnd.replies):
            if isinstance(reply, Granted):
                pending.granted(i, reply.token, start)
            elif isinstance(reply, Held):
                busy.append(reply.pttl)
                pending.refused(i, start, reply.counter)
            elif isinstance(reply, Tagged):
                busy.append(reply.pttl)
                tagged.append(reply)
            elif isinstance(reply, Mismatch):
                busy.append(_MISMATCH_RETRY_MS)
                mismatched.append(reply.permits)
            elif isinstance(reply, Unsynced) or (isinstance(reply, Quarantined) and not reply.pttl):
                self._resyncer.schedule(self.nodes[i])  # a resync, or its second copy (R21)
        found = found_lease(tagged, self.quorum, start, loop.time()) if tagged else None
        if found is not None or len(mismatched) >= self.quorum:
            # R26: the lease of the tag answers; R22: semaphore holders of other permits.
            # The grants this try got (there may be some) are undone by the caller.
            if ticket:
                self._handovers.close(lease_id)
            if found is not None:
                return found
            return PermitsMismatch(name, max(set(mismatched), key=mismatched.count), permits)
        ready = pending.lease(loop.time())
        if ready is not None:
            for i, fut in enumerate(futures):  # R16 for nodes that have not answered
                if rnd.replies[i] is None:
                    settle = functools.partial(self._cleanups.settle_if_granted, i, name, lease_id)
                    fut.add_done_callback(functools.partial(settle, ready[0]))
                    # its late "queued" answer leaves the waiter queued there: a hand-over
                    # may follow, whose grant needs the lease's token (R16: remembered)
                    pending.queued = pending.queued or bool(ticket)
            return await self._grant(name, lease_id, ticket, pending, ready)
        granted = len(pending.grants)
        if ticket:  # a node still to answer may yet grant: that grant is the waiter's
            for i, fut in enumerate(futures):
                if rnd.replies[i] is None:
                    late = functools.partial(self._handovers.late_reply, i, name, lease_id, start)
                    fut.add_done_callback(late)
        usable = rnd.count(lambda r: isinstance(r, Granted | Held | Tagged | Mismatch))
        if granted or (not ticket and None in rnd.replies):
            # R15: a queued waiter keeps grants it is owed while others hold the rest;
            # one that too few nodes answer gives them up, or it would block the lock.
            self._undo(name, lease_id, ticket, pending, give_up=usable < need)
        if granted >= need:
            pending.move(AttemptState.QUEUED)
            return Attempt(0, 0.0, _AGAIN)  # took longer than the ttl: try again
        if busy and granted + len(busy) >= need:
            # 0 ms: the lock is free but earlier waiters are queued; sleep until woken.
            pending.move(AttemptState.QUEUED)
            return Attempt(0, 0.0, max(busy) / 1000)
        pending.move(AttemptState.FAILED)
        failed = self._rounds.unavailable(name, rnd, _is_granted, need)
        # R32: no more than N - Q nodes are known to be out (a round decides as soon as
        # one is, a semaphore's, so the others may not have answered yet): a majority may
        # be there, as exclusive and shared locks would find, and a waiter tries again
        # (its grants were given up above); more than N - Q out is a dead quorum
        out = rnd.count(lambda r: isinstance(r, Failure | Quarantined | Unsynced))
        failed.majority = len(self.nodes) - out >= self.quorum
        return failed

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
            pending.move(AttemptState.RAISING)
            failed = await self._raise_fence(name, lease_id, token, pending.need)
            if failed is not None:
                self._undo(name, lease_id, ticket, pending, give_up=True)
                pending.move(AttemptState.FAILED)
                return failed
            pending.retoken(token)  # so that an undo below names what the nodes hold
        if valid_until <= asyncio.get_running_loop().time():
            self._undo(name, lease_id, ticket, pending)
            pending.move(AttemptState.QUEUED)
            return Attempt(0, 0.0, _AGAIN)  # took longer than the ttl: try again
        pending.move(AttemptState.GRANTED)
        self._handovers.close(lease_id, token)
        return Attempt(token, valid_until, 0.0)

    async def _raise_fence(
        self, name: str, lease_id: str, token: int, need: int
    ) -> QuorumUnavailable | None:
        """Round 2 (R4); None when ``need`` nodes acked (Q, or all for a semaphore: R32),
        else why not."""
        keys = raise_keys(name)
        futures = [node.call(scripts.RAISE_FENCE, keys, (token, lease_id)) for node in self.nodes]

        def good(reply: int | Failure) -> bool:
            return isinstance(reply, int) and reply >= token

        decided = self._rounds.decider(good, need)
        rnd = await self._rounds.run(futures, parse_count, decided)
        if rnd.count(good) >= need:
            return None
        return self._rounds.unavailable(name, rnd, good, need)

    def _undo(
        self, name: str, lease_id: str, ticket: str, pending: Pending, *, give_up: bool = False
    ) -> None:
        """Give back the grants of a failed try (R7); a queued waiter keeps those it is
        owed unless ``give_up`` (R15), names each by its token (R13), and counts
        nothing from a node until its undo answered (R14)."""
        named = pending.park()
        if not ticket:
            self._cleanups.undo_any(name, lease_id, pending.spec)
            return
        sent = "" if give_up else ticket
        futures = self._cleanups.undo_named(name, lease_id, sent, pending.spec, named)
        for i, fut in futures.items():
            fut.add_done_callback(
                functools.partial(self._handovers.undo_reply, i, lease_id, named[i])
            )


def try_decider(before: frozenset[int], need: int) -> Decider[AcquireReply]:
    """Granted, held or unavailable: decided only once the class is certain.

    A held lock must not be reported as a lost quorum because the node that
    would have said "held" had not answered yet. ``before``: nodes whose
    grant this waiter already holds (handed over by a release); ``need``: the
    grants that make a lease (R3, R32). Such a node counts toward a lease at
    once, but "held" or "unavailable" waits for its answer (R33).
    """
    q = need

    def decided(replies: Sequence[AcquireReply | None]) -> bool:
        granted = held = pending = owed = 0
        for i, reply in enumerate(replies):
            if reply is None:
                pending += 1
                if i in before:
                    owed += 1  # its grant, held since a hand-over or an earlier try
            elif isinstance(reply, Granted):
                granted += 1
            elif isinstance(reply, _REFUSALS):
                held += 1
            elif i in before:
                owed += 1  # failed or quarantined since: its grant still counts for a lease
        if granted + owed >= q:
            return True
        if granted + pending >= q:
            return False  # still grantable
        return granted + held >= q or granted + held + pending < q or pending == 0

    return decided


@functools.lru_cache(maxsize=256)
def _try_args(ttl_ms: int) -> Packed:
    """ARGV[2..4] of acquire.lua for a try without waiting (no ticket), packed: the
    same for every such try with this ttl. A pure function's cache: never stale."""
    return pack_args(ttl_ms, "", KEEPALIVE_MS)


def _is_granted(reply: AcquireReply) -> bool:
    return isinstance(reply, Granted)


def found_lease(tagged: Sequence[Tagged], quorum: int, start: float, now: float) -> Attempt | None:
    """The lease committed with the try's tag, when a quorum answered it (R26): its
    id, the token its owner decided (every node that committed the tag holds that
    one) and the validity a quorum of them still gives it. None when that validity
    is (about to be) over at ``now``: the lock's last moments are past its lease's validity,
    and a repeat then waits them out and acquires afresh."""
    ids = [t.lease_id for t in tagged]
    for lease_id in set(ids):
        if ids.count(lease_id) >= quorum:
            mine = [t for t in tagged if t.lease_id == lease_id]
            token = max(t.token for t in mine)
            left = sorted((t.pttl for t in mine), reverse=True)[quorum - 1] / 1000
            valid_until = start + left - drift(left)
            if valid_until - now <= drift(left):
                return None
            return Attempt(token, valid_until, 0.0, lease_id)
    return None
