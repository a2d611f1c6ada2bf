"""Lock names spread over independent Redlock groups, and changes of the groups (R27-R31).

Each group is one ``Redlock`` (its own quorum, resync and quarantine); this
backend only routes: every call for a name goes to the group that owns it
(``placement.owner``). During a change of groups (``previous``), a name whose
owner changed is *moved*: it is locked in its old group first and then in its
new one, with one lease id, and the lease's token is raised in both (R28, R29),
so gateways of the old configuration (old group only), of the change (both)
and of the new one (new group only) exclude each other pairwise and tokens keep
rising. ``carry.carry_over`` finishes a change (R30).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from contextvars import ContextVar

from lockservice import scripts
from lockservice.backend import Attempt, Readiness
from lockservice.errors import LeaseLost, QuorumUnavailable
from lockservice.events import LockEvents
from lockservice.lease import LockInfo
from lockservice.node import parse_node_url
from lockservice.placement import GroupSpec, owner
from lockservice.protocol import grants_needed, raise_keys
from lockservice.redlock import Redlock
from lockservice.resp import Reply
from lockservice.waiters import Waiters

__all__ = ["Groups"]

_AGAIN = 0.01  # seconds: a try that found a moved name's tagged lease in one group alone
_tried: ContextVar[tuple[Redlock, ...]] = ContextVar("fencegate_groups_tried", default=())


class Groups:
    """The backend of ``LockManager`` over several Redlock groups."""

    def __init__(
        self,
        groups: Sequence[GroupSpec],
        *,
        previous: Sequence[GroupSpec] = (),
        node_timeout: float,
        max_ttl: float,
        events: LockEvents,
        batch_writes: bool = False,
    ) -> None:
        if not groups:
            raise ValueError("redlock groups: none given")
        specs: dict[str, GroupSpec] = {}
        for spec in (*groups, *previous):
            if specs.setdefault(spec.id, spec).urls != spec.urls:
                raise ValueError(f"redlock groups: id {spec.id!r} names two different groups")
        seen: dict[str, str] = {}
        for spec in specs.values():
            for url in spec.urls:
                label = parse_node_url(url).label
                if seen.setdefault(label, spec.id) != spec.id:
                    raise ValueError(
                        f"redlock groups: node {label} is in group {seen[label]!r} and {spec.id!r}"
                    )
        self.waiters = Waiters()  # one for all groups: a waiter hears releases of any
        self.groups: dict[str, Redlock] = {
            gid: Redlock(
                spec.urls,
                node_timeout=node_timeout,
                max_ttl=max_ttl,
                events=events,
                waiters=self.waiters,
                batch_writes=batch_writes,
            )
            for gid, spec in specs.items()
        }
        self.current = tuple(dict.fromkeys(g.id for g in groups))
        self.previous = tuple(dict.fromkeys(g.id for g in previous))
        self._timeout = node_timeout

    def route(self, name: str) -> tuple[Redlock, ...]:
        """The group of ``name``; during a change, its old group first when it moved (R28)."""
        new = owner(name, self.current)
        if self.previous:
            old = owner(name, self.previous)
            if old != new:
                return self.groups[old], self.groups[new]
        return (self.groups[new],)

    def describe(self) -> str:
        parts = [f"group {gid}: {self.groups[gid].describe()}" for gid in self.current]
        text = f"{len(self.current)} Redlock group(s) by rendezvous hashing; " + "; ".join(parts)
        if self.previous:
            text += "; changing from the groups " + ", ".join(self.previous)
        return text

    async def start(self) -> None:
        await asyncio.gather(*(g.start() for g in self.groups.values()))

    async def close(self) -> None:
        await asyncio.gather(*(g.close() for g in self.groups.values()))

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
        route = self.route(name)
        _tried.set(route)  # settle() in the same task waits for these groups alone
        if len(route) == 1:
            return await route[0].try_acquire(
                name, lease_id, ttl, ticket, mode=mode, permits=permits, tag=tag
            )
        old, new = route
        # R28: the old group first. Its grant is kept while the new group refuses: a
        # retry of the same lease there is issued anew, and abandon() gives it up.
        first = await old.try_acquire(
            name, lease_id, ttl, ticket, mode=mode, permits=permits, tag=tag
        )
        if first.lease_id and first.lease_id != lease_id:  # R26: the tag's lease
            other = await new.find(name, tag)
            if other is not None and other.lease_id == first.lease_id:
                return _both(first, other)
            # R31: not a lease in one group alone; again. Grants this try got in the old
            # group are kept, as R28 keeps them: giving them up here (a release, replayed
            # where it could not be sent) and trying again with this lease id would let
            # a replay free a grant of the lease decided meanwhile (R7).
            return Attempt(0, 0.0, _AGAIN)
        if not first.token:
            return first
        second = await new.try_acquire(
            name, lease_id, ttl, ticket, mode=mode, permits=permits, tag=tag
        )
        if second.lease_id and second.lease_id != lease_id:  # R26 in the new group alone
            other = await old.find(name, tag)
            if other is not None and other.lease_id == second.lease_id:
                return _both(other, second)
            return Attempt(0, 0.0, _AGAIN)  # the old group's grant is kept (R28)
        if not second.token:
            return second
        token = max(first.token, second.token)
        # R29: both counters at least the token before the lease exists.
        for group, got in ((old, first.token), (new, second.token)):
            if got < token:
                await self._raise(group, name, lease_id, token, mode)
        valid_until = min(first.valid_until, second.valid_until)
        if valid_until <= asyncio.get_running_loop().time():
            return Attempt(0, 0.0, 0.001)  # took longer than the ttl: both issued anew
        return Attempt(token, valid_until, 0.0)

    async def find(self, name: str, tag: str) -> Attempt | None:
        """R26, R31: a moved name's lease answers only when both groups name it."""
        found = await asyncio.gather(*(g.find(name, tag) for g in self.route(name)))
        if len(found) == 1:
            return found[0]
        a, b = found
        if a is not None and b is not None and a.lease_id == b.lease_id:
            return _both(a, b)
        return None

    async def commit(self, name: str, lease_id: str, token: int, tag: str) -> Attempt | None:
        """R26 in route order: the old group decides. The new group is asked only once
        the old one took the tag; the other lease of the tag is trusted from the old
        group (completed by the new one's answer) and never from the new one alone."""
        route = self.route(name)
        first = await route[0].commit(name, lease_id, token, tag)
        if len(route) == 1:
            return first
        if first is not None:  # another lease committed the tag first in the old group
            other = await route[1].find(name, tag)
            if other is not None and other.lease_id == first.lease_id:
                return _both(first, other)
            return first
        # Its answer decides nothing, nor does its missing quorum: every lease of a moved
        # name needs the old group (R28), where the tag holds another one off.
        with contextlib.suppress(QuorumUnavailable):
            await route[1].commit(name, lease_id, token, tag)
        return None

    async def _raise(self, group: Redlock, name: str, lease_id: str, token: int, mode: str) -> None:
        """Raise ``fence:{name}`` to ``token`` on a quorum of ``group`` (every node of it
        for a semaphore, R32) that this lease holds or that is free (``raise_fence.lua``,
        as round 2 does, R4)."""
        keys = raise_keys(name)
        futures = [n.call(scripts.RAISE_FENCE, keys, (token, lease_id)) for n in group.nodes]
        await asyncio.wait(futures, timeout=self._timeout)  # a late answer changes nothing
        errors = {
            n.label: "did not take the raise"
            for n, f in zip(group.nodes, futures, strict=True)
            if not (f.done() and _at_least(f.result(), token))
        }
        need = grants_needed(mode, len(group.nodes))
        if len(group.nodes) - len(errors) < need:
            raise QuorumUnavailable(name, errors, need, len(group.nodes))

    async def settle(self) -> bool:
        """Wait for the resyncs of the groups this task's last try asked (all groups,
        when it tried none): another group's resync must not hold up its names."""
        groups = _tried.get() or tuple(self.groups.values())
        return any(await asyncio.gather(*(g.settle() for g in groups)))

    def abandon(self, name: str, lease_id: str) -> None:
        for group in self.route(name):
            group.abandon(name, lease_id)

    async def extend(
        self, name: str, lease_id: str, ttl: float, *, mode: str = "exclusive"
    ) -> tuple[float, int]:
        # R31: a lease of a moved name holds both groups, or it is lost: the old group
        # first, the new one only once the old one extended it. A lost lease gives its
        # grant in the other group up, or that grant would hold the name until its ttl.
        route = self.route(name)
        done = []
        for group in route:
            try:
                done.append(await group.extend(name, lease_id, ttl, mode=mode))
            except LeaseLost:
                for other in route:
                    if other is not group:
                        await other.release(name, lease_id, confirm=False)
                raise
        return min(v for v, _ in done), max(t for _, t in done)

    async def release(self, name: str, lease_id: str, *, confirm: bool = True) -> bool:
        route = self.route(name)
        released = await asyncio.gather(
            *(g.release(name, lease_id, confirm=confirm) for g in route), return_exceptions=True
        )
        for outcome in released:
            if isinstance(outcome, BaseException) and not isinstance(outcome, QuorumUnavailable):
                raise outcome
        if all(isinstance(r, QuorumUnavailable) for r in released):
            raise next(r for r in released if isinstance(r, QuorumUnavailable))
        return any(r is True for r in released)

    async def inspect(self, name: str) -> LockInfo:
        infos = await asyncio.gather(*(g.inspect(name) for g in self.route(name)))
        held = [i for i in infos if i.held]
        if not held:
            return LockInfo(name, False, max(i.token for i in infos), 0.0)
        # During a change a moved name's leases hold both groups (or one, taken through
        # an old or new gateway): the newest grant says the mode, and the larger count
        # of holders is the one both groups' holders include.
        newest = max(held, key=lambda i: i.token)
        return LockInfo(
            name,
            True,
            newest.token,
            max(i.ttl for i in held),
            newest.mode,
            max(i.holders for i in held),
            max(i.permits for i in held),
        )

    async def issued(self, name: str) -> int:
        return max(await asyncio.gather(*(g.issued(name) for g in self.route(name))))

    async def ready(self) -> Readiness:
        """Ready when every group, current and previous, can grant; the reason names each."""
        states = await asyncio.gather(*(g.ready() for g in self.groups.values()))
        per_group = tuple(
            (gid, "ok" if r.ready else r.reason) for gid, r in zip(self.groups, states, strict=True)
        )
        semaphores = "; ".join(
            f"group {gid}: {r.semaphores}"
            for gid, r in zip(self.groups, states, strict=True)
            if r.semaphores != "ok"
        )
        semaphores = semaphores or "ok"
        if all(r.ready for r in states):
            return Readiness(True, groups=per_group, semaphores=semaphores)
        reason = "; ".join(f"group {gid}: {text}" for gid, text in per_group if text != "ok")
        waits = [r.retry_after for r in states if not r.ready]
        retry = None if None in waits else max(w for w in waits if w is not None)
        return Readiness(False, reason, retry, groups=per_group, semaphores=semaphores)


def _at_least(reply: Reply, token: int) -> bool:
    return isinstance(reply, int) and reply >= token


def _both(first: Attempt, second: Attempt) -> Attempt:
    """One lease found in both groups: the larger token, the earlier end."""
    token = max(first.token, second.token)
    return Attempt(token, min(first.valid_until, second.valid_until), 0.0, first.lease_id)
