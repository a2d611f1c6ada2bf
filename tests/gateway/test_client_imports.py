"""The Python clients work with the server's dependencies refused at import.

Each case runs ``tests/gateway/client_without_server.py`` in a fresh interpreter
against a real gateway: it refuses hiredis, redis, asyncpg, prometheus_client,
storage_adapters, aiobotocore, asyncmy, uvloop and every project module but the
clients' (``sync``: everything outside the standard library), then locks,
renews, inspects and releases through the client (``cli``: the ``fencegate``
command's HTTP verbs).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from tests.gateway.conftest import Client, Start, make_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
async def url(start: Start, lock_urls: list[str]) -> str:
    server: Client = await start(make_config(lock_urls=lock_urls))
    return str(server.make_url("")).rstrip("/")


async def run_probe(mode: str, url: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.gateway.client_without_server", mode, url,
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


@pytest.mark.parametrize("mode", ["async", "sync", "cli"])
async def test_a_client_works_without_the_server_dependencies(mode: str, url: str) -> None:
    code, out, err = await run_probe(mode, url)
    assert (code, out.strip()) == (0, "ok"), err


def test_every_error_code_a_request_can_meet_has_a_client_class() -> None:
    """The client raises a class of its own for each code the gateway answers with
    (``gateway.errors.STATUS``), not a bare FencegateError."""
    from gateway import errors
    from gateway._client_base import BY_CODE

    # a method or route the clients never send; 500s are bugs, not refusals
    not_for_clients = {"method_not_allowed", "route_not_found"}
    codes = set()
    for cls, status in errors.STATUS.items():
        code = getattr(cls, "code", None)
        if status < 500 or status == 503:
            assert isinstance(code, str), cls
            codes.add(code)
        # subclasses answer with their own codes at their base's status
        codes |= {
            sub.code
            for sub in _subclasses(cls)
            if isinstance(getattr(sub, "code", None), str)
            and errors.STATUS.get(sub) is None
            and (status < 500 or status == 503)
        }
    missing = sorted(codes - not_for_clients - set(BY_CODE))
    assert not missing, missing


def _subclasses(cls: type) -> set[type]:
    found: set[type] = set()
    for sub in cls.__subclasses__():
        found |= {sub, *_subclasses(sub)}
    return found
