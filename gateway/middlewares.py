"""The gateway's middlewares, outermost first: metrics, errors, auth, drain.

* ``metrics_middleware`` counts every response, labelled with the route
  template (``/v1/stores/{store}/{key}``), never the raw path.
* ``error_middleware`` renders every error as JSON with the status from
  ``errors.STATUS`` and enforces ``request_timeout_ms``.
* ``auth_middleware`` checks the bearer key before anything else looks at the
  request, when ``[[auth.keys]]`` are configured.
* ``drain_middleware`` refuses new acquires and writes once shutdown began.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import time
from collections.abc import Awaitable
from typing import Final

from aiohttp import web
from aiohttp.typedefs import Handler

from gateway.config import ApiKey
from gateway.errors import (
    Forbidden,
    GatewayError,
    MethodNotAllowed,
    RequestTimeout,
    RouteNotFound,
    ShuttingDown,
    TooLarge,
    Unauthorized,
    error_data,
    error_headers,
    status_of,
)
from gateway.state import API_KEY, CONFIG, METRICS, STATE
from storage_adapters import StoreNotStarted

__all__ = [
    "MIDDLEWARES",
    "OPEN_PATHS",
    "auth_middleware",
    "authenticate",
    "drain_middleware",
    "error_middleware",
    "metrics_middleware",
    "route_label",
]

log = logging.getLogger(__name__)

OPEN_PATHS: Final = frozenset({"/v1/openapi.json"})
"""``/v1`` paths that need no key (everything outside ``/v1`` needs none either)."""
_METHODS: Final = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"})
_LOCK_ROUTES: Final = frozenset({
    "lock_acquire", "lock_renew", "lock_release", "lock_status",
    "semaphore_acquire", "semaphore_renew", "semaphore_release", "semaphore_status",
})  # fmt: skip
_ACQUIRES: Final = frozenset({"lock_acquire", "semaphore_acquire"})
_WRITES: Final = frozenset({"store_put", "store_delete", *_ACQUIRES})


def route_label(request: web.Request) -> str:
    """The route template of the request, or ``unmatched``: a bounded label."""
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else "unmatched"


@web.middleware
async def metrics_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    started = time.perf_counter()  # the loop's clock is ms-coarse under uvloop
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    except web.HTTPException as exc:
        status = exc.status
        raise
    except asyncio.CancelledError:
        status = 499  # the client went away (nginx's code)
        raise
    finally:
        method = request.method if request.method in _METHODS else "other"
        request.app[METRICS].request_done(
            route_label(request), method, status, time.perf_counter() - started
        )


def _json_error(exc: BaseException, status: int) -> web.Response:
    code = getattr(exc, "code", "error")
    body = {"error": code, "message": str(exc), **error_data(exc)}
    return web.json_response(body, status=status, headers=error_headers(exc))


def _from_http(exc: web.HTTPException, body_limit: int) -> GatewayError:
    """aiohttp's own errors (no route, wrong method, body too large) as ours."""
    if isinstance(exc, web.HTTPMethodNotAllowed):
        return MethodNotAllowed(exc.method, set(exc.allowed_methods))
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        return TooLarge(None, body_limit)
    if exc.status == 404:
        return RouteNotFound("no route for this path; see GET /v1/openapi.json")
    error = GatewayError(exc.reason.lower())
    error.code = exc.reason.lower().replace(" ", "_")
    return error


class _Deadline:
    """``asyncio.timeout`` for one request at the cost of one loop timer.

    At ``timeout`` it cancels the request's task; ``stop`` takes that cancellation
    back and says whether a ``CancelledError`` is the deadline's alone (no other
    cancellation pending), as ``asyncio.timeout`` decides it, whose Python
    context manager costs several times the timer.
    """

    __slots__ = ("_cancelling", "_handle", "_task", "expired")

    def __init__(self, timeout: float) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self._cancelling = task.cancelling()
        self.expired = False
        self._handle = asyncio.get_running_loop().call_later(timeout, self._expire)

    def _expire(self) -> None:
        self.expired = True
        self._task.cancel()

    def stop(self) -> bool:
        """Stop the timer; True if it fired and its cancellation is the only one."""
        self._handle.cancel()
        return self.expired and self._task.uncancel() <= self._cancelling


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    config = request.app[CONFIG]
    timeout = config.request_timeout
    deadline = _Deadline(timeout)
    cut_off = False
    try:
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            err = _from_http(exc, config.max_body_bytes)
            return _json_error(err, exc.status)
        finally:
            cut_off = deadline.stop()
    except asyncio.CancelledError as exc:
        if not cut_off:
            raise
        cause: Exception = TimeoutError(str(exc))
    except Exception as exc:
        if not deadline.expired:
            return _render(request, exc)
        cause = exc
    # Cut off by the deadline: whatever came out of the cancelled call (the cancellation,
    # or a driver error raised while it was being cancelled) is a consequence.
    log.warning(
        "%s %s cut off by request_timeout_ms: %r", request.method, route_label(request), cause
    )
    err = RequestTimeout(f"the request took longer than {timeout:.3f} s (request_timeout_ms)")
    return _json_error(err, 503)


