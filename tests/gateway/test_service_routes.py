"""/healthz, /readyz, /metrics, /v1/openapi.json, unknown routes and methods, draining."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from gateway.app import start_draining
from gateway.guard import UNMATCHED, add_guarded
from tests.gateway.conftest import Client, Start, make_config


@pytest.fixture
async def client(start: Start, files_root: Path) -> Client:
    stores = {"files": {"type": "files", "root": str(files_root)}}
    return await start(make_config(stores=stores))


def app_of(client: Client) -> web.Application:
    app = client.app
    assert app is not None
    return app


async def test_healthz(client: Client) -> None:
    response = await client.get("/healthz")
    assert response.status == 200
    assert await response.json() == {"status": "ok"}


async def test_readyz_when_ready(client: Client) -> None:
    response = await client.get("/readyz")
    assert response.status == 200
    assert await response.json() == {
        "ready": True,
        "draining": False,
        "locks": "ok",
        "semaphores": {"ready": True},
        "stores": {"files": "ok"},
    }


async def test_draining_turns_readyz_503_and_refuses_new_writes(client: Client) -> None:
    grant = await (await client.post("/v1/locks/files/k")).json()
    start_draining(app_of(client))
    ready = await client.get("/readyz")
    assert ready.status == 503
    assert (await ready.json())["draining"] is True
    assert (await client.get("/healthz")).status == 200
    put = await client.put(
        "/v1/stores/files/k", data=b"x", headers={"X-Fencing-Token": str(grant["token"])}
    )
    assert put.status == 503
    assert (await put.json())["error"] == "shutting_down"
    acquire = await client.post("/v1/locks/other")
    assert (await acquire.json())["error"] == "shutting_down"
    # holders can still finish: reads, renew and release go through
    assert (await client.get("/v1/locks/files/k")).status == 200
    release = await client.delete("/v1/locks/files/k", headers={"X-Lease-Id": grant["lease_id"]})
    assert release.status == 204


@pytest.mark.parametrize(
    "path", ["/nope", "/v1/nope", "/v1/locks", "/v1/stores/files", "/v2/locks/x"]
)
async def test_unknown_route_is_404_json(client: Client, path: str) -> None:
    response = await client.get(path)
    assert response.status == 404
    body = await response.json()
    assert body["error"] == "not_found"
    assert body["message"]


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("PATCH", "/v1/locks/x"),
        ("PUT", "/v1/locks/x"),
        ("POST", "/v1/stores/files/k"),
        ("POST", "/healthz"),
    ],
)
async def test_wrong_method_is_405_json(client: Client, method: str, path: str) -> None:
    response = await client.request(method, path)
    assert response.status == 405
    body = await response.json()
    assert body["error"] == "method_not_allowed"
    assert set(response.headers["Allow"].split(", ")) == set(body["allowed"])


async def test_each_path_is_one_resource_with_its_renew_route_first(client: Client) -> None:
    """The routes of one path share one resource (aiohttp tries them one at a time), and
    a renew route is tried before its name's, which would take ``x/renew`` as a name."""
    resources = [r for r in app_of(client).router.resources() if r.name != UNMATCHED]
    paths = [r.canonical for r in resources]
    assert len(paths) == len(set(paths))
    for kind in ("locks", "semaphores"):
        assert paths.index(f"/v1/{kind}/{{name}}/renew") < paths.index(f"/v1/{kind}/{{name}}")
        [named] = [r for r in resources if r.canonical == f"/v1/{kind}/{{name}}"]
        assert {route.method for route in named} == {"POST", "DELETE", "GET", "HEAD"}
    [store] = [r for r in resources if r.canonical == "/v1/stores/{store}/{key}"]
    assert {route.method for route in store} == {"PUT", "GET", "DELETE"}  # no HEAD
    response = await client.put("/v1/locks/x/renew")
    assert response.status == 405
    assert set(response.headers["Allow"].split(", ")) == {"POST", "DELETE", "GET", "HEAD"}


def test_a_guarded_route_takes_no_option_the_guard_would_drop() -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.Response()

    with pytest.raises(TypeError, match="takes only"):
        add_guarded(web.Application(), [web.get("/x", handler, expect_handler=handler)])


async def test_a_request_target_that_is_no_path_is_404_json(client: Client) -> None:
    """``OPTIONS *`` (RFC 9110 9.3.7) names no path: no route takes it, and it is answered
    as every path no route takes is, in JSON, not with aiohttp's text."""
    port = client.server.port
    assert port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n")
        async with asyncio.timeout(10):
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            fields = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in head[1:] if h)}
            body = json.loads(await reader.readexactly(int(fields["content-length"])))
    finally:
        writer.close()
    assert head[0].split()[1] == "404"
    assert fields["content-type"] == "application/json; charset=utf-8"
    assert body["error"] == "not_found"


