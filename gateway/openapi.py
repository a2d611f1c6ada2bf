"""The OpenAPI 3.1 document of the HTTP API, served at ``GET /v1/openapi.json``.

Written by hand from DESIGN.md; ``tests/gateway/test_service_routes.py`` checks
that its paths and methods are exactly the routes of the app. The schema building
blocks and the ``components`` section are in ``gateway/openapi_components.py``.
"""

from __future__ import annotations

import copy
from functools import cache
from typing import Any, Final

from gateway.openapi_components import (
    INT,
    JSON,
    STR,
    TOKEN,
    components,
    error_response,
    object_schema,
    ok_response,
    schema_ref,
)
from lockservice.lease import MAX_PERMITS

__all__ = ["openapi"]

_AUTH: Final = {
    "401": error_response("no or unknown bearer key, when [auth] is configured", "unauthorized"),
    "403": error_response("the key may not use this verb or name", "forbidden"),
}
_BAD: Final = {"400": error_response("malformed request", "bad_request")}
_TOO_LARGE: Final = {"413": error_response("body above max_body_bytes", "too_large")}
_QUORUM: Final = {"503": error_response("no majority of lock nodes answered", "quorum_unavailable")}
_LEASE_LOST: Final = {
    "409": error_response("the lease expired or another holds the lock", "lease_lost")
}
_RETRY: Final = {"Retry-After": {"schema": INT, "description": "seconds"}}
_RELEASED: Final = {
    "204": {"description": "released"},
    **_BAD,
    **_AUTH,
    **_LEASE_LOST,
    **_QUORUM,
}
_RENEW_BODY: Final = {
    "required": True,
    "content": {JSON: {"schema": object_schema(["lease_id"], lease_id=STR, ttl_ms=INT)}},
}
_RENEWED: Final = {
    "200": ok_response("renewed", schema_ref("schemas/Renewal")),
    **_BAD,
    **_AUTH,
    **_LEASE_LOST,
    **_TOO_LARGE,
    **_QUORUM,
}
_MODE_FIELD: Final = {
    "type": "string",
    "enum": ["exclusive", "shared"],
    "default": "exclusive",
    "description": "exclusive: no other lease at once, a new larger token; shared: any "
    "number of shared leases at once, the newest token issued for the name",
}
_PERMITS_FIELD: Final = {
    "type": "integer",
    "minimum": 1,
    "maximum": MAX_PERMITS,
    "description": "how many leases may hold the semaphore at once; every holder must ask "
    "with the same number",
}
_ACQUIRE_DOC: Final = (
    "A queued request is served before later ones (FIFO); a queued exclusive request is "
    "served before shared requests that came after it. Every exclusive grant gets a new, "
    "larger token; a shared grant gets the newest token issued for the name. With "
    "Idempotency-Key, a repeated request returns the lease its first try was granted "
    "(same lease_id and token) while that lease is held, through any gateway."
)
_SEMAPHORE_DOC: Final = (
    "Up to permits leases of the name at once (the name space is that of /v1/locks: an "
    "exclusive or shared lock and a semaphore of one name exclude each other). Every grant "
    "gets a new, larger token. Idempotency-Key as for locks."
)
_STORE_FAIL: Final = {
    "400": error_response("bad key, token, fence lock or body", "bad_request", "bad_token"),
    "403": error_response(
        "token greater than any issued for the fence lock, or key outside the bearer "
        "key's prefixes",
        "token_not_issued",
        "forbidden",
    ),
    "404": error_response("no such store", "unknown_store"),
    "409": error_response(
        "the token is older than the newest seen for the fence lock (or, with "
        'fencing = "lease", not the holder\'s)',
        "stale_token",
    ),
    "503": error_response("the storage or the lock quorum is unreachable, the store's table no "
                  "longer matches its configuration, or the key's fencing metadata was "
                  "written around fencegate", "storage_unavailable",
                  "storage_config", "storage_corrupt", "quorum_unavailable", "shutting_down"),
}  # fmt: skip


_HEAD_PATHS: Final = (
    "/v1/locks/{name}",
    "/v1/semaphores/{name}",
    "/v1/stats/hot",
    "/v1/openapi.json",
    "/healthz",
    "/readyz",
    "/metrics",
)
"""Paths whose GET also answers HEAD (probes); a store read does not (a fenced read
raises a mark)."""


