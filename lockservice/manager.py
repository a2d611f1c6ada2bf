"""``LockManager``: acquire, extend, release and ``lock()`` over a backend.

Waiting is push-driven: a task registers for wake-ups of its name *before*
each try, then sleeps until a release of that name is published, the holder's
remaining TTL runs out, or a jittered back-off timer fires (the fallback when
a notification is lost). Within one process, tasks contend for a name one at
a time in arrival order (a per-name FIFO turn), so fifty local waiters cost
Redis one contender, and a task that releases and re-acquires at once queues
behind those already waiting.
"""

from __future__ import annotations

import asyncio
import random
import secrets
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Final

from lockservice.backend import Attempt, Backend, Readiness
from lockservice.backends import start_backend
from lockservice.errors import (
    LeaseLost,
    LockHeld,
    LockServiceError,
    PermitsMismatch,
    QuorumUnavailable,
)
from lockservice.events import ContentionObserver, LockEvents, NoEvents
from lockservice.idempotency import commit_tag, find_held
from lockservice.kinds import Kind, SemaphoreAPI, handle_lease
from lockservice.lease import EXCLUSIVE, Lease, LockInfo, validate_mode, validate_name, validate_ttl
from lockservice.placement import GroupSpec
from lockservice.renew import Renewal, hold
from lockservice.turns import Turn, Turns, Wait

__all__ = ["LockManager"]

_BACKOFF_FIRST = 0.05
_BACKOFF_QUEUED = 0.25  # a queued waiter is woken by the release: polling is the fallback
_BACKOFF_MAX = 1.0
_NOT_YET: Final = Attempt(0, 0.0, 0.0)  # a waiter's try that missed a semaphore's node
_RELEASED_MEMORY = 10_000  # lease ids released here, to refuse a second release of one


