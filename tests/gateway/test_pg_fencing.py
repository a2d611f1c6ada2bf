"""In-database fencing next to the gateway: direct and proxy writers of one row, and the CLI."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from gateway.cli import main
from storage_adapters.pg_fencing import fenced_transaction, fencing_status, install_fencing
from tests.gateway.conftest import Client, Start, make_config, store_section

TTL_MS = 150
INCREMENTS = 5  # per writer
WRITERS = 3  # of each kind


def accounts_section(pg_dsn: str, pg_schema: str, tmp_path: Path) -> dict[str, Any]:
    return store_section("legacy", files_root=tmp_path, pg_dsn=pg_dsn, pg_schema=pg_schema)


async def take(client: Client) -> dict[str, Any]:
    response = await client.post("/v1/locks/accounts/a", json={"ttl_ms": TTL_MS, "wait_ms": 10_000})
    assert response.status == 200, await response.text()
    grant: dict[str, Any] = await response.json()
    return grant


async def drop(client: Client, grant: dict[str, Any]) -> None:
    response = await client.delete(
        "/v1/locks/accounts/a", headers={"X-Lease-Id": grant["lease_id"]}
    )
    assert response.status in (204, 409), await response.text()  # 409: it had expired


async def balance(conn: asyncpg.Connection, schema: str) -> int:
    return int(await conn.fetchval(f"SELECT balance FROM \"{schema}\".accounts WHERE id = 'a'"))


async def test_direct_and_proxy_writers_lose_no_update_and_never_deadlock(
    start: Start, legacy_table: str, pg_dsn: str, pg_schema: str, tmp_path: Path
) -> None:
    """Fenced read-modify-write increments of one row, under one real lock with a short TTL.

    Direct writers sometimes pause past the TTL while holding the row (SELECT ... FOR
    UPDATE); the next holder, often a proxy writer, then reaches the row. With the
    proxy taking the fence row before the data row, the paused writer's trigger and
    the proxy's PUT each held what the other needed: 40P01. Now both take the data
    row first, so the proxy's PUT queues behind the paused writer, whose late
    UPDATE is refused (FG409), and nothing is lost.
    """
    client = await start(
        make_config(stores={"accounts": accounts_section(pg_dsn, pg_schema, tmp_path)})
    )
    admin = await asyncpg.connect(pg_dsn)
    counts: Counter[str] = Counter()
    try:
        await admin.execute(f"INSERT INTO \"{pg_schema}\".accounts (id, balance) VALUES ('a', 0)")
        await install_fencing(
            admin, store="accounts", table="accounts", key_column="id", schema=pg_schema
        )

        async def direct(n: int) -> None:
            conn = await asyncpg.connect(pg_dsn)
            try:
                done = attempts = 0
                while done < INCREMENTS and attempts < 60:
                    attempts += 1
                    grant = await take(client)
                    try:
                        async with fenced_transaction(conn, grant["token"]):
                            read = await conn.fetchval(
                                f'SELECT balance FROM "{pg_schema}".accounts'
                                " WHERE id = 'a' FOR UPDATE"
                            )
                            if attempts % 2 == n % 2:  # the pause: past the lease's TTL
                                await asyncio.sleep(TTL_MS * 1.5 / 1000)
                            await conn.execute(
                                f"UPDATE \"{pg_schema}\".accounts SET balance = $1 WHERE id = 'a'",
                                read + 1,
                            )
                        done += 1
                        counts["ok"] += 1
                    except asyncpg.PostgresError as exc:
                        counts[exc.sqlstate] += 1  # anything but FG409 and 40P01 fails below
                    finally:
                        await drop(client, grant)
            finally:
                await conn.close()

        async def proxy() -> None:
            done = attempts = 0
            while done < INCREMENTS and attempts < 60:
                attempts += 1
                grant = await take(client)
                headers = {"X-Fencing-Token": str(grant["token"])}
                try:
                    got = await client.get("/v1/stores/accounts/a", headers=headers)
                    if got.status == 200:
                        read = int(json.loads(await got.read())["balance"])
                        put = await client.put(
                            "/v1/stores/accounts/a",
                            data=json.dumps({"balance": read + 1}),
                            headers=headers,
                        )
                        got = put
                    text = await got.text()
                    if got.status == 200 and got.method == "PUT":
                        done += 1
                        counts["ok"] += 1
                    elif got.status == 409:
                        assert json.loads(text)["error"] == "stale_token", text
                        counts["stale_proxy"] += 1
                    else:
                        assert got.status == 503, text
                        assert "40P01" in text, text
                        counts["40P01"] += 1
                finally:
                    await drop(client, grant)

        async with asyncio.timeout(100), asyncio.TaskGroup() as tg:
            for n in range(WRITERS):
                tg.create_task(direct(n))
                tg.create_task(proxy())
        assert set(counts) <= {"ok", "FG409", "stale_proxy", "40P01"}, counts
        assert counts["40P01"] == 0, counts
        assert counts["ok"] == 2 * WRITERS * INCREMENTS, counts
        assert counts["FG409"] > 0, counts  # paused direct writers were overtaken
        assert await balance(admin, pg_schema) == counts["ok"], counts
    finally:
        await admin.close()


def write_config(path: Path, pg_dsn: str, pg_schema: str, files_root: Path) -> Path:
    section = accounts_section(pg_dsn, pg_schema, files_root)
    lines = ["[stores.accounts]"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in section.items()]
    lines += ["", "[stores.files]", 'type = "files"', f"root = {json.dumps(str(files_root))}"]
    path.write_text("\n".join(lines) + "\n")
    return path


async def run(*argv: str) -> int:
    return await asyncio.to_thread(main, list(argv))


async def test_cli_installs_and_uninstalls_fencing(
    legacy_table: str,
    pg_dsn: str,
    pg_schema: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = str(write_config(tmp_path / "fencegate.toml", pg_dsn, pg_schema, tmp_path / "f"))
    admin = await asyncpg.connect(pg_dsn)
    try:
        await admin.execute(f"INSERT INTO \"{pg_schema}\".accounts (id, balance) VALUES ('a', 1)")
        for _ in range(2):
            assert (
                await run("pg", "install-fencing", "--config", config, "--store", "accounts") == 0
            )
        assert "installed trigger fencegate_fence" in capsys.readouterr().out
        status = await fencing_status(admin, table="accounts", schema=pg_schema)
        assert status is not None
        assert status["require_token"] is True
        args = ("pg", "install-fencing", "--config", config, "--store", "accounts")
        assert await run(*args, "--allow-unfenced") == 0
        status = await fencing_status(admin, table="accounts", schema=pg_schema)
        assert status is not None
        assert status["require_token"] is False
        assert await run(*args, "--require-token") == 0
        with pytest.raises(asyncpg.PostgresError) as refused:
            await admin.execute(f'UPDATE "{pg_schema}".accounts SET balance = 2')
        assert refused.value.sqlstate == "FG428"

        said = []
        for _ in range(2):
            assert (
                await run("pg", "uninstall-fencing", "--config", config, "--store", "accounts") == 0
            )
            said.append(capsys.readouterr().out)
        assert "removed trigger fencegate_fence" in said[0]
        assert "data kept" in said[0]
        assert said[1].startswith("nothing to remove:"), said[1]
        assert await fencing_status(admin, table="accounts", schema=pg_schema) is None
        assert await balance(admin, pg_schema) == 1
    finally:
        await admin.close()


@pytest.mark.parametrize(
    ("store", "message"),
    [("nope", "no store 'nope'"), ("files", "not a postgres legacy-table store")],
)
async def test_cli_refuses_other_stores_in_one_line(
    store: str,
    message: str,
    pg_dsn: str,
    pg_schema: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = str(write_config(tmp_path / "fencegate.toml", pg_dsn, pg_schema, tmp_path / "f"))
    assert await run("pg", "install-fencing", "--config", config, "--store", store) == 1
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1


async def test_cli_names_a_missing_table(
    pg_dsn: str, pg_schema: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = str(write_config(tmp_path / "fencegate.toml", pg_dsn, pg_schema, tmp_path / "f"))
    assert await run("pg", "install-fencing", "--config", config, "--store", "accounts") == 1
    err = capsys.readouterr().err
    assert "accounts' does not exist" in err
    assert "Traceback" not in err


async def test_unfenced_store_over_a_table_that_requires_tokens_gets_428(
    start: Start, legacy_table: str, pg_dsn: str, pg_schema: str, tmp_path: Path
) -> None:
    section = {**accounts_section(pg_dsn, pg_schema, tmp_path), "fencing": "none"}
    client = await start(make_config(stores={"accounts": section}))
    admin = await asyncpg.connect(pg_dsn)
    try:
        await install_fencing(
            admin, store="accounts", table="accounts", key_column="id", schema=pg_schema
        )
        response = await client.put("/v1/stores/accounts/a", data=json.dumps({"balance": 1}))
        body = await response.json()
        assert response.status == 428, body
        assert body["error"] == "token_required"
        assert "--allow-unfenced" in body["message"]
        assert await admin.fetchval(f'SELECT count(*) FROM "{pg_schema}".accounts') == 0
    finally:
        await admin.close()
