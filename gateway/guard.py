"""One guard around every route's handler: metrics, errors, the deadline, auth, drain.

* metrics: every response is counted, labelled with the route template
  (``/v1/stores/{store}/{key}``), never the raw path.
* errors: every error is rendered as JSON with the status from
  ``errors.STATUS``, and ``request_timeout_ms`` is enforced.
* auth: the bearer key is checked before anything else looks at the request,
  when ``[[auth.keys]]`` are configured.
* drain: new acquires and writes are refused once shutdown began, and an
  acquire that waits for a lock is answered 503 when it begins (or 499 when its
  client goes away: ``gateway.state.Acquires``).

The guard wraps each handler when its route is added (``add_guarded``), rather
than running as an aiohttp middleware: aiohttp runs a middleware through a chain
of partials and an app-fixing middleware of its own, which cost more than the
guard's work, and a route's name, metrics label and kind are known when it is
wrapped instead of looked up on every request. A catch-all route, added last
(``add_unmatched``), answers the paths no route matches: 404, or 405 naming the
methods the path takes, guarded like the others.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
from collections.abc import Iterable
from time import perf_counter
from typing import Final

from aiohttp import hdrs, web
from aiohttp.typedefs import Handler
from aiohttp.web_protocol import RequestPayloadError

from gateway.config import ApiKey
from gateway.cuts import Cut
from gateway.deadlines import Deadlines
from gateway.errors import (
    INTERNAL,
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
    reason_code,
    status_of,
)
from gateway.headers import json_answer, one_header
from gateway.state import API_KEY, CONFIG, METRICS, STATE, GatewayState
from storage_adapters import CorruptMetadata, StoreNotStarted

__all__ = ["OPEN_PATHS", "UNMATCHED", "add_guarded", "add_unmatched", "authenticate"]

log = logging.getLogger(__name__)

OPEN_PATHS: Final = frozenset({"/v1/openapi.json"})
"""``/v1`` paths that need no key (everything outside ``/v1`` needs none either)."""
UNMATCHED: Final = "unmatched"
"""The metrics label (and the route name) of a request that no route matches."""
_METHODS: Final = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"})
_DEADLINES: Final = web.AppKey("deadlines", Deadlines)
_ROUTE_OPTIONS: Final = frozenset({"name", "allow_head"})
_VERBS: Final = {
    **dict.fromkeys(("lock_acquire", "lock_renew", "lock_release", "lock_status"), "lock"),
    **dict.fromkeys(
        ("semaphore_acquire", "semaphore_renew", "semaphore_release", "semaphore_status"), "lock"
    ),
    "store_get": "read",
    "store_put": "write",
    "store_delete": "write",
}
"""What a key needs for each route (``[[auth.keys]]`` verbs); the others need a valid key."""
_ACQUIRES: Final = frozenset({"lock_acquire", "semaphore_acquire"})
_WRITES: Final = frozenset({"store_put", "store_delete", *_ACQUIRES})


def add_guarded(app: web.Application, defs: Iterable[web.AbstractRouteDef]) -> None:
    """Add each route of ``defs`` to ``app`` with its handler in the guard.

    The routes of one path share one resource, added where the path first comes in
    ``defs``: aiohttp tries the resources under a path's prefix one at a time, each
    with a regex match, so with a resource per route a lock's DELETE would match
    (and pass over) its POST's before its own. The order of the paths still decides
    which one a request path takes when two match (a lock's renew route first).
    """
    resources: dict[str, web.Resource] = {}
    for d in defs:
        if not isinstance(d, web.RouteDef):
            raise TypeError(f"only handler routes can be guarded, not {d!r}")
        if not _ROUTE_OPTIONS.issuperset(d.kwargs):
            raise TypeError(f"{d!r}: a guarded route takes only {sorted(_ROUTE_OPTIONS)}")
        resource = resources.get(d.path)
        if resource is None:
            resource = resources[d.path] = app.router.add_resource(d.path)
        name = str(d.kwargs.get("name") or "")
        guarded = _guard(app, name, resource.canonical, d.path, d.handler)
        if d.method == hdrs.METH_GET and d.kwargs.get("allow_head", True):
            resource.add_route(hdrs.METH_HEAD, guarded)  # as aiohttp's add_get
        resource.add_route(d.method, guarded)


def add_unmatched(app: web.Application) -> None:
    """The last route: every method on every path that no other route takes."""
    guarded = _guard(app, UNMATCHED, UNMATCHED, "", _unmatched)
    resource = _Anything("/", name=UNMATCHED)
    app.router.register_resource(resource)
    resource.add_route("*", guarded)


class _Anything(web.PlainResource):
    """A resource that takes any path, also a request target that is none (``*``).

    aiohttp's router tries the resources whose path prefix is the longest first,
    so this one (indexed under ``/``, added last) gets only what no other takes.
    """

    def _match(self, path: str) -> dict[str, str] | None:
        return {}


async def _unmatched(request: web.Request) -> web.StreamResponse:
    """404, or 405 with the methods of the routes whose path this is."""
    allowed: set[str] = set()
    for resource in request.app.router.resources():
        if resource.name != UNMATCHED:
            _, methods = await resource.resolve(request)
            allowed |= methods
    if allowed:
        raise MethodNotAllowed(request.method, allowed)
    raise RouteNotFound("no route for this path; see GET /v1/openapi.json")


def _guard(app: web.Application, name: str, label: str, path: str, handler: Handler) -> Handler:
    """``handler`` in the guard: route ``name``, metrics ``label``, ``path`` as added."""
    config = app[CONFIG]
    state = app[STATE]
    timeout, keys, body_limit = config.request_timeout, config.auth_keys, config.max_body_bytes
    write, acquire, verb = name in _WRITES, name in _ACQUIRES, _VERBS.get(name)
    # the catch-all's path is only known per request
    keyed = bool(keys) and (not path or (path.startswith("/v1/") and path not in OPEN_PATHS))
    acquires = state.acquires
    deadlines = app.get(_DEADLINES)
    if deadlines is None:
        deadlines = app[_DEADLINES] = Deadlines(timeout)

    async def guarded(request: web.Request) -> web.StreamResponse:
        """Metrics around errors, the deadline, auth and drain: every response is
        counted (route template, method, status); an exception that still escapes is
        counted 500, a request whose client went away 499."""
        started = perf_counter()
        status = 500
        cut = Cut(asyncio.current_task())  # type: ignore[arg-type]
        place = deadlines.add(cut)
        cut_off = False
        try:
            try:
                try:
                    if keyed and (path or _keyed_path(request.path)):
                        _authenticate_request(request, keys, verb)
                    if not write:
                        response = await handler(request)
                    elif state.draining:
                        raise ShuttingDown("the gateway is shutting down; retry on another replica")
                    elif not acquire:
                        response = await handler(request)
                    elif _client_gone(request):  # closed right after its request
                        response = web.Response(status=499)  # counted as 499 (nginx's)
                    else:  # cut by the drain or its client's going away (``Acquires``)
                        acquires.add(cut, request)
                        try:
                            response = await handler(request)
                        finally:
                            acquires.discard(cut)
                except web.HTTPException as exc:
                    if exc.status < 400:
                        raise
                    response = _json_error(_from_http(exc, body_limit), exc.status)
                finally:
                    deadlines.done(place)
                    cut_off = cut.take_back()
            except asyncio.CancelledError as exc:
                if not cut_off:
                    raise
                response = _cut_off(request, label, cut.reason, exc, timeout)
            except Exception as exc:
                if cut.reason == Cut.DEADLINE:
                    response = _cut_off(request, label, cut.reason, exc, timeout)
                else:
                    response = _render(request, label, state, exc)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        except asyncio.CancelledError:
            status = 499  # the client went away (nginx's code)
            raise
        finally:
            method = request.method
            app[METRICS].request_done(
                label, method if method in _METHODS else "other", status,
                perf_counter() - started,
            )  # fmt: skip

    return guarded


def _keyed_path(path: str) -> bool:
    return path.startswith("/v1/") and path not in OPEN_PATHS


def _cut_off(
    request: web.Request, label: str, reason: str | None, cause: BaseException, timeout: float
) -> web.StreamResponse:
    """The answer of a request whose task a ``Cut`` cancelled: whatever came out of the
    cancelled call (the cancellation, or a driver error raised while it was being
    cancelled) is a consequence."""
    if reason == Cut.DRAIN:
        return _json_error(
            ShuttingDown(
                "the gateway is shutting down and stopped waiting for the lock; "
                "retry on another replica"
            ),
            503,
        )
    if reason == Cut.GONE:
        log.debug("%s %s: the client went away while it waited", request.method, label)
        return web.Response(status=499)  # nobody reads it; counted as 499 (nginx's)
    log.warning("%s %s cut off by request_timeout_ms: %r", request.method, label, cause)
    err = RequestTimeout(f"the request took longer than {timeout:.3f} s (request_timeout_ms)")
    return _json_error(err, 503)


def _json_error(exc: BaseException, status: int) -> web.Response:
    code = getattr(exc, "code", "error")
    body = {"error": code, "message": str(exc), **error_data(exc)}
    return json_answer(body, status=status, headers=error_headers(exc))


def _from_http(exc: web.HTTPException, body_limit: int) -> GatewayError:
    """aiohttp's own errors (no route, wrong method, body too large) as ours."""
    if isinstance(exc, web.HTTPMethodNotAllowed):
        return MethodNotAllowed(exc.method, set(exc.allowed_methods))
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        return TooLarge(None, body_limit)
    if exc.status == 404:
        return RouteNotFound("no route for this path; see GET /v1/openapi.json")
    error = GatewayError(exc.reason.lower())
    error.code = reason_code(exc.reason)
    return error


def _render(request: web.Request, label: str, state: GatewayState, exc: Exception) -> web.Response:
    if isinstance(exc, RequestPayloadError):
        return _unreadable_body(request, exc)
    status = status_of(exc)
    if status is None and isinstance(exc, ConnectionResetError) and _client_gone(request):
        # The client closed the connection before its body arrived (aiohttp fails the
        # read): nobody is left to answer, and it is no bug. Counted as 499 (nginx's).
        log.debug("%s %s: the client went away: %s", request.method, label, exc)
        return web.Response(status=499)
    if status is None:
        log.exception("unhandled error in %s %s", request.method, label)
        return json_answer(INTERNAL, status=500)
    # Draining, a store that could not start yet and a key's corrupt fencing metadata
    # are logged once (where they are found), not per request; the other 5xx once a
    # second per route and code (a node down answers every request 503).
    if status >= 500 and not isinstance(exc, ShuttingDown | StoreNotStarted | CorruptMetadata):
        more = state.log_5xx.passes((label, getattr(exc, "code", "")))
        if more is not None:
            like = f" ({more} more like it in the last second)" if more else ""
            log.warning("%s %s: %s%s", request.method, label, exc, like)
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


def _authorize(key: ApiKey, request: web.Request, verb: str | None) -> None:
    if verb is None:
        return  # /v1 routes on no lock or key (stats): any valid key; unmatched: 404/405
    info = request.match_info
    if verb == "lock":
        target, prefixes = info["name"], key.locks
    else:
        target, prefixes = f"{info['store']}/{info['key']}", key.stores
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


def _authenticate_request(request: web.Request, keys: tuple[ApiKey, ...], verb: str | None) -> None:
    """Check the bearer key of a ``/v1`` request (but ``OPEN_PATHS``) before anything else,
    and that it may use ``verb`` (None: any valid key may) on the request's name or key."""
    key = authenticate(one_header(request, "Authorization"), keys)
    _authorize(key, request, verb)
    request[API_KEY] = key  # scopes an Idempotency-Key to the key that sent it
