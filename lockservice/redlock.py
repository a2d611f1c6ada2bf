"""Redlock over N independent Redis nodes, with quorum-monotonic fencing tokens.

Round 1 sends the acquire script to every node at once; each granting node
INCRs ``fence:{name}`` in the same script. With a quorum Q = N//2 + 1 of
grants inside the validity window the token is the maximum of the returned
counters. Any earlier grant's token sits in the counters of Q nodes, and any
two quorums share a node, so that maximum exceeds every earlier token. If the
granting nodes disagree, round 2 raises the counter on every node to the
token (Q acks), so the next grant starts above it wherever it lands; in steady
state they agree and an acquire is one round trip.

A round returns as soon as its outcome is decided (Q grants, or too many
refusals for Q), so one slow or paused node never delays an answer; it is
bounded by the per-node timeout only when the outcome hangs on that node.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import secrets
from collections import Counter
from collections.abc import Callable, Sequence

from lockservice import scripts
from lockservice.backend import Attempt, drift
from lockservice.errors import LeaseLost, QuorumUnavailable
from lockservice.events import LockEvents
from lockservice.handover import Handovers, Pending
from lockservice.lease import LockInfo
from lockservice.node import Node, parse_node_url
from lockservice.resp import Reply, is_failure
from lockservice.resync import QUARANTINE_KEY, SYNCED_KEY, Resyncer
from lockservice.waiters import Waiters

__all__ = ["RELEASE_CHANNEL", "Redlock"]

log = logging.getLogger(__name__)

RELEASE_CHANNEL = "fencegate:released"
_UNSET: Reply = object()


def _lock_key(name: str) -> str:
    return f"lock:{{{name}}}"


def _fence_key(name: str) -> str:
    return f"fence:{{{name}}}"


def _keys(name: str) -> tuple[str, ...]:
    """The keys acquire.lua and release.lua take, in their order."""
    return (
        _lock_key(name),
        _fence_key(name),
        SYNCED_KEY,
        QUARANTINE_KEY,
        f"waitq:{{{name}}}",
        f"waitx:{{{name}}}",
        f"waitt:{{{name}}}",
    )


_KEEPALIVE_MS = 3000  # a queued waiter retries at least every ~1.5 s
# A hand-over from some nodes but not a quorum within this long: try the others (a
# node the previous holder did not hold has nothing to hand over, though it is free).
_HANDOVER_GRACE = 0.01  # at least; a tenth of the node timeout when that is longer
_AGAIN = 0.001  # "try again at once" (the grants ran out on the way)


def _describe(reply: Reply) -> str:
    if reply is _UNSET:
        return "no reply within the node timeout"
    return str(reply) if is_failure(reply) else f"unexpected reply {reply!r}"


class Redlock:
    """The Redis backend of ``LockManager``."""

    def __init__(
        self, urls: Sequence[str], *, node_timeout: float, max_ttl: float, events: LockEvents
    ) -> None:
        if len(urls) not in (1, 3, 5):
            raise ValueError(f"redis nodes: {len(urls)} given, use 1, 3 or 5 independent nodes")
        addresses = [parse_node_url(url) for url in urls]
        labels = [a.label for a in addresses]
        if len(set(labels)) != len(labels):
            raise ValueError(f"redis nodes: the same node is listed twice in {labels}")
        self.waiters = Waiters()
        # Releases that name one of this process's waiters come on its own channel.
        self._process = secrets.token_hex(8)
        self._events = events
        self._timeout = node_timeout
        self.nodes = [
            Node(
                a,
                timeout=node_timeout,
                channels=(f"{RELEASE_CHANNEL}:{self._process}",),
                on_release=functools.partial(self._on_message, i),
                on_connected=self._on_connected,
                cleanup_horizon=max_ttl,
            )
            for i, a in enumerate(addresses)
        ]
        self.quorum = len(self.nodes) // 2 + 1
        self._handovers = Handovers(
            self.quorum,
            max(_HANDOVER_GRACE, node_timeout / 10),
            wake=lambda name, lease_id: self.waiters.wake(name, head=lease_id),
            settle_late=self._settle_late,
        )
        self._last_errors: dict[str, str] = {}
        self._states: dict[str, str] = {}
        self.resyncer = Resyncer(
            self.nodes, self.quorum, max_ttl=max_ttl, timeout=node_timeout, on_state=self._state
        )

    def describe(self) -> str:
        return f"Redlock over {len(self.nodes)} redis node(s), quorum {self.quorum}: " + ", ".join(
            n.label for n in self.nodes
        )

    async def start(self) -> None:
        await asyncio.gather(*(node.start() for node in self.nodes))
        await self.resyncer.settle(max(self._timeout * 10, 2.0))

    async def close(self) -> None:
        await self.resyncer.close()
        await asyncio.gather(*(node.close() for node in self.nodes))

    async def _on_connected(self, node: Node, restarted: bool) -> None:
        self._state(node, "connected")
        await self.resyncer.check(node, restarted=restarted)

    def _state(self, node: Node, state: str) -> None:
        """Report a node's state (healthy, unsynced, quarantined, down) when it changes."""
        if self._states.get(node.label) != state:
            self._states[node.label] = state
            self._events.node_state(node.label, state)

    def _note(self, node: Node, reply: Reply) -> None:
        if isinstance(reply, ConnectionError):
            self._state(node, "down")
        elif isinstance(reply, list) and reply and isinstance(reply[0], int):
            code = reply[0]
            self._state(
                node, "unsynced" if code == -2 else "quarantined" if code == -1 else "healthy"
            )

    # rounds
    async def _round(
        self,
        futures: list[asyncio.Future[Reply]],
        decided: Callable[[list[Reply]], bool],
    ) -> list[Reply]:
        """Wait until ``decided(replies)`` or the node timeout; unanswered stay ``_UNSET``.

        Late replies are still reported to the metrics hook when they come.
        """
        loop = asyncio.get_running_loop()
        replies: list[Reply] = [_UNSET] * len(futures)
        finished: asyncio.Future[bool] = loop.create_future()
        start = loop.time()

        def on_done(i: int, fut: asyncio.Future[Reply]) -> None:
            reply = fut.result()
            replies[i] = reply
            self._note(self.nodes[i], reply)
            self._events.node_call(self.nodes[i].label, loop.time() - start, not is_failure(reply))
            if not finished.done() and decided(replies):
                finished.set_result(False)

        for i, fut in enumerate(futures):
            fut.add_done_callback(functools.partial(on_done, i))
        timer = loop.call_later(self._timeout, _settle, finished)
        try:
            timed_out = await finished
        finally:
            timer.cancel()
        if timed_out:
            for i, reply in enumerate(replies):
                if reply is _UNSET:
                    self._events.node_call(self.nodes[i].label, self._timeout, False)
        return list(replies)  # a snapshot: late replies keep landing in ``replies``

    def _call_all(
        self,
        script: scripts.Script,
        keys: Sequence[str],
        args: Sequence[str | int],
        *,
        run_id: bool = False,
        tail: tuple[str, ...] = (),
    ) -> list[asyncio.Future[Reply]]:
        if run_id:  # scripts that trust a node only in the run it was synced in
            return [
                node.call(script, keys, (*args, node.run_id or "", *tail)) for node in self.nodes
            ]
        return [node.call(script, keys, args) for node in self.nodes]

    def _decider(self, good: Callable[[Reply], bool]) -> Callable[[list[Reply]], bool]:
        """Decided once Q replies are good, or so many are not that Q cannot be reached."""
        n, q = len(self.nodes), self.quorum

        def decided(replies: list[Reply]) -> bool:
            ok = bad = 0
            for reply in replies:
                if reply is _UNSET:
                    continue
                if good(reply):
                    ok += 1
                else:
                    bad += 1
            return ok >= q or bad > n - q or ok + bad == n

        return decided

    def _acquire_decider(self, before: frozenset[int]) -> Callable[[list[Reply]], bool]:
        """Granted, held or unavailable: decided only once the class is certain.

        A held lock must not be reported as a lost quorum because the node that
        would have said "held" had not answered yet. ``before``: nodes whose
        grant this waiter already holds (handed over by a release).
        """
        q = self.quorum

        def decided(replies: list[Reply]) -> bool:
            granted = held = pending = 0
            for i, reply in enumerate(replies):
                if i in before:
                    granted += 1
                elif reply is _UNSET:
                    pending += 1
                elif _granted(reply):
                    granted += 1
                elif _answered(reply) and int(reply[0]) == 0:
                    held += 1
            if granted >= q:
                return True
            if granted + pending >= q:
                return False  # still grantable
            return granted + held >= q or granted + held + pending < q or pending == 0

        return decided

    def _errors(self, replies: list[Reply], ok: Callable[[Reply], bool]) -> dict[str, str]:
        return {
            node.label: _describe(reply)
            for node, reply in zip(self.nodes, replies, strict=True)
            if not ok(reply)
        }

    # operations
    async def try_acquire(self, name: str, lease_id: str, ttl: float, ticket: str) -> Attempt:
        attempt = await self._attempt(name, lease_id, ttl, ticket)
        if attempt is None and self.resyncer.pending():
            # Nodes that restarted or are new may be in the middle of a resync: wait once.
            await self.resyncer.settle(max(self._timeout * 10, 2.0))
            for node in self.nodes:  # a late replay of the first try's undo would
                node.forget_cleanups(lease_id)  # remove a grant of the second

            attempt = await self._attempt(name, lease_id, ttl, ticket)
        if attempt is None:
            raise QuorumUnavailable(name, self._last_errors, self.quorum)
        return attempt

    async def _attempt(self, name: str, lease_id: str, ttl: float, ticket: str) -> Attempt | None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        pending = self._handovers.get(lease_id) if ticket else None
        if pending is not None:
            ready = pending.lease(self.quorum, start)
            if ready is not None:  # releases handed it over: no round trip
                return await self._grant(name, lease_id, ticket, pending, ready)
        elif ticket:
            pending = self._handovers.open(lease_id, Pending(name, len(self.nodes), ttl, start))
        else:  # a try without waiting: this try's grants alone
            pending = Pending(name, len(self.nodes), ttl, start)
        pending.nudge_due = False  # this try asks every node anyway
        args = (lease_id, max(1, int(ttl * 1000)), ticket, _KEEPALIVE_MS)
        futures = self._call_all(
            scripts.ACQUIRE, _keys(name), args, run_id=True, tail=(self._process,)
        )
        before = pending.valid(start) if pending.grants else frozenset()
        replies = await self._round(futures, self._acquire_decider(before))
        busy = []
        for i, reply in enumerate(replies):
            if not _answered(reply):
                continue
            code = int(reply[0])
            if code > 0:
                pending.granted(i, code, start)
            elif code == 0:
                busy.append(int(reply[1]))
                pending.refused(i, start, _counter(reply))
            elif code == -2:
                self.resyncer.schedule(self.nodes[i])
        ready = pending.lease(self.quorum, loop.time())
        if ready is not None:
            self._reconcile_late(futures, replies, name, lease_id, ready[0])
            return await self._grant(name, lease_id, ticket, pending, ready)
        granted = len(pending.grants)
        if ticket:  # a node still to answer may yet grant: that grant is the waiter's
            for i, reply in enumerate(replies):
                if reply is _UNSET:
                    futures[i].add_done_callback(
                        functools.partial(self._late_reply, name, lease_id, i, start)
                    )
        usable = sum(_answered(r) and int(r[0]) >= 0 for r in replies)
        if granted or (not ticket and any(r is _UNSET for r in replies)):
            # A queued waiter keeps grants it is owed while others hold the rest; one
            # that too few nodes answer gives them up, or it would block the lock.
            self._undo(name, lease_id, ticket, pending, give_up=usable < self.quorum)
        if granted >= self.quorum:
            return Attempt(0, 0.0, _AGAIN)  # took longer than the ttl: try again
        if busy and granted + len(busy) >= self.quorum:
            # 0 ms: the lock is free but earlier waiters are queued; sleep until woken.
            return Attempt(0, 0.0, max(busy) / 1000)
        self._last_errors = self._errors(replies, _granted)
        return None

    async def _grant(
        self,
        name: str,
        lease_id: str,
        ticket: str,
        pending: Pending,
        ready: tuple[int, float, bool],
    ) -> Attempt | None:
        """A quorum of valid grants: round 2 if their tokens differ, then the lease."""
        token, valid_until, agreed = ready
        if not agreed:
            if not await self._raise_fence(name, lease_id, token):
                self._undo(name, lease_id, ticket, pending, give_up=True)
                return None
            pending.retoken(token)  # so that an undo below names what the nodes hold
        if valid_until <= asyncio.get_running_loop().time():
            self._undo(name, lease_id, ticket, pending)
            return Attempt(0, 0.0, _AGAIN)  # took longer than the ttl: try again
        self._handovers.close(lease_id, token)
        return Attempt(token, valid_until, 0.0)

    def _on_message(self, index: int, payload: bytes) -> None:
        """A message on this process's release channel, from node ``index``."""
        parts = payload.decode(errors="replace").split("\n")
        if len(parts) != 4:
            self.waiters.wake_from_message(payload)  # a wake-up: try again
            return
        name, _, lease_id, token = parts
        self._handovers.handed(index, name, lease_id, int(token))

    def _settle_late(self, index: int, name: str, lease_id: str, granted: int, late: int) -> None:
        """Node ``index`` granted lease ``granted`` late, counting ``late``.

        The lease's real token is recorded there, or that node's lock value would
        carry a token nobody was issued. A node whose counter ran ahead raises the
        others' to it, so that the next grant finds them equal (no round 2).
        """
        if late == granted:
            return
        keys = (_fence_key(name), _lock_key(name))
        self.nodes[index].call(scripts.RAISE_FENCE, keys, (granted, lease_id))
        if late > granted:
            for i, node in enumerate(self.nodes):
                if i != index:
                    node.call(scripts.RAISE_FENCE, keys, (late, ""))  # counter only

    def _reconcile_late(
        self,
        futures: list[asyncio.Future[Reply]],
        replies: list[Reply],
        name: str,
        lease_id: str,
        token: int,
    ) -> None:
        """A node that grants after the decision gets the lease's real token recorded.

        Otherwise its lock value would carry a token nobody was issued.
        """
        for i, (fut, reply) in enumerate(zip(futures, replies, strict=True)):
            if reply is not _UNSET:
                continue

            def late(fut: asyncio.Future[Reply], index: int) -> None:
                reply = fut.result()
                if _granted(reply):
                    self._settle_late(index, name, lease_id, token, int(reply[0]))

            fut.add_done_callback(functools.partial(late, index=i))

    async def _raise_fence(self, name: str, lease_id: str, token: int) -> bool:
        futures = self._call_all(
            scripts.RAISE_FENCE, (_fence_key(name), _lock_key(name)), (token, lease_id)
        )

        def good(reply: Reply) -> bool:
            return isinstance(reply, int) and reply >= token

        replies = await self._round(futures, self._decider(good))
        return sum(good(r) for r in replies) >= self.quorum

    def abandon(self, name: str, lease_id: str) -> None:
        self._handovers.close(lease_id)
        self._send_release(name, lease_id, "1", later=False)  # cleanup: out at once

    def _undo(
        self, name: str, lease_id: str, ticket: str, pending: Pending, *, give_up: bool = False
    ) -> None:
        """Give back the grants of a failed try; a queued waiter keeps those it is owed
        unless ``give_up``.

        Sent on each node's connection after the acquire, so it runs after it.
        A try without waiting undoes any grant of its lease on every node (a node
        that has not answered may still grant). A queued waiter undoes only the
        grants it knows, each named by its token, so that an undo stuck in a
        dropped connection and delivered late cannot take a grant issued after it
        (a try confirming a hand-over issues it anew); until a node answers, its
        grant does not count. Nor is it replayed after a reconnect.
        """
        named = pending.park()
        ttl = max(1, int(pending.ttl * 1000))
        if not ticket:
            self._send_release(name, lease_id, "0", "", ttl)
            return
        sent = "" if give_up else ticket
        futures = self._send_release(name, lease_id, "0", sent, ttl, replay=False, named=named)
        for i, fut in futures.items():
            fut.add_done_callback(functools.partial(self._undone, lease_id, i, named[i]))

    def _late_reply(
        self, name: str, lease_id: str, index: int, sent: float, fut: asyncio.Future[Reply]
    ) -> None:
        """A queued waiter's try answered after the try was decided."""
        reply = fut.result()
        if _answered(reply):
            code = int(reply[0])
            self._handovers.answered_late(index, name, lease_id, sent, code, _counter(reply))

    def _undone(self, lease_id: str, index: int, token: int, fut: asyncio.Future[Reply]) -> None:
        reply = fut.result()
        self._handovers.undone(index, lease_id, token, reply if isinstance(reply, int) else None)

    def _send_release(
        self,
        name: str,
        lease_id: str,
        mode: str,
        ticket: str = "",
        ttl: int = 0,
        *,
        replay: bool = True,
        later: bool = True,
        named: dict[int, int] | None = None,
    ) -> dict[int, asyncio.Future[Reply]]:
        """Send release.lua to every node (``named``: to those nodes only, undoing the
        grant with that token); with ``replay``, a node that cannot take it now gets
        it on reconnect. Returns the futures by node index."""
        keys = _keys(name)
        head = (lease_id, RELEASE_CHANNEL, name, mode, self._process)
        tail = (ticket, str(_KEEPALIVE_MS), str(ttl))
        futures = {}
        for i, node in enumerate(self.nodes):
            if named is not None and i not in named:
                continue
            grant = str(named[i]) if named is not None else ""
            args = (*head, node.run_id or "", *tail, grant)
            fut = node.call(scripts.RELEASE, keys, args, later=later)
            if replay:
                fut.add_done_callback(functools.partial(_retry_later, node, keys, args))
            futures[i] = fut
        return futures

    async def extend(self, name: str, lease_id: str, ttl: float) -> tuple[float, int]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        futures = self._call_all(scripts.EXTEND, (_lock_key(name),), (lease_id, int(ttl * 1000)))
        replies = await self._round(futures, self._decider(_positive))
        tokens = [r for r in replies if _positive(r)]
        if len(tokens) >= self.quorum:
            # the token a majority recorded for this lease (a late grant may differ)
            return start + ttl - drift(ttl), Counter(tokens).most_common(1)[0][0]
        if sum(r == 0 for r in replies) > len(self.nodes) - self.quorum:
            raise LeaseLost(name, "it expired or another lease holds it")
        raise QuorumUnavailable(name, self._errors(replies, _positive), self.quorum)

    async def release(self, name: str, lease_id: str, *, confirm: bool = True) -> bool:
        futures = self._send_release(name, lease_id, "1", later=not confirm)
        if not confirm:
            return True
        replies = await self._round(list(futures.values()), self._decider(_one))
        not_owner = sum(r == 0 for r in replies)
        if not_owner > len(self.nodes) - self.quorum:
            return False
        if sum(isinstance(r, int) for r in replies) < self.quorum:
            raise QuorumUnavailable(name, self._errors(replies, _one), self.quorum)
        return True

    async def _inspect_replies(self, name: str, *, early: bool) -> list[list[int]]:
        keys = (_lock_key(name), _fence_key(name), SYNCED_KEY)
        futures = self._call_all(scripts.INSPECT, keys, (), run_id=True)
        n = len(self.nodes)

        def decided(replies: list[Reply]) -> bool:
            answered = sum(r is not _UNSET for r in replies)
            return answered == n or (early and sum(map(_inspected, replies)) >= self.quorum)

        replies = await self._round(futures, decided)
        good = [[int(x) for x in r] for r in replies if _inspected(r)]
        if len(good) < self.quorum:
            raise QuorumUnavailable(name, self._errors(replies, _inspected), self.quorum)
        return good

    async def inspect(self, name: str) -> LockInfo:
        replies = await self._inspect_replies(name, early=False)
        counter = max(r[2] for r in replies)
        holders = [r for r in replies if r[0] > 0]
        if len(holders) >= self.quorum:
            token = Counter(r[0] for r in holders).most_common(1)[0][0]
            ttl = sorted(r[1] for r in holders)[len(holders) - self.quorum] / 1000
            return LockInfo(name, True, token, ttl)
        return LockInfo(name, False, counter, 0.0)

    async def issued(self, name: str) -> int:
        replies = await self._inspect_replies(name, early=True)
        return max(r[2] for r in replies)

    async def ready(self) -> bool:
        futures = [node.command("PING") for node in self.nodes]
        replies = await self._round(futures, self._decider(_pong))
        return sum(_pong(r) for r in replies) >= self.quorum


def _settle(fut: asyncio.Future[bool]) -> None:
    if not fut.done():
        fut.set_result(True)


def _retry_later(
    node: Node, keys: tuple[str, ...], args: tuple[str, ...], fut: asyncio.Future[Reply]
) -> None:
    if isinstance(fut.result(), ConnectionError):
        node.remember_cleanup(keys, args)


def _pong(reply: Reply) -> bool:
    return isinstance(reply, bytes) and reply == b"PONG"


def _answered(reply: Reply) -> bool:
    return isinstance(reply, list) and len(reply) >= 2


def _counter(reply: list[int]) -> int:
    """The node's counter in a "held"/"queued" answer of acquire.lua (an answer
    without one, from an older script, vouches for no hand-over)."""
    return int(reply[2]) if len(reply) > 2 else 1 << 62


def _granted(reply: Reply) -> bool:
    return _answered(reply) and int(reply[0]) > 0


def _positive(reply: Reply) -> bool:
    return isinstance(reply, int) and reply > 0


def _one(reply: Reply) -> bool:
    return isinstance(reply, int) and reply == 1


def _inspected(reply: Reply) -> bool:
    return isinstance(reply, list) and len(reply) == 3
