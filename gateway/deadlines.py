"""The deadlines of an app's requests (``request_timeout_ms``) on one loop timer for all.

Every request gets the same timeout, so the deadlines come in the order the
requests do: a queue, oldest first, and one timer armed for the oldest deadline
not yet met cut the requests in time, where a timer per request would be started
and stopped for each (a libuv timer and its handle, the dearest part of a request's
``Cut``). A request that ends marks its place done; done places are dropped from
the front as they come, and all at once when they pile up behind a long request.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, Final

from gateway.cuts import Cut

__all__ = ["Deadlines"]

_RESOLUTION: Final = 0.001
"""A deadline this close is due: loop timers have millisecond steps (uvloop's, libuv's)."""
_COMPACT_AT: Final = 1024
"""Done places kept behind a running request before the queue is compacted."""


class Deadlines:
    """Cut each request added (``add``) ``timeout`` seconds after, unless it is ``done``."""

    def __init__(self, timeout: float) -> None:
        self._timeout = timeout
        self._queue: deque[list[Any]] = deque()  # [deadline, cut, or None once done]
        self._done = 0  # done places still in the queue
        self._timer: asyncio.TimerHandle | None = None

    def add(self, cut: Cut) -> list[Any]:
        """Fire ``cut`` (``Cut.DEADLINE``) at the timeout; returns its place, for ``done``."""
        loop = asyncio.get_running_loop()
        at = loop.time() + self._timeout
        place: list[Any] = [at, cut]
        self._queue.append(place)
        if self._timer is None:
            self._timer = loop.call_at(at, self._expire)
        return place

    def done(self, place: list[Any]) -> None:
        """The request of ``place`` ended: its cut no longer fires (before ``Cut.take_back``)."""
        if place[1] is None:
            return  # it fired, and left the queue then
        place[1] = None
        queue = self._queue
        if queue[0] is place:
            queue.popleft()
            while queue and queue[0][1] is None:
                queue.popleft()
                self._done -= 1
        else:
            self._done += 1
            if self._done >= _COMPACT_AT and self._done * 2 > len(queue):
                self._queue = deque(p for p in queue if p[1] is not None)
                self._done = 0

    def _expire(self) -> None:
        self._timer = None
        queue = self._queue
        loop = asyncio.get_running_loop()
        due = loop.time() + _RESOLUTION
        while queue and (queue[0][1] is None or queue[0][0] <= due):
            place = queue.popleft()
            cut, place[1] = place[1], None
            if cut is None:
                self._done -= 1
            else:
                cut.fire(Cut.DEADLINE)
        if queue:
            self._timer = loop.call_at(queue[0][0], self._expire)

    def __len__(self) -> int:
        """The requests running (added, not done)."""
        return len(self._queue) - self._done
