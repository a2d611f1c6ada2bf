"""A gateway killed mid-write leaves whole files; PostgreSQL restarted under load loses nothing.

(a) SIGKILL of a gateway process in the middle of many concurrent large file
writes: every file below the root is then exactly one complete version (the
old or the new one, never a mix or a truncation, never older than a write
that was acknowledged), and a restarted gateway removes the temp files the
dead one left and serves the keys.

(b) A PostgreSQL server of the test's own (``tests/_pg_server.py``) is
stopped (``pg_ctl stop -m immediate``, as a crash, or ``-m fast``), kept down
a second and started again while clients write, read and delete through one
gateway process: every failed request is a prompt 503
``storage_unavailable`` (``/readyz`` a prompt 503), writes succeed again
within seconds without restarting the gateway, and every acknowledged write
is still there.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest

from storage_adapters.files import HIDDEN  # the folder of temp files and metadata
from tests._pg_server import PgServer, pg_bin_dir
from tests._servers import RedisNode
from tests.faults.test_gateway_two_processes import (
    TOKEN,
    GatewayProcess,
    acquire,
    http_session,
    release,
)

pytestmark = pytest.mark.faults


# -- (a) SIGKILL in the middle of file writes ------------------------------------------------------

KEYS = 16
CYCLES = 6  # kills: a tear can only happen while a write() runs, a few % of a put's time
RECORD = 32  # bytes of one record of the body pattern


def versioned_body(key: int, version: int) -> bytes:
    """Records ``k=.. v=..`` repeated over 160-400 KB; the size depends on the version too."""
    record = f"k={key:02d} v={version:08d}".ljust(RECORD - 1).encode() + b"\n"
    return record * ((160 << 10) // RECORD + (version % 8) * 1000)


def parse_body(body: bytes) -> tuple[int, int] | None:
    """(key, version) if ``body`` is exactly one whole ``versioned_body``, else None."""
    try:
        head = body[:RECORD].decode()
        key, version = int(head[2:4]), int(head[7:15])
    except (UnicodeDecodeError, ValueError):
        return None
    return (key, version) if body == versioned_body(key, version) else None


@dataclass
class KeyLog:
    """What one writer of one key knows: versions acknowledged (200) and attempted."""

    acked: int = 0
    attempted: int = 0
    errors: list[str] = field(default_factory=list)


async def write_versions(
    session: aiohttp.ClientSession, base: str, key: int, token: int, log: KeyLog
) -> None:
    """Write versions 1, 2, ... of ``crash/k<key>`` until the gateway stops answering."""
    url = f"{base}/v1/stores/files/crash/k{key:02d}"
    while True:
        version = log.attempted + 1
        log.attempted = version
        try:
            async with session.put(
                url, data=versioned_body(key, version), headers={TOKEN: str(token)}
            ) as response:
                if response.status != 200:
                    log.errors.append(f"{response.status} {await response.text()}")
                    return
                await response.read()
        except (aiohttp.ClientError, ConnectionError):
            return  # the gateway died with this write in flight: its outcome is unknown
        log.acked = version


def files_below(root: Path) -> Iterator[Path]:
    """Every file of the store's keys: everything under root but the hidden folder."""
    for path in root.rglob("*"):
        if path.is_file() and HIDDEN not in path.relative_to(root).parts:
            yield path


def key_name(k: int) -> str:
    return f"crash/k{k:02d}"


async def put_files(
    session: aiohttp.ClientSession, base: str, key: str, body: bytes, token: int
) -> tuple[int, str]:
    url = f"{base}/v1/stores/files/{key}"
    async with session.put(url, data=body, headers={TOKEN: str(token)}) as response:
        return response.status, await response.text()


