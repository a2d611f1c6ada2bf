"""What the async and the sync client share: errors by API code, the lease, paths, TLS.

Standard library only (and ``lockservice.lease``, which is too): nothing here
imports the server or aiohttp, so ``gateway.sync_client`` needs no third-party
package and ``gateway.client`` only aiohttp (tests/gateway/test_client_imports.py).
"""

from __future__ import annotations

import json
import math
import os
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import quote, urlsplit

from lockservice.lease import Lease as _ServerLease

__all__ = [
    "BY_CODE",
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
    "ShuttingDown",
    "SslOption",
    "StaleToken",
    "StorageUnavailable",
    "TokenNotIssued",
    "TokenRequired",
    "TooLarge",
    "Unauthorized",
    "UnknownStore",
    "acquire_path",
    "acquire_semaphore_path",
    "check_base_url",
    "error_from",
    "fence_headers",
    "idempotency_headers",
    "lease_from",
    "lease_path",
    "lock_path",
    "ms",
    "semaphore_path",
    "ssl_context",
    "status_from",
    "store_path",
]

SslOption = ssl.SSLContext | str | os.PathLike[str] | bool | None
"""``ssl=`` of both clients: a context, a CA file to trust, False (no check), None/True (system)."""

_SAFE: Final = "/:~._-"  # the name and key alphabet, kept as is in the path


@dataclass(frozen=True, slots=True)
class Lease(_ServerLease):
    """A lease granted through the HTTP API.

    ``valid_until`` is on ``time.monotonic()`` (the clock asyncio's default
    loop uses too), so ``remaining()`` works with and without an event loop.
    ``valid_ms`` is the validity the gateway computed for the grant or the
    last renew (ttl - elapsed - drift), or None from a gateway that does not
    send it; ``valid_until`` then counts from ``ttl_ms``. ``mode`` is
    ``"exclusive"``, ``"shared"`` or ``"semaphore"`` (``permits`` its size):
    ``extend`` and ``release`` use the routes of that kind.
    """

    valid_ms: int | None = None

    def remaining(self) -> float:
        """Seconds of validity left (negative once expired)."""
        return self.valid_until - time.monotonic()


def lease_from(
    reply: Mapping[str, Any], started: float, lease: Lease | None = None, *, semaphore: bool = False
) -> Lease:
    """The lease an acquire (``lease`` None) or a renew of ``lease`` answered, sent at ``started``.

    The deadline counts from when the request was sent, a lower bound of when
    the gateway measured it. ``semaphore``: the reply of ``POST /v1/semaphores``.
    """
    valid_ms = reply.get("valid_ms")
    span = valid_ms if isinstance(valid_ms, int) else reply["ttl_ms"]
    valid = valid_ms if isinstance(valid_ms, int) else None
    deadline = started + span / 1000
    if lease is None:
        mode = "semaphore" if semaphore else str(reply.get("mode", "exclusive"))
        permits = int(reply["permits"]) if semaphore else 0
        return Lease(reply["name"], reply["token"], reply["lease_id"], deadline,
                     mode=mode, permits=permits, valid_ms=valid)  # fmt: skip
    # A lease's token never changes: keep the one the grant returned, if known.
    token = lease.token or reply["token"]
    return Lease(lease.name, token, lease.lease_id, deadline,
                 mode=lease.mode, permits=lease.permits, valid_ms=valid)  # fmt: skip


@dataclass(frozen=True, slots=True)
class LockStatus:
    """``GET /v1/locks/{name}``: the holder's token when held, else the newest issued.

    ``mode``: ``""`` when free, else ``"exclusive"``, ``"shared"`` or ``"semaphore"``;
    ``holders``: how many leases hold it; ``permits``: the semaphore's size, else 0.
    """

    name: str
    held: bool
    token: int
    ttl: float
    mode: str = ""
    holders: int = 0
    permits: int = 0


def status_from(data: Mapping[str, Any]) -> LockStatus:
    return LockStatus(
        data["name"],
        data["held"],
        data["token"],
        data["ttl_ms"] / 1000,
        mode=data.get("mode", ""),
        holders=data.get("holders", 1 if data["held"] else 0),
        permits=data.get("permits", 0),
    )


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


class PermitsMismatch(FencegateError):
    """409 permits_mismatch: the semaphore is held with another number of permits."""

    @property
    def permits(self) -> int | None:
        """The permits of the current holders."""
        return self.data.get("permits")


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


class StorageConfig(FencegateError):
    """503 storage_config: the store's table or bucket does not match its configuration."""


class StorageCorrupt(FencegateError):
    """503 storage_corrupt: the key's fencing metadata was changed around the gateway."""


