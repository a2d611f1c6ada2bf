"""In-process fan-out of release notifications to the tasks waiting on a name.

One subscription per node per process feeds ``wake``; a release wakes only
the waiters of that name. A waiter registers *before* it tries the lock, so a
release that lands between its failed try and its sleep still wakes it.
"""

from __future__ import annotations

import asyncio

__all__ = ["Waiters"]


class Waiters:
    """Futures of tasks waiting for a name to be released, by name."""

    def __init__(self) -> None:
        self._by_name: dict[str, set[asyncio.Future[None]]] = {}

    def register(self, name: str) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._by_name.setdefault(name, set()).add(fut)
        return fut

    def unregister(self, name: str, fut: asyncio.Future[None]) -> None:
        waiting = self._by_name.get(name)
        if waiting is not None:
            waiting.discard(fut)
            if not waiting:
                del self._by_name[name]
        if not fut.done():
            fut.cancel()

    def wake(self, name: str) -> None:
        for fut in self._by_name.get(name, ()):
            if not fut.done():
                fut.set_result(None)

    def __len__(self) -> int:
        return len(self._by_name)
