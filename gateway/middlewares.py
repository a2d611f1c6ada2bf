"""The gateway's one middleware: its steps, outermost first: metrics, errors, auth, drain.

* metrics: every response is counted, labelled with the route template
  (``/v1/stores/{store}/{key}``), never the raw path.
* errors: every error is rendered as JSON with the status from
  ``errors.STATUS``, and ``request_timeout_ms`` is enforced.
* auth: the bearer key is checked before anything else looks at the request,
  when ``[[auth.keys]]`` are configured.
* drain: new acquires and writes are refused once shutdown began, and an
  acquire that waits for a lock is answered 503 when it begins.

The steps are one middleware and one helper coroutine rather than four
middlewares: each middleware level costs a coroutine and a call per request.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import time
from typing import Any, Final

from aiohttp import web
from aiohttp.typedefs import Handler
from aiohttp.web_protocol import RequestPayloadError

from gateway.config import ApiKey
from gateway.errors import (
    BadRequest,
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
from gateway.headers import one_header
from gateway.state import API_KEY, CONFIG, METRICS, STATE, GatewayState
from storage_adapters import CorruptMetadata, StoreNotStarted

__all__ = [
    "MIDDLEWARES",
    "OPEN_PATHS",
    "authenticate",
    "gateway_middleware",
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
async def gateway_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Metrics around errors, the deadline, auth and drain: one middleware, one frame less.

    Every response is counted (the route template, the method, the status); an
    exception that still escapes is counted 500, a request whose client went away 499.
    """
    started = time.perf_counter()  # the loop's clock is ms-coarse under uvloop
    status = 500
    try:
        response = await _guarded(request, handler)
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


class _Cut:
    """A cancellation of the request's task for one reason, that can be taken back.

    ``asyncio.timeout`` for one request at the cost of one loop timer (``at``
    seconds), and the drain's cut of a waiting acquire at no cost until it fires.
    Calling it cancels the task; ``take_back`` (once) says whether a
    ``CancelledError`` is this cut's alone (no other cancellation pending), as
    ``asyncio.timeout`` decides it, whose Python context manager costs several
    times the timer.
    """

    __slots__ = ("_cancelling", "_handle", "_taken", "_task", "fired")

    def __init__(self, task: asyncio.Task[Any], at: float | None = None) -> None:
        self._task = task
        self._cancelling = task.cancelling()
        self.fired = self._taken = False
        self._handle = None if at is None else asyncio.get_running_loop().call_later(at, self)

    def __call__(self) -> None:
        if not self.fired:
            self.fired = True
            self._task.cancel()

    def take_back(self) -> bool:
        """Stop the timer; True if the cut fired and its cancellation is the only one."""
        if self._handle is not None:
            self._handle.cancel()
        if not self.fired or self._taken:
            return False
        self._taken = True
        return self._task.uncancel() <= self._cancelling