async def test_sigkill_mid_write_leaves_only_whole_files_and_restart_cleans_temp_files(
    redis3: list[RedisNode], tmp_path: Path
) -> None:
    root = tmp_path / "root"
    tmp = root / HIDDEN / "tmp"
    raw = {
        "shutdown_timeout_ms": 2000,
        "locks": {"redis": [n.url for n in redis3], "node_timeout_ms": 500},
        "stores": {"files": {"type": "files", "root": str(root)}},
    }
    gateway = GatewayProcess(tmp_path / "gw", raw)
    leftovers_seen: list[int] = []
    async with http_session(total=20) as session:
        gateway.start()
        try:
            await gateway.wait_ready(session)
            grants = []
            for k in range(KEYS):  # the locks live in Redis: they outlive the gateway
                status, grant = await acquire(
                    session, gateway.url, f"files/{key_name(k)}", 60_000, 0
                )
                assert status == 200, grant
                grants.append(grant)
            logs = [KeyLog() for _ in range(KEYS)]

            for _ in range(CYCLES):
                writers = [
                    asyncio.create_task(
                        write_versions(session, gateway.url, k, grants[k]["token"], logs[k])
                    )
                    for k in range(KEYS)
                ]
                # Kill once every key has two new acknowledged versions, mid-stream.
                floor = [log.acked for log in logs]
                deadline = time.monotonic() + 10
                while any(log.acked < floor[k] + 2 for k, log in enumerate(logs)):
                    assert time.monotonic() < deadline, "writes too slow"
                    assert not any(log.errors for log in logs), [log.errors for log in logs]
                    await asyncio.sleep(0.01)
                gateway.kill()
                async with asyncio.timeout(10):
                    await asyncio.gather(*writers)
                assert not any(log.errors for log in logs), [log.errors for log in logs]

                # On disk, with no gateway running: whole versions only, none lost.
                found: dict[str, tuple[int, int]] = {}
                for path in files_below(root):
                    name = path.relative_to(root).as_posix()
                    parsed = parse_body(path.read_bytes())
                    assert parsed is not None, f"{name}: torn, truncated or mixed body"
                    found[name] = parsed
                assert set(found) == {key_name(k) for k in range(KEYS)}, sorted(found)
                for k, log in enumerate(logs):
                    key, version = found[key_name(k)]
                    assert key == k
                    assert log.acked <= version <= log.attempted, (k, version, log)
                leftovers_seen.append(len(os.listdir(tmp)))

                gateway.start()  # the same config, port and root
                await gateway.wait_ready(session)
                assert os.listdir(tmp) == [], "a restarted gateway removes leftover temp files"
                for k in range(KEYS):
                    async with session.get(f"{gateway.url}/v1/stores/files/{key_name(k)}") as r:
                        assert r.status == 200
                        assert parse_body(await r.read()) == found[key_name(k)]
                        # Killed between data and metadata, the token may be unknown (absent);
                        # a token it reports is the writer's.
                        assert r.headers.get(TOKEN, str(grants[k]["token"])) == str(
                            grants[k]["token"]
                        )
            assert any(leftovers_seen), f"no kill caught a write in flight: {leftovers_seen}"

            # The restarted gateway takes writes with the surviving leases' tokens ...
            for k in range(KEYS):
                version = logs[k].attempted + 1
                body = versioned_body(k, version)
                token = grants[k]["token"]
                status, text = await put_files(session, gateway.url, key_name(k), body, token)
                assert (status, json.loads(text)["token"]) == (200, token), text
                assert parse_body((root / key_name(k)).read_bytes()) == (k, version)
                lease_id = grants[k]["lease_id"]
                assert await release(session, gateway.url, f"files/{key_name(k)}", lease_id) == 204
            # ... and still refuses an older one once a newer one wrote.
            status, newer = await acquire(session, gateway.url, f"files/{key_name(0)}", 5000, 0)
            assert status == 200
            status, _ = await put_files(session, gateway.url, key_name(0), b"new", newer["token"])
            assert status == 200
            old = grants[0]["token"]
            status, text = await put_files(session, gateway.url, key_name(0), b"stale", old)
            assert (status, json.loads(text)["error"]) == (409, "stale_token")
            assert (root / key_name(0)).read_bytes() == b"new"
        finally:
            gateway.stop()


# -- (b) PostgreSQL restarted under load ---------------------------------------------------------

REQUEST_TIMEOUT = 3.0
PG_TIMEOUT_MS = 1000  # command_timeout_ms and acquire_timeout_ms of the store
WRITERS = 8
RECOVERY = 3.0  # writes must succeed again this soon after PostgreSQL is back