async def test_openapi_lists_exactly_the_routes_of_the_app(client: Client) -> None:
    response = await client.get("/v1/openapi.json")
    assert response.status == 200
    doc = await response.json()
    assert doc["openapi"].startswith("3.")
    documented = {
        (method.upper(), path)
        for path, item in doc["paths"].items()
        for method in item
        if method in {"get", "put", "post", "delete", "patch", "head", "options"}
    }
    routed = {
        (route.method, route.resource.canonical)
        for route in app_of(client).router.routes()
        if route.resource is not None and route.name != UNMATCHED  # 404/405 for the rest
    }
    assert documented == routed


async def test_openapi_document_is_valid_openapi_3_1(client: Client) -> None:
    from openapi_spec_validator import OpenAPIV31SpecValidator

    doc = await (await client.get("/v1/openapi.json")).json()
    assert doc["openapi"] == "3.1.0"
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
              for e in OpenAPIV31SpecValidator(doc).iter_errors()]  # fmt: skip
    assert errors == []


async def test_acquire_and_renew_answers_match_their_openapi_schemas(client: Client) -> None:
    from jsonschema import Draft202012Validator

    schemas = (await (await client.get("/v1/openapi.json")).json())["components"]["schemas"]
    for name in ("Grant", "Renewal"):  # every field documented, and required
        Draft202012Validator.check_schema(schemas[name])
        assert {"ttl_ms", "valid_ms"} <= set(schemas[name]["required"])
    response = await client.post("/v1/locks/documented", json={"ttl_ms": 2000})
    grant = await response.json()
    renew_body = {"lease_id": grant["lease_id"], "ttl_ms": 3000}
    renewal = await (await client.post("/v1/locks/documented/renew", json=renew_body)).json()
    for schema, answer in ((schemas["Grant"], grant), (schemas["Renewal"], renewal)):
        assert set(answer) == set(schema["properties"]), answer
        Draft202012Validator(schema).validate(answer)


async def test_openapi_documents_every_error_code_and_header(client: Client) -> None:
    doc = await (await client.get("/v1/openapi.json")).json()
    text = str(doc)
    for code in ("lock_held", "quorum_unavailable", "bad_request", "lease_lost", "token_required",
                 "bad_token", "stale_token", "token_not_issued", "unknown_store", "too_large",
                 "not_found", "storage_unavailable", "unauthorized", "forbidden",
                 "permits_mismatch", "method_not_allowed"):  # fmt: skip
        assert code in text, code
    for header in ("Retry-After", "X-Fencing-Token", "X-Fencing-Lock", "X-Lease-Id",
                   "Idempotency-Key"):  # fmt: skip
        assert header in text, header
    acquire = doc["paths"]["/v1/locks/{name}"]["post"]["responses"]
    assert set(acquire) >= {"200", "400", "409", "503"}
    assert "Retry-After" in acquire["409"]["headers"]
    put = doc["paths"]["/v1/stores/{store}/{key}"]["put"]["responses"]
    assert set(put) >= {"200", "400", "403", "404", "409", "413", "428", "503"}
    for method in ("put", "get", "delete"):  # a legacy table changed under the gateway
        store_503 = doc["paths"]["/v1/stores/{store}/{key}"][method]["responses"]["503"]
        assert "storage_config" in store_503["description"], method
        assert "storage_corrupt" in store_503["description"], method  # metadata written around
    assert set(doc["paths"]["/v1/stats/hot"]["get"]["responses"]) >= {"200", "400", "401"}
    assert "Allow" in doc["components"]["responses"]["MethodNotAllowed"]["headers"]


@pytest.mark.parametrize(
    ("path", "template"),
    [("/v1/locks/big", "/v1/locks/{name}"), ("/v1/locks/big/renew", "/v1/locks/{name}/renew"),
     ("/v1/semaphores/big", "/v1/semaphores/{name}"),
     ("/v1/semaphores/big/renew", "/v1/semaphores/{name}/renew")],
)  # fmt: skip
async def test_a_lock_body_above_max_body_bytes_is_413_as_documented(
    start: Start, path: str, template: str
) -> None:
    client = await start(make_config(max_body_bytes=64))
    body = b'{"ttl_ms": 1000, "pad": "' + b"x" * 100 + b'"}'
    response = await client.post(path, data=body, headers={"Content-Type": "application/json"})
    assert response.status == 413, await response.text()
    assert (await response.json())["error"] == "too_large"
    doc = await (await client.get("/v1/openapi.json")).json()
    documented = doc["paths"][template]["post"]["responses"]
    assert "413" in documented, sorted(documented)
    assert "too_large" in str(documented["413"])