class RequestTimeout(FencegateError):
    """503 request_timeout: the gateway cut the request off at its request_timeout_ms."""


class ShuttingDown(FencegateError):
    """503 shutting_down: retry on another replica."""


class GatewayUnavailable(FencegateError):
    """The gateway could not be reached, or did not answer in time."""


BY_CODE: Final[Mapping[str, type[FencegateError]]] = {
    "bad_request": BadRequest,
    "bad_token": BadToken,
    "unauthorized": Unauthorized,
    "forbidden": Forbidden,
    "token_not_issued": TokenNotIssued,
    "not_found": NotFound,
    "unknown_store": UnknownStore,
    "lock_held": LockHeld,
    "lease_lost": LeaseLost,
    "permits_mismatch": PermitsMismatch,
    "stale_token": StaleToken,
    "too_large": TooLarge,
    "token_required": TokenRequired,
    "quorum_unavailable": QuorumUnavailable,
    "storage_unavailable": StorageUnavailable,
    "storage_config": StorageConfig,
    "storage_corrupt": StorageCorrupt,
    "request_timeout": RequestTimeout,
    "shutting_down": ShuttingDown,
}


def error_from(status: int, raw: bytes) -> FencegateError:
    """The typed error for a refusal's status and JSON body."""
    try:
        reply = json.loads(raw)
        code, message = str(reply.pop("error")), str(reply.pop("message", ""))
    except (ValueError, KeyError, TypeError, AttributeError):
        return FencegateError(f"http_{status}", status, raw[:200].decode(errors="replace"))
    return BY_CODE.get(code, FencegateError)(code, status, message, reply)


def check_base_url(base_url: str) -> str:
    """``base_url`` without a trailing slash.

    Raises:
        ValueError: not ``http://host[:port]`` or ``https://host[:port]``.
    """
    url = base_url.strip().rstrip("/")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  # raises ValueError for a port outside 0-65535
    except ValueError as exc:
        if "port" in str(exc).lower():
            raise ValueError(f"gateway url {base_url!r} has a bad port: {exc}") from exc
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        hint = f"; did you mean 'http://{url}'?" if "://" not in url and url else ""
        raise ValueError(
            f"gateway url {base_url!r} must start with http:// or https:// and name a host{hint}"
        )
    return url


def ssl_context(option: SslOption) -> ssl.SSLContext | None:
    """The context for ``ssl=``; None means the system's default verification.

    Raises:
        ValueError: a CA file that cannot be read or holds no certificate.
    """
    if option is None or option is True:
        return None
    if isinstance(option, ssl.SSLContext):
        return option
    if option is False:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    path = os.fspath(option)
    try:
        return ssl.create_default_context(cafile=path)
    except FileNotFoundError:
        raise ValueError(f"CA file {path!r}: no such file") from None
    except (ssl.SSLError, OSError) as exc:
        raise ValueError(f"CA file {path!r} holds no usable PEM certificate: {exc}") from None


def ms(seconds: float) -> int:
    return math.ceil(seconds * 1000)


def lock_path(name: str) -> str:
    return "/v1/locks/" + quote(name, safe=_SAFE)


def semaphore_path(name: str) -> str:
    return "/v1/semaphores/" + quote(name, safe=_SAFE)


def lease_path(lease: _ServerLease) -> str:
    """The route of the lease's kind: ``/v1/semaphores/...`` or ``/v1/locks/...``."""
    return semaphore_path(lease.name) if lease.mode == "semaphore" else lock_path(lease.name)


def _check_renew(name: str, kind: str) -> None:
    if name.rpartition("/")[2] == "renew":
        raise ValueError(
            f"{kind} name {name!r} is refused: its last segment may not be 'renew' "
            f"(that path is the renew route of the {kind} before it)"
        )


def acquire_path(name: str) -> str:
    """The acquire route of ``name``.

    Raises:
        ValueError: the name's last segment is ``renew`` (that path is the renew route).
    """
    _check_renew(name, "lock")
    return lock_path(name)


def acquire_semaphore_path(name: str) -> str:
    """The acquire route of the semaphore ``name`` (``ValueError`` as ``acquire_path``)."""
    _check_renew(name, "semaphore")
    return semaphore_path(name)


def idempotency_headers(key: str | None) -> dict[str, str]:
    return {} if key is None else {"Idempotency-Key": key}


def store_path(store: str, key: str) -> str:
    return f"/v1/stores/{quote(store, safe='')}/{quote(key, safe=_SAFE)}"


def fence_headers(token: int | None, lock: str | None) -> dict[str, str]:
    headers = {}
    if token is not None:
        headers["X-Fencing-Token"] = str(token)
    if lock is not None:
        headers["X-Fencing-Lock"] = lock
    return headers
