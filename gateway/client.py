"""An async Python client for the fencegate HTTP API.

::

    async with FencegateClient("http://127.0.0.1:8080", api_key=key) as fg:
        async with fg.lock("orders/42", ttl=10.0, wait=5.0) as lease:
            body, _ = await fg.get("kv", "orders/42", token=lease.token)   # fenced read
            await fg.put("kv", "orders/42", update(body), token=lease.token)

``lock()`` renews the lease every ttl/3 through the renew route. If a renew
learns the lease is gone, the body is cancelled and ``LeaseLost`` is raised
from the ``async with``: the holder always learns it lost the lock, and a
write it still sends carries a token storage will refuse.

Every refusal raises a ``FencegateError`` subclass named for its API code
(``LockHeld``, ``StaleToken``, ...); a gateway that cannot be reached raises
``GatewayUnavailable``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any, Self

import aiohttp
from yarl import URL

from gateway._client_base import (
    BadRequest,
    BadToken,
    FencegateError,
    Forbidden,
    GatewayUnavailable,
    Lease,
    LeaseLost,
    LockHeld,
    LockStatus,
    NotFound,
    PermitsMismatch,
    QuorumUnavailable,
    RequestTimeout,
    ShuttingDown,
    SslOption,
    StaleToken,
    StorageConfig,
    StorageCorrupt,
    StorageUnavailable,
    TokenNotIssued,
    TokenRequired,
    TooLarge,
    Unauthorized,
    UnknownStore,
    acquire_path,
    acquire_semaphore_path,
    check_base_url,
    error_from,
    fence_headers,
    idempotency_headers,
    lease_from,
    lease_path,
    lock_path,
    ms,
    ssl_context,
    status_from,
    store_path,
)
from gateway.sync_client import SyncFencegateClient
from lockservice.renew import Renewal, hold

__all__ = [
    "BadRequest",
    "BadToken",
    "FencegateClient",
    "FencegateError",
    "Forbidden",
    "GatewayUnavailable",
    "Lease",
    "LeaseLost",
    "LockHeld",
    "LockStatus",
    "NotFound",
    "PermitsMismatch",
    "QuorumUnavailable",
    "RequestTimeout",
    "ShuttingDown",
    "SslOption",
    "StaleToken",
    "StorageConfig",
    "StorageCorrupt",
    "StorageUnavailable",
    "SyncFencegateClient",
    "TokenNotIssued",
    "TokenRequired",
    "TooLarge",
    "Unauthorized",
    "UnknownStore",
]

log = logging.getLogger(__name__)


class FencegateClient:
    """The HTTP API over one ``aiohttp.ClientSession`` (created on first use).

    Args:
        base_url: ``http://host:port`` or ``https://host:port`` of a gateway.
        api_key: sent as ``Authorization: Bearer <key>``.
        timeout: seconds one call may take, on top of an acquire's ``wait``.
        ssl: for https: an ``ssl.SSLContext``, the path of a CA file to trust
            (a private CA), False to skip verification, or None for the system's
            trust store.
    Raises:
        ValueError: ``base_url`` has no http/https scheme, or the CA file is unusable.
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float = 30.0,
        ssl: SslOption = None,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        self.base_url = check_base_url(base_url)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = timeout
        context = ssl_context(ssl)
        self._ssl: Any = False if ssl is False else (context if context is not None else True)
        self._session = session
        self._own_session = session is None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None and self._own_session:
            await self._session.close()
        self._session = None

    # locks
    async def acquire(
        self,
        name: str,
        ttl: float = 10.0,
        wait: float = 0.0,
        *,
        mode: str = "exclusive",
        idempotency_key: str | None = None,
    ) -> Lease:
        """Take ``name`` for ``ttl`` seconds, waiting up to ``wait``.

        Args:
            mode: ``"exclusive"`` (a new, larger token) or ``"shared"`` (with
                other shared leases; the newest token issued for the name).
            idempotency_key: sent as ``Idempotency-Key``: a repeated acquire with
                the same key returns the same lease while it is held, so this call
                retries once by itself when the gateway could not be reached or its
                answer was lost (``GatewayUnavailable``).
        Raises:
            LockHeld: still held when ``wait`` ran out (``.retry_after``).
            GatewayUnavailable: unreachable (twice, with ``idempotency_key``).
            ValueError: the name's last segment is ``renew``.
        """
        body: dict[str, object] = {"ttl_ms": ms(ttl), "wait_ms": ms(wait)}
        if mode != "exclusive":  # the default: a gateway without lock kinds takes the body
            body["mode"] = mode
        return await self._acquire(acquire_path(name), body, wait, idempotency_key)

    async def acquire_semaphore(
        self,
        name: str,
        permits: int,
        ttl: float = 10.0,
        wait: float = 0.0,
        *,
        idempotency_key: str | None = None,
    ) -> Lease:
        """Take one of ``permits`` leases of the semaphore ``name``, waiting up to ``wait``.

        ``extend``, ``release`` and ``lock``'s renewals work on the returned lease.

        Raises:
            LockHeld: ``permits`` leases (or a lock) still held it when ``wait`` ran out.
            PermitsMismatch: its holders use another number of permits (``.permits``).
            ValueError: the name's last segment is ``renew``.
        """
        body = {"permits": permits, "ttl_ms": ms(ttl), "wait_ms": ms(wait)}
        path = acquire_semaphore_path(name)
        return await self._acquire(path, body, wait, idempotency_key, semaphore=True)

    async def _acquire(
        self,
        path: str,
        body: Mapping[str, object],
        wait: float,
        key: str | None,
        *,
        semaphore: bool = False,
    ) -> Lease:
        headers = idempotency_headers(key)
        for attempt in (1, 2):
            started = time.monotonic()
            try:
                data = await self._json("POST", path, body=body, extra=wait, headers=headers)
            except GatewayUnavailable as exc:
                if key is None or attempt == 2:
                    raise
                log.info("acquire %s: %s; retrying with its Idempotency-Key", path, exc)
                continue
            return lease_from(data, started, semaphore=semaphore)
        raise AssertionError("unreachable")  # pragma: no cover

    async def extend(self, lease: Lease, ttl: float = 10.0) -> Lease:
        """Extend ``lease`` to ``ttl`` seconds from now (``POST .../renew``).

        Raises:
            LeaseLost: it expired or another lease holds the lock.
        """
        started = time.monotonic()
        body = {"lease_id": lease.lease_id, "ttl_ms": ms(ttl)}
        data = await self._json("POST", lease_path(lease) + "/renew", body=body)
        return lease_from(data, started, lease)

    renew = extend
    """The HTTP route's name for ``extend``."""

    async def release(self, lease: Lease) -> None:
        """Release ``lease``.

        Raises:
            LeaseLost: it had expired (or another lease holds the lock).
        """
        await self._call("DELETE", lease_path(lease), headers={"X-Lease-Id": lease.lease_id})

    async def inspect(self, name: str) -> LockStatus:
        """Whether ``name`` is held, in which mode, by how many leases, its token, time left."""
        return status_from(await self._json("GET", lock_path(name)))

    status = inspect
    """The CLI's name for ``inspect``."""

    @asynccontextmanager
    async def lock(
        self,
        name: str,
        ttl: float = 10.0,
        wait: float = 0.0,
        *,
        auto_renew: bool = True,
        mode: str = "exclusive",
        idempotency_key: str | None = None,
    ) -> AsyncIterator[Lease]:
        """Hold ``name`` for the body, renewing every ttl/3 (``auto_renew``); release after.

        Raises:
            LeaseLost: a renew found the lease gone (the body was cancelled).
        """
        lease = await self.acquire(
            name, ttl=ttl, wait=wait, mode=mode, idempotency_key=idempotency_key
        )
        async with self._held(lease, ttl, auto_renew) as held:
            yield held

    @asynccontextmanager
    async def semaphore(
        self,
        name: str,
        permits: int,
        ttl: float = 10.0,
        wait: float = 0.0,
        *,
        auto_renew: bool = True,
        idempotency_key: str | None = None,
    ) -> AsyncIterator[Lease]:
        """Hold one of ``permits`` leases of ``name`` for the body, as ``lock()`` does."""
        lease = await self.acquire_semaphore(
            name, permits, ttl=ttl, wait=wait, idempotency_key=idempotency_key
        )
        async with self._held(lease, ttl, auto_renew) as held:
            yield held

    @asynccontextmanager
    async def _held(self, lease: Lease, ttl: float, auto_renew: bool) -> AsyncIterator[Lease]:
        renewal = (
            Renewal(
                lease,
                ttl,
                self.extend,  # type: ignore[arg-type]  # only ever given our Lease subclass
                lost=(LeaseLost,),
                transient=(FencegateError,),  # unreachable, no quorum: retry while valid
                lose=lambda lease, reason: LeaseLost("lease_lost", 409, reason),
            )
            if auto_renew
            else None
        )
        release = self.release
        async with hold(lease, renewal, release, release_errors=(FencegateError,)):  # type: ignore[arg-type]
            yield lease

    # stores
    async def put(
        self,
        store: str,
        key: str,
        body: bytes | str,
        *,
        token: int | None,
        lock: str | None = None,
        content_type: str | None = None,
    ) -> int | None:
        """Write ``body`` at ``key`` with ``token``; return the token stored.

        Raises:
            StaleToken: a newer token was seen for the fence lock; nothing was written.
        """
        data = body.encode() if isinstance(body, str) else body
        headers = fence_headers(token, lock)
        headers["Content-Type"] = content_type or (
            "text/plain; charset=utf-8" if isinstance(body, str) else "application/octet-stream"
        )
        reply = await self._json("PUT", store_path(store, key), data=data, headers=headers)
        token_back: int | None = reply["token"]
        return token_back

    async def get(
        self, store: str, key: str, *, token: int | None = None, lock: str | None = None
    ) -> tuple[bytes, int | None]:
        """Read ``key``: its body and the token of its last write; with ``token``, fenced.

        Raises:
            NotFound: no such key.
        """
        _, headers, body = await self._call(
            "GET", store_path(store, key), headers=fence_headers(token, lock)
        )
        stored = headers.get("X-Fencing-Token")
        return body, int(stored) if stored is not None else None

    async def delete(
        self, store: str, key: str, *, token: int | None, lock: str | None = None
    ) -> None:
        await self._call("DELETE", store_path(store, key), headers=fence_headers(token, lock))

    # transport
    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession()
            self._own_session = True
        return self._session

    async def _json(
        self,
        method: str,
        path: str,
        *,
        body: object = None,
        data: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        extra: float = 0.0,
    ) -> dict[str, Any]:
        if body is not None:
            data = json.dumps(body).encode()
            headers = {**(headers or {}), "Content-Type": "application/json"}
        _, _, raw = await self._call(method, path, data=data, headers=headers, extra=extra)
        reply: dict[str, Any] = json.loads(raw)
        return reply

    async def _call(
        self,
        method: str,
        path: str,
        *,
        data: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        extra: float = 0.0,
    ) -> tuple[int, Mapping[str, str], bytes]:
        url = URL(self.base_url + path, encoded=True)
        timeout = aiohttp.ClientTimeout(total=self._timeout + extra)
        try:
            async with self._client().request(
                method,
                url,
                data=data,
                headers={**self._headers, **(headers or {})},
                timeout=timeout,
                ssl=self._ssl,
            ) as response:
                raw = await response.read()
                status, reply_headers = response.status, response.headers
        except (aiohttp.ClientError, TimeoutError) as exc:
            reason = str(exc) or type(exc).__name__
            raise GatewayUnavailable(
                "gateway_unavailable", 0, f"{self.base_url}: {reason}"
            ) from exc
        if status >= 400:
            raise error_from(status, raw)
        return status, reply_headers, raw
