"""Cutting a request short: its task cancelled for one reason, and taken back.

A request's ``Cut`` fires on its deadline (``request_timeout_ms``, one loop
timer), or, for an acquire in flight (``Acquires``), when draining begins or its
client goes away. The guard (``gateway.guard``) then answers for the reason:
503 ``request_timeout``, 503 ``shutting_down`` or 499.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

from aiohttp import web

__all__ = ["CLIENT_CHECK_S", "Acquires", "Cut"]

CLIENT_CHECK_S: Final = 0.05
"""How often the clients of running acquires are looked at (still connected?)."""


class Cut:
    """A cancellation of a request's task for one reason, that can be taken back.

    ``asyncio.timeout`` for one request at the cost of one loop timer (``at``
    seconds), and the drain's or the client watch's cut at no cost until it
    fires. The first reason to fire is the one (``reason``); ``take_back`` (once)
    stops the timer and says whether a ``CancelledError`` is this cut's alone (no
    other cancellation pending), as ``asyncio.timeout`` decides it, whose Python
    context manager costs several times the timer.
    """

    DEADLINE: Final = "deadline"
    DRAIN: Final = "drain"
    GONE: Final = "gone"

    __slots__ = ("_cancelling", "_handle", "_taken", "_task", "reason")

    def __init__(self, task: asyncio.Task[Any], at: float | None = None) -> None:
        self._task = task
        self._cancelling = task.cancelling()
        self._taken = False
        self.reason: str | None = None
        self._handle = None if at is None else asyncio.get_running_loop().call_later(at, self.fire)

    def fire(self, reason: str = DEADLINE) -> None:
        if self.reason is None:
            self.reason = reason
            self._task.cancel()

    def take_back(self) -> bool:
        """Stop the timer; True if the cut fired and its cancellation is the only one."""
        if self._handle is not None:
            self._handle.cancel()
        if self.reason is None or self._taken:
            return False
        self._taken = True
        return self._task.uncancel() <= self._cancelling


class Acquires:
    """The acquires in flight: ``drain`` cuts them all, and one that lost its client is cut.

    aiohttp does not cancel a handler when its client goes away (its server's
    ``handler_cancellation`` is off: a store write is never cut half-way by a
    disconnect). A waiting acquire must be, or the next release hands the lock
    to nobody; aiohttp has no public hook for the close, so the transports are
    looked at every ``CLIENT_CHECK_S`` by one timer for all acquires, armed only
    while one runs.
    """

    def __init__(self, every: float = CLIENT_CHECK_S) -> None:
        self._every = every
        self._running: dict[Cut, web.BaseRequest] = {}
        self._timer: asyncio.TimerHandle | None = None

    def add(self, cut: Cut, request: web.BaseRequest) -> None:
        self._running[cut] = request
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._every, self._check)

    def discard(self, cut: Cut) -> None:
        self._running.pop(cut, None)  # the timer, if armed, is not re-armed when none is left

    def drain(self) -> None:
        for cut in list(self._running):
            cut.fire(Cut.DRAIN)

    def _check(self) -> None:
        self._timer = None
        for cut, request in list(self._running.items()):
            transport = request.transport
            if transport is None or transport.is_closing():
                cut.fire(Cut.GONE)
        if self._running:
            self._timer = asyncio.get_running_loop().call_later(self._every, self._check)

    def __len__(self) -> int:
        return len(self._running)
