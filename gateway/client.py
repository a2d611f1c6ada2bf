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

import asyncio
import json
import logging
import math
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Self
from urllib.parse import quote

import aiohttp
from yarl import URL

from lockservice.lease import Lease
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
    "QuorumUnavailable",
    "ShuttingDown",
    "StaleToken",
    "StorageUnavailable",
    "TokenNotIssued",
    "TokenRequired",
    "TooLarge",
    "Unauthorized",
    "UnknownStore",
]

log = logging.getLogger(__name__)

_SAFE: Final = "/:~._-"  # the name and key alphabet, kept as is in the path


class FencegateError(Exception):
    """A refusal from the gateway: its API ``code``, HTTP ``status``, message and data."""

    def __init__(
        self, code: str, status: int, message: str, data: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.status = status
        self.message = message
        self.data: dict[str, Any] = dict(data or {})


class BadRequest(FencegateError):
    """400 bad_request."""


class BadToken(FencegateError):
    """400 bad_token."""


class Unauthorized(FencegateError):
    """401 unauthorized."""


class Forbidden(FencegateError):
    """403 forbidden."""


class TokenNotIssued(FencegateError):
    """403 token_not_issued: the token is above any issued for its lock."""


class NotFound(FencegateError):
    """404 not_found: no such key (or route)."""


class UnknownStore(FencegateError):
    """404 unknown_store."""


class LockHeld(FencegateError):
    """409 lock_held: another lease holds the lock."""

    @property
    def retry_after(self) -> float:
        """Seconds after which a retry may succeed."""
        return float(self.data.get("retry_after_ms", 1000)) / 1000


class LeaseLost(FencegateError):
    """409 lease_lost: the lease expired or another lease holds the lock."""


class StaleToken(FencegateError):
    """409 stale_token: a newer token was already seen; nothing was written."""

    @property
    def token(self) -> int | None:
        return self.data.get("token")

    @property
    def high_water(self) -> int | None:
        return self.data.get("high_water")


class TooLarge(FencegateError):
    """413 too_large."""


class TokenRequired(FencegateError):
    """428 token_required."""


class QuorumUnavailable(FencegateError):
    """503 quorum_unavailable."""


class StorageUnavailable(FencegateError):
    """503 storage_unavailable."""


class ShuttingDown(FencegateError):
    """503 shutting_down: retry on another replica."""


class GatewayUnavailable(FencegateError):
    """The gateway could not be reached, or did not answer in time."""


_BY_CODE: Final[Mapping[str, type[FencegateError]]] = {
    "bad_request": BadRequest,
    "bad_token": BadToken,
    "unauthorized": Unauthorized,
    "forbidden": Forbidden,
    "token_not_issued": TokenNotIssued,
    "not_found": NotFound,
    "unknown_store": UnknownStore,
    "lock_held": LockHeld,
    "lease_lost": LeaseLost,
    "stale_token": StaleToken,
    "too_large": TooLarge,
    "token_required": TokenRequired,
    "quorum_unavailable": QuorumUnavailable,
    "storage_unavailable": StorageUnavailable,
    "shutting_down": ShuttingDown,
}


@dataclass(frozen=True, slots=True)
class LockStatus:
    """``GET /v1/locks/{name}``: the holder's token when held, else the newest issued."""

    name: str
    held: bool
    token: int
    ttl: float


class FencegateClient:
    """The HTTP API over one ``aiohttp.ClientSession`` (created on first use).

    Args:
        base_url: ``http://host:port`` of a gateway.
        api_key: sent as ``Authorization: Bearer <key>``.
        timeout: seconds one call may take, on top of an acquire's ``wait``.
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float = 30.0,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = timeout
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
    async def acquire(self, name: str, ttl: float = 10.0, wait: float = 0.0) -> Lease:
        """Take ``name`` for ``ttl`` seconds, waiting up to ``wait``.

        Raises:
            LockHeld: still held when ``wait`` ran out (``.retry_after``).
        """
        body = {"ttl_ms": _ms(ttl), "wait_ms": _ms(wait)}
        started = asyncio.get_running_loop().time()
        data = await self._json("POST", _lock_path(name), body=body, extra=wait)
        return Lease(data["name"], data["token"], data["lease_id"], started + data["ttl_ms"] / 1000)

    async def renew(self, lease: Lease, ttl: float = 10.0) -> Lease:
        """Extend ``lease`` to ``ttl`` seconds from now.

        Raises:
            LeaseLost: it expired or another lease holds the lock.
        """
        started = asyncio.get_running_loop().time()
        body = {"lease_id": lease.lease_id, "ttl_ms": _ms(ttl)}
        data = await self._json("POST", _lock_path(lease.name) + "/renew", body=body)
        # A lease's token never changes: keep the one the grant returned, if known.
        token = lease.token or data["token"]
        return Lease(lease.name, token, lease.lease_id, started + data["ttl_ms"] / 1000)

    async def release(self, lease: Lease) -> None:
        """Release ``lease``.

        Raises:
            LeaseLost: it had expired (or another lease holds the lock).
        """
        await self._call("DELETE", _lock_path(lease.name), headers={"X-Lease-Id": lease.lease_id})

    async def status(self, name: str) -> LockStatus:
        data = await self._json("GET", _lock_path(name))
        return LockStatus(data["name"], data["held"], data["token"], data["ttl_ms"] / 1000)

    @asynccontextmanager
    async def lock(
        self, name: str, ttl: float = 10.0, wait: float = 0.0, *, auto_renew: bool = True
    ) -> AsyncIterator[Lease]:
        """Hold ``name`` for the body, renewing every ttl/3 (``auto_renew``); release after.

        Raises:
            LeaseLost: a renew found the lease gone (the body was cancelled).
        """
        lease = await self.acquire(name, ttl=ttl, wait=wait)
        renewal = (
            Renewal(
                lease,
                ttl,
                self.renew,
                lost=(LeaseLost,),
                transient=(FencegateError,),  # unreachable, no quorum: retry while valid
                lose=lambda lease, reason: LeaseLost("lease_lost", 409, reason),
            )
            if auto_renew
            else None
        )
        async with hold(lease, renewal, self.release, release_errors=(FencegateError,)) as held:
            yield held

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
        headers = _fence_headers(token, lock)
        headers["Content-Type"] = content_type or (
            "text/plain; charset=utf-8" if isinstance(body, str) else "application/octet-stream"
        )
        reply = await self._json("PUT", _store_path(store, key), data=data, headers=headers)
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
            "GET", _store_path(store, key), headers=_fence_headers(token, lock)
        )
        stored = headers.get("X-Fencing-Token")
        return body, int(stored) if stored is not None else None

    async def delete(
        self, store: str, key: str, *, token: int | None, lock: str | None = None
    ) -> None:
        await self._call("DELETE", _store_path(store, key), headers=_fence_headers(token, lock))

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
            ) as response:
                raw = await response.read()
                status, reply_headers = response.status, response.headers
        except (aiohttp.ClientError, TimeoutError) as exc:
            reason = str(exc) or type(exc).__name__
            raise GatewayUnavailable(
                "gateway_unavailable", 0, f"{self.base_url}: {reason}"
            ) from exc
        if status >= 400:
            raise _error(status, raw)
        return status, reply_headers, raw


def _error(status: int, raw: bytes) -> FencegateError:
    try:
        reply = json.loads(raw)
        code, message = str(reply.pop("error")), str(reply.pop("message", ""))
    except (ValueError, KeyError, TypeError, AttributeError):
        return FencegateError(f"http_{status}", status, raw[:200].decode(errors="replace"))
    return _BY_CODE.get(code, FencegateError)(code, status, message, reply)


def _ms(seconds: float) -> int:
    return math.ceil(seconds * 1000)


def _lock_path(name: str) -> str:
    return "/v1/locks/" + quote(name, safe=_SAFE)


def _store_path(store: str, key: str) -> str:
    return f"/v1/stores/{quote(store, safe='')}/{quote(key, safe=_SAFE)}"


def _fence_headers(token: int | None, lock: str | None) -> dict[str, str]:
    headers = {}
    if token is not None:
        headers["X-Fencing-Token"] = str(token)
    if lock is not None:
        headers["X-Fencing-Lock"] = lock
    return headers
