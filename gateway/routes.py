"""The HTTP API, version 1 (DESIGN.md "HTTP API"): parse, call, shape JSON.

The lock and semaphore routes are in ``gateway/lock_routes.py``; stores and
service routes here.

Every check that refuses a request raises an error from ``gateway.errors``,
``lockservice`` or ``storage_adapters``; the error middleware renders it.
Durations are ``_ms`` integers here and float seconds everywhere else.

A store write or fenced read goes through, in order: the store name, the
key, the token header, the fence scope, the body limit, the fencing guard
(``_fence``), and then the adapter's atomic check-and-write.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
from json.encoder import encode_basestring_ascii
from typing import Any, Final

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.aiohttp import make_aiohttp_handler

from gateway.errors import (
    BadRequest,
    BadToken,
    NotLeaseHolder,
    TokenRequired,
    TooLarge,
    UnknownStore,
)
from gateway.guard import add_guarded, add_unmatched
from gateway.headers import json_answer, json_bytes, one_header, read_body
from gateway.lock_routes import routes as lock_routes
from gateway.openapi import openapi
from gateway.state import CONFIG, HOT, LOCKS, METRICS, STATE, STORES, StoreEntry
from lockservice import LockServiceError, validate_name
from lockservice.backend import Readiness
from storage_adapters.base import DEFAULT_CONTENT_TYPE, MAX_TOKEN
from storage_adapters.errors import StorageError, TokenNotIssued

__all__ = ["add_routes", "parse_token"]

TOKEN_HEADER: Final = "X-Fencing-Token"
LOCK_HEADER: Final = "X-Fencing-Lock"
_TOKEN: Final = re.compile(r"[0-9]{1,19}")
_quote: Final = encode_basestring_ascii  # json.dumps of a str, as ensure_ascii=True does

routes = web.RouteTableDef()


# parsing
def parse_token(value: str) -> int:
    """The token in ``X-Fencing-Token``: a positive integer below 2**63.

    Raises:
        BadToken: anything else (sign, spaces inside, letters, zero, overflow).
    """
    token = int(value) if _TOKEN.fullmatch(value) else 0
    if not 1 <= token <= MAX_TOKEN:
        raise BadToken(value)
    return token


# stores
def _target(request: web.Request, stores: dict[str, StoreEntry]) -> tuple[StoreEntry, str]:
    store = request.match_info["store"]
    entry = stores.get(store)
    if entry is None:
        raise UnknownStore(store, sorted(stores))
    key = request.match_info["key"]
    # validate_key, and whatever else this store refuses: 400, before the fencing guard
    entry.store.check_key(key)
    return entry, key


def _token(request: web.Request, entry: StoreEntry, *, required: bool) -> int | None:
    if entry.config.fencing == "none":
        return None  # the baseline: no check at all (logged loudly at start)
    values = request.headers.getall(TOKEN_HEADER, None)
    if values is None:
        if not required:
            return None
        request.app[METRICS].rejected(entry.name, "token_required")
        raise TokenRequired(entry.name)
    if len(values) > 1:  # which one was meant? Neither is taken (gateway/headers.py)
        request.app[METRICS].rejected(entry.name, "bad_token")
        raise BadToken(", ".join(values), copies=len(values))
    try:
        return parse_token(values[0].strip())
    except BadToken:
        request.app[METRICS].rejected(entry.name, "bad_token")
        raise


def _scope(request: web.Request, entry: StoreEntry, key: str, token: int | None) -> str:
    """The fence scope: the lock named by X-Fencing-Lock, else ``{store}/{key}``.

    Without a token nothing is fenced, so the header does not matter then; on a
    store that fences each key alone (s3) the header is refused either way.
    """
    if entry.store.per_key_scope and LOCK_HEADER in request.headers:
        raise BadRequest(
            f"store {entry.name!r} ({entry.store.kind}) fences each key by its own lock"
            f" {entry.name + '/' + key!r}; {LOCK_HEADER} cannot name a coarser one here"
            " (a conditional write checks one object): drop the header and use that lock's token"
        )
    if token is None:
        return f"{entry.name}/{key}"
    named = one_header(request, LOCK_HEADER)
    scope = f"{entry.name}/{key}" if named is None else named
    try:
        return validate_name(scope)
    except ValueError as exc:
        hint = "" if LOCK_HEADER in request.headers else f"; name a shorter one in {LOCK_HEADER}"
        raise BadRequest(f"fence lock: {exc}{hint}") from None


async def _fence(
    request: web.Request, app: web.Application, entry: StoreEntry, scope: str, token: int
) -> None:
    """Refuse a forged token (never issued for ``scope``), and in lease mode a non-holder's.

    A token at or below the cached ``issued`` counter of the scope passes
    without a lock-service call; above it the counter is read again first.
    """
    if entry.config.fencing == "lease":
        info = await app[LOCKS].inspect(scope)
        if not info.held or info.token != token:
            app[METRICS].rejected(entry.name, "not_lease_holder")
            raise NotLeaseHolder(scope, token, info.token if info.held else None, info.token)
        return
    cache = app[STATE].issued
    if cache.covers(scope, token):
        return
    issued = await app[LOCKS].issued(scope)
    cache.update(scope, issued)
    if token > issued:
        app[METRICS].rejected(entry.name, "token_not_issued")
        hint = _not_issued_hint(request, entry, scope)
        raise TokenNotIssued(token, issued, scope=scope, hint=hint)


def _not_issued_hint(request: web.Request, entry: StoreEntry, scope: str) -> str:
    """How to fix a token of another lock: the lock that fences the key, or the header."""
    if LOCK_HEADER in request.headers:
        return f"send a token of lock {scope!r}, the lock {LOCK_HEADER} names"
    if scope.rpartition("/")[2] == "renew":  # POST /v1/locks refuses such a name
        if entry.store.per_key_scope:
            return (
                f"the lock {scope!r} that fences this key cannot be taken over HTTP (its last"
                f" segment is 'renew') and store {entry.name!r} ({entry.store.kind}) takes no"
                f" {LOCK_HEADER}: use a key whose last segment is not 'renew'"
            )
        return (
            f"the lock {scope!r} that fences this key cannot be taken over HTTP (its last"
            f" segment is 'renew'): take another lock and name it in {LOCK_HEADER}"
        )
    return (
        f"a key is fenced by the lock {scope!r} (its store/key): take that lock, or name "
        f"the lock you hold in {LOCK_HEADER} (fencegate put --lock, client lock=)"
    )


def _check_length(request: web.Request, limit: int) -> None:
    """Refuse a body whose Content-Length is above ``limit`` before reading it."""
    length = request.content_length
    if length is not None and length > limit:
        raise TooLarge(length, limit)


@routes.put("/v1/stores/{store}/{key:.+}", name="store_put")
async def put(request: web.Request) -> web.Response:
    """Write the body at the key if the token is not stale."""
    app = request.app
    entry, key = _target(request, app[STORES])
    token = _token(request, entry, required=True)
    scope = _scope(request, entry, key, token)
    _check_length(request, app[CONFIG].max_body_bytes)
    body = await read_body(request)  # client_max_size = the limit also stops a chunked body
    if token is not None:
        await _fence(request, app, entry, scope, token)
    content_type = request.headers.get("Content-Type", DEFAULT_CONTENT_TYPE)
    stored = await entry.store.put(scope, key, token, body, content_type=content_type)
    return _put_answer(entry.name, key, stored)


def _put_answer(store: str, key: str, token: int | None) -> web.Response:
    """``json_answer({"store": store, "key": key, "token": token})``: the same bytes.

    Built without the JSON encoder (which costs more than the rest of the
    answer): the key passed ``validate_key``, whose characters JSON never
    escapes, and the store name is quoted as ``json.dumps`` quotes a string.
    """
    stored = "null" if token is None else str(token)
    text = f'{{"store": {_quote(store)}, "key": "{key}", "token": {stored}}}'
    return json_bytes(text.encode())


# No HEAD here (405): a read with X-Fencing-Token raises the key's mark, and a
# probe has no business reading storage; HEAD is for the service and lock routes.
@routes.get("/v1/stores/{store}/{key:.+}", name="store_get", allow_head=False)
async def get(request: web.Request) -> web.Response:
    """Read the key; with X-Fencing-Token, a fenced read that raises the mark first."""
    app = request.app
    entry, key = _target(request, app[STORES])
    token = _token(request, entry, required=False)
    scope = _scope(request, entry, key, token)
    if token is not None:
        await _fence(request, app, entry, scope, token)
    record = await entry.store.get(scope, key, token)
    headers = {"Content-Type": record.content_type}
    if record.token is not None:
        headers[TOKEN_HEADER] = str(record.token)
    return web.Response(body=record.body, headers=headers)


@routes.delete("/v1/stores/{store}/{key:.+}", name="store_delete")
async def delete(request: web.Request) -> web.Response:
    """Delete the key if the token is not stale (a missing key is not an error)."""
    app = request.app
    entry, key = _target(request, app[STORES])
    token = _token(request, entry, required=True)
    scope = _scope(request, entry, key, token)
    if token is not None:
        await _fence(request, app, entry, scope, token)
    await entry.store.delete(scope, key, token)
    return web.Response(status=204)


# service
@routes.get("/v1/stats/hot", name="stats_hot")
async def stats_hot(request: web.Request) -> web.Response:
    """The most contended lock names of the server (all its workers) over the sliding window."""
    raw = request.query.get("n", "10")
    if not raw.isdigit() or not 1 <= int(raw) <= 100:
        raise BadRequest(f"n {raw!r} must be a whole number from 1 to 100")
    hot = request.app[HOT]
    n = int(raw)
    shared = request.app[STATE].shared
    others = [] if shared is None else await asyncio.to_thread(shared.read_hot, exclude=os.getpid())
    return json_answer(
        {
            "window_s": hot.window,
            "by_wait_time": [h.as_json() for h in hot.top(n, others=others)],
            "by_waits": [h.as_json() for h in hot.top(n, by="waits", others=others)],
        }
    )


@routes.get("/v1/openapi.json", name="openapi")
async def openapi_document(request: web.Request) -> web.Response:
    """This API as an OpenAPI 3 document."""
    return json_answer(openapi())


@routes.get("/healthz", name="healthz")
async def healthz(request: web.Request) -> web.Response:
    """Liveness: the process runs and its event loop answers."""
    return json_answer({"status": "ok"})


@routes.get("/readyz", name="readyz")
async def readyz(request: web.Request) -> web.Response:
    """Readiness: a lock quorum answers, every store answers, and not shutting down."""
    timeout = max(request.app[CONFIG].locks.node_timeout * 5, 1.0)
    stores = request.app[STORES]
    locks, *pings = await asyncio.gather(
        _probe(request.app[LOCKS].ready(), timeout, ""),
        *(_probe(e.store.ping(), timeout, "") for e in stores.values()),
    )
    draining = request.app[STATE].draining
    store_states = dict(zip(stores, pings, strict=True))
    lock_state, retry, groups, semaphores = (
        locks if isinstance(locks, tuple) else (locks, None, (), locks)
    )
    ready = not draining and lock_state == "ok" and all(s == "ok" for s in pings)
    body: dict[str, object] = {
        "ready": ready,
        "draining": draining,
        "locks": lock_state,
        # Not part of "ready": a semaphore needs every node (R32), and taking the
        # gateway out of rotation for it would stop the locks, which need a quorum.
        "semaphores": {"ready": True}
        if semaphores == "ok"
        else {"ready": False, "reason": semaphores},
        "stores": store_states,
    }
    if groups:  # [locks] groups: each Redlock group, "ok" or why it cannot grant
        body["lock_groups"] = dict(groups)
    headers = {}
    if retry is not None:  # locks come back by themselves once quarantines end
        body["locks_ready_in_s"] = round(retry, 3)
        headers["Retry-After"] = str(max(1, math.ceil(retry)))
    return json_answer(body, status=200 if ready else 503, headers=headers)


async def _probe(
    check: Any, seconds: float, refused: str
) -> str | tuple[str, float | None, tuple[tuple[str, str], ...], str]:
    try:
        async with asyncio.timeout(seconds):
            result = await check
    except TimeoutError:
        return f"no answer within {seconds:.1f} s"
    except (StorageError, LockServiceError) as exc:
        return str(exc)
    except Exception as exc:  # readiness reports any failure; it must not turn into a 500
        return f"{type(exc).__name__}: {exc}"
    if isinstance(result, Readiness):  # the locks: grantable now, or why not and how long
        lock_state = "ok" if result.ready else result.reason
        return lock_state, result.retry_after, result.groups, result.semaphores
    return refused if result is False else "ok"


def add_routes(app: web.Application, registry: CollectorRegistry | None) -> None:
    """Every route of the API, and ``GET /metrics`` for ``registry`` unless it is None.

    With ``metrics_listen`` the metrics are served on that address alone (no
    ``/metrics`` here: the main port may be reachable by more than the scraper).
    """
    add_guarded(app, lock_routes)  # locks and semaphores
    add_guarded(app, routes)
    if registry is not None:
        add_guarded(app, [web.get("/metrics", make_aiohttp_handler(registry), name="metrics")])
    add_unmatched(app)  # last: what no route above takes
