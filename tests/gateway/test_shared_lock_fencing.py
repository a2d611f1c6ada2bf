"""Why a shared grant issues a new token (R23): a stale exclusive write after a shared read.

Kleppmann's schedule with a shared reader, over HTTP with a files store:

    X (exclusive, token t): put(t) ... pauses past its ttl ............... put(t) late
    S (shared):                         takes the lock, fenced read ->

DESIGN.md's first wording gave S "the newest token issued for the name (not a
new one)": t, X's own. S's fenced read then leaves the mark at t, and X's late
write (t >= t) is accepted while S holds its read lock: what S read was
overwritten under it. The core gives S a new token t + 1, so its read raises the
mark above X's and X's late write is refused with 409 stale_token.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from lockservice.protocol import fence_key
from tests._servers import RedisNode
from tests.faults.conftest import reply_bulk
from tests.gateway.conftest import Client, Start, make_config

X_TTL_MS = 200  # X's lease: it never renews it, so it ends after this


async def json_of(client: Client, method: str, path: str, **kw: Any) -> tuple[int, Any]:
    response = await client.request(method, path, **kw)
    return response.status, await response.json()


async def wait_free(client: Client, name: str) -> dict[str, Any]:
    """Poll the lock until no lease holds it (bounded: 50 x 100 ms)."""
    state: dict[str, Any] = {}
    for _ in range(50):
        status, state = await json_of(client, "GET", f"/v1/locks/{name}")
        assert status == 200, state
        if not state["held"]:
            return dict(state)
        await asyncio.sleep(0.1)
    raise AssertionError(f"lock {name!r} still held: {state}")


async def counters_agree(nodes: list[RedisNode], name: str) -> None:
    """Wait until every node's counter of ``name`` is the same (bounded: 50 x 20 ms).

    The first grant of a fresh name starts above each node's own token base, so
    the counters differ until round 2 or the settling of a late grant (R4, R16)
    raises them; from then on a grant on every node increments them alike.
    """
    counters: set[bytes | None] = set()
    for _ in range(50):
        counters = {reply_bulk(n.command("GET", fence_key(name))) for n in nodes}
        if len(counters) <= 1:  # (no nodes: the in-process backend)
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"the nodes' counters of {name!r} differ: {counters}")


async def late_exclusive_write(
    client: Client, nodes: list[RedisNode], key: str, *, reader_token: str
) -> tuple[int, bytes]:
    """Run the schedule on files/{key}; return the late write's status and the value after it.

    ``reader_token`` is what S reads with: ``"granted"`` (the token S's grant
    carries: ours) or ``"newest issued"`` (DESIGN's first wording: the newest
    token issued for the name when S was granted, which is X's).
    """
    name, path = f"files/{key}", f"/v1/stores/files/{key}"
    status, first = await json_of(client, "POST", f"/v1/locks/{name}", json={})
    assert status == 200, first  # an earlier holder: the nodes' counters come to agree
    released = await client.delete(f"/v1/locks/{name}", headers={"X-Lease-Id": first["lease_id"]})
    assert released.status == 204
    await counters_agree(nodes, name)

    status, x = await json_of(client, "POST", f"/v1/locks/{name}", json={"ttl_ms": X_TTL_MS})
    assert status == 200, x
    x_fenced = {"X-Fencing-Token": str(x["token"])}
    assert (await client.put(path, data=b"by X", headers=x_fenced)).status == 200

    newest = (await wait_free(client, name))["token"]  # X paused past its ttl
    assert newest == x["token"]  # no grant since X's: DESIGN's rule would give S this one
    status, s = await json_of(client, "POST", f"/v1/locks/{name}", json={"mode": "shared"})
    assert status == 200, s
    token = s["token"] if reader_token == "granted" else newest
    read = await client.get(path, headers={"X-Fencing-Token": str(token)})
    assert (read.status, await read.read()) == (200, b"by X")

    late = await client.put(path, data=b"late by X", headers=x_fenced)
    after = await client.get(path)
    assert after.status == 200
    status, value = late.status, await after.read()
    if status == 409:
        assert (await late.json())["error"] == "stale_token"
    state = (await json_of(client, "GET", f"/v1/locks/{name}"))[1]
    assert (state["held"], state["mode"]) == (True, "shared")  # S still holds its read lock
    return status, value


async def test_a_late_exclusive_write_is_refused_after_a_shared_read(
    start: Start, lock_urls: list[str], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    nodes: list[RedisNode] = request.getfixturevalue("redis3") if lock_urls else []
    stores = {"files": {"type": "files", "root": str(tmp_path / "files")}}
    client = await start(make_config(lock_urls=lock_urls, stores=stores))
    # R23: S's grant issued a new token above X's; its read raised the mark past X's token.
    assert await late_exclusive_write(client, nodes, "ledger", reader_token="granted") == (
        409,
        b"by X",
    )
    # DESIGN's "newest issued, not a new one": the store accepts X's late write, and the
    # value S read under its read lock is gone while S still holds it.
    hole = await late_exclusive_write(client, nodes, "ledger-2", reader_token="newest issued")
    assert hole == (200, b"late by X")