@pytest.fixture
def own_pg() -> Iterator[PgServer]:
    """A PostgreSQL server of this test's own (it is crashed and restarted)."""
    bin_dir = pg_bin_dir()
    if bin_dir is None:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) not found")
    server = PgServer(bin_dir)
    try:
        server.init()
        server.start()
        yield server
    finally:
        server.cleanup()


@dataclass(frozen=True)
class Outcome:
    op: str  # "put", "get" (a fenced read) or "delete"
    writer: int
    seq: int
    key: str
    status: int  # 200 also for a 204 delete; 0 for a 200 read with the wrong body
    error: str
    started: float
    seconds: float


async def call(
    session: aiohttp.ClientSession, method: str, url: str, body: bytes | None, token: int, i: int
) -> tuple[int, bytes]:
    headers = {TOKEN: str(token), "X-Fencing-Lock": f"kv/w{i}"}  # one lock per writer
    async with session.request(method, url, data=body, headers=headers) as response:
        return response.status, await response.read()


async def write_until(
    session: aiohttp.ClientSession,
    base: str,
    i: int,
    token: int,
    stop_at: list[float],
    outcomes: list[Outcome],
) -> None:
    """Each round: put a key of its own (every acknowledged one must survive), put
    ``w<i>/last``, read it back with a fenced read, and delete a missing key (a fenced
    delete is a transaction); the next round after a failure.
    """
    seq = 0
    while time.monotonic() < stop_at[0]:
        seq += 1
        steps = (
            ("put", f"w{i}/s{seq:05d}", b"w%d:%d" % (i, seq)),
            ("put", f"w{i}/last", b"%d" % seq),
            ("get", f"w{i}/last", None),
            ("delete", f"w{i}/gone", None),
        )
        for op, key, body in steps:
            started = time.monotonic()
            url = f"{base}/v1/stores/kv/{key}"
            status, reply = await call(session, op.upper(), url, body, token, i)
            seconds = time.monotonic() - started
            if op == "delete" and status == 204:
                status = 200  # done, as for the others
            error = "" if status == 200 else str(json.loads(reply).get("error"))
            if op == "get" and status == 200 and reply != b"%d" % seq:
                status, error = 0, f"read {reply[:40]!r} after writing {seq}"
            outcomes.append(Outcome(op, i, seq, key, status, error, started, seconds))
            if status != 200:
                await asyncio.sleep(0.02)
                break


async def probe_ready(
    session: aiohttp.ClientSession, base: str, stop_at: list[float], probes: list[tuple[int, float]]
) -> None:
    """``GET /readyz`` every 50 ms: (status, seconds) of each."""
    while time.monotonic() < stop_at[0]:
        started = time.monotonic()
        async with session.get(f"{base}/readyz") as response:
            await response.read()
        probes.append((response.status, time.monotonic() - started))
        await asyncio.sleep(0.05)


async def read_back(session: aiohttp.ClientSession, base: str, key: str) -> tuple[int, bytes]:
    async with session.get(f"{base}/v1/stores/kv/{key}") as response:
        return response.status, await response.read()