def _wake_up(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class LockManager(SemaphoreAPI):
    """Distributed locks with fencing tokens.

    Build one with ``await LockManager.connect(urls)``; with no URL the
    in-process backend serves a single process only.
    """

    def __init__(
        self,
        backend: Backend,
        *,
        min_ttl: float = 0.01,
        max_ttl: float = 300.0,
        max_wait: float = 30.0,
        events: LockEvents | None = None,
        observer: ContentionObserver | None = None,
    ) -> None:
        self._backend = backend
        self.observer = observer
        self.min_ttl = min_ttl
        self.max_ttl = max_ttl
        self.max_wait = max_wait
        self.events: LockEvents = events or NoEvents()
        self._turns = Turns()
        self._released: OrderedDict[str, None] = OrderedDict()
        self._closed = False

    @classmethod
    async def connect(
        cls,
        urls: Sequence[str] = (),
        *,
        groups: Sequence[GroupSpec | Sequence[str]] = (),
        previous_groups: Sequence[GroupSpec | Sequence[str]] = (),
        node_timeout: float = 0.2,
        min_ttl: float = 0.01,
        max_ttl: float = 300.0,
        max_wait: float = 30.0,
        events: LockEvents | None = None,
        observer: ContentionObserver | None = None,
        batch_writes: bool = False,
    ) -> LockManager:
        """Connect to 1, 3 or 5 independent Redis nodes (none: in-process backend).

        Args:
            urls: ``redis://[user:password@]host:port/db``, ``rediss://`` or ``unix://``.
            groups: instead of ``urls``, several Redlock groups (each a list of URLs,
                or a ``GroupSpec`` with an id); names are spread over them by
                rendezvous hashing (``lockservice.groups``).
            previous_groups: during a change of groups, the groups before it (with
                ``urls`` or ``groups`` as the groups after it).
            node_timeout: seconds each node has to answer one command.
            min_ttl, max_ttl: bounds of a lease's TTL in seconds; ``max_ttl`` is
                also how long a restarted node stays quarantined.
            max_wait: the longest ``wait`` an acquire may ask for.
            events: metrics hooks (no lock names); observer: sees contention per name.
            batch_writes: every command waits for the end of its loop turn, so that
                a node gets one write per turn (a server with many clients at once:
                fewer syscalls and wake-ups); by default the first command of a turn
                goes out at once (the lowest latency for an application's own calls).
        Raises:
            ValueError: a bad URL, or a node count other than 1, 3 or 5.
        """
        events = events or NoEvents()
        backend = await start_backend(
            urls,
            groups=groups,
            previous_groups=previous_groups,
            node_timeout=node_timeout,
            max_ttl=max_ttl,
            events=events,
            batch_writes=batch_writes,
        )
        return cls(
            backend,
            min_ttl=min_ttl,
            max_ttl=max_ttl,
            max_wait=max_wait,
            events=events,
            observer=observer,
        )

    @property
    def backend(self) -> Backend:
        return self._backend

    def describe(self) -> str:
        return self._backend.describe()

    async def close(self) -> None:
        self._closed = True
        await self._backend.close()

    # acquire
    async def acquire(
        self,
        name: str,
        ttl: float = 10.0,
        wait: float = 0.0,
        *,
        mode: str = EXCLUSIVE,
        idempotency_key: str | None = None,
    ) -> Lease:
        """Take the lock ``name`` for ``ttl`` seconds, waiting up to ``wait`` seconds.

        ``mode="shared"`` joins other shared leases (R22); a queued exclusive
        waiter is served before shared requests that came after it. With an
        ``idempotency_key``, a repeat while the lease taken with that key is held
        returns that lease (same id and token) instead of queueing again (R26).

        Returns:
            A ``Lease``; an exclusive one's token exceeds that of every earlier
            grant of ``name``, a shared one's is the newest issued (R23).
        Raises:
            LockHeld: another lease still held it when ``wait`` ran out.
            QuorumUnavailable: a majority of nodes could not answer.
            ValueError: a bad name, ttl, wait, mode or idempotency key.
        """
        mode = validate_mode(mode)
        return await self._acquire(name, ttl, wait, mode, 0, idempotency_key)

    async def _acquire(
        self, name: str, ttl: float, wait: float, mode: str, permits: int, key: str | None
    ) -> Lease:
        validate_name(name)
        ttl = validate_ttl(ttl, self.min_ttl, self.max_ttl)
        wait = validate_ttl(wait, 0.0, self.max_wait, "wait")
        kind = Kind.of(mode, permits, key)
        loop = asyncio.get_running_loop()
        start = time.perf_counter()  # durations: the loop's clock may be ms-coarse (uvloop)
        deadline = loop.time() + wait
        if kind.tag:  # a repeat: answer the held lease before queueing behind anyone (R26)
            found = await find_held(self._backend, self.events, name, kind, start, self)
            if found is not None:
                return found
        lease_id = secrets.token_hex(16)
        ticket = f"{time.time() * 1000:.3f}" if wait else ""  # place in the remote queue
        result = "cancelled"
        turn = self._turns.join(name)
        waited = Wait(self.events, self.observer, name, start, mode)
        if turn.users > 1:  # behind other local tasks asking for the same name
            try:
                waited.begin()
                await Turns.wait(turn, deadline)
            except TimeoutError:
                self._turns.leave(name, turn)
                waited.end(timed_out=True)
                self.events.acquire_done("held", time.perf_counter() - start, kind=mode)
                raise LockHeld(name, retry_after=await self._held_for(name)) from None
            except BaseException:
                self._turns.leave(name, turn)
                waited.end(timed_out=False)
                raise
        # else the turn is free and ours: no lock, no timer
        try:
            lease = await self._contend(name, lease_id, ttl, deadline, ticket, waited, kind, turn)
            result = "granted"
            return lease
        except LockHeld:
            result = "held"
            raise
        except PermitsMismatch:
            result = "permits_mismatch"
            raise
        except QuorumUnavailable:
            result = "quorum_unavailable"
            self.events.quorum_failed("acquire")
            raise
        finally:
            turn.release()
            self._turns.leave(name, turn)
            waited.end(timed_out=result == "held")
            self.events.acquire_done(result, time.perf_counter() - start, kind=mode)

    async def _contend(
        self,
        name: str,
        lease_id: str,
        ttl: float,
        deadline: float,
        ticket: str,
        waited: Wait,
        kind: Kind,
        turn: Turn,
    ) -> Lease:
        loop = asyncio.get_running_loop()
        backend = self._backend
        backoff = _BACKOFF_QUEUED if ticket else _BACKOFF_FIRST
        resynced = retried = False
        unavailable: QuorumUnavailable | None = None  # why the last try failed, if it did
        try:
            while True:
                # before the try; a try without waiting (wait 0: no ticket) never sleeps
                woken = backend.waiters.register(name, lease_id) if ticket else None
                try:
                    try:
                        attempt = await backend.try_acquire(
                            name,
                            lease_id,
                            ttl,
                            ticket,
                            mode=kind.mode,
                            permits=kind.permits,
                            tag=kind.tag,
                        )
                        unavailable = None
                    except QuorumUnavailable as exc:
                        # Nodes in the middle of a resync: wait for them once, then retry.
                        if not resynced and await backend.settle():
                            resynced = True
                            continue
                        # R32: a semaphore's node is missing while a majority answers
                        # (exclusive and shared locks would go on): a waiter keeps trying
                        # until its wait runs out. A dead quorum fails at once.
                        if not (ticket and exc.majority and loop.time() < deadline):
                            raise
                        unavailable, attempt = exc, _NOT_YET
                    else:
                        # R26: decided, the tag is committed (a cancel here, or a commit
                        # that no quorum took, gives it back, below)
                        attempt = await commit_tag(backend, name, lease_id, attempt, kind)
                    if attempt.token:
                        if attempt.lease_id and attempt.lease_id != lease_id:
                            backend.abandon(name, lease_id)  # the tag's lease answered: R26
                        return kind.lease(name, attempt.lease_id or lease_id, attempt, self)
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        if unavailable is not None:  # the node stayed missing: 503, not 409
                            raise unavailable
                        # 0: refused behind queued waiters, not a holder; say the holders' time
                        left = attempt.retry_after or await self._held_for(name)
                        raise LockHeld(name, retry_after=max(left, 0.001))
                    waited.begin()
                    sleep = min(remaining, backoff * (0.5 + random.random()))
                    if attempt.retry_after > 0:
                        sleep = min(sleep, attempt.retry_after + 0.001)
                    backoff = min(backoff * 2, _BACKOFF_MAX)
                    assert woken is not None  # time left to wait: a ticket
                    timer = loop.call_later(sleep, _wake_up, woken)
                    turn.sleeping = True  # tasks queued behind it stop at their deadline
                    try:
                        await woken  # a release of this name, or the timer
                    finally:
                        turn.sleeping = False
                        timer.cancel()
                finally:
                    if ticket:
                        backend.waiters.unregister(name, lease_id)
                    if resynced and not ticket and not retried:
                        # R7: the failed try's undo names no grant and may still run late
                        # (replayed, or stuck in a dropped socket): the retry is a new lease.
                        backend.abandon(name, lease_id)
                        lease_id = secrets.token_hex(16)
                        retried = True
        except BaseException:
            # Undo partial grants and leave the queue, even when cancelled mid-flight:
            # abandon() only queues commands, behind the acquire on each connection.
            backend.abandon(name, lease_id)
            raise

    # extend, release
    async def extend(self, lease: Lease, ttl: float = 10.0) -> Lease:
        """Push the lease's expiry to ``ttl`` seconds from now.

        Raises:
            LeaseLost: the lease expired or another lease holds the lock; an
                expired lock is never silently re-acquired.
            QuorumUnavailable: a majority of nodes could not answer (the lease
                is still valid until its old ``valid_until``).
        """
        ttl = validate_ttl(ttl, self.min_ttl, self.max_ttl)
        if lease.expired:
            self.events.renewed("lost")
            self.events.lease_lost("expired")
            raise LeaseLost(lease.name, "it expired before the extend")
        try:
            valid_until, token = await self._backend.extend(
                lease.name, lease.lease_id, ttl, mode=lease.mode
            )
        except LeaseLost:
            self.events.renewed("lost")
            self.events.lease_lost("expired")
            raise
        except QuorumUnavailable:
            self.events.renewed("error")
            self.events.quorum_failed("extend")
            raise
        self.events.renewed("ok")
        # A lease keeps the token it was granted; a bare handle learns it here.
        token = lease.token or token
        return replace(lease, token=token, valid_until=valid_until)

    @staticmethod
    def handle(name: str, lease_id: str, mode: str = EXCLUSIVE, permits: int = 0) -> Lease:
        """A lease known only by name and id (e.g. from an HTTP request).

        ``mode`` is ``"exclusive"``, ``"shared"`` or ``"semaphore"`` (with its
        ``permits``); it only labels the lease: extend and release find the
        lease by its id whatever its kind.

        ``extend`` of it returns the real token and deadline; its ``release`` always
        waits for the nodes' answer, since nothing local says it is still valid.
        """
        return handle_lease(name, lease_id, mode, permits)

    async def release(self, lease: Lease) -> None:
        """Release the lease; the release goes out even if this call is cancelled.

        A lease that is not held is refused, never released twice: a second
        release of a lease, a release of a handle whose lease the nodes no
        longer hold (e.g. a retried HTTP ``DELETE``) or of a lease that expired.
        Only the last is a *lost* lease (``events.lease_lost``): its holder held it
        past its validity; the others are ``released(..., "not_held")``.

        Raises:
            LeaseLost: the lease had expired, was released already, or another
                lease holds the lock.
        """
        if lease.lease_id in self._released:
            self.events.released(0.0, "not_held")
            raise LeaseLost(lease.name, "it was released already")
        expired = lease.expired
        # A valid lease of ours is held by a majority: no need to wait for the answer.
        confirm = expired or lease.issuer is not self
        try:
            released = await self._backend.release(lease.name, lease.lease_id, confirm=confirm)
        except QuorumUnavailable:
            self.events.quorum_failed("release")
            raise
        if expired:
            self.events.released(0.0, "expired")
            self.events.lease_lost("expired")
            raise LeaseLost(lease.name, "it had expired")
        if not released:
            self.events.released(0.0, "not_held")
            raise LeaseLost(
                lease.name, "it is not held (released already, expired, or another lease holds it)"
            )
        if lease.issuer is self:  # a handle's second release is answered by the nodes
            self._released[lease.lease_id] = None
            if len(self._released) > _RELEASED_MEMORY:
                self._released.popitem(last=False)
        self.events.released(0.0, "released")

    # reading
    async def _held_for(self, name: str) -> float:
        """Seconds until the holders of ``name`` are gone: the retry hint of a request
        refused behind queued waiters (0 when free, or when the nodes cannot say)."""
        try:
            info = await self._backend.inspect(name)
        except LockServiceError:
            return 0.0
        return info.ttl if info.held else 0.0

    async def inspect(self, name: str) -> LockInfo:
        """Whether ``name`` is held, by which token, for how long (never the lease_id)."""
        try:
            return await self._backend.inspect(validate_name(name))
        except QuorumUnavailable:
            self.events.quorum_failed("inspect")
            raise

    async def issued(self, name: str) -> int:
        """An upper bound of every token issued for ``name`` (forged-token guard)."""
        try:
            return await self._backend.issued(validate_name(name))
        except QuorumUnavailable:
            self.events.quorum_failed("inspect")
            raise

    async def ready(self) -> Readiness:
        """Whether a lock could be granted now; if not, why (readiness)."""
        return await self._backend.ready()

    @asynccontextmanager
    async def lock(
        self,
        name: str,
        ttl: float = 10.0,
        wait: float = 0.0,
        *,
        auto_renew: bool = False,
        mode: str = EXCLUSIVE,
    ) -> AsyncIterator[Lease]:
        """Hold ``name`` for the body; with ``auto_renew`` a watchdog extends it every ttl/3.

        If the watchdog learns the lease is lost, the body is cancelled and
        ``LeaseLost`` is raised from the ``async with``: the holder always
        learns it no longer holds the lock.
        """
        lease = await self.acquire(name, ttl=ttl, wait=wait, mode=mode)
        async with self._hold(lease, ttl, auto_renew) as held:
            yield held

    @asynccontextmanager
    async def _hold(self, lease: Lease, ttl: float, auto_renew: bool) -> AsyncIterator[Lease]:
        renewal = (
            Renewal(
                lease,
                ttl,
                self.extend,
                lost=(LeaseLost,),
                transient=(QuorumUnavailable,),
                lose=lambda lease, reason: LeaseLost(lease.name, reason),
                on_lost=self.events.lease_lost,  # only when retries ran out
            )
            if auto_renew
            else None
        )
        async with hold(
            lease, renewal, self.release, release_errors=(LeaseLost, QuorumUnavailable)
        ) as held:
            yield held
