"""The lock routes of the HTTP API: ``/v1/locks/{name}`` and ``/v1/semaphores/{name}``.

Parse, call the lock service, shape JSON (DESIGN.md "HTTP API" and "Lock
kinds, retries, and locks around a command"). A lock is exclusive or shared
(``"mode"``); a semaphore is the same name space with ``permits``. Both
acquire routes take an ``Idempotency-Key`` header: a retried request with
the same key returns the lease its first try was granted while that lease is
held, through any replica (the lock service keeps a digest of the key with
the lease). With ``[auth]`` the key is scoped to the API key that sent it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from json.encoder import encode_basestring_ascii as _string
from typing import Any, Final

from aiohttp import web

from gateway.errors import BadRequest
from gateway.headers import json_answer, json_bytes, one_header, read_body
from gateway.state import API_KEY, CONFIG, LOCKS, METRICS
from lockservice import Lease, LockManager
from lockservice.lease import EXCLUSIVE, MAX_PERMITS, MODES, validate_name

__all__ = ["IDEMPOTENCY_HEADER", "LEASE_HEADER", "idempotency_key", "routes"]

LEASE_HEADER: Final = "X-Lease-Id"
IDEMPOTENCY_HEADER: Final = "Idempotency-Key"
_LEASE_ID: Final = re.compile(r"[0-9a-f]{32}")
_LEASE_WHERE: Final = f"header {LEASE_HEADER}"
_IDEMPOTENCY_KEY: Final = re.compile(r"[A-Za-z0-9._~:-]{1,128}")
_LOCK_FIELDS: Final = frozenset({"ttl_ms", "wait_ms", "mode"})
_SEMAPHORE_FIELDS: Final = frozenset({"permits", "ttl_ms", "wait_ms"})
_RENEW_FIELDS: Final = frozenset({"lease_id", "ttl_ms", "wait_ms", "mode", "permits"})

routes = web.RouteTableDef()


# parsing
def _lock_name(request: web.Request) -> str:
    name = request.match_info["name"]
    try:
        validate_name(name)
    except ValueError as exc:
        raise BadRequest(str(exc)) from None
    if name.rpartition("/")[2] == "renew":
        kind = "semaphore" if request.path.startswith("/v1/semaphores/") else "lock"
        raise BadRequest(
            f"{kind} name {name!r} is refused: its last segment is 'renew', "
            "which would make its renew route ambiguous"
        )
    return name


async def _json_object(request: web.Request, fields: frozenset[str]) -> dict[str, Any]:
    raw = await read_body(request)
    if not raw.strip():
        return {}
    # json.loads(raw, parse_constant=...) without a new decoder per call; a body that
    # starts with "{" and no NUL is UTF-8 (what json.detect_encoding would find)
    encoding = "utf-8" if raw[:1] == b"{" and raw[1:2] != b"\x00" else json.detect_encoding(raw)
    try:
        body = _DECODER.decode(raw.decode(encoding, "surrogatepass"))
    except (ValueError, RecursionError) as exc:
        raise BadRequest(f"the body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest(f"the body must be a JSON object, not {type(body).__name__}")
    if not fields.issuperset(body):
        unknown = sorted(set(body) - fields)
        raise BadRequest(f"unknown field {unknown[0]!r}; fields are {', '.join(sorted(fields))}")
    return body


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not a number in JSON")


_DECODER: Final = json.JSONDecoder(parse_constant=_no_constant)


def _ms(body: Mapping[str, Any], field: str, default: float, low: float, high: float) -> float:
    """``body[field]`` (milliseconds) as seconds, checked against ``low..high`` seconds."""
    value = body.get(field)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise BadRequest(f"{field} {value!r} is not a number of milliseconds")
    low_ms, high_ms = round(low * 1000), round(high * 1000)  # config holds whole ms
    if not low_ms <= value <= high_ms:
        raise BadRequest(f"{field} {value!r} is outside {low_ms}..{high_ms}")
    return value / 1000


def _millis(seconds: float) -> int:
    """Whole milliseconds, rounded down: a validity is never overstated."""
    return max(0, math.floor(seconds * 1000 + 1e-9))


def _lease_id(value: object, where: str) -> str:
    if not isinstance(value, str) or not _LEASE_ID.fullmatch(value):
        raise BadRequest(f"{where} must be the lease_id returned by the acquire (32 hex digits)")
    return value


def _mode(body: Mapping[str, Any]) -> str:
    mode = body.get("mode", EXCLUSIVE)
    if mode not in MODES:
        raise BadRequest(f"mode {mode!r} is invalid: use {' or '.join(repr(m) for m in MODES)}")
    return str(mode)


def _permits(body: Mapping[str, Any]) -> int:
    if "permits" not in body:
        raise BadRequest(f"permits is required: a whole number from 1 to {MAX_PERMITS}")
    permits = body["permits"]
    if isinstance(permits, bool) or not isinstance(permits, int):
        raise BadRequest(f"permits {permits!r} is not a whole number (1 to {MAX_PERMITS})")
    if not 1 <= permits <= MAX_PERMITS:
        raise BadRequest(f"permits {permits!r} is outside 1..{MAX_PERMITS}")
    return permits


def idempotency_key(request: web.Request) -> str | None:
    """The ``Idempotency-Key`` of the request as the lock service gets it, or None.

    With ``[auth]`` it is scoped to the API key (``"<key name>\\n<key>"``): two
    callers that choose the same key never share a lease. The newline cannot
    occur in a header key, so a scoped key never equals an unscoped one.

    Raises:
        BadRequest: not 1-128 characters of ``A-Z a-z 0-9 . _ ~ : -``.
    """
    value = one_header(request, IDEMPOTENCY_HEADER)
    if value is None:
        return None
    if not _IDEMPOTENCY_KEY.fullmatch(value):
        shown = value if len(value) <= 40 else value[:40] + "..."
        raise BadRequest(
            f"{IDEMPOTENCY_HEADER} {shown!r} is invalid: use 1-128 characters of "
            "A-Z a-z 0-9 . _ ~ : -"
        )
    api_key = request.get(API_KEY)
    return value if api_key is None else f"{api_key.name}\n{value}"


def _ttl_wait(app: web.Application, body: Mapping[str, Any]) -> tuple[float, float]:
    """An acquire's ``ttl_ms`` and ``wait_ms`` in seconds, defaults and bounds from [locks]."""
    locks = app[CONFIG].locks
    ttl = _ms(body, "ttl_ms", locks.default_ttl, locks.min_ttl, locks.max_ttl)
    wait = _ms(body, "wait_ms", locks.default_wait, 0.0, locks.max_wait)
    return ttl, wait


