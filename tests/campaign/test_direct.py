"""A direct writer against a real PostgreSQL with the trigger: what it records for each outcome."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from storage_adapters.pg_fencing import install_fencing
from tests._pg_server import PgServer, pg_bin_dir
from tests.campaign.client import ClientSpec
from tests.campaign.direct import KEY_COLUMN, STYLES, TABLE, DirectClient
from tests.campaign.history import Op, load_events, pair_ops

pytestmark = pytest.mark.faults


@pytest.fixture
async def pg() -> AsyncIterator[PgServer]:
    bin_dir = pg_bin_dir()
    if bin_dir is None:
        pytest.skip("no PostgreSQL binaries (initdb, pg_ctl)")
    server = PgServer(bin_dir)
    try:
        server.init()
        server.start()
        conn = await asyncpg.connect(server.dsn)
        try:
            await conn.execute(f"CREATE TABLE {TABLE} ({KEY_COLUMN} text PRIMARY KEY, v bigint)")
            await conn.execute(f"INSERT INTO {TABLE} VALUES ('k', 0)")
            await install_fencing(conn, store="ledger", table=TABLE, key_column=KEY_COLUMN)
        finally:
            await conn.close()
        yield server
    finally:
        server.cleanup()


def writer(pg: PgServer, history: Path) -> DirectClient:
    spec = ClientSpec(
        process="d0", gateways=["http://127.0.0.1:9"], targets=[["ledger", "k"]],
        history=str(history), seed=1, seconds=10, stop_file=str(history) + ".stop",
        pause_share=0.0, row_stores=["ledger"], direct_dsn=pg.dsn,
    )  # fmt: skip
    return DirectClient(spec)


def ops(history: Path) -> list[tuple[str, str, int | None, str | None, int | None]]:
    paired: list[Op] = pair_ops(load_events([history]))
    assert all(op.direct for op in paired)
    return [(op.f, op.result, op.status, op.error, op.value) for op in paired]


async def test_direct_writer_records_accepted_refused_and_unreachable(
    pg: PgServer, tmp_path: Path
) -> None:
    history = tmp_path / "d0.jsonl"
    client = writer(pg, history)
    try:
        for style in STYLES:
            client.read_modify_write("ledger", "k", {"token": 10, "lease_id": "a"}, style=style)
        for style in STYLES:  # an older token: the trigger refuses it
            client.read_modify_write("ledger", "k", {"token": 5, "lease_id": "b"}, style=style)
        pg.stop("immediate")
        client.read_modify_write("ledger", "k", {"token": 11, "lease_id": "c"}, style="locked")
        pg.start()
        client.read_modify_write("ledger", "k", {"token": 11, "lease_id": "c"}, style="touch")
    finally:
        client.close()
    got = ops(history)
    assert got[:4] == [
        ("read", "ok", 200, None, 0),
        ("write", "ok", 200, None, 1),
        ("read", "ok", 200, None, 1),  # touch: a fenced read (the trigger raised the mark)
        ("write", "ok", 200, None, 2),
    ]
    assert got[4:7] == [
        ("read", "ok", 200, None, 2),  # locked: SELECT ... FOR UPDATE raises no mark
        ("write", "fail", 409, "FG409", 3),
        ("read", "fail", 409, "FG409", None),  # touch: refused at once
    ]
    f, result, _status, error, _value = got[7]
    assert (f, result) in {("read", "info"), ("read", "fail")}, got[7]  # PostgreSQL down
    assert error is not None
    assert got[8:] == [("read", "ok", 200, None, 2), ("write", "ok", 200, None, 3)], got
    events = [json.loads(line) for line in history.read_text().splitlines()]
    assert {e["style"] for e in events if e["type"] == "invoke"} == set(STYLES)
