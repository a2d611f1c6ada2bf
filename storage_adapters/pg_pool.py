"""A lean asyncpg connection pool for the PostgreSQL stores.

asyncpg's own pool costs about a tenth of the gateway's CPU per fenced PUT:
every ``acquire(timeout=...)`` goes through ``wait_for``, ``asyncio.timeout``
and ``Queue.get``, and every release through ``asyncio.shield`` (a Task), while
the statement itself is one ``fetchrow``. Here the common case is a deque pop
to acquire and a deque append (or a hand-over to the oldest waiter) to release:
no task, no timer, no future. Only a caller that must wait gets a future;
waiters are served first come, first served, and one timer, armed for the
earliest deadline of those waiting, fails each whose ``acquire_timeout``
passed (not a timer per waiter: under load nearly every acquire waits).

A connection released after its block raised is kept only when it is open,
not in a transaction, and ``reusable_after`` the error (by default: one the
server answered); otherwise it is terminated and its slot freed. Idle connections above
``min_size`` close after ``max_idle`` seconds, checked by one timer armed only
while there are more than ``min_size``. While fewer than ``min_size`` are open
one task restores the floor, retrying with a backoff and logging each failure
as "Failed to restore the pool connection floor" (``_pg.RECONNECT_LOG`` turns
those into one line per reason).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Mapping
from typing import Final

import asyncpg

__all__ = ["PgPool", "PoolClosing"]

log = logging.getLogger(__name__)

MAX_IDLE: Final = 300.0  # seconds: asyncpg's default max_inactive_connection_lifetime


class PoolClosing(asyncpg.InterfaceError):  # type: ignore[misc]
    """The pool is closing: it hands out no more connections."""


def _server_answered(exc: BaseException) -> bool:
    """The default ``reusable_after``: an error the server sent (the session is in step)."""
    return isinstance(exc, asyncpg.PostgresError)


# uvloop rounds a timer to the ms and its clock moves in ms: a timer may run up to a
# ms before its deadline reads as passed, which must not re-arm it for "now" in a spin.
_SLACK: Final = 0.001
_Waiter = tuple[float, "asyncio.Future[asyncpg.Connection | None]"]  # (deadline, future)


class PgPool:
    """At most ``max_size`` connections open or opening, ``min_size`` kept open."""

    def __init__(
        self,
        dsn: str,
        *,
        min_size: int,
        max_size: int,
        acquire_timeout: float,
        connect_timeout: float,
        command_timeout: float | None,
        server_settings: Mapping[str, str],
        max_idle: float = MAX_IDLE,
        reusable_after: Callable[[BaseException], bool] = _server_answered,
    ) -> None:
        self._dsn = dsn
        self._min = min_size
        self._max = max_size
        self._timeout = acquire_timeout
        self._connect_timeout = connect_timeout
        self._command_timeout = command_timeout
        self._settings = dict(server_settings)
        self._max_idle = max_idle
        self._reusable_after = reusable_after
        self._idle: deque[tuple[float, asyncpg.Connection]] = deque()  # oldest release first
        self._waiters: deque[_Waiter] = deque()
        self._all: set[asyncpg.Connection] = set()  # open, idle or in use
        self._open = 0  # open or opening: never above max_size
        self._started = False  # the floor is restored only once start succeeded
        self._closing = False
        self._drained: asyncio.Future[None] | None = None
        self._sweep: asyncio.TimerHandle | None = None
        self._expiry: asyncio.TimerHandle | None = None  # armed while someone may wait
        self._floor: asyncio.Task[None] | None = None
        self._loop = asyncio.get_running_loop()

    @property
    def size(self) -> int:
        """Connections open or being opened."""
        return self._open

    @property
    def idle(self) -> int:
        return len(self._idle)

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @property
    def full(self) -> bool:
        """No idle connection and no room to open one: an ``acquire`` now would wait."""
        return not self._idle and self._open >= self._max

    async def start(self) -> None:
        """Open ``min_size`` connections: the first alone, so that its error is the one seen."""
        try:
            for count in (1, self._min - 1) if self._min else ():
                self._open += max(count, 0)
                opened = await asyncio.gather(*(self._connect(None) for _ in range(count)))
                self._idle.extend((self._loop.time(), conn) for conn in opened)
        except BaseException:
            self.terminate()
            raise
        self._started = True

    async def acquire(self) -> asyncpg.Connection:
        """An idle connection if there is one, else a new one, else the next one released."""
        deadline = None
        while not self._closing:
            idle = self._idle
            while idle:
                conn = idle.pop()[1]
                if not conn.is_closed():
                    return conn
                self._drop(conn)
            if deadline is None:
                deadline = self._loop.time() + self._timeout
            if self._open < self._max:
                self._open += 1
                return await self._connect(deadline)
            fut: asyncio.Future[asyncpg.Connection | None] = self._loop.create_future()
            waiter = (deadline, fut)
            self._waiters.append(waiter)
            if self._expiry is None:
                self._expiry = self._loop.call_at(deadline, self._expire)
            try:  # until the next connection released or slot freed (None), or the deadline
                conn = await fut
            except BaseException:
                self._forget(waiter)
                raise
            if conn is None:  # a freed slot was handed over: open in it
                return await self._connect(deadline)
            if not conn.is_closed():
                return conn
            self._drop(conn)
        raise PoolClosing("the pool is closing")

    def release(self, conn: asyncpg.Connection, exc: BaseException | None = None) -> None:
        """Give ``conn`` to the oldest waiter or back to idle; ``exc`` is what its block raised."""
        if conn.is_in_transaction() or (
            exc is not None and (conn.is_closed() or not self._reusable_after(exc))
        ):
            self._drop(conn)
            return
        waiters = self._waiters
        while waiters:
            fut = waiters.popleft()[1]
            if not fut.done():
                fut.set_result(conn)
                return
        if self._drained is not None and self._drained.done():  # closed: nothing to keep
            self._drop(conn)
            return
        self._idle.append((self._loop.time(), conn))
        if self._drained is not None:
            self._check_drained()

    async def close(self, grace: float = 10.0) -> bool:
        """Hand out no more; wait up to ``grace`` s for connections in use, then close all.

        False when some were still in use after ``grace`` (they are terminated).
        """
        if self._closing:
            return True
        self._closing = True  # the floor task stops; terminate() below cancels it
        while self._waiters:
            fut = self._waiters.popleft()[1]
            if not fut.done():
                fut.set_exception(PoolClosing("the pool is closing"))
        self._drained = self._loop.create_future()
        self._check_drained()
        try:
            async with asyncio.timeout(grace):
                await asyncio.shield(self._drained)
                idle = [conn for _, conn in self._idle]
                self._idle.clear()
                await asyncio.gather(*(conn.close() for conn in idle), return_exceptions=True)
        except TimeoutError:
            return False
        finally:
            self.terminate()
        return True

    def terminate(self) -> None:
        """Terminate every connection at once (in use or not) and hand out no more."""
        self._closing, self._started = True, False
        if self._floor is not None:
            self._floor.cancel()
        for timer in (self._sweep, self._expiry):
            if timer is not None:
                timer.cancel()
        self._sweep = self._expiry = None
        for conn in list(self._all):
            conn.terminate()
        self._all.clear()
        self._idle.clear()

    async def _connect(self, deadline: float | None) -> asyncpg.Connection:
        """Open a connection in a slot already counted in ``_open``; free the slot if it fails."""
        try:
            async with asyncio.timeout_at(deadline):
                conn = await asyncpg.connect(
                    self._dsn,
                    timeout=self._connect_timeout,
                    command_timeout=self._command_timeout,
                    server_settings=self._settings,
                )
        except BaseException:
            self._open -= 1
            self._slot_freed()
            raise
        self._all.add(conn)
        if self._closing:
            self._drop(conn)
            raise PoolClosing("the pool is closing")
        if self._open > self._min and self._sweep is None:
            self._sweep = self._loop.call_later(self._max_idle, self._shrink)
        return conn

    def _expire(self) -> None:
        """Fail the waiters whose deadline passed; re-arm for the earliest one left."""
        self._expiry = None
        now = self._loop.time() + _SLACK
        left: deque[_Waiter] = deque()
        for deadline, fut in self._waiters:
            if fut.done():
                continue
            if deadline <= now:
                fut.set_exception(TimeoutError())
            else:
                left.append((deadline, fut))
        self._waiters = left
        if left:
            self._expiry = self._loop.call_at(min(d for d, _ in left), self._expire)

    def _forget(self, waiter: _Waiter) -> None:
        """A waiter gave up: pass on whatever was handed to it in the same moment."""
        fut = waiter[1]
        if not fut.done() or fut.cancelled() or fut.exception() is not None:
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)
            return
        conn = fut.result()
        if conn is None:
            self._open -= 1
            self._slot_freed()
        else:
            self.release(conn)

    def _drop(self, conn: asyncpg.Connection) -> None:
        """Terminate ``conn`` and free its slot."""
        conn.terminate()
        self._all.discard(conn)
        self._open -= 1
        self._slot_freed()

    def _slot_freed(self) -> None:
        """The oldest waiter may open a connection in the freed slot; else restore the floor."""
        waiters = self._waiters
        while waiters and not self._closing:
            fut = waiters.popleft()[1]
            if not fut.done():
                self._open += 1
                fut.set_result(None)
                return
        if self._drained is not None:
            self._check_drained()
        elif self._open < self._min and self._floor is None and self._started:
            self._floor = self._loop.create_task(self._restore_floor())

    def _check_drained(self) -> None:
        if self._open == len(self._idle) and self._drained and not self._drained.done():
            self._drained.set_result(None)

    async def _restore_floor(self) -> None:
        """Open connections until ``min_size`` are open, retrying with a backoff up to 60 s."""
        delay = 1.0
        try:
            while not self._closing and self._open < self._min:
                self._open += 1
                try:
                    conn = await self._connect(None)
                except Exception:
                    if self._closing:
                        return
                    log.warning(
                        "Failed to restore the pool connection floor; retrying", exc_info=True
                    )
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 60.0)
                    continue
                delay = 1.0
                self.release(conn)
        finally:
            self._floor = None

    def _shrink(self) -> None:
        """Close connections above ``min_size`` idle for ``max_idle`` s; re-arm while above."""
        self._sweep = None
        now = self._loop.time()
        idle = self._idle
        while idle and self._open > self._min and idle[0][0] <= now - self._max_idle:
            self._drop(idle.popleft()[1])
        if self._open > self._min and not self._closing:
            due = idle[0][0] + self._max_idle - now if idle else self._max_idle
            self._sweep = self._loop.call_later(due, self._shrink)
