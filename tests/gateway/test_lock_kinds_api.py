"""Shared locks, semaphores and idempotent acquire over HTTP, on each lock backend.

DESIGN.md "Lock kinds, retries, and locks around a command": routes, fields,
status codes and error codes as clients see them; the kinds' own invariants
under faults are the lock service's tests.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gateway.app import start_draining
from gateway.state import STATE
from tests.gateway.conftest import Client, Start, auth_section, bearer, make_config


@pytest.fixture
async def client(start: Start, lock_urls: list[str]) -> Client:
    return await start(make_config(lock_urls=lock_urls))


async def post(client: Client, path: str, body: dict[str, Any], **kw: Any) -> tuple[int, Any]:
    response = await client.post(path, json=body, **kw)
    return response.status, await response.json()


# shared locks
async def test_shared_leases_hold_together_and_exclude_an_exclusive_one(client: Client) -> None:
    status, first = await post(client, "/v1/locks/report", {"ttl_ms": 5000, "mode": "shared"})
    assert status == 200, first
    assert first["mode"] == "shared"
    assert set(first) == {"name", "token", "lease_id", "ttl_ms", "valid_ms", "mode"}
    status, second = await post(client, "/v1/locks/report", {"ttl_ms": 5000, "mode": "shared"})
    assert status == 200, second
    assert second["lease_id"] != first["lease_id"]
    # Every grant issues a new token, a shared one too: the newest issued at its grant.
    assert second["token"] > first["token"]

    state = await (await client.get("/v1/locks/report")).json()
    assert state["held"] is True
    assert state["mode"] == "shared"
    assert state["holders"] == 2
    assert state["token"] == second["token"]  # the newest token of a current holder
    assert "lease_id" not in state

    response = await client.post("/v1/locks/report", json={"ttl_ms": 5000})
    assert response.status == 409
    assert (await response.json())["error"] == "lock_held"
    assert int(response.headers["Retry-After"]) >= 1

    renewed = await post(client, "/v1/locks/report/renew",
                         {"lease_id": first["lease_id"], "ttl_ms": 5000})  # fmt: skip
    assert renewed[0] == 200, renewed
    assert renewed[1]["token"] == first["token"]
    for grant in (first, second):
        headers = {"X-Lease-Id": grant["lease_id"]}
        assert (await client.delete("/v1/locks/report", headers=headers)).status == 204

    status, exclusive = await post(client, "/v1/locks/report", {"ttl_ms": 5000})
    assert status == 200, exclusive
    assert exclusive["mode"] == "exclusive"
    assert exclusive["token"] > second["token"]
    status, refused = await post(client, "/v1/locks/report", {"mode": "shared"})
    assert (status, refused["error"]) == (409, "lock_held")


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"mode": "read"}, "mode 'read' is invalid"),
        ({"mode": "SHARED"}, "mode 'SHARED' is invalid"),
        ({"mode": 1}, "mode 1 is invalid"),
        ({"mode": None}, "mode None is invalid"),
        ({"permits": 2}, "unknown field 'permits'"),
    ],
)
async def test_a_bad_mode_is_refused_with_400(
    client: Client, body: dict[str, Any], fragment: str
) -> None:
    status, error = await post(client, "/v1/locks/moded", body)
    assert status == 400, error
    assert error["error"] == "bad_request"
    assert fragment in error["message"]
    assert not (await (await client.get("/v1/locks/moded")).json())["held"]


async def test_a_free_lock_shows_no_mode_and_no_holders(client: Client) -> None:
    state = await (await client.get("/v1/locks/never-taken")).json()
    assert state == {"name": "never-taken", "held": False, "token": state["token"], "ttl_ms": 0,
                     "mode": "", "holders": 0, "permits": 0}  # fmt: skip


# semaphores
async def test_a_semaphore_grants_up_to_permits_leases_with_increasing_tokens(
    client: Client,
) -> None:
    grants = []
    for _ in range(3):
        status, grant = await post(client, "/v1/semaphores/pool", {"permits": 3, "ttl_ms": 5000})
        assert status == 200, grant
        assert set(grant) == {"name", "token", "lease_id", "ttl_ms", "valid_ms", "permits"}
        assert grant["permits"] == 3
        grants.append(grant)
    tokens = [g["token"] for g in grants]
    assert tokens == sorted(tokens)
    assert len(set(tokens)) == 3
    response = await client.post("/v1/semaphores/pool", json={"permits": 3})
    assert response.status == 409
    assert (await response.json())["error"] == "lock_held"
    assert int(response.headers["Retry-After"]) >= 1

    for path in ("/v1/semaphores/pool", "/v1/locks/pool"):  # one name space
        state = await (await client.get(path)).json()
        assert (state["held"], state["mode"], state["holders"], state["permits"]) == (
            True, "semaphore", 3, 3,
        )  # fmt: skip
    status, locked = await post(client, "/v1/locks/pool", {"mode": "shared"})
    assert (status, locked["error"]) == (409, "lock_held")

    renew = {"lease_id": grants[0]["lease_id"], "ttl_ms": 5000}
    status, renewed = await post(client, "/v1/semaphores/pool/renew", renew)
    assert status == 200, renewed
    assert renewed["token"] == grants[0]["token"]
    headers = {"X-Lease-Id": grants[0]["lease_id"]}
    assert (await client.delete("/v1/semaphores/pool", headers=headers)).status == 204
    again = await client.delete("/v1/semaphores/pool", headers=headers)
    assert again.status == 409
    assert (await again.json())["error"] == "lease_lost"
    status, fourth = await post(client, "/v1/semaphores/pool", {"permits": 3})
    assert status == 200, fourth
    assert fourth["token"] > max(tokens)


async def test_other_permits_than_the_holders_are_refused_at_once(client: Client) -> None:
    status, grant = await post(client, "/v1/semaphores/sized", {"permits": 2, "ttl_ms": 5000})
    assert status == 200, grant
    response = await client.post("/v1/semaphores/sized", json={"permits": 5, "wait_ms": 3000})
    assert response.status == 409
    error = await response.json()
    assert error["error"] == "permits_mismatch"
    assert error["permits"] == 2
    assert "Retry-After" not in response.headers  # waiting would not help


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({}, "permits is required"),
        ({"ttl_ms": 1000}, "permits is required"),
        ({"permits": 0}, "permits 0 is outside 1..10000"),
        ({"permits": -1}, "is outside"),
        ({"permits": 10_001}, "permits 10001 is outside 1..10000"),
        ({"permits": 1.5}, "is not a whole number"),
        ({"permits": "2"}, "is not a whole number"),
        ({"permits": True}, "is not a whole number"),
        ({"permits": None}, "is not a whole number"),
        ({"permits": 2, "mode": "shared"}, "unknown field 'mode'"),
    ],
)
async def test_bad_permits_are_refused_with_400(
    client: Client, body: dict[str, Any], fragment: str
) -> None:
    status, error = await post(client, "/v1/semaphores/bad", body)
    assert status == 400, error
    assert error["error"] == "bad_request"
    assert fragment in error["message"]


async def test_a_semaphore_name_whose_last_segment_is_renew_is_refused(client: Client) -> None:
    status, error = await post(client, "/v1/semaphores/jobs/renew", {"permits": 2})
    assert status == 400
    assert "renew" in error["message"]


# idempotent acquire
@pytest.mark.parametrize("path", ["/v1/locks/idem", "/v1/semaphores/idem"])
async def test_a_repeated_acquire_with_its_key_returns_the_same_lease(
    client: Client, path: str
) -> None:
    body = {"ttl_ms": 5000, **({"permits": 1} if "semaphores" in path else {})}
    key = {"Idempotency-Key": "retry-7f3a:2026.11~x"}
    status, first = await post(client, path, body, headers=key)
    assert status == 200, first
    status, again = await post(client, path, {**body, "wait_ms": 1000}, headers=key)
    assert status == 200, again
    assert (again["lease_id"], again["token"]) == (first["lease_id"], first["token"])
    # the same lease, its remaining validity: each answer estimates it from its own
    # request's start and the nodes' pttl (R26), so a loaded first acquire may have
    # counted a few ms more conservatively than the repeat
    assert again["valid_ms"] <= first["valid_ms"] + 20
    status, other = await post(client, path, body, headers={"Idempotency-Key": "another"})
    assert (status, other["error"]) == (409, "lock_held")
    status, plain = await post(client, path, body)
    assert (status, plain["error"]) == (409, "lock_held")
    state = await (await client.get(path)).json()
    assert state["holders"] == 1

    assert (await client.delete(path, headers={"X-Lease-Id": first["lease_id"]})).status == 204
    status, fresh = await post(client, path, body, headers=key)  # not held: a new lease
    assert status == 200, fresh
    assert fresh["lease_id"] != first["lease_id"]
    assert fresh["token"] > first["token"]


async def test_shared_holders_with_their_own_keys_each_get_their_own_lease_back(
    client: Client,
) -> None:
    leases = {}
    for key in ("reader-1", "reader-2"):
        status, grant = await post(client, "/v1/locks/idem-shared", {"mode": "shared"},
                                   headers={"Idempotency-Key": key})  # fmt: skip
        assert status == 200, grant
        leases[key] = grant["lease_id"]
    for key in ("reader-2", "reader-1"):
        status, grant = await post(client, "/v1/locks/idem-shared", {"mode": "shared"},
                                   headers={"Idempotency-Key": key})  # fmt: skip
        assert grant["lease_id"] == leases[key]
    state = await (await client.get("/v1/locks/idem-shared")).json()
    assert state["holders"] == 2


@pytest.mark.parametrize(
    "value",
    ["", "a b", "x" * 129, "key/with/slash", "ключ", "a,b", "k=1", "tab\there"],
    ids=["empty", "space", "129", "slash", "non-ascii", "comma", "equals", "tab"],
)
@pytest.mark.parametrize("path", ["/v1/locks/idem-bad", "/v1/semaphores/idem-bad"])
async def test_a_bad_idempotency_key_is_refused_with_400(
    client: Client, path: str, value: str
) -> None:
    body = {"permits": 1} if "semaphores" in path else {}
    response = await client.post(
        path, json=body, headers={"Idempotency-Key": value.encode().decode("latin-1")}
    )
    assert response.status == 400
    error = await response.json()
    assert error["error"] == "bad_request"
    assert "Idempotency-Key" in error["message"]
    assert not (await (await client.get(path)).json())["held"]


async def test_an_idempotency_key_of_128_characters_is_taken(client: Client) -> None:
    key = "A-z0.9_~:" * 14 + "ab"
    assert len(key) == 128
    status, grant = await post(client, "/v1/locks/idem-long", {}, headers={"Idempotency-Key": key})
    assert status == 200, grant


async def test_with_auth_an_idempotency_key_is_scoped_to_the_api_key(
    start: Start, lock_urls: list[str]
) -> None:
    client = await start(make_config(lock_urls=lock_urls, auth=auth_section()))
    key = {"Idempotency-Key": "nightly-1"}
    status, mine = await post(client, "/v1/locks/billing/run", {"ttl_ms": 5000},
                              headers={**bearer("billing"), **key})  # fmt: skip
    assert status == 200, mine
    # Another API key choosing the same Idempotency-Key never gets billing's lease.
    status, theirs = await post(client, "/v1/locks/billing/run", {"ttl_ms": 5000},
                                headers={**bearer("admin"), **key})  # fmt: skip
    assert (status, theirs["error"]) == (409, "lock_held"), theirs
    status, again = await post(client, "/v1/locks/billing/run", {"ttl_ms": 5000},
                               headers={**bearer("billing"), **key})  # fmt: skip
    assert status == 200, again
    assert again["lease_id"] == mine["lease_id"]


async def test_the_lock_verb_and_lock_prefixes_cover_semaphores(
    start: Start, lock_urls: list[str]
) -> None:
    client = await start(make_config(lock_urls=lock_urls, auth=auth_section()))
    response = await client.post("/v1/semaphores/billing/pool", json={"permits": 2})
    assert response.status == 401
    response = await client.post("/v1/semaphores/other/pool", json={"permits": 2},
                                 headers=bearer("billing"))  # fmt: skip
    assert response.status == 403
    assert "may not take the lock 'other/pool'" in (await response.json())["message"]
    response = await client.get("/v1/semaphores/billing/pool", headers=bearer("reader"))
    assert response.status == 403
    assert "lacks the verb 'lock'" in (await response.json())["message"]
    status, grant = await post(client, "/v1/semaphores/billing/pool", {"permits": 2},
                               headers=bearer("billing"))  # fmt: skip
    assert status == 200, grant
    response = await client.delete("/v1/semaphores/billing/pool",
                                   headers={"X-Lease-Id": grant["lease_id"]})  # fmt: skip
    assert response.status == 401


# metrics
async def test_acquisitions_are_counted_by_kind_and_result(
    start: Start, lock_urls: list[str]
) -> None:
    registry = CollectorRegistry()
    client = await start(make_config(lock_urls=lock_urls), registry)
    for _ in range(2):
        assert (await client.post("/v1/locks/zq-kinds", json={"mode": "shared"})).status == 200
    assert (await client.post("/v1/locks/zq-kinds", json={})).status == 409
    assert (await client.post("/v1/semaphores/zq-sem", json={"permits": 1})).status == 200
    assert (await client.post("/v1/semaphores/zq-sem", json={"permits": 1})).status == 409
    assert (await client.post("/v1/semaphores/zq-sem", json={"permits": 2})).status == 409

    def count(kind: str, result: str) -> float | None:
        labels = {"kind": kind, "result": result}
        return registry.get_sample_value("fencegate_lock_acquisitions_by_kind_total", labels)

    assert count("shared", "granted") == 2
    assert count("exclusive", "held") == 1
    assert count("exclusive", "granted") == 0  # exported before its first event
    assert count("semaphore", "granted") == 1
    assert count("semaphore", "held") == 1
    assert count("semaphore", "permits_mismatch") == 1
    waits = registry.get_sample_value(
        "fencegate_lock_acquire_wait_by_kind_seconds_count", {"kind": "shared", "result": "granted"}
    )
    assert waits == 2
    text = await (await client.get("/metrics")).text()
    assert "zq-" not in text  # never a lock name as a label


async def test_answers_match_their_openapi_schemas(client: Client) -> None:
    from jsonschema import Draft202012Validator

    doc = await (await client.get("/v1/openapi.json")).json()
    schemas = doc["components"]["schemas"]
    answers = {
        "Grant": await (await client.post("/v1/locks/doc", json={"mode": "shared"})).json(),
        "SemaphoreGrant": await (
            await client.post("/v1/semaphores/doc-sem", json={"permits": 2})
        ).json(),
        "LockState": await (await client.get("/v1/locks/doc")).json(),
    }
    for name, answer in answers.items():
        assert set(answer) == set(schemas[name]["properties"]), (name, answer)
        assert set(schemas[name]["required"]) == set(answer), name
        Draft202012Validator(schemas[name]).validate(answer)
    error = await (await client.post("/v1/semaphores/doc-sem", json={"permits": 3})).json()
    Draft202012Validator(schemas["Error"]).validate(error)
    assert "permits" in schemas["Error"]["properties"]
    for path in ("/v1/locks/{name}", "/v1/semaphores/{name}"):
        post_op = doc["paths"][path]["post"]
        refs = [p.get("$ref", "") for p in post_op["parameters"]]
        assert "#/components/parameters/IdempotencyKey" in refs, path
    responses = doc["paths"]["/v1/semaphores/{name}"]["post"]["responses"]
    assert "permits_mismatch" in responses["409"]["description"]
    assert "Retry-After" in responses["409"]["headers"]


async def test_draining_answers_a_waiting_semaphore_acquire_and_refuses_new_ones(
    client: Client,
) -> None:
    status, held = await post(client, "/v1/semaphores/drained", {"permits": 1, "ttl_ms": 5000})
    assert status == 200, held
    waiting = asyncio.create_task(
        post(client, "/v1/semaphores/drained", {"permits": 1, "wait_ms": 10_000})
    )
    await asyncio.sleep(0.2)
    assert client.app is not None
    start_draining(client.app)
    status, answer = await asyncio.wait_for(waiting, 5)
    assert (status, answer["error"]) == (503, "shutting_down")
    status, refused = await post(client, "/v1/semaphores/other", {"permits": 1})
    assert (status, refused["error"]) == (503, "shutting_down")
    headers = {"X-Lease-Id": held["lease_id"]}  # holders can still finish
    assert (await client.delete("/v1/semaphores/drained", headers=headers)).status == 204


async def test_draining_answers_every_waiting_acquire_at_once_and_leaves_the_holders(
    client: Client,
) -> None:
    """One drain cuts every acquire in flight (one registry for all of them), whatever its
    kind and name; the leases granted before it stand."""
    held = {}
    for path, body in (("/v1/locks/d/x", {}), ("/v1/locks/d/s", {}),
                       ("/v1/semaphores/d/m", {"permits": 1})):  # fmt: skip
        status, held[path] = await post(client, path, {**body, "ttl_ms": 20_000})
        assert status == 200, held[path]
    waits = [
        ("/v1/locks/d/x", {}), ("/v1/locks/d/x", {"mode": "shared"}),
        ("/v1/locks/d/s", {}), ("/v1/semaphores/d/m", {"permits": 1}),
    ]  # fmt: skip
    waiting = [
        asyncio.create_task(post(client, path, {**body, "wait_ms": 15_000})) for path, body in waits
    ]
    await asyncio.sleep(0.3)
    assert not any(w.done() for w in waiting)
    assert client.app is not None
    assert len(client.app[STATE].acquires) == len(waits)
    start_draining(client.app)
    answers = await asyncio.wait_for(asyncio.gather(*waiting), 5)
    assert [(status, a["error"]) for status, a in answers] == [(503, "shutting_down")] * len(waits)
    assert len(client.app[STATE].acquires) == 0
    for path, lease in held.items():  # holders can still finish
        response = await client.delete(path, headers={"X-Lease-Id": lease["lease_id"]})
        assert response.status == 204, path


async def test_a_shared_lease_token_is_refused_for_a_fenced_read_after_a_later_write(
    start: Start, lock_urls: list[str], tmp_path: Any
) -> None:
    stores = {"files": {"type": "files", "root": str(tmp_path / "files")}}
    client = await start(make_config(lock_urls=lock_urls, stores=stores))
    status, reader = await post(client, "/v1/locks/files/report", {"mode": "shared"})
    assert status == 200, reader
    fenced = {"X-Fencing-Token": str(reader["token"])}
    assert (await client.put("/v1/stores/files/report", data=b"v1", headers=fenced)).status == 200
    assert (await client.get("/v1/stores/files/report", headers=fenced)).status == 200
    headers = {"X-Lease-Id": reader["lease_id"]}
    assert (await client.delete("/v1/locks/files/report", headers=headers)).status == 204
    status, writer = await post(client, "/v1/locks/files/report", {})
    assert status == 200, writer
    written = await client.put("/v1/stores/files/report", data=b"v2",
                               headers={"X-Fencing-Token": str(writer["token"])})  # fmt: skip
    assert written.status == 200
    late = await client.get("/v1/stores/files/report", headers=fenced)  # the reader, paused
    assert late.status == 409
    assert (await late.json())["error"] == "stale_token"


async def test_a_lease_fenced_store_takes_only_the_newest_holders_token(
    start: Start, lock_urls: list[str], tmp_path: Any
) -> None:
    # fencing = "lease" checks the token against the one GET /v1/locks shows: of several
    # shared or semaphore holders, the newest. An older holder's write is refused (the
    # safe side: the gateway cannot tell which of the holders' tokens it is).
    stores = {"files": {"type": "files", "root": str(tmp_path / "files"), "fencing": "lease"}}
    client = await start(make_config(lock_urls=lock_urls, stores=stores))
    grants = [(await post(client, "/v1/semaphores/files/pool", {"permits": 2}))[1] for _ in "ab"]
    older, newer = sorted(grants, key=lambda g: g["token"])

    async def put(grant: dict[str, Any]) -> int:
        headers = {"X-Fencing-Token": str(grant["token"])}
        return (await client.put("/v1/stores/files/pool", data=b"x", headers=headers)).status

    assert await put(newer) == 200
    assert await put(older) == 409
