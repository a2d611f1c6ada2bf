"""Per-name FIFO turns inside one process, and the accounting of time spent waiting.

Within one process, tasks contend for a name one at a time in arrival order,
so fifty local waiters cost Redis one contender, and a task that releases and
re-acquires at once queues behind those already waiting.
"""

from __future__ import annotations

import asyncio
import time
from typing import Final

from lockservice.events import ContentionObserver, LockEvents

__all__ = ["TRY_GRACE", "Turn", "Turns", "Wait"]

TRY_GRACE: Final = 0.25
"""How long a task waits for the local tries ahead of it, even with no wait of its own.

A turn ahead that is trying (a round trip) is not a held lock: compatible requests
sent together (shared leases, a semaphore's permits) each get theirs, one try after
the other, where failing them at once would refuse a lease that was free. A turn
whose holder waits for the lock (between tries) ends a task's wait at its deadline."""


class Turn:
    """One name's turn: one local task at a time contends in the backend.

    The lock exists only once a second task asks for the name while the first
    holds the turn: the first takes a free name's turn without a lock, as most
    acquires do, and the second makes the lock, taken in the first's place, to
    queue on (``Turns.wait``). While the turn is in use (``users``) every later
    task queues on that lock, in arrival order.
    """

    __slots__ = ("lock", "sleeping", "users")

    def __init__(self) -> None:
        self.lock: asyncio.Lock | None = None
        self.sleeping = False  # its holder waits for the lock between tries
        self.users = 0

    def release(self) -> None:
        """End the holder's turn: the next queued task's, if any."""
        if self.lock is not None:  # made while the holder held it: the holder's
            self.lock.release()


class Turns:
    """The turns of the names some local task is acquiring; forgotten when unused."""

    def __init__(self) -> None:
        self._turns: dict[str, Turn] = {}

    def join(self, name: str) -> Turn:
        """Count a task in the turn of ``name``; a turn with one user (``users == 1``)
        is that task's at once, with no lock to take."""
        turn = self._turns.get(name)
        if turn is None:
            turn = self._turns[name] = Turn()
        turn.users += 1
        return turn

    @staticmethod
    async def wait(turn: Turn, deadline: float) -> None:
        """Queue for a turn that another task holds or is queued for (``users > 1``),
        until loop time ``deadline``, or ``TRY_GRACE`` from now if that is later and
        the holder is trying, not waiting for the lock. Raises ``TimeoutError``."""
        loop = asyncio.get_running_loop()
        at = deadline if turn.sleeping else max(deadline, loop.time() + TRY_GRACE)
        async with asyncio.timeout_at(at):
            lock = turn.lock
            if lock is None:
                # Held by the task that took it free, without a lock: take the new lock
                # in its place (a free asyncio.Lock is taken without suspending), so that
                # its ``Turn.release`` hands the turn to the tasks queued from now on.
                lock = turn.lock = asyncio.Lock()
                await lock.acquire()
            await lock.acquire()

    def leave(self, name: str, turn: Turn) -> None:
        turn.users -= 1
        if turn.users == 0 and self._turns.get(name) is turn:
            del self._turns[name]


class Wait:
    """One acquire's time spent waiting, reported once to metrics and the observer."""

    __slots__ = ("active", "events", "kind", "name", "observer", "start")

    def __init__(
        self,
        events: LockEvents,
        observer: ContentionObserver | None,
        name: str,
        start: float,
        kind: str = "exclusive",
    ) -> None:
        self.events = events
        self.kind = kind
        self.observer = observer
        self.name = name
        self.start = start  # time.perf_counter()
        self.active = False

    def begin(self) -> None:
        if not self.active:
            self.active = True
            self.events.waiting(+1, kind=self.kind)
            if self.observer is not None:
                self.observer.started_waiting(self.name)

    def end(self, *, timed_out: bool) -> None:
        if self.active:
            self.active = False
            self.events.waiting(-1, kind=self.kind)
            if self.observer is not None:
                self.observer.stopped_waiting(self.name)
                waited = time.perf_counter() - self.start
                self.observer.record(self.name, waited, timed_out=timed_out)
