"""[[auth.keys]]: 401 without a known bearer key, 403 outside its prefixes or verbs, first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.gateway.conftest import API_KEYS, Client, Start, auth_section, bearer, make_config


@pytest.fixture
async def client(start: Start, files_root: Path) -> Client:
    stores = {"files": {"type": "files", "root": str(files_root)}}
    return await start(make_config(stores=stores, auth=auth_section()))


async def take(client: Client, name: str, key: str = "admin") -> dict[str, Any]:
    response = await client.post(f"/v1/locks/{name}", headers=bearer(key))
    assert response.status == 200, await response.text()
    grant: dict[str, Any] = await response.json()
    return grant


async def code(response: Any) -> tuple[int, str]:
    return response.status, (await response.json())["error"]


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/locks/billing/1"),
        ("POST", "/v1/locks/billing/1/renew"),
        ("DELETE", "/v1/locks/billing/1"),
        ("GET", "/v1/locks/billing/1"),
        ("PUT", "/v1/stores/files/billing/1"),
        ("GET", "/v1/stores/files/billing/1"),
        ("DELETE", "/v1/stores/files/billing/1"),
        ("GET", "/v1/nothing/here"),
        ("PUT", "/v1/stores/nope/k"),
        ("PATCH", "/v1/locks/billing/1"),  # a /v1 path no route takes by this method
    ],
)
@pytest.mark.parametrize(
    "authorization", [None, "Bearer wrong-key", "Basic YWRtaW46eA==", "Bearer ", API_KEYS["admin"]]
)
async def test_missing_or_unknown_key_is_401_before_anything_else(
    client: Client, method: str, path: str, authorization: str | None
) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    response = await client.request(method, path, headers=headers, data=b"{garbage")
    assert await code(response) == (401, "unauthorized")
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert API_KEYS["admin"] not in await response.text()


@pytest.mark.parametrize("path", ["/v1/openapi.json", "/healthz", "/readyz", "/metrics"])
async def test_open_routes_need_no_key(client: Client, path: str) -> None:
    assert (await client.get(path)).status == 200


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/nope", 404),
        ("GET", "/v2/locks/x", 404),
        ("GET", "/v1", 404),
        ("POST", "/healthz", 405),
        ("PUT", "/v1/openapi.json", 405),
    ],
)
async def test_paths_outside_v1_that_no_route_takes_need_no_key(
    client: Client, method: str, path: str, status: int
) -> None:
    """404 or 405 as without [auth]: only /v1 (but its open paths) asks for a key."""
    response = await client.request(method, path)
    assert response.status == status
    assert "WWW-Authenticate" not in response.headers


async def test_key_may_lock_inside_its_prefix_only(client: Client) -> None:
    grant = await take(client, "billing/inv/1", key="billing")
    assert grant["token"] > 0
    response = await client.post("/v1/locks/orders/1", headers=bearer("billing"))
    assert await code(response) == (403, "forbidden")
    status = await client.get("/v1/locks/orders/1", headers=bearer("billing"))
    assert await code(status) == (403, "forbidden")


async def test_forbidden_comes_before_validation(client: Client) -> None:
    # a bad name outside the prefix: 403, not 400
    response = await client.post("/v1/locks/other%20name", headers=bearer("billing"))
    assert await code(response) == (403, "forbidden")
    # an unknown store outside the prefix: 403, not 404
    response = await client.put("/v1/stores/nope/k", headers=bearer("billing"))
    assert await code(response) == (403, "forbidden")


async def test_write_outside_prefix_is_403_and_nothing_written(client: Client) -> None:
    grant = await take(client, "files/orders/1")
    headers = {**bearer("billing"), "X-Fencing-Token": str(grant["token"])}
    response = await client.put("/v1/stores/files/orders/1", data=b"sneaky", headers=headers)
    assert await code(response) == (403, "forbidden")
    missing = await client.get("/v1/stores/files/orders/1", headers=bearer("admin"))
    assert await code(missing) == (404, "not_found")


async def test_verbs_are_checked(client: Client) -> None:
    grant = await take(client, "files/doc")
    write = {"X-Fencing-Token": str(grant["token"])}
    ok = await client.put("/v1/stores/files/doc", data=b"v1", headers={**bearer("admin"), **write})
    assert ok.status == 200
    # the reader may read but not write, delete or lock
    got = await client.get("/v1/stores/files/doc", headers=bearer("reader"))
    assert got.status == 200
    assert await got.read() == b"v1"
    response = await client.put(
        "/v1/stores/files/doc", data=b"v2", headers={**bearer("reader"), **write}
    )
    assert await code(response) == (403, "forbidden")
    response = await client.delete("/v1/stores/files/doc", headers={**bearer("reader"), **write})
    assert await code(response) == (403, "forbidden")
    response = await client.post("/v1/locks/anything", headers=bearer("reader"))
    assert await code(response) == (403, "forbidden")
    got = await client.get("/v1/stores/files/doc", headers=bearer("admin"))
    assert await got.read() == b"v1"


async def test_allowed_key_goes_through_every_route(client: Client) -> None:
    h = bearer("billing")
    grant = await take(client, "billing/x", key="billing")
    renew = await client.post(
        "/v1/locks/billing/x/renew", json={"lease_id": grant["lease_id"]}, headers=h
    )
    assert renew.status == 200
    status = await client.get("/v1/locks/billing/x", headers=h)
    assert status.status == 200
    store_lock = await take(client, "files/billing/x", key="admin")
    write = {**h, "X-Fencing-Token": str(store_lock["token"])}
    assert (await client.put("/v1/stores/files/billing/x", data=b"ok", headers=write)).status == 200
    assert (await client.get("/v1/stores/files/billing/x", headers=h)).status == 200
    assert (await client.delete("/v1/stores/files/billing/x", headers=write)).status == 204
    release = await client.delete(
        "/v1/locks/billing/x", headers={**h, "X-Lease-Id": grant["lease_id"]}
    )
    assert release.status == 204


async def test_unknown_route_with_a_valid_key_is_404_json(client: Client) -> None:
    response = await client.get("/v1/nothing/here", headers=bearer("admin"))
    assert await code(response) == (404, "not_found")