def _granted(app: web.Application, name: str, lease: Lease, ttl: float, extra: str) -> web.Response:
    """Count the grant and reply with the lease (and the kind's own ``extra`` field)."""
    valid = lease.remaining()
    app[METRICS].lease_granted(lease.lease_id, valid)
    return json_bytes(_grant_json(name, lease, ttl, valid, extra))


def _grant_json(name: str, lease: Lease, ttl: float, valid: float, extra: str) -> bytes:
    """``json.dumps`` of a grant, byte for byte, written out: the answer of every acquire,
    a flat object of strings and whole numbers, for which ``json.dumps`` would build an
    encoder each time (tests/gateway/test_locks_api.py holds the two equal)."""
    return (
        f'{{"name": {_string(name)}, "token": {lease.token}, '
        f'"lease_id": {_string(lease.lease_id)}, "ttl_ms": {_millis(ttl)}, '
        f'"valid_ms": {_millis(valid)}, {extra}}}'
    ).encode()


async def _status(request: web.Request) -> web.Response:
    name = _lock_name(request)
    info = await request.app[LOCKS].inspect(name)
    return json_answer(
        {
            "name": name,
            "held": info.held,
            "token": info.token,
            "ttl_ms": _millis(info.ttl),
            "mode": info.mode,
            "holders": info.holders,
            "permits": info.permits,
        }
    )


