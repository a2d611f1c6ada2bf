"""The docs' examples run as written, against real gateways over three real Redis nodes.

Shell blocks run line by line with the real ``curl`` and the ``fencegate``
command against ``python -m gateway serve`` processes configured with the
README's own configuration block (its stores, on the test's PostgreSQL schema
and a temporary files root; its auth keys and TLS left out, which the examples
do not use) over three ``redis-server`` nodes; a line that starts with ``# {``
is the output the docs show, and the real output must have the same fields with the
same values, but for those that differ from run to run (``_VARYING``, a status's ttl).
Python blocks run as written (top-level ``await`` allowed) against the same
setup; TOML blocks go through ``fencegate check-config``. Blocks the docs mark
``<!-- docs-test: not run (...) -->`` are exactly ``NOT_RUN``.
"""

from __future__ import annotations

import ast
import asyncio
import copy
import hashlib
import inspect
import json
import os
import subprocess
import sys
import tomllib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from gateway.app import create_app
from gateway.config import DEFAULT_STORES, parse_config
from tests._gateway import ServeClient
from tests._servers import RedisNode, free_port
from tests.docs._blocks import ROOT, Block, Substitutions, all_blocks, blocks, shell_commands
from tests.faults.test_gateway_two_processes import gateways, http_session

NOT_RUN = {
    ("README.md", "./dev serve"),  # installs packages and serves on the fixed port 8080
    ("README.md", ". .venv/bin/activate"),  # test_the_three_node_setup_..., on free ports
    ("deploy/README.md", "docker compose -f deploy/compose.yaml up --build"),  # no Docker here
    # the in-database fencing examples: a config file on disk, connections to the table
    ("README.md", "fencegate pg install-fencing --config fencegate.toml --store accounts"),
    ("README.md", "BEGIN;"),
    (
        "README.md",
        "from storage_adapters.pg_fencing import fenced_transaction, fenced_transaction_sync",
    ),
    ("deploy/README.md", "docker build -f deploy/Dockerfile -t fencegate:0.1.0 ."),
    ("deploy/README.md", "kubectl apply -k deploy/kubernetes"),  # no cluster here
    ("deploy/README.md", "apiVersion: kustomize.config.k8s.io/v1beta1"),  # tests/deploy renders it
    ("README.md", "groups = ["),  # a fragment of [locks]: tests/gateway/test_config_groups
}
# What a block leaves behind, checked after it ran: (store, key, body) by its first line.
EFFECTS = {
    "curl -s -XPOST localhost:8080/v1/locks/files/orders/42": ("files", "orders/42", b"paid"),
    "from gateway.client import FencegateClient": ("files", "orders/42", b"paid"),
    "fencegate lock files/orders/42": ("files", "orders/42", b"hello\n"),
}
_VARYING = frozenset({"token", "lease_id", "valid_ms"})
"""Fields of a shown answer that differ from run to run; the others must be as shown."""
SHELL_PRELUDE = """set -euo pipefail
curl() { command curl --fail-with-body --show-error --max-time 30 "$@"; }
fencegate() { "$FENCEGATE_TEST_PYTHON" -m gateway "$@"; }
"""


def runnable(lang: str) -> list[Block]:
    return [b for b in all_blocks() if b.lang == lang and b.skip is None]


def readme_config() -> dict[str, Any]:
    """The configuration block of README.md (the TOML block with ``[locks]``)."""
    (block,) = [b for b in blocks("README.md") if b.lang == "toml" and "[locks]" in b.text]
    return tomllib.loads(block.text)


def gateway_config(
    redis: list[RedisNode], pg_dsn: str, pg_schema: str, root: Path
) -> dict[str, Any]:
    """README's configuration on this machine: its stores, the test's servers."""
    raw = copy.deepcopy(readme_config())
    # listen: a free port per gateway; metrics_listen: one per gateway would be needed
    for left_out in ("auth", "tls", "listen", "metrics_listen"):
        raw.pop(left_out, None)
    raw["locks"]["redis"] = [n.url for n in redis]
    for store in raw["stores"].values():
        if store["type"] == "postgres":
            store.update(dsn=pg_dsn, schema=pg_schema)
        else:
            store["root"] = str(root)
    return raw


def test_only_the_listed_blocks_are_not_run() -> None:
    found = all_blocks()
    not_run = {(b.file, b.first_line.partition("#")[0].strip()) for b in found if b.skip}
    assert not_run == NOT_RUN
    assert {b.lang for b in found if b.skip is None} <= {"sh", "python", "toml"}
    assert len([b for b in found if b.skip is None]) >= 5


