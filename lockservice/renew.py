"""The auto-renew watchdog: extend a lease every ttl/3 while its holder works.

A watchdog that swallows errors lets a holder run on without its lock. This
one reports: when the lease is lost it cancels the holder's task, and the
``async with`` then raises ``LeaseLost`` in place of that cancellation.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from types import TracebackType
from typing import TYPE_CHECKING

from lockservice.errors import LeaseLost, QuorumUnavailable
from lockservice.lease import Lease

if TYPE_CHECKING:
    from lockservice.manager import LockManager

__all__ = ["Renewal"]

log = logging.getLogger(__name__)


class Renewal:
    """Keeps ``lease`` alive for the body of an ``async with``."""

    def __init__(self, manager: LockManager, lease: Lease, ttl: float) -> None:
        self._manager = manager
        self._ttl = ttl
        self.lease = lease
        self.lost: LeaseLost | None = None
        self._owner: asyncio.Task[object] | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._in_body = False
        self._cancelled_owner = False

    async def __aenter__(self) -> Renewal:
        self._owner = asyncio.current_task()
        self._in_body = True
        self._watchdog = asyncio.create_task(self._run(), name=f"fencegate-renew-{self.lease.name}")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        self._in_body = False
        assert self._watchdog is not None
        if not self._watchdog.done():
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog
        if self.lost is None:
            return False
        if self._cancelled_owner and self._owner is not None and self._owner.uncancel() > 0:
            return False  # someone else cancelled the holder too: let that win
        if exc_type is None or exc_type is asyncio.CancelledError:
            raise self.lost from None
        return False

    async def _run(self) -> None:
        # The grant may have used up part of the ttl: renew before a third of what is left.
        interval = min(self._ttl / 3, max(self.lease.remaining() / 3, 0.001))
        while True:
            await asyncio.sleep(interval)
            try:
                self.lease = await self._manager.extend(self.lease, self._ttl)
                interval = self._ttl / 3
            except LeaseLost as exc:
                self._lose(exc)
                return
            except QuorumUnavailable as exc:
                if self.lease.expired:
                    self._lose(LeaseLost(self.lease.name, f"renewal failed: {exc}"))
                    return
                log.warning("renewal of %r failed, retrying: %s", self.lease.name, exc)
                interval = min(self._ttl / 10, max(self.lease.remaining() / 2, 0.001))

    def _lose(self, exc: LeaseLost) -> None:
        self.lost = exc
        self._manager.events.lease_lost("renew_failed")
        log.warning("%s; cancelling its holder", exc)
        if self._in_body and self._owner is not None and not self._owner.done():
            self._cancelled_owner = True
            self._owner.cancel(msg=str(exc))
