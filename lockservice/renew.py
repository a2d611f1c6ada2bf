"""The auto-renew watchdog: extend a lease every ttl/3 while its holder works.

A watchdog that swallows errors lets a holder run on without its lock. This
one reports: when the lease is lost it cancels the holder's task, and the
``async with`` then raises the loss in place of that cancellation. It serves
``LockManager.lock`` and the HTTP client (``gateway.client``) alike: both pass
their own ``extend`` and error types.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from types import TracebackType

from lockservice.lease import Lease

__all__ = ["Renewal", "hold"]

log = logging.getLogger(__name__)


class Renewal:
    """Keeps ``lease`` alive for the body of an ``async with``.

    Args:
        lease: the lease to keep; ``self.lease`` is the latest extended one.
        ttl: each extend asks for this many seconds.
        extend: ``extend(lease, ttl) -> lease``.
        lost: the exception types that mean the lease is gone for good.
        transient: the types worth retrying while the lease is still valid.
        lose: builds the loss to raise when retries ran out (lease, reason).
        on_lost: told when the lease ran out while renewals failed (metrics).
    """

    def __init__(
        self,
        lease: Lease,
        ttl: float,
        extend: Callable[[Lease, float], Awaitable[Lease]],
        *,
        lost: tuple[type[BaseException], ...],
        transient: tuple[type[BaseException], ...],
        lose: Callable[[Lease, str], BaseException],
        on_lost: Callable[[str], None] | None = None,
    ) -> None:
        self.lease = lease
        self._ttl = ttl
        self._extend = extend
        self._lost_types = lost
        self._transient_types = transient
        self._make_lost = lose
        self._on_lost = on_lost
        self.lost: BaseException | None = None
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
        retried: tuple[type[BaseException], ...] = (*self._transient_types, TimeoutError)
        while True:
            await asyncio.sleep(interval)
            # An extend that has not answered when the lease runs out is a loss then, not
            # when its own timeout ends (an HTTP client's may be far longer than the
            # lease): the holder must not work on past its validity.
            deadline = asyncio.timeout(max(self.lease.remaining(), 0.0))
            try:
                async with deadline:
                    self.lease = await self._extend(self.lease, self._ttl)
                interval = self._ttl / 3
            except self._lost_types as exc:
                self._lose(exc)  # extend reported it already
                return
            except retried as exc:
                if not deadline.expired() and not isinstance(exc, self._transient_types):
                    raise  # a TimeoutError of the extend's own making, not ours: not handled
                if self.lease.expired or deadline.expired():
                    if self._on_lost is not None:
                        self._on_lost("renew_failed")
                    reason = "no answer before the lease ran out" if deadline.expired() else exc
                    self._lose(self._make_lost(self.lease, f"renewal failed: {reason}"))
                    return
                log.warning("renewal of %r failed, retrying: %s", self.lease.name, exc)
                interval = min(self._ttl / 10, max(self.lease.remaining() / 2, 0.001))

    def _lose(self, exc: BaseException) -> None:
        self.lost = exc
        log.warning("%s; cancelling its holder", exc)
        if self._in_body and self._owner is not None and not self._owner.done():
            self._cancelled_owner = True
            self._owner.cancel(msg=str(exc))


@asynccontextmanager
async def hold(
    lease: Lease,
    renewal: Renewal | None,
    release: Callable[[Lease], Awaitable[None]],
    *,
    release_errors: tuple[type[BaseException], ...],
) -> AsyncIterator[Lease]:
    """The body of ``lock()``: keep ``lease`` (renewed by ``renewal``), then release it.

    The release runs even when the body is cancelled. When the body failed, a
    failed release is only logged (the lease will expire); when the watchdog
    found the lease lost, there is nothing left to release.
    """
    try:
        if renewal is None:
            yield lease
        else:
            async with renewal:
                yield lease
    except BaseException as exc:
        if renewal is None or renewal.lost is not exc:
            current = renewal.lease if renewal is not None else lease
            try:
                await asyncio.shield(release(current))
            except release_errors as error:
                log.warning("release of %r failed (it will expire): %s", current.name, error)
        raise
    await asyncio.shield(release(renewal.lease if renewal is not None else lease))