@asynccontextmanager
async def running(raw: dict[str, Any], workdir: Path, count: int) -> AsyncIterator[list[str]]:
    with gateways(workdir, raw, count) as procs:
        async with http_session() as session:
            await asyncio.gather(*(p.wait_ready(session) for p in procs))
            try:
                yield [p.url for p in procs]
            except BaseException:
                for p in procs:
                    print(f"--- log of {p.url}:\n{p.log_text()[-4000:]}")
                raise


@pytest.fixture
def setup(
    redis3: list[RedisNode], pg_dsn: str, pg_schema: str, legacy_table: str, tmp_path: Path
) -> Callable[[int], Any]:
    """``async with setup(n) as (urls, subs)``: n README gateways and the substitutions."""
    raw = gateway_config(redis3, pg_dsn, pg_schema, tmp_path / "files")

    @asynccontextmanager
    async def start(count: int) -> AsyncIterator[tuple[list[str], Substitutions]]:
        async with running(raw, tmp_path, count) as urls:
            yield urls, Substitutions(urls, [n.url for n in redis3])

    return start


async def check_effect(block: Block, url: str) -> None:
    effect = next((e for first, e in EFFECTS.items() if block.first_line.startswith(first)), None)
    if effect is None:
        return
    store, key, body = effect
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{url}/v1/stores/{store}/{key}") as response,
    ):
        assert response.status == 200, await response.text()
        assert await response.read() == body