async def _guarded(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Render every error as JSON; enforce ``request_timeout_ms``, auth and drain."""
    app = request.app
    config = app[CONFIG]
    task = asyncio.current_task()
    assert task is not None
    deadline = _Cut(task, config.request_timeout)
    cut_off = False
    try:
        try:
            if config.auth_keys and request.path.startswith("/v1/"):
                _authenticate_request(request, config.auth_keys)
            route = request.match_info.route.name
            if route in _WRITES:
                state = app[STATE]
                if state.draining:
                    raise ShuttingDown("the gateway is shutting down; retry on another replica")
                if route in _ACQUIRES:
                    return await _unless_drained(state, task, handler, request)
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            err = _from_http(exc, config.max_body_bytes)
            return _json_error(err, exc.status)
        finally:
            cut_off = deadline.take_back()
    except asyncio.CancelledError as exc:
        if not cut_off:
            raise
        cause: Exception = TimeoutError(str(exc))
    except Exception as exc:
        if not deadline.fired:
            return _render(request, exc)
        cause = exc
    # Cut off by the deadline: whatever came out of the cancelled call (the cancellation,
    # or a driver error raised while it was being cancelled) is a consequence.
    timeout = config.request_timeout
    log.warning(
        "%s %s cut off by request_timeout_ms: %r", request.method, route_label(request), cause
    )
    err = RequestTimeout(f"the request took longer than {timeout:.3f} s (request_timeout_ms)")
    return _json_error(err, 503)


def _render(request: web.Request, exc: Exception) -> web.Response:
    if isinstance(exc, RequestPayloadError):
        return _unreadable_body(request, exc)
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
    # Draining, a store that could not start yet and a key's corrupt fencing metadata
    # are logged once (where they are found), not per request; the other 5xx once a
    # second per route and code (a node down answers every request 503).
    if status >= 500 and not isinstance(exc, ShuttingDown | StoreNotStarted | CorruptMetadata):
        route = route_label(request)
        more = request.app[STATE].log_5xx.passes((route, getattr(exc, "code", "")))
        if more is not None:
            like = f" ({more} more like it in the last second)" if more else ""
            log.warning("%s %s: %s%s", request.method, route, exc, like)
    return _json_error(exc, status)


def _unreadable_body(request: web.Request, exc: RequestPayloadError) -> web.Response:
    """400 for a body aiohttp could not decode (not in its ``Content-Encoding``).

    The client's mistake, answered as one rather than a 500 with a traceback. The
    rest of the body cannot be read either: the connection closes after the answer,
    and the body is marked ended so that aiohttp does not read it again to drain it
    (which would raise the same error and log it).
    """
    reason = " ".join(str(getattr(exc.__cause__, "message", None) or exc).split())
    request.content.feed_eof()
    response = _json_error(BadRequest(f"the body cannot be read: {reason}"), 400)
    response.force_close()
    return response


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


def _authenticate_request(request: web.Request, keys: tuple[ApiKey, ...]) -> None:
    """Check the bearer key of a ``/v1`` request (but ``OPEN_PATHS``) before anything else."""
    if request.path not in OPEN_PATHS:
        key = authenticate(one_header(request, "Authorization"), keys)
        _authorize(key, request)
        request[API_KEY] = key  # scopes an Idempotency-Key to the key that sent it


class _ClientWatch:
    """Calls ``cut`` once the request's connection is closed: checked every ``every`` s.

    aiohttp does not cancel a handler when its client goes away (its server's
    ``handler_cancellation`` is off: a store write is never cut half-way by a
    disconnect). A waiting acquire must be, or the next release hands the lock
    to nobody; aiohttp has no public hook for the close, so the transport is
    looked at on a timer, for acquires only and only while one runs.
    """

    __slots__ = ("_cut", "_every", "_handle", "_request")

    def __init__(self, request: web.Request, cut: _Cut, every: float) -> None:
        self._request, self._cut, self._every = request, cut, every
        self._handle: asyncio.TimerHandle | None = None
        self._arm()

    def _arm(self) -> None:
        self._handle = asyncio.get_running_loop().call_later(self._every, self._check)

    def _check(self) -> None:
        if _client_gone(self._request):
            self._handle = None
            self._cut()
        else:
            self._arm()

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


_CLIENT_CHECK_S: Final = 0.05
"""How often a running acquire looks whether its client is still connected."""


async def _unless_drained(
    state: GatewayState, task: asyncio.Task[Any], handler: Handler, request: web.Request
) -> web.StreamResponse:
    """``handler``'s answer; 503 ``shutting_down`` if draining starts while it runs;
    499 if its client goes away while it runs.

    An acquire may wait up to ``max_wait_ms``: far longer than a shutdown may take,
    or than its client may stay. Draining, or the client's disconnect, cancels it
    (in this task: no task of its own), which runs the lock service's cleanup (no
    partial grant is left, a hand-over is given back), and a draining waiter gets
    an HTTP answer it can act on instead of a closed connection. A grant that the
    cancellation came too late for stands (an ``Idempotency-Key`` repeat gets it back).
    """
    drain, gone = _Cut(task), _Cut(task)
    state.on_drain.add(drain)
    watch = _ClientWatch(request, gone, _CLIENT_CHECK_S)
    try:
        # One loop turn before the handler runs (as when it ran in a task of its own):
        # a client that closed right after its request is seen gone then, and its
        # body read fails (499) before a lock is taken for nobody.
        await asyncio.sleep(0)
        return await handler(request)
    except asyncio.CancelledError:
        state.on_drain.discard(drain)
        watch.stop()
        if drain.take_back():
            raise ShuttingDown(
                "the gateway is shutting down and stopped waiting for the lock; "
                "retry on another replica"
            ) from None
        if gone.take_back():
            log.debug(
                "%s %s: the client went away while it waited", request.method, route_label(request)
            )
            return web.Response(status=499)  # nobody reads it; counted as 499 (nginx's)
        raise
    finally:
        state.on_drain.discard(drain)
        watch.stop()
        drain.take_back()  # a cut that came too late: the grant stands
        gone.take_back()


MIDDLEWARES: Final = (gateway_middleware,)
