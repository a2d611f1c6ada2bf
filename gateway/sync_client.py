"""A synchronous Python client for the fencegate HTTP API (no asyncio; standard library only).

::

    with SyncFencegateClient("http://127.0.0.1:8080", api_key=key) as fg:
        with fg.lock("orders/42", ttl=10.0, wait=5.0) as lease:
            body, _ = fg.get("kv", "orders/42", token=lease.token)   # fenced read
            fg.put("kv", "orders/42", update(body), token=lease.token)

The same methods as ``FencegateClient``, for WSGI apps, scripts and cron
jobs. One difference: a thread cannot be cancelled, so when ``lock()``'s
renewer learns the lease is gone it cannot stop the body; the loss is logged
at once and ``LeaseLost`` is raised when the body ends. Writes the body still
sends carry a token storage refuses once another holder has written.

Connections are kept alive per thread (``http.client``); the client may be
shared between threads.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import threading
import time
from collections.abc import Iterator, Mapping
from types import TracebackType
from typing import Any, Final, Self, cast
from urllib.parse import urlsplit

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

__all__ = [
    "BadRequest",
    "BadToken",
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

_IDLE_REOPEN: Final = 5.0
"""A kept-alive connection idle this long is replaced before a request that must not be
retried: the gateway may have closed it (keep-alive timeout) just as the request is sent."""


class _Connection:
    def __init__(self, conn: http.client.HTTPConnection) -> None:
        self.conn = conn
        self.used = time.monotonic()
        self.reused = False


class SyncFencegateClient:
    """The HTTP API with ``http.client``; arguments as for ``FencegateClient``.

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
    ) -> None:
        self.base_url = check_base_url(base_url)
        parts = urlsplit(self.base_url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port
        self._prefix = parts.path
        self._ssl = ssl_context(ssl)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = timeout
        self._local = threading.local()
        self._all: list[_Connection] = []
        self._all_lock = threading.Lock()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close every kept-alive connection (of all threads)."""
        with self._all_lock:
            conns, self._all = self._all, []
        for c in conns:
            c.conn.close()
        self._local = threading.local()

    # locks
    def acquire(
        self,
        name: str,
        ttl: float = 10.0,
        wait: float = 0.0,
        *,
        mode: str = "exclusive",
        idempotency_key: str | None = None,
    ) -> Lease:
        """Take ``name`` for ``ttl`` seconds, waiting up to ``wait`` (see ``FencegateClient``).

        With ``idempotency_key``, retried once when unreachable or its answer was lost.

        Raises:
            LockHeld: still held when ``wait`` ran out (``.retry_after``).
            ValueError: the name's last segment is ``renew``.
        """
        body: dict[str, object] = {"ttl_ms": ms(ttl), "wait_ms": ms(wait)}
        if mode != "exclusive":  # the default: a gateway without lock kinds takes the body
            body["mode"] = mode
        return self._acquire(acquire_path(name), body, wait, idempotency_key)

    def acquire_semaphore(
        self,
        name: str,
        permits: int,
        ttl: float = 10.0,
        wait: float = 0.0,
        *,
        idempotency_key: str | None = None,
    ) -> Lease:
        """Take one of ``permits`` leases of the semaphore ``name`` (see ``FencegateClient``).

        Raises:
            LockHeld: ``permits`` leases (or a lock) still held it when ``wait`` ran out.
            PermitsMismatch: its holders use another number of permits (``.permits``).
        """
        body = {"permits": permits, "ttl_ms": ms(ttl), "wait_ms": ms(wait)}
        path = acquire_semaphore_path(name)
        return self._acquire(path, body, wait, idempotency_key, semaphore=True)

    def _acquire(
        self,
        path: str,
        body: Mapping[str, object],
        wait: float,
        key: str | None,
        *,
        semaphore: bool = False,
    ) -> Lease:
        """One acquire; with an Idempotency-Key, retried once when unreachable (a lost answer)."""
        headers = idempotency_headers(key)
        for attempt in (1, 2):
            started = time.monotonic()
            try:
                data = self._json("POST", path, body=body, extra=wait, headers=headers)
            except GatewayUnavailable as exc:
                if key is None or attempt == 2:
                    raise
                log.info("acquire %s: %s; retrying with its Idempotency-Key", path, exc)
                continue
            return lease_from(data, started, semaphore=semaphore)
        raise AssertionError("unreachable")  # pragma: no cover

    def extend(self, lease: Lease, ttl: float = 10.0) -> Lease:
        """Extend ``lease`` to ``ttl`` seconds from now (``POST .../renew``).

        Raises:
            LeaseLost: it expired or another lease holds the lock.
        """
        return self._extend(lease, ttl)

    renew = extend

    def _extend(self, lease: Lease, ttl: float, *, within: float | None = None) -> Lease:
        """``extend``; with ``within``, each socket wait of the call is cut to that many s."""
        started = time.monotonic()
        body = {"lease_id": lease.lease_id, "ttl_ms": ms(ttl)}
        extra = 0.0 if within is None else min(0.0, max(within, 0.001) - self._timeout)
        data = self._json("POST", lease_path(lease) + "/renew", body=body, extra=extra)
        return lease_from(data, started, lease)

    def release(self, lease: Lease) -> None:
        """Release ``lease``.

        Raises:
            LeaseLost: it had expired (or another lease holds the lock).
        """
        self._call("DELETE", lease_path(lease), headers={"X-Lease-Id": lease.lease_id})

    def inspect(self, name: str) -> LockStatus:
        """Whether ``name`` is held, in which mode, by how many leases, its token, time left."""
        return status_from(self._json("GET", lock_path(name)))

    status = inspect

    @contextlib.contextmanager
    def lock(
        self,
        name: str,
        ttl: float = 10.0,
        wait: float = 0.0,
        *,
        auto_renew: bool = True,
        mode: str = "exclusive",
        idempotency_key: str | None = None,
    ) -> Iterator[Lease]:
        """Hold ``name`` for the body, renewed every ttl/3 by a thread (``auto_renew``).

        Raises:
            LeaseLost: after the body, when a renew found the lease gone during it.
        """
        lease = self.acquire(name, ttl=ttl, wait=wait, mode=mode, idempotency_key=idempotency_key)
        with self._held(lease, ttl, auto_renew) as held:
            yield held

    @contextlib.contextmanager
    def semaphore(
        self,
        name: str,
        permits: int,
        ttl: float = 10.0,
        wait: float = 0.0,
        *,
        auto_renew: bool = True,
        idempotency_key: str | None = None,
    ) -> Iterator[Lease]:
        """Hold one of ``permits`` leases of ``name`` for the body, as ``lock()`` does."""
        lease = self.acquire_semaphore(
            name, permits, ttl=ttl, wait=wait, idempotency_key=idempotency_key
        )
        with self._held(lease, ttl, auto_renew) as held:
            yield held

    @contextlib.contextmanager
    def _held(self, lease: Lease, ttl: float, auto_renew: bool) -> Iterator[Lease]:
        renewer = _Renewer(self, lease, ttl) if auto_renew else None
        try:
            yield lease
        except BaseException:
            current = lease if renewer is None else renewer.stop()
            if renewer is None or renewer.lost is None:
                try:
                    self.release(current)
                except FencegateError as error:
                    log.warning("release of %r failed (it will expire): %s", lease.name, error)
            raise
        current = lease if renewer is None else renewer.stop()
        if renewer is not None and renewer.lost is not None:
            raise renewer.lost
        self.release(current)

    # stores
    def put(
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
        reply = self._json("PUT", store_path(store, key), data=data, headers=headers)
        token_back: int | None = reply["token"]
        return token_back

    def get(
        self, store: str, key: str, *, token: int | None = None, lock: str | None = None
    ) -> tuple[bytes, int | None]:
        """Read ``key``: its body and the token of its last write; with ``token``, fenced.

        Raises:
            NotFound: no such key.
        """
        _, headers, body = self._call(
            "GET", store_path(store, key), headers=fence_headers(token, lock)
        )
        stored = headers.get("X-Fencing-Token")
        return body, int(stored) if stored is not None else None

    def delete(self, store: str, key: str, *, token: int | None, lock: str | None = None) -> None:
        self._call("DELETE", store_path(store, key), headers=fence_headers(token, lock))

    # transport
    def _json(
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
        _, _, raw = self._call(method, path, data=data, headers=headers, extra=extra)
        reply: dict[str, Any] = json.loads(raw)
        return reply

    def _connection(self, method: str) -> _Connection:
        current: _Connection | None = getattr(self._local, "conn", None)
        if current is not None and (
            method != "GET" and time.monotonic() - current.used > _IDLE_REOPEN
        ):
            self._drop(current)
            current = None
        if current is None:
            conn: http.client.HTTPConnection
            if self._https:
                conn = http.client.HTTPSConnection(self._host, self._port, context=self._ssl)
            else:
                conn = http.client.HTTPConnection(self._host, self._port)
            current = _Connection(conn)
            self._local.conn = current
            with self._all_lock:
                self._all.append(current)
        return current

    def _drop(self, current: _Connection) -> None:
        current.conn.close()
        self._local.conn = None
        with self._all_lock, contextlib.suppress(ValueError):
            self._all.remove(current)

    def _call(
        self,
        method: str,
        path: str,
        *,
        data: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        extra: float = 0.0,
    ) -> tuple[int, Mapping[str, str], bytes]:
        all_headers = {**self._headers, **(headers or {})}
        for attempt in (1, 2):
            current = self._connection(method)
            current.conn.timeout = self._timeout + extra
            if current.conn.sock is not None:
                current.conn.sock.settimeout(self._timeout + extra)
            try:
                current.conn.request(method, self._prefix + path, body=data, headers=all_headers)
                response = current.conn.getresponse()
                raw = response.read()
            except (OSError, http.client.HTTPException) as exc:
                reused = current.reused
                self._drop(current)
                # A kept-alive connection the gateway closed meanwhile: a GET is safe to resend.
                if attempt == 1 and reused and method == "GET":
                    continue
                reason = str(exc) or type(exc).__name__
                raise GatewayUnavailable(
                    "gateway_unavailable", 0, f"{self.base_url}: {reason}"
                ) from exc
            current.used = time.monotonic()
            current.reused = True
            if response.will_close:
                self._drop(current)
            if response.status >= 400:
                raise error_from(response.status, raw)
            # email.message.Message: case-insensitive .get, as the async client's headers
            return response.status, cast(Mapping[str, str], response.headers), raw
        raise AssertionError("unreachable")  # pragma: no cover


class _Renewer:
    """A thread that extends a lease every ttl/3 until stopped or the lease is lost."""

    def __init__(self, client: SyncFencegateClient, lease: Lease, ttl: float) -> None:
        self.lease = lease
        self.lost: LeaseLost | None = None
        self._client = client
        self._ttl = ttl
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"fencegate-renew-{lease.name}", daemon=True
        )
        self._thread.start()

    def stop(self) -> Lease:
        """Stop renewing; the latest lease."""
        self._stop.set()
        self._thread.join()
        return self.lease

    def _run(self) -> None:
        interval = min(self._ttl / 3, max(self.lease.remaining() / 3, 0.001))
        while not self._stop.wait(interval):
            # A renew still unanswered when the lease runs out is the loss then, not when
            # the client's timeout (30 s by default) ends: cut its waits to the validity.
            deadline = time.monotonic() + self.lease.remaining()
            try:
                within = self.lease.remaining()
                if within <= 0:
                    raise GatewayUnavailable("gateway_unavailable", 0, "the lease ran out")
                self.lease = self._client._extend(self.lease, self._ttl, within=within)
                interval = self._ttl / 3
            except LeaseLost as exc:
                self._lose(exc)
                return
            except FencegateError as exc:
                if self.lease.expired or time.monotonic() >= deadline:
                    self._lose(LeaseLost("lease_lost", 409, f"renewal failed: {exc}"))
                    return
                log.warning("renewal of %r failed, retrying: %s", self.lease.name, exc)
                interval = min(self._ttl / 10, max(self.lease.remaining() / 2, 0.001))

    def _lose(self, exc: LeaseLost) -> None:
        self.lost = exc
        log.warning("%s; the lock's holder learns it when its block ends", exc)