def _render(request: web.Request, exc: Exception) -> web.Response:
    status = status_of(exc)
    if status is None and isinstance(exc, ConnectionResetError) and _client_gone(request):
        # The client closed the connection before its body arrived (aiohttp fails the
        # read): nobody is left to answer, and it is no bug. Counted as 499 (nginx's).
        log.debug("%s %s: the client went away: %s", request.method, route_label(request), exc)
        return web.Response(status=499)
    if status is None:
        log.exception("unhandled error in %s %s", request.method, route_label(request))
        return web.json_response(
            {"error": "internal", "message": "internal error; see the gateway log"}, status=500
        )
    # Draining and a store that could not start yet are logged once, not per request.
    if status >= 500 and not isinstance(exc, ShuttingDown | StoreNotStarted):
        log.warning("%s %s: %s", request.method, route_label(request), exc)
    return _json_error(exc, status)


def _client_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


def authenticate(header: str | None, keys: tuple[ApiKey, ...]) -> ApiKey:
    """The key for ``Authorization: Bearer <key>``; compares every digest in constant time.

    Raises:
        Unauthorized: no bearer key, or one that is not configured.
    """
    scheme, _, secret = (header or "").strip().partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise Unauthorized("this route needs an 'Authorization: Bearer <key>' header")
    digest = hashlib.sha256(secret.strip().encode()).digest()
    found: ApiKey | None = None
    for key in keys:  # no early exit: the time does not say which key matched
        if hmac.compare_digest(digest, key.sha256):
            found = key
    if found is None:
        raise Unauthorized("the API key is not known to this gateway")
    return found


def _authorize(key: ApiKey, request: web.Request) -> None:
    route = request.match_info.route.name or ""
    info = request.match_info
    if route in _LOCK_ROUTES:
        verb, target, prefixes = "lock", info["name"], key.locks
    elif route == "store_get":
        verb, target, prefixes = "read", f"{info['store']}/{info['key']}", key.stores
    elif route in ("store_put", "store_delete"):
        verb, target, prefixes = "write", f"{info['store']}/{info['key']}", key.stores
    else:
        return  # /v1 routes on no lock or key (stats): any valid key; unmatched: 404/405
    if verb not in key.verbs:
        allowed = ", ".join(sorted(key.verbs)) or "none"
        raise Forbidden(f"key {key.name!r} lacks the verb {verb!r} (its verbs: {allowed})")
    if not any(target.startswith(p) for p in prefixes):
        shown = ", ".join(repr(p) for p in prefixes) or "none"
        if verb == "lock":
            what = f"may not take the lock {target!r} (its lock prefixes: {shown})"
        else:
            action = "read" if verb == "read" else "write"
            what = f"may not {action} {target!r} (its store prefixes: {shown})"
        raise Forbidden(f"key {key.name!r} {what}")


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    keys = request.app[CONFIG].auth_keys
    if keys and request.path.startswith("/v1/") and request.path not in OPEN_PATHS:
        key = authenticate(request.headers.get("Authorization"), keys)
        _authorize(key, request)
        request[API_KEY] = key  # scopes an Idempotency-Key to the key that sent it
    return await handler(request)


@web.middleware
async def drain_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    state = request.app[STATE]
    route = request.match_info.route.name
    if state.draining and route in _WRITES:
        raise ShuttingDown("the gateway is shutting down; retry on another replica")
    if route in _ACQUIRES:
        return await _unless_drained(state.drained, handler(request))
    return await handler(request)


async def _unless_drained(
    drained: asyncio.Event, call: Awaitable[web.StreamResponse]
) -> web.StreamResponse:
    """``call``'s answer, or 503 ``shutting_down`` if draining starts while it runs.

    An acquire may wait up to ``max_wait_ms``: far longer than a shutdown may take.
    Cancelling it runs the lock service's cleanup (no partial grant is left), and
    the waiter gets an HTTP answer it can act on instead of a closed connection.
    """
    task = asyncio.ensure_future(call)
    woken = asyncio.ensure_future(drained.wait())
    try:
        await asyncio.wait((task, woken), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        raise
    finally:
        woken.cancel()
    if not task.done():
        task.cancel()
        try:
            return await task  # granted while being cancelled: the grant stands
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
        raise ShuttingDown(
            "the gateway is shutting down and stopped waiting for the lock; "
            "retry on another replica"
        )
    return task.result()


MIDDLEWARES: Final = (metrics_middleware, error_middleware, auth_middleware, drain_middleware)