async def test_metrics_are_prometheus_text_with_route_templates(
    start: Start, files_root: Path
) -> None:
    registry = CollectorRegistry()
    config = make_config(stores={"files": {"type": "files", "root": str(files_root)}})
    client = await start(config, registry)
    grant = await (await client.post("/v1/locks/files/secret-name", json={"ttl_ms": 5000})).json()
    headers = {"X-Fencing-Token": str(grant["token"])}
    await client.put("/v1/stores/files/secret-name", data=b"v", headers=headers)
    await client.put("/v1/stores/files/secret-name", data=b"v", headers={"X-Fencing-Token": "x"})
    await client.put(
        "/v1/stores/files/secret-name", data=b"v", headers={"X-Fencing-Token": "999999999999999999"}
    )
    await client.put("/v1/stores/files/secret-name", data=b"v")
    await client.post("/v1/locks/files/secret-name")
    response = await client.get("/metrics")
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/plain")
    text = await response.text()
    assert "secret-name" not in text
    assert grant["lease_id"] not in text
    assert str(grant["token"]) not in text

    def value(name: str, **labels: str) -> float | None:
        got = registry.get_sample_value(name, labels)
        return got

    assert value("fencegate_lock_acquisitions_total", result="granted") == 1
    assert value("fencegate_lock_acquisitions_total", result="held") == 1
    assert value("fencegate_leases_held") == 1
    assert value("fencegate_storage_writes_total", store="files", result="ok") == 1
    assert value("fencegate_storage_write_duration_seconds_count", store="files") == 1
    for reason in ("bad_token", "token_not_issued", "token_required"):
        assert value("fencegate_fencing_rejections_total", store="files", reason=reason) == 1
    route = "/v1/stores/{store}/{key}"
    assert value("fencegate_http_requests_total", route=route, method="PUT", status="200") == 1
    assert value("fencegate_http_requests_total", route=route, method="PUT", status="428") == 1
    assert (
        value(
            "fencegate_http_requests_total", route="/v1/locks/{name}", method="POST", status="409"
        )
        == 1
    )
    assert value("fencegate_http_request_duration_seconds_count", route=route, method="PUT") == 4
    await client.get("/no/such/path")
    assert (
        value("fencegate_http_requests_total", route="unmatched", method="GET", status="404") == 1
    )
    for name in ("fencegate_lock_acquire_wait_seconds", "fencegate_lock_hold_seconds",
                 "fencegate_lock_waiters", "fencegate_quorum_failures_total",
                 "fencegate_redis_node_latency_seconds", "fencegate_lock_renewals_total",
                 "fencegate_leases_lost_total"):  # fmt: skip
        assert f"# TYPE {name.removesuffix('_total')}" in text, name


async def test_requests_are_counted_by_their_own_method(start: Start) -> None:
    """HEAD (which a GET route takes) is counted as HEAD, on a route as on no route;
    a method outside the known ones as "other"."""
    registry = CollectorRegistry()
    client = await start(make_config(), registry)
    assert (await client.head("/v1/locks/counted")).status == 200
    assert (await client.head("/no/such/path")).status == 404
    assert (await client.request("PROPFIND", "/v1/locks/counted")).status == 405

    def count(route: str, method: str, status: str) -> float | None:
        labels = {"route": route, "method": method, "status": status}
        return registry.get_sample_value("fencegate_http_requests_total", labels)

    assert count("/v1/locks/{name}", "HEAD", "200") == 1
    assert count(UNMATCHED, "HEAD", "404") == 1
    assert count(UNMATCHED, "other", "405") == 1
    assert count("/v1/locks/{name}", "GET", "200") is None


async def test_hold_time_is_observed_on_release(start: Start) -> None:
    registry = CollectorRegistry()
    client = await start(make_config(), registry)
    grant = await (await client.post("/v1/locks/held")).json()
    await client.delete("/v1/locks/held", headers={"X-Lease-Id": grant["lease_id"]})
    assert registry.get_sample_value("fencegate_lock_hold_seconds_count") == 1
    assert registry.get_sample_value("fencegate_leases_held") == 0
    assert registry.get_sample_value("fencegate_lock_releases_total", {"result": "released"}) == 1


async def test_metrics_are_not_on_the_main_port_when_metrics_listen_is_set(
    start: Start, files_root: Path
) -> None:
    registry = CollectorRegistry()
    config = make_config(
        stores={"files": {"type": "files", "root": str(files_root)}},
        metrics_listen="127.0.0.1:9108",
    )
    client = await start(config, registry)
    assert (await client.post("/v1/locks/x", json={"ttl_ms": 5000})).status == 200
    response = await client.get("/metrics")
    assert response.status == 404
    assert (await response.json())["error"] == "not_found"
    # the registry still counts: fencegate serve exposes it on metrics_listen
    granted = registry.get_sample_value("fencegate_lock_acquisitions_total", {"result": "granted"})
    assert granted == 1.0
    routed = {route.resource.canonical for route in app_of(client).router.routes()
              if route.resource is not None}  # fmt: skip
    assert "/metrics" not in routed
    assert "/healthz" in routed