def _with_head(paths: dict[str, Any]) -> None:
    """Add a HEAD operation, GET's answers without their bodies, to each of ``_HEAD_PATHS``."""
    for path in _HEAD_PATHS:
        get = paths[path]["get"]
        responses = {
            status: {k: v for k, v in answer.items() if k != "content"}
            for status, answer in get["responses"].items()
        }
        paths[path]["head"] = {
            "operationId": f"{get['operationId']}_head",
            "summary": f"As GET, without the body: {get['summary']}",
            "responses": responses,
        }


def _document() -> dict[str, Any]:
    lock = {"$ref": "#/components/parameters/LockName"}
    store_params = [
        {"$ref": "#/components/parameters/Store"},
        {"$ref": "#/components/parameters/Key"},
        {"$ref": "#/components/parameters/FencingLock"},
    ]
    # A $ref allows no sibling but summary/description: one component each for the
    # required (PUT, DELETE) and the optional (fenced read) token header.
    token_header = {"$ref": "#/components/parameters/FencingToken"}
    read_token_header = {"$ref": "#/components/parameters/FencedReadToken"}
    idempotency = {"$ref": "#/components/parameters/IdempotencyKey"}
    lease_header = {"name": "X-Lease-Id", "in": "header", "required": True, "schema": STR}
    fenced_write = {
        **_AUTH,
        **_STORE_FAIL,
        "428": error_response("X-Fencing-Token is missing", "token_required"),
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "fencegate",
            "version": "1",
            "description": "Distributed locks with fencing tokens, and storage that refuses "
            "stale writes. Errors are JSON {error, message, ...}. Besides the answers each "
            "operation lists, a path that is not here answers 404 (error: not_found), and a "
            "method a path does not take answers 405 (error: method_not_allowed) with an "
            "Allow header; see components.responses.",
        },
        "paths": {
            "/v1/locks/{name}": {
                "parameters": [lock],
                "post": {
                    "operationId": "acquire",
                    "summary": "Take a lock, exclusive (default) or shared, waiting up to wait_ms",
                    "description": _ACQUIRE_DOC,
                    "parameters": [idempotency],
                    "requestBody": {
                        "required": False,
                        "content": {
                            JSON: {
                                "schema": object_schema(
                                    [], ttl_ms=INT, wait_ms=INT, mode=_MODE_FIELD
                                )
                            }
                        },
                    },
                    "responses": {
                        "200": ok_response("granted", schema_ref("schemas/Grant")),
                        **_BAD,
                        **_AUTH,
                        "409": error_response(
                            "another lease holds it", "lock_held", headers=_RETRY
                        ),
                        **_TOO_LARGE,
                        **_QUORUM,
                    },
                },
                "get": {
                    "operationId": "status",
                    "summary": "Whether the name is held, in which mode, by how many leases",
                    "responses": {
                        "200": ok_response("state", schema_ref("schemas/LockState")),
                        **_BAD,
                        **_AUTH,
                        **_QUORUM,
                    },
                },
                "delete": {
                    "operationId": "release",
                    "summary": "Release a lease (exclusive or shared)",
                    "parameters": [lease_header],
                    "responses": _RELEASED,
                },
            },
            "/v1/locks/{name}/renew": {
                "parameters": [lock],
                "post": {
                    "operationId": "renew",
                    "summary": "Extend a lease (exclusive or shared) to ttl_ms from now",
                    "requestBody": _RENEW_BODY,
                    "responses": _RENEWED,
                },
            },
            "/v1/semaphores/{name}": {
                "parameters": [lock],
                "post": {
                    "operationId": "acquire_semaphore",
                    "summary": "Take one of permits leases of a semaphore, waiting up to wait_ms",
                    "description": _SEMAPHORE_DOC,
                    "parameters": [idempotency],
                    "requestBody": {
                        "required": True,
                        "content": {
                            JSON: {
                                "schema": object_schema(
                                    ["permits"], permits=_PERMITS_FIELD, ttl_ms=INT, wait_ms=INT
                                )
                            }
                        },
                    },
                    "responses": {
                        "200": ok_response("granted", schema_ref("schemas/SemaphoreGrant")),
                        **_BAD,
                        **_AUTH,
                        "409": error_response(
                            "permits leases are held (lock_held; also while an exclusive or "
                            "shared lock holds the name), or the holders have other permits "
                            "(permits_mismatch, with their permits)",
                            "lock_held",
                            "permits_mismatch",
                            headers=_RETRY,
                        ),
                        **_TOO_LARGE,
                        **_QUORUM,
                    },
                },
                "get": {
                    "operationId": "semaphore_status",
                    "summary": "The name's state, as GET /v1/locks/{name}",
                    "responses": {
                        "200": ok_response("state", schema_ref("schemas/LockState")),
                        **_BAD,
                        **_AUTH,
                        **_QUORUM,
                    },
                },
                "delete": {
                    "operationId": "release_semaphore",
                    "summary": "Release a semaphore lease",
                    "parameters": [lease_header],
                    "responses": _RELEASED,
                },
            },
            "/v1/semaphores/{name}/renew": {
                "parameters": [lock],
                "post": {
                    "operationId": "renew_semaphore",
                    "summary": "Extend a semaphore lease to ttl_ms from now",
                    "requestBody": _RENEW_BODY,
                    "responses": _RENEWED,
                },
            },
            "/v1/stores/{store}/{key}": {
                "parameters": store_params,
                "put": {
                    "operationId": "put",
                    "summary": "Write the body if the token is not stale",
                    "parameters": [token_header],
                    "requestBody": {
                        "required": True,
                        "description": "bytes (for a legacy table: a JSON object of columns)",
                        "content": {"*/*": {"schema": {"type": "string", "format": "binary"}}},
                    },
                    "responses": {
                        "200": ok_response("written", schema_ref("schemas/Written")),
                        **fenced_write,
                        **_TOO_LARGE,
                    },
                },
                "get": {
                    "operationId": "get",
                    "summary": "Read; with X-Fencing-Token a fenced read that raises the mark",
                    "parameters": [read_token_header],
                    "responses": {
                        "200": {
                            "description": "the body, with its stored content type",
                            "headers": {
                                "X-Fencing-Token": {
                                    "schema": TOKEN,
                                    "description": "token of the last accepted write",
                                }
                            },
                            "content": {"*/*": {"schema": {"type": "string", "format": "binary"}}},
                        },
                        **_AUTH,
                        **_STORE_FAIL,
                        "404": error_response("no such store or key", "unknown_store", "not_found"),
                    },
                },
                "delete": {
                    "operationId": "delete",
                    "summary": "Delete if the token is not stale",
                    "parameters": [token_header],
                    "responses": {"204": {"description": "deleted (or absent)"}, **fenced_write},
                },
            },
            "/v1/stats/hot": {
                "get": {
                    "operationId": "stats_hot",
                    "summary": "The most contended locks of this gateway, lately",
                    "description": (
                        "Top names by time spent waiting and by number of waits over a "
                        "sliding window, in bounded memory (counts of rarely contended "
                        "names may be dropped, so counts are lower bounds). Each gateway "
                        "reports what its own clients waited for; the workers of one "
                        "`fencegate serve --workers N` are one gateway (the others' counts "
                        "up to a second old). With [auth], any valid key may read it."
                    ),
                    "parameters": [
                        {
                            "name": "n",
                            "in": "query",
                            "required": False,
                            "schema": {"type": "integer", "minimum": 1, "maximum": 100},
                            "description": "how many names per list (default 10)",
                        }
                    ],
                    "responses": {
                        "200": ok_response(
                            "hot locks",
                            object_schema(
                                ["window_s", "by_wait_time", "by_waits"],
                                window_s={"type": "number"},
                                by_wait_time={"type": "array", "items": {"type": "object"}},
                                by_waits={"type": "array", "items": {"type": "object"}},
                            ),
                        ),
                        **_BAD,
                        "401": _AUTH["401"],
                    },
                }
            },
            "/v1/openapi.json": {
                "get": {
                    "operationId": "openapi",
                    "summary": "This document",
                    "responses": {"200": ok_response("OpenAPI 3.1", {"type": "object"})},
                }
            },
            "/healthz": {
                "get": {
                    "operationId": "healthz",
                    "summary": "Liveness",
                    "responses": {
                        "200": ok_response("running", object_schema(["status"], status=STR))
                    },
                }
            },
            "/readyz": {
                "get": {
                    "operationId": "readyz",
                    "summary": "Readiness: lock quorum and every store answer, not draining",
                    "responses": {
                        "200": ok_response("ready", schema_ref("schemas/Readiness")),
                        "503": ok_response(
                            "not ready; says what is not", schema_ref("schemas/Readiness")
                        ),
                    },
                }
            },
            "/metrics": {
                "get": {
                    "operationId": "metrics",
                    "summary": "Prometheus metrics (only on metrics_listen when that is set)",
                    "responses": {
                        "200": {"description": "text format", "content": {"text/plain": {}}}
                    },
                }
            },
        },
        "components": components(),
        "security": [{}, {"bearer": []}],
    }


@cache
def _cached() -> dict[str, Any]:
    doc = _document()
    _with_head(doc["paths"])
    return doc


def openapi() -> dict[str, Any]:
    """A copy of the document (callers may change it)."""
    return copy.deepcopy(_cached())