async def _renew(request: web.Request) -> web.Response:
    """Extend a lease by its lease_id; reply with its token, the ttl and the new validity.

    ``valid_ms`` is what the lock service computed (ttl - elapsed - drift), measured
    when the response is built; ``ttl_ms`` is the ttl asked for (or the default).
    """
    name = _lock_name(request)
    locks = request.app[CONFIG].locks
    body = await _json_object(request, _RENEW_FIELDS)
    if not {"wait_ms", "mode", "permits"}.isdisjoint(body) or "lease_id" not in body:
        # an acquire of a name ending in /renew
        kind = "semaphore" if request.path.startswith("/v1/semaphores/") else "lock"
        raise BadRequest(
            f"this is the renew route of {kind} {name!r}: it needs lease_id (and takes "
            f"ttl_ms); to take a {kind}, use a name whose last segment is not 'renew'"
        )
    lease_id = _lease_id(body.get("lease_id"), "lease_id")
    ttl = _ms(body, "ttl_ms", locks.default_ttl, locks.min_ttl, locks.max_ttl)
    # The gateway keeps no lease: a handle (name + id) is all the lock service needs;
    # its extend confirms the lease with the nodes and returns the lease's token. It
    # finds the lease by its id whatever its kind: the renew and DELETE routes of
    # /v1/locks and /v1/semaphores name one name space and act alike.
    extended = await request.app[LOCKS].extend(LockManager.handle(name, lease_id), ttl)
    valid = extended.remaining()
    request.app[METRICS].lease_renewed(lease_id, valid)
    return json_answer(
        {"name": name, "token": extended.token, "ttl_ms": _millis(ttl), "valid_ms": _millis(valid)}
    )


# locks
@routes.post("/v1/locks/{name:.+}/renew", name="lock_renew")
async def lock_renew(request: web.Request) -> web.Response:
    """Extend an exclusive or shared lease."""
    return await _renew(request)


@routes.post("/v1/locks/{name:.+}", name="lock_acquire")
async def lock_acquire(request: web.Request) -> web.Response:
    """Take a lock (``mode`` exclusive or shared); wait up to wait_ms for it."""
    name = _lock_name(request)
    body = await _json_object(request, _LOCK_FIELDS)
    app = request.app
    ttl, wait = _ttl_wait(app, body)
    mode = _mode(body)
    key = idempotency_key(request)
    try:
        lease = await app[LOCKS].acquire(name, ttl=ttl, wait=wait, mode=mode, idempotency_key=key)
    except ValueError as exc:  # the lock service's own checks, after ours
        raise BadRequest(str(exc)) from None
    return _granted(app, name, lease, ttl, f'"mode": {_string(lease.mode)}')


@routes.delete("/v1/locks/{name:.+}", name="lock_release")
async def lock_release(request: web.Request) -> web.Response:
    """Release a lease named by the X-Lease-Id header (a lock's or a semaphore's: the
    lock service finds a lease by its id whatever its kind, so one handler serves both
    routes, with no coroutine of its own in between)."""
    name = _lock_name(request)
    lease_id = _lease_id(one_header(request, LEASE_HEADER), _LEASE_WHERE)
    app = request.app
    metrics = app[METRICS]
    try:
        await app[LOCKS].release(LockManager.handle(name, lease_id))
    finally:
        metrics.lease_ended(lease_id)
    return web.Response(status=204)


@routes.get("/v1/locks/{name:.+}", name="lock_status")
async def lock_status(request: web.Request) -> web.Response:
    """Whether a name is held, in which mode, by how many, its token, time left; no lease_id."""
    return await _status(request)


# semaphores
@routes.post("/v1/semaphores/{name:.+}/renew", name="semaphore_renew")
async def semaphore_renew(request: web.Request) -> web.Response:
    """Extend a semaphore lease."""
    return await _renew(request)


@routes.post("/v1/semaphores/{name:.+}", name="semaphore_acquire")
async def semaphore_acquire(request: web.Request) -> web.Response:
    """Take one of ``permits`` leases of a semaphore; wait up to wait_ms for one."""
    name = _lock_name(request)
    body = await _json_object(request, _SEMAPHORE_FIELDS)
    permits = _permits(body)
    app = request.app
    ttl, wait = _ttl_wait(app, body)
    key = idempotency_key(request)
    try:
        lease = await app[LOCKS].acquire_semaphore(
            name, permits, ttl=ttl, wait=wait, idempotency_key=key
        )
    except ValueError as exc:  # the lock service's own checks, after ours
        raise BadRequest(str(exc)) from None
    return _granted(app, name, lease, ttl, f'"permits": {lease.permits}')


semaphore_release = routes.delete("/v1/semaphores/{name:.+}", name="semaphore_release")(
    lock_release
)
"""Release a semaphore lease named by the X-Lease-Id header: ``lock_release``."""


@routes.get("/v1/semaphores/{name:.+}", name="semaphore_status")
async def semaphore_status(request: web.Request) -> web.Response:
    """The name's state, as for locks (``mode`` is ``semaphore`` while a semaphore holds it)."""
    return await _status(request)
