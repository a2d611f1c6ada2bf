"""The gateway's own errors, and THE table from every error class to its HTTP status.

Each error has a DESIGN.md ``code``; the error middleware renders any error as
``{"error": exc.code, "message": str(exc), **error_data(exc)}`` with the status
of the nearest class in ``STATUS`` along its MRO. An exception that is in
none of them is a bug: 500 ``internal``, with the traceback logged, never sent.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Final

from lockservice import LeaseLost, LockHeld, LockServiceError, PermitsMismatch, QuorumUnavailable
from storage_adapters.errors import (
    BadValue,
    CorruptMetadata,
    NotFound,
    StaleToken,
    StorageError,
    StorageUnavailable,
    StoreMisconfigured,
    TableMismatch,
    TokenNotIssued,
    UnfencedRefused,
)

__all__ = [
    "INTERNAL",
    "STATUS",
    "BadRequest",
    "BadToken",
    "ConfigError",
    "Forbidden",
    "GatewayError",
    "MethodNotAllowed",
    "NotLeaseHolder",
    "RequestTimeout",
    "RouteNotFound",
    "ShuttingDown",
    "StartupError",
    "TokenRequired",
    "TooLarge",
    "Unauthorized",
    "UnknownStore",
    "error_data",
    "error_headers",
    "reason_code",
    "status_of",
]

INTERNAL: Final = {"error": "internal", "message": "internal error; see the gateway log"}
"""The body of every 500: what went wrong is logged, never sent."""


def reason_code(reason: str) -> str:
    """The error code of an HTTP status aiohttp answers by itself (``Request Timeout``:
    ``request_timeout``)."""
    return reason.lower().replace(" ", "_")


class ConfigError(Exception):
    """The configuration is invalid; the message is one line naming the key and value."""

    code = "config_error"


class StartupError(Exception):
    """A resource could not start (a store's database, a legacy table that does not match)."""

    code = "startup_error"


class GatewayError(Exception):
    """Base class for every error the gateway raises itself."""

    code = "gateway_error"


class BadRequest(GatewayError):
    """The request is malformed: JSON, a field, a name, a key or a header."""

    code = "bad_request"


class BadToken(GatewayError):
    """``X-Fencing-Token`` is not a positive integer that fits in a signed 64-bit int."""

    code = "bad_token"

    def __init__(self, value: str, *, copies: int = 1) -> None:
        shown = value if len(value) <= 40 else value[:40] + "..."
        if copies > 1:
            super().__init__(f"X-Fencing-Token is sent {copies} times ({shown!r}); send one token")
            return
        super().__init__(
            f"X-Fencing-Token {shown!r} is not a positive integer below 2**63 "
            "(a token from POST /v1/locks/{name})"
        )


class TokenRequired(GatewayError):
    """A fenced write came without ``X-Fencing-Token``."""

    code = "token_required"

    def __init__(self, store: str) -> None:
        super().__init__(
            f"store {store!r} is fenced: send the lock's token in the X-Fencing-Token header"
        )
        self.store = store


class NotLeaseHolder(GatewayError):
    """(``fencing = "lease"``) the token is not the token of the lease that holds the lock now."""

    code = "stale_token"

    def __init__(self, scope: str, token: int, holder: int | None, newest: int) -> None:
        now = f"the lease holding it now has token {holder}" if holder else "nobody holds it now"
        super().__init__(f"token {token} does not hold lock {scope!r}: {now}")
        self.scope = scope
        self.token = token
        self.holder = holder
        # Reported as high_water, like StaleToken: the newest token of that lock.
        self.high_water = max(newest, holder or 0)


class UnknownStore(GatewayError):
    """No ``[stores.<name>]`` of that name is configured."""

    code = "unknown_store"

    def __init__(self, store: str, known: list[str]) -> None:
        super().__init__(f"store {store!r} is not configured; stores: {', '.join(known) or 'none'}")
        self.store = store


class TooLarge(GatewayError):
    """The body exceeds ``max_body_bytes``."""

    code = "too_large"

    def __init__(self, size: int | None, limit: int) -> None:
        what = f"{size} bytes" if size is not None else "the body"
        super().__init__(f"{what} exceeds the limit of {limit} bytes (max_body_bytes)")
        self.limit = limit


class Unauthorized(GatewayError):
    """No ``Authorization: Bearer`` key, or a key that is not configured."""

    code = "unauthorized"


class Forbidden(GatewayError):
    """The key is valid but not for this verb or name."""

    code = "forbidden"


class RouteNotFound(GatewayError):
    """No route has this path."""

    code = "not_found"


class MethodNotAllowed(GatewayError):
    """The path exists, the method does not."""

    code = "method_not_allowed"

    def __init__(self, method: str, allowed: set[str]) -> None:
        super().__init__(
            f"method {method} is not allowed here; allowed: {', '.join(sorted(allowed))}"
        )
        self.allowed = allowed


class ShuttingDown(GatewayError):
    """The gateway is draining: it finishes what it started and starts nothing new."""

    code = "shutting_down"


class RequestTimeout(GatewayError):
    """The request ran longer than ``request_timeout_ms``."""

    code = "request_timeout"


STATUS: Final[Mapping[type[Exception], int]] = {
    BadRequest: 400,
    BadToken: 400,
    BadValue: 400,
    Unauthorized: 401,
    Forbidden: 403,
    TokenNotIssued: 403,
    RouteNotFound: 404,
    UnknownStore: 404,
    NotFound: 404,
    MethodNotAllowed: 405,
    LockHeld: 409,
    LeaseLost: 409,
    PermitsMismatch: 409,
    StaleToken: 409,
    NotLeaseHolder: 409,
    TooLarge: 413,
    TokenRequired: 428,
    UnfencedRefused: 428,
    QuorumUnavailable: 503,
    StorageUnavailable: 503,
    TableMismatch: 503,
    StoreMisconfigured: 503,
    CorruptMetadata: 503,  # the key's fencing metadata was written around fencegate
    ShuttingDown: 503,
    RequestTimeout: 503,
    StorageError: 500,  # any other storage failure: rendered with its code, and logged
    LockServiceError: 500,
}
"""Error class -> HTTP status; a subclass inherits the status of its nearest listed base."""


def status_of(exc: BaseException) -> int | None:
    """The status for ``exc`` from ``STATUS``, or None when it is not an API error."""
    for cls in type(exc).__mro__:
        status = STATUS.get(cls)
        if status is not None:
            return status
    return None


def retry_after_ms(exc: LockHeld) -> int:
    return max(1, math.ceil(exc.retry_after * 1000))


def error_data(exc: BaseException) -> dict[str, object]:
    """Fields a client needs besides code and message (never a secret, never a lease_id)."""
    if isinstance(exc, LockHeld):
        return {"retry_after_ms": retry_after_ms(exc)}
    if isinstance(exc, PermitsMismatch):
        return {"permits": exc.permits}  # the holders': ask with these, or wait
    if isinstance(exc, StaleToken | NotLeaseHolder):
        return {"token": exc.token, "high_water": exc.high_water}
    if isinstance(exc, TokenNotIssued):
        return {"token": exc.token, "issued": exc.issued}
    if isinstance(exc, QuorumUnavailable):
        data: dict[str, object] = {"needed": exc.needed, "nodes": exc.node_errors}
        if exc.retry_after is not None:  # quarantined nodes count again by then
            data["retry_after_ms"] = max(1, math.ceil(exc.retry_after * 1000))
        return data
    if isinstance(exc, CorruptMetadata):
        return {"store": exc.store, "key": exc.key}
    if isinstance(exc, TooLarge):
        return {"limit": exc.limit}
    if isinstance(exc, MethodNotAllowed):
        return {"allowed": sorted(exc.allowed)}
    return {}


def error_headers(exc: BaseException) -> dict[str, str]:
    """Headers that go with the error response."""
    if isinstance(exc, LockHeld):
        return {"Retry-After": str(max(1, math.ceil(exc.retry_after)))}
    if isinstance(exc, QuorumUnavailable) and exc.retry_after is not None:
        return {"Retry-After": str(max(1, math.ceil(exc.retry_after)))}
    if isinstance(exc, QuorumUnavailable | StorageUnavailable | ShuttingDown):
        return {"Retry-After": "1"}
    if isinstance(exc, MethodNotAllowed):
        return {"Allow": ", ".join(sorted(exc.allowed))}
    if isinstance(exc, Unauthorized):
        return {"WWW-Authenticate": 'Bearer realm="fencegate"'}
    return {}
