"""In-process fan-out of release notifications to the tasks waiting on a name.

One subscription per node per process feeds ``wake``; a release wakes only
the waiters of that name, and when the release names the next queued waiter,
only that waiter. A release is published on every node, so repeats of the
same release are dropped. A waiter registers *before* it tries the lock, so a
release that lands between its failed try and its sleep still wakes it.
"""

from __future__ import annotations

import asyncio

__all__ = ["Waiters"]


class Waiters:
    """Futures of tasks waiting for a name to be released, by name and lease id."""

    def __init__(self) -> None:
        self._by_name: dict[str, dict[str, asyncio.Future[None]]] = {}
        self._last_release: dict[str, str] = {}

    def register(self, name: str, lease_id: str) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._by_name.setdefault(name, {})[lease_id] = fut
        return fut

    def unregister(self, name: str, lease_id: str) -> None:
        waiting = self._by_name.get(name)
        if waiting is None:
            return
        fut = waiting.pop(lease_id, None)
        if fut is not None and not fut.done():
            fut.cancel()
        if not waiting:
            del self._by_name[name]
            self._last_release.pop(name, None)

    def wake(self, name: str, released: str = "", head: str = "") -> None:
        """A lease on ``name`` was released; ``head`` is the next queued waiter, if known."""
        waiting = self._by_name.get(name)
        if not waiting:
            return
        if released:
            if self._last_release.get(name) == released:
                return  # the same release, published by another node
            self._last_release[name] = released
        if head:
            fut = waiting.get(head)
            if fut is not None and not fut.done():
                fut.set_result(None)
            return
        for fut in waiting.values():
            if not fut.done():
                fut.set_result(None)

    def wake_from_message(self, payload: bytes) -> None:
        """Handle a ``name\\nreleased lease\\nnext waiter`` message of the release channel."""
        parts = payload.decode(errors="replace").split("\n")
        if len(parts) == 3:
            self.wake(parts[0], parts[1], parts[2])
        else:
            self.wake(parts[0])

    def __len__(self) -> int:
        return len(self._by_name)
