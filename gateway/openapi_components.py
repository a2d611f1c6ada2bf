"""The building blocks of the OpenAPI document and its ``components`` section.

``gateway/openapi.py`` assembles the paths from these; ``components()`` is the
document's shared responses, parameters and schemas.
"""

from __future__ import annotations

from typing import Any, Final

from lockservice.lease import MAX_PERMITS

__all__ = [
    "INT",
    "JSON",
    "STR",
    "TOKEN",
    "components",
    "error_response",
    "object_schema",
    "ok_response",
    "schema_ref",
]

JSON: Final = "application/json"
_NAME_PATTERN: Final = "^[A-Za-z0-9._~:/-]{1,512}$"


def schema_ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/{name}"}


def error_response(
    description: str, *codes: str, headers: dict[str, Any] | None = None
) -> dict[str, Any]:
    response: dict[str, Any] = {
        "description": f"{description} (error: {', '.join(codes)})",
        "content": {JSON: {"schema": schema_ref("schemas/Error")}},
    }
    if headers:
        response["headers"] = headers
    return response


def ok_response(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {JSON: {"schema": schema}}}


def object_schema(required: list[str], **props: Any) -> dict[str, Any]:
    return {"type": "object", "required": required, "properties": props}


INT: Final = {"type": "integer", "format": "int64"}
TOKEN: Final = {"type": "integer", "format": "int64", "minimum": 1}
STR: Final = {"type": "string"}
_TTL_MS: Final = {**INT, "description": "the ttl granted: the one asked for, or the default"}
_VALID_MS: Final = {
    **INT,
    "minimum": 0,
    "description": "how long the lease is valid from this response, as the gateway "
    "computed it: ttl - time the grant took - clock drift allowance (1% of ttl + 2 ms)",
}


def components() -> dict[str, Any]:
    return {
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        "responses": {
            "NotFound": error_response("no route for this path", "not_found"),
            "MethodNotAllowed": error_response(
                "the path does not take this method; Allow lists those it takes",
                "method_not_allowed",
                headers={"Allow": {"schema": STR, "description": "the methods of the path"}},
            ),
        },
        "parameters": {
            "LockName": {
                "name": "name",
                "in": "path",
                "required": True,
                "description": "may contain '/'; its last segment may not be 'renew'",
                "schema": {"type": "string", "pattern": _NAME_PATTERN},
            },
            "Store": {"name": "store", "in": "path", "required": True, "schema": STR},
            "Key": {
                "name": "key",
                "in": "path",
                "required": True,
                "description": "may contain '/'",
                "schema": {"type": "string", "pattern": _NAME_PATTERN},
            },
            "FencingToken": {
                "name": "X-Fencing-Token",
                "in": "header",
                "required": True,
                "description": "the lock's token, 1..2**63-1",
                "schema": TOKEN,
            },
            "FencedReadToken": {
                "name": "X-Fencing-Token",
                "in": "header",
                "required": False,
                "description": "optional: a fenced read, refused when the token is stale, "
                "else raising the key's high-water mark to it",
                "schema": TOKEN,
            },
            "IdempotencyKey": {
                "name": "Idempotency-Key",
                "in": "header",
                "required": False,
                "description": "a key of the caller's choosing: a retried acquire with the same "
                "key returns the lease the first was granted while it is held (scoped to the "
                "API key with [auth])",
                "schema": {"type": "string", "pattern": "^[A-Za-z0-9._~:-]{1,128}$"},
            },
            "FencingLock": {
                "name": "X-Fencing-Lock",
                "in": "header",
                "description": "the lock that fences this key; default '{store}/{key}'"
                " (an s3 store refuses the header: 400)",
                "schema": {"type": "string", "pattern": _NAME_PATTERN},
            },
        },
        "schemas": {
            "Error": {
                "type": "object",
                "required": ["error", "message"],
                "properties": {
                    "error": STR,
                    "message": STR,
                    "retry_after_ms": INT,
                    "token": INT,
                    "high_water": INT,
                    "issued": INT,
                    "permits": {
                        **INT,
                        "description": "permits_mismatch: the permits of the current holders",
                    },
                    "needed": INT,
                    "nodes": {
                        "type": "object",
                        "description": "quorum_unavailable: why each node could not take part",
                        "additionalProperties": STR,
                    },
                },
                "additionalProperties": True,
            },
            "Grant": object_schema(
                ["name", "token", "lease_id", "ttl_ms", "valid_ms", "mode"],
                name=STR,
                token=TOKEN,
                lease_id=STR,
                ttl_ms=_TTL_MS,
                valid_ms=_VALID_MS,
                mode={"type": "string", "enum": ["exclusive", "shared"]},
            ),
            "SemaphoreGrant": object_schema(
                ["name", "token", "lease_id", "ttl_ms", "valid_ms", "permits"],
                name=STR,
                token=TOKEN,
                lease_id=STR,
                ttl_ms=_TTL_MS,
                valid_ms=_VALID_MS,
                permits={"type": "integer", "minimum": 1, "maximum": MAX_PERMITS},
            ),
            "Renewal": object_schema(
                ["name", "token", "ttl_ms", "valid_ms"],
                name=STR,
                token=TOKEN,
                ttl_ms=_TTL_MS,
                valid_ms=_VALID_MS,
            ),
            "LockState": object_schema(
                ["name", "held", "token", "ttl_ms", "mode", "holders", "permits"],
                name=STR,
                held={"type": "boolean"},
                token={
                    **INT,
                    "description": "the newest token of a current holder, else the newest issued",
                },
                ttl_ms={**INT, "description": "until the last current lease ends"},
                mode={
                    "type": "string",
                    "enum": ["", "exclusive", "shared", "semaphore"],
                    "description": "the holders' mode; empty when free",
                },
                holders={**INT, "minimum": 0, "description": "how many leases hold it"},
                permits={**INT, "minimum": 0, "description": "the semaphore's permits, else 0"},
            ),
            "Written": object_schema(
                ["store", "key", "token"], store=STR, key=STR, token={"type": ["integer", "null"]}
            ),
            "Readiness": object_schema(
                ["ready", "draining", "locks", "semaphores", "stores"],
                ready={"type": "boolean"},
                draining={"type": "boolean"},
                locks=STR,
                semaphores={
                    **object_schema(
                        ["ready"],
                        ready={"type": "boolean"},
                        reason={**STR, "description": "why not, per node; only when not ready"},
                    ),
                    "description": "whether a semaphore could be granted now: it needs every "
                    "node (of its group), not a quorum. Not part of the top-level ready: "
                    "locks still grant with a node down",
                },
                lock_groups={
                    "type": "object",
                    "additionalProperties": STR,
                    "description": "with [locks] groups: each group, ok or why it cannot grant",
                },
                locks_ready_in_s={
                    "type": "number",
                    "description": "when locks are refused only because nodes are "
                    "quarantined: seconds until enough quarantines end",
                },
                stores={"type": "object", "additionalProperties": STR},
            ),
        },
    }