@pytest.mark.parametrize("mode", ["immediate", "fast"])
async def test_postgres_restart_under_load_gives_clean_503s_then_recovers_without_losing_writes(
    own_pg: PgServer, tmp_path: Path, mode: str
) -> None:
    raw = {
        "request_timeout_ms": int(REQUEST_TIMEOUT * 1000),
        "shutdown_timeout_ms": 2000,
        "locks": {"max_wait_ms": 1000},  # the in-process lock backend: one gateway
        "stores": {
            "kv": {
                "type": "postgres",
                "dsn": own_pg.dsn,
                "schema": "fg_restart",
                "pool_min": 2,
                "pool_max": 10,
                "command_timeout_ms": PG_TIMEOUT_MS,
                "acquire_timeout_ms": PG_TIMEOUT_MS,
            }
        },
    }
    gateway = GatewayProcess(tmp_path / "gw", raw)
    outcomes: list[Outcome] = []
    probes: list[tuple[int, float]] = []
    stop_at = [float("inf")]
    async with http_session(total=REQUEST_TIMEOUT + 10) as session:
        gateway.start()
        try:
            await gateway.wait_ready(session)
            assert gateway.proc is not None
            pid = gateway.proc.pid
            grants = []
            for i in range(WRITERS):
                status, grant = await acquire(session, gateway.url, f"kv/w{i}", 120_000, 0)
                assert status == 200, grant
                grants.append(grant)
            tasks = [
                asyncio.create_task(
                    write_until(session, gateway.url, i, grants[i]["token"], stop_at, outcomes)
                )
                for i in range(WRITERS)
            ]
            tasks.append(asyncio.create_task(probe_ready(session, gateway.url, stop_at, probes)))
            try:
                await asyncio.sleep(1.0)
                down = time.monotonic()
                await asyncio.to_thread(own_pg.restart, mode=mode, down=1.0)
                up = time.monotonic()
                # Go on until every writer wrote again, then 1 s more; RECOVERY at most.
                for _ in range(int(RECOVERY / 0.05)):
                    recovered = {o.writer for o in outcomes if o.status == 200 and o.started >= up}
                    if len(recovered) == WRITERS:
                        break
                    await asyncio.sleep(0.05)
                stop_at[0] = min(time.monotonic() + 1.0, up + RECOVERY)
                async with asyncio.timeout(REQUEST_TIMEOUT + 5):
                    await asyncio.gather(*tasks)
            finally:
                stop_at[0] = 0.0
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

            assert gateway.proc.poll() is None, "the gateway must not have died"
            assert gateway.proc.pid == pid
            failed = [o for o in outcomes if o.status != 200]
            bad = [o for o in failed if (o.status, o.error) != (503, "storage_unavailable")]
            assert not bad, f"failures other than 503 storage_unavailable: {bad[:5]}"
            assert failed, "no request met the outage: it was not under load"
            slow = [o for o in outcomes if o.seconds > REQUEST_TIMEOUT]
            assert not slow, f"requests hung up to request_timeout_ms: {slow[:5]}"
            before = [o for o in outcomes if o.started + o.seconds < down]
            assert before, "no write before the outage"
            assert all(o.status == 200 for o in before), [o for o in before if o.status != 200][:5]
            # Back without a gateway restart: every writer writes again soon after 'up',
            # and from its first success on nothing fails (no dead pooled connection is reused).
            for i in range(WRITERS):
                mine = [o for o in outcomes if o.writer == i and o.started >= up]
                first = next((o.started for o in mine if o.op == "put" and o.status == 200), None)
                assert first is not None, (
                    f"writer {i}: no write succeeded after PostgreSQL was back"
                )
                assert first - up < RECOVERY, f"writer {i}: first write {first - up:.1f} s after up"
                after = [o for o in mine if o.started >= first and o.status != 200]
                assert not after, f"writer {i}: failed after recovering: {after[:3]}"

            # Every acknowledged write is there; the last one of each writer wins.
            puts = [o for o in outcomes if o.op == "put"]
            accepted = [o for o in puts if o.status == 200 and not o.key.endswith("/last")]
            limit = asyncio.Semaphore(16)

            async def check(o: Outcome) -> None:
                async with limit:
                    status, body = await read_back(session, gateway.url, o.key)
                assert (status, body) == (200, b"w%d:%d" % (o.writer, o.seq)), (
                    f"{o.key}: an acknowledged write was lost: {status} {body[:100]!r}"
                )

            await asyncio.gather(*(check(o) for o in accepted))
            for i in range(WRITERS):
                mine = [o for o in puts if o.writer == i and o.key.endswith("/last")]
                assert mine[-1].status == 200
                assert await read_back(session, gateway.url, f"w{i}/last") == (
                    200,
                    b"%d" % mine[-1].seq,
                )
            # /readyz said so all along, and promptly.
            assert {status for status, _ in probes} == {200, 503}, probes
            assert max(seconds for _, seconds in probes) < REQUEST_TIMEOUT, probes
            async with session.get(f"{gateway.url}/readyz") as r:
                assert r.status == 200
        finally:
            gateway.stop()