async def run_shell(block: Block, subs: Substitutions, workdir: Path) -> None:
    """Each command line of ``block``, with the docs' values substituted, exit 0 each."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FENCEGATE_")}
    env.update(PYTHONPATH=str(ROOT), FENCEGATE_TEST_PYTHON=sys.executable)
    for command, shown in shell_commands(block.text):
        line = subs.apply(command)
        proc = await asyncio.create_subprocess_exec(
            "bash", "-c", SHELL_PRELUDE + line, cwd=workdir, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        output = out.decode()
        assert proc.returncode == 0, (
            f"{block.id}: {command!r}\nran as {line!r}\nexit {proc.returncode}\n"
            f"stdout: {output}\nstderr: {err.decode()}"
        )
        data = subs.learn(output)
        if shown is not None:
            expected = json.loads(shown)
            assert data is not None, f"{command!r} printed no JSON: {output!r}"
            assert set(data) == set(expected), (command, data, expected)
            for field in set(expected) - _VARYING:
                if field == "ttl_ms" and "held" in expected:
                    continue  # a status's ttl_ms is what is left: it varies
                assert data[field] == expected[field], (command, field, data, expected)


async def run_python(block: Block, subs: Substitutions) -> None:
    """``block`` as a module whose top level may ``await``, within a minute."""
    code = compile(subs.apply(block.text), block.id, "exec",
                   flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)  # fmt: skip
    result = eval(code, {"__name__": "docs_example"})
    if inspect.iscoroutine(result):
        await asyncio.wait_for(result, 60)
    assert subs.seen, f"{block.id} names no address of the test setup"


@pytest.mark.parametrize("block", runnable("sh"), ids=lambda b: b.id)
async def test_shell_block(block: Block, setup: Callable[[int], Any], tmp_path: Path) -> None:
    async with setup(2 if ":8082" in block.text else 1) as (urls, subs):
        await run_shell(block, subs, tmp_path)
        await check_effect(block, urls[0])


@pytest.mark.parametrize("block", runnable("python"), ids=lambda b: b.id)
async def test_python_block(block: Block, setup: Callable[[int], Any]) -> None:
    async with setup(1) as (urls, subs):
        await run_python(block, subs)
        await check_effect(block, urls[0])


ZERO_CONFIG = [b for b in runnable("sh") + runnable("python")
               if b.file == "README.md" and ":8080" in b.text]  # fmt: skip


@pytest.mark.parametrize("block", ZERO_CONFIG, ids=lambda b: b.id)
async def test_readme_http_block_on_the_zero_config_gateway(block: Block, tmp_path: Path) -> None:
    # What ./dev serve runs: no config, so the in-process lock backend and the default
    # files store under ./fencegate-data (written out: the helper always passes a file).
    async with running({"stores": DEFAULT_STORES}, tmp_path, 1) as urls:
        subs = Substitutions(urls, [])
        if block.lang == "sh":
            await run_shell(block, subs, tmp_path)
        else:
            await run_python(block, subs)
        await check_effect(block, urls[0])


@pytest.mark.parametrize("block", runnable("toml"), ids=lambda b: b.id)
def test_toml_block_passes_check_config(block: Block, tmp_path: Path) -> None:
    config = tomllib.loads(block.text)
    tls = config.get("tls")
    if tls is not None:  # the block names files; make them real (a self-signed pair)
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
             "/CN=127.0.0.1", "-keyout", str(tmp_path / tls["key"]),
             "-out", str(tmp_path / tls["cert"])],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
    (tmp_path / "fencegate.toml").write_text(block.text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FENCEGATE_")}
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "check-config", "fencegate.toml"],
        cwd=tmp_path, env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, f"{block.id}: {proc.stdout}{proc.stderr}"


async def test_readme_api_key_can_take_the_fence_lock_of_every_key_it_may_write(
    gateway_client: ServeClient,
    redis3: list[RedisNode],
    pg_dsn: str,
    pg_schema: str,
    legacy_table: str,
    tmp_path: Path,
) -> None:
    secret = "readme-example-key"
    (key,) = readme_config()["auth"]["keys"]
    raw = gateway_config(redis3, pg_dsn, pg_schema, tmp_path / "files")
    raw["auth"] = {"keys": [{**key, "sha256": hashlib.sha256(secret.encode()).hexdigest()}]}
    client = await gateway_client(create_app(parse_config(raw), registry=CollectorRegistry()))
    bearer = {"Authorization": f"Bearer {secret}"}
    assert {"lock", "write"} <= set(key["verbs"])
    assert key["stores"]
    for prefix in key["stores"]:
        store, _, under = prefix.partition("/")
        name = f"{under}example-1"
        legacy = "table" in raw["stores"][store]
        grant = await client.post(f"/v1/locks/{store}/{name}", json={"ttl_ms": 5000},
                                  headers=bearer)  # fmt: skip
        assert grant.status == 200, (prefix, await grant.text())
        token = (await grant.json())["token"]
        body = json.dumps({"balance": "1.50", "note": "n"}).encode() if legacy else b"x"
        written = await client.put(f"/v1/stores/{store}/{name}", data=body,
                                   headers={**bearer, "X-Fencing-Token": str(token)})  # fmt: skip
        assert written.status == 200, (prefix, await written.text())


THREE_NODES = next(b for b in all_blocks() if b.first_line.startswith(". .venv/bin/activate"))


async def test_the_three_node_setup_serves_both_gateways_over_the_nodes(tmp_path: Path) -> None:
    """The README's three-node set-up as written, on free ports: it starts three nodes
    and two gateways over them, and an acquire repeated with its Idempotency-Key
    through the second gateway gets the first one's lease (one lock service)."""
    activate = Path(sys.executable).parent / "activate"
    if not activate.exists():
        pytest.skip("the tests do not run from a virtualenv: no .venv/bin/activate")
    text = THREE_NODES.text.replace(". .venv/bin/activate", f". {activate}")
    ports = {p: free_port() for p in ("7101", "7102", "7103", "8080", "8082")}
    nodes = " ".join(str(ports[p]) for p in ("7101", "7102", "7103"))
    text = text.replace("for port in 7101 7102 7103;", f"for port in {nodes};")
    for doc, real in ports.items():
        text = text.replace(f"127.0.0.1:{doc}", f"127.0.0.1:{real}")
    assert not any(doc in text for doc in ports), text  # every fixed port replaced
    one, two = f"127.0.0.1:{ports['8080']}", f"127.0.0.1:{ports['8082']}"
    script = f"""set -uo pipefail
cleanup() {{
    kill $(jobs -p) 2>/dev/null; wait
    for p in {nodes}; do redis-cli -p $p shutdown nosave >/dev/null 2>&1; done
}}
trap cleanup EXIT
set -e
{text}
for url in {one} {two}; do
    for i in $(seq 1 150); do
        curl -sf -o /dev/null $url/readyz && break
        sleep 0.2
    done
done
key='Idempotency-Key: readme-three-nodes'
a=$(curl -sf -XPOST {one}/v1/locks/jobs/readme -H "$key" -d '{{"ttl_ms": 10000}}')
b=$(curl -sf -XPOST {two}/v1/locks/jobs/readme -H "$key" -d '{{"ttl_ms": 10000}}')
echo "$a"
echo "$b"
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FENCEGATE_")}
    proc = await asyncio.create_subprocess_exec(
        "bash", "-c", script, cwd=tmp_path, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode == 0, f"stdout: {out.decode()}\nstderr: {err.decode()[-4000:]}"
    first, second = (json.loads(line) for line in out.decode().splitlines())
    assert first["lease_id"] == second["lease_id"]
    assert first["token"] == second["token"]
    assert (tmp_path / "fencegate-data").is_dir()  # the default files store, where it ran
