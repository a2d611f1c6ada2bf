"""Store routes beyond the contract suite (tests/stores): content types, the files root,
lease and none fencing, the issued-token cache and its messages."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tests._servers import RedisNode
from tests.gateway.conftest import (
    Client,
    Start,
    drop,
    error,
    make_config,
    store_section,
    take,
)

KINDS = ["files", "kv", "legacy"]


def encode(kind: str, value: str) -> bytes:
    """A body holding ``value``: the bytes, or for a legacy table a JSON object of columns."""
    if kind == "legacy":
        return json.dumps({"note": value, "balance": "1.50"}).encode()
    return value.encode()


def decode(kind: str, raw: bytes) -> str:
    if kind == "legacy":
        note: str = json.loads(raw)["note"]
        return note
    return raw.decode()


@pytest.fixture
def stores(files_root: Path, pg_dsn: str, pg_schema: str, legacy_table: str) -> dict[str, Any]:
    return {
        k: store_section(k, files_root=files_root, pg_dsn=pg_dsn, pg_schema=pg_schema)
        for k in KINDS
    }


@pytest.fixture
async def client(start: Start, stores: dict[str, Any]) -> Client:
    return await start(make_config(stores=stores))


async def put(
    client: Client, kind: str, key: str, value: str, token: int | str | None, **headers: str
) -> Any:
    if token is not None:
        headers["X-Fencing-Token"] = str(token)
    return await client.put(f"/v1/stores/{kind}/{key}", data=encode(kind, value), headers=headers)


async def read(client: Client, kind: str, key: str) -> str | None:
    response = await client.get(f"/v1/stores/{kind}/{key}")
    if response.status == 404:
        assert (await response.json())["error"] == "not_found"
        return None
    assert response.status == 200, await response.text()
    return decode(kind, await response.read())


@pytest.mark.parametrize("kind", ["files", "kv"])
async def test_get_returns_the_stored_content_type(client: Client, kind: str) -> None:
    grant = await take(client, f"{kind}/doc")
    response = await put(
        client, kind, "doc", "{}", grant["token"], **{"Content-Type": "text/plain; charset=utf-8"}
    )
    assert response.status == 200
    got = await client.get(f"/v1/stores/{kind}/doc")
    assert got.headers["Content-Type"] == "text/plain; charset=utf-8"


async def test_largest_token_is_accepted_as_a_token(client: Client) -> None:
    # 2**63 - 1 is well formed; it was never issued, so the guard refuses it.
    await error(await put(client, "kv", "k", "x", 2**63 - 1), 403, "token_not_issued")


@pytest.mark.parametrize(
    "path",
    [
        "/v1/stores/files/%2E%2E/etc/passwd",
        "/v1/stores/files//etc/passwd",
        "/v1/stores/files/a/%2e%2e/%2e%2e/b",
        "/v1/stores/files/a%2F..%2F..%2Fescape",
    ],
)
async def test_bad_keys_are_400_and_nothing_escapes_the_root(
    client: Client, files_root: Path, path: str
) -> None:
    from yarl import URL

    grant = await take(client, "any")
    url = URL(str(client.make_url("")).rstrip("/") + path, encoded=True)
    response = await client.session.put(
        url, data=b"x", headers={"X-Fencing-Token": str(grant["token"])}
    )
    await error(response, 400, "bad_request")
    assert not (files_root.parent / "etc").exists()
    assert not (files_root.parent / "escape").exists()


async def test_oversized_body_without_content_length_is_413(
    start: Start, stores: dict[str, Any]
) -> None:
    # The contract suite sends a Content-Length; a streamed body is held to the limit too.
    client = await start(make_config(stores=stores, max_body_bytes=1024))
    grant = await take(client, "files/big")
    headers = {"X-Fencing-Token": str(grant["token"])}

    async def chunks() -> Any:
        for _ in range(4):
            yield b"y" * 512

    response = await client.put("/v1/stores/files/big", data=chunks(), headers=headers)
    body = await error(response, 413, "too_large")
    assert body["limit"] == 1024
    assert await read(client, "files", "big") is None
    assert (
        await client.put("/v1/stores/files/big", data=b"z" * 1024, headers=headers)
    ).status == 200


@pytest.mark.parametrize("late", [False, True])
async def test_a_body_is_written_whole_whether_it_came_at_once_or_in_late_pieces(
    client: Client, late: bool
) -> None:
    grant = await take(client, "files/pieces")
    first, second = b"a" * 1000, b"b" * 3000

    async def pieces() -> Any:
        yield first
        await asyncio.sleep(0.05)  # the route starts before the rest comes
        yield second

    data: Any = pieces() if late else first + second
    headers = {"X-Fencing-Token": str(grant["token"])}
    response = await client.put("/v1/stores/files/pieces", data=data, headers=headers)
    assert response.status == 200, await response.text()
    assert await read(client, "files", "pieces") == (first + second).decode()


async def test_lease_mode_needs_the_current_holder(start: Start, files_root: Path) -> None:
    stores = {"strict": {"type": "files", "root": str(files_root), "fencing": "lease"}}
    client = await start(make_config(stores=stores))
    first = await take(client, "strict/doc")
    assert (await put(client, "strict", "doc", "one", first["token"])).status == 200
    await drop(client, first)
    # nobody holds the lock: even the newest token is refused
    body = await error(
        await put(client, "strict", "doc", "late", first["token"]), 409, "stale_token"
    )
    assert body["token"] == first["token"]
    second = await take(client, "strict/doc")
    await error(await put(client, "strict", "doc", "old", first["token"]), 409, "stale_token")
    stale_read = await client.get(
        "/v1/stores/strict/doc", headers={"X-Fencing-Token": str(first["token"])}
    )
    await error(stale_read, 409, "stale_token")
    assert (await put(client, "strict", "doc", "two", second["token"])).status == 200
    assert await read(client, "strict", "doc") == "two"


async def test_fencing_none_writes_without_any_check(start: Start, files_root: Path) -> None:
    stores = {"raw": {"type": "files", "root": str(files_root), "fencing": "none"}}
    client = await start(make_config(stores=stores))
    response = await client.put("/v1/stores/raw/k", data=b"a")
    assert response.status == 200
    assert (await response.json())["token"] is None
    assert (await put(client, "raw", "k", "b", 1)).status == 200
    assert await read(client, "raw", "k") == "b"


@pytest.mark.parametrize("fencing", ["token", "none"])
async def test_put_answer_is_the_bytes_json_dumps_gives(
    start: Start, files_root: Path, fencing: str
) -> None:
    # The PUT answer is built without the JSON encoder: the same bytes and header.
    name, key = "Odd_store-1", "A-Z.a_z~0:9/x-y"
    stores = {name: {"type": "files", "root": str(files_root), "fencing": fencing}}
    client = await start(make_config(stores=stores))
    token = (await take(client, f"{name}/{key}"))["token"] if fencing == "token" else None
    headers = {} if token is None else {"X-Fencing-Token": str(token)}
    response = await client.put(f"/v1/stores/{name}/{key}", data=b"v", headers=headers)
    assert response.status == 200
    assert response.headers["Content-Type"] == "application/json; charset=utf-8"
    expected = json.dumps({"store": name, "key": key, "token": token}).encode()
    assert await response.read() == expected


async def test_issued_counter_is_cached_and_refreshed_above_it(
    start: Start, files_root: Path, redis3: list[RedisNode]
) -> None:
    registry = CollectorRegistry()
    stores = {"files": {"type": "files", "root": str(files_root)}}
    client = await start(make_config(lock_urls=[n.url for n in redis3], stores=stores), registry)

    def redis_calls() -> float:
        return sum(
            registry.get_sample_value(
                "fencegate_redis_node_latency_seconds_count", {"node": f"127.0.0.1:{n.port}"}
            )
            or 0.0
            for n in redis3
        )

    first = await take(client, "files/cached")
    before = redis_calls()
    assert (await put(client, "files", "cached", "a", first["token"])).status == 200
    after_miss = redis_calls()
    assert after_miss > before  # asked the lock service once
    assert (await put(client, "files", "cached", "b", first["token"])).status == 200
    assert redis_calls() == after_miss  # answered from the cache
    await drop(client, first)
    second = await take(client, "files/cached")
    after_take = redis_calls()
    assert (await put(client, "files", "cached", "c", second["token"])).status == 200
    assert redis_calls() > after_take  # above the cached counter: asked again, then accepted


async def test_token_of_another_lock_is_403_and_the_message_says_how_to_fix_it(
    start: Start, files_root: Path, lock_urls: list[str]
) -> None:
    # Over both backends: a token is issued per lock name, never for every scope.
    stores = {"files": {"type": "files", "root": str(files_root)}}
    client = await start(make_config(lock_urls=lock_urls, stores=stores))
    grant = await take(client, "orders/42")
    body = await error(await put(client, "files", "orders/42", "paid", grant["token"]), 403,
                       "token_not_issued")  # fmt: skip
    assert body["token"] == grant["token"]
    assert body["issued"] == 0
    assert "'files/orders/42'" in body["message"], body
    assert "X-Fencing-Lock" in body["message"], body
    assert await read(client, "files", "orders/42") is None
    # either fix works: name the lock that was taken, or take the key's own lock
    named = await put(client, "files", "orders/42", "paid", grant["token"],
                      **{"X-Fencing-Lock": "orders/42"})  # fmt: skip
    assert named.status == 200, await named.text()
    elsewhere = await put(client, "files", "orders/42", "x", grant["token"],
                          **{"X-Fencing-Lock": "never/taken"})  # fmt: skip
    body = await error(elsewhere, 403, "token_not_issued")
    assert "'never/taken'" in body["message"], body
    assert "X-Fencing-Lock" in body["message"], body
    own = await take(client, "files/orders/43")
    assert (await put(client, "files", "orders/43", "paid", own["token"])).status == 200


@pytest.mark.parametrize("kind", KINDS)
async def test_every_store_serves_the_content_type_of_the_last_write(
    client: Client, kind: str
) -> None:
    # curl -d sends application/x-www-form-urlencoded; a write without any type is
    # served as application/octet-stream; a legacy table's rows are JSON documents.
    grant = await take(client, f"{kind}/typed")
    form = "application/x-www-form-urlencoded"
    written = await put(client, kind, "typed", "one", grant["token"], **{"Content-Type": form})
    assert written.status == 200, await written.text()
    fenced = {"X-Fencing-Token": str(grant["token"])}
    for headers in ({}, fenced):
        got = await client.get(f"/v1/stores/{kind}/typed", headers=headers)
        assert got.status == 200
        assert got.headers["Content-Type"] == ("application/json" if kind == "legacy" else form)
    untyped = await client.put(
        f"/v1/stores/{kind}/typed", data=encode(kind, "two"), headers=fenced,
        skip_auto_headers=["Content-Type"],
    )  # fmt: skip
    assert untyped.status == 200, await untyped.text()
    got = await client.get(f"/v1/stores/{kind}/typed")
    assert decode(kind, await got.read()) == "two"
    expected = "application/json" if kind == "legacy" else "application/octet-stream"
    assert got.headers["Content-Type"].partition(";")[0] == expected


async def test_a_key_whose_lock_cannot_be_taken_says_to_name_another(
    start: Start, files_root: Path
) -> None:
    # The lock files/jobs/renew is refused by POST /v1/locks (its renew route would be
    # ambiguous), so the default scope of key jobs/renew has no lock a client can take.
    client = await start(make_config(stores={"files": {"type": "files", "root": str(files_root)}}))
    refused = await client.post("/v1/locks/files/jobs/renew", json={"ttl_ms": 1000})
    await error(refused, 400, "bad_request")
    grant = await take(client, "jobs")
    body = await error(await put(client, "files", "jobs/renew", "x", grant["token"]), 403,
                       "token_not_issued")  # fmt: skip
    assert "take that lock" not in body["message"], body
    assert "'renew'" in body["message"], body
    assert "X-Fencing-Lock" in body["message"], body
    named = await put(client, "files", "jobs/renew", "x", grant["token"],
                      **{"X-Fencing-Lock": "jobs"})  # fmt: skip
    assert named.status == 200, await named.text()
