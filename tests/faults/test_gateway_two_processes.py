"""Two real gateway processes, one set of Redis nodes, one storage: paused clients lose nothing.

Twenty HTTP clients increment one counter by read-modify-write under the
counter's lock (TTL 300 ms), each step through either of two ``python -m
gateway serve`` processes, and some pause past the TTL between their read
and their write, as a GC pause would. With fenced reads the counter ends equal to the
number of accepted writes and the accepted tokens strictly increase; the
paused writers are refused with 409 ``stale_token``. The control experiment
replays the Kleppmann timeline with plain reads and shows the lost update
that fenced reads exist to prevent.

``GatewayProcess`` (a gateway subprocess on a free port, from a TOML file)
is also used by ``test_gateway_crash.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests._servers import RedisNode, free_port

pytestmark = pytest.mark.faults

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "X-Fencing-Token"

TTL_MS = 300
WAIT_MS = 3000
CLIENTS = 20
DURATION = 6.0
LONG_PAUSE = 0.2  # share of cycles that pause past the TTL between read and write


# -- gateway processes -----------------------------------------------------------------------


def toml_value(value: object) -> str:
    """A TOML literal for a str, int, bool, list or inline table of them (enough for these
    configs)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(value)


def toml_document(raw: dict[str, Any]) -> str:
    """Top-level keys, then ``[locks]`` and ``[stores.<name>]`` tables."""
    lines = [f"{k} = {toml_value(v)}" for k, v in raw.items() if not isinstance(v, dict)]
    if "locks" in raw:
        lines.append("[locks]")
        lines += [f"{k} = {toml_value(v)}" for k, v in raw["locks"].items()]
    for name, table in raw.get("stores", {}).items():
        lines.append(f"[stores.{name}]")
        lines += [f"{k} = {toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


class GatewayProcess:
    """``python -m gateway serve --config <toml>`` on a free loopback port, log to a file."""

    def __init__(self, workdir: Path, raw: dict[str, Any]) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        self.port = free_port()
        self.config = workdir / "fencegate.toml"
        self.config.write_text(toml_document({"listen": f"127.0.0.1:{self.port}", **raw}))
        self.logfile = workdir / "gateway.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FENCEGATE_")}
        env["PYTHONPATH"] = str(ROOT)
        with open(self.logfile, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gateway", "serve", "--config", str(self.config)],
                cwd=self.workdir, env=env, stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip

    async def wait_ready(self, session: aiohttp.ClientSession, within: float = 20.0) -> None:
        """Until ``/readyz`` answers 200 (stores started, lock quorum answers)."""
        deadline = time.monotonic() + within
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                pytest.fail(f"gateway exited {self.proc.returncode}:\n{self.log_text()[-3000:]}")
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.get(self.url + "/readyz") as response:
                    if response.status == 200:
                        return
            if time.monotonic() > deadline:
                pytest.fail(f"gateway not ready within {within} s:\n{self.log_text()[-3000:]}")
            await asyncio.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL: no cleanup of any kind runs."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def terminate(self) -> None:
        """SIGTERM (drain and close) without waiting."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def stop(self) -> None:
        """SIGTERM (drain and close), SIGKILL after 10 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()

    def log_text(self) -> str:
        return self.logfile.read_text(errors="replace")


@contextlib.contextmanager
def gateways(workdir: Path, raw: dict[str, Any], count: int) -> Iterator[list[GatewayProcess]]:
    """``count`` gateway processes with one config (each its own port), stopped afterwards.

    Unless ``raw`` says otherwise they close at once on SIGTERM (``shutdown_grace_ms = 0``:
    no load balancer to tell), and they are stopped together, not one after another.
    """
    raw = {"shutdown_grace_ms": 0, **raw}
    procs = [GatewayProcess(workdir / f"gw{i}", raw) for i in range(count)]
    try:
        for proc in procs:
            proc.start()
        yield procs
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.stop()


@contextlib.asynccontextmanager
async def http_session(total: float = 15.0) -> AsyncIterator[aiohttp.ClientSession]:
    connector = aiohttp.TCPConnector(limit=100)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=total)
    ) as session:
        yield session


# -- the two-gateway cluster of these tests ----------------------------------------------------


@dataclass
class Cluster:
    gateways: list[GatewayProcess]
    session: aiohttp.ClientSession

    @property
    def urls(self) -> list[str]:
        return [g.url for g in self.gateways]


@pytest.fixture
async def cluster(
    redis3: list[RedisNode], pg_dsn: str, pg_schema: str, tmp_path: Path
) -> AsyncIterator[Cluster]:
    """Two gateways over three Redis nodes, with a kv store (one schema) and a files store."""
    raw = {
        "shutdown_timeout_ms": 2000,
        "shutdown_grace_ms": 0,  # no load balancer to tell: close at once
        "locks": {"redis": [n.url for n in redis3], "node_timeout_ms": 500},
        "stores": {
            "kv": {"type": "postgres", "dsn": pg_dsn, "schema": pg_schema},
            "files": {"type": "files", "root": str(tmp_path / "shared-root")},
        },
    }
    with gateways(tmp_path, raw, 2) as procs:
        async with http_session() as session:
            await asyncio.gather(*(p.wait_ready(session) for p in procs))
            yield Cluster(procs, session)


# -- HTTP steps ----------------------------------------------------------------------------------


async def acquire(
    session: aiohttp.ClientSession, base: str, name: str, ttl_ms: int, wait_ms: int
) -> tuple[int, dict[str, Any]]:
    async with session.post(
        f"{base}/v1/locks/{name}", json={"ttl_ms": ttl_ms, "wait_ms": wait_ms}
    ) as response:
        return response.status, await response.json()


async def release(session: aiohttp.ClientSession, base: str, name: str, lease_id: str) -> int:
    async with session.delete(f"{base}/v1/locks/{name}", headers={"X-Lease-Id": lease_id}) as r:
        await r.read()
        return r.status


async def read(
    session: aiohttp.ClientSession, base: str, store: str, key: str, token: int | None
) -> tuple[int, bytes, dict[str, str]]:
    headers = {} if token is None else {TOKEN: str(token)}
    async with session.get(f"{base}/v1/stores/{store}/{key}", headers=headers) as response:
        return response.status, await response.read(), dict(response.headers)


async def write(
    session: aiohttp.ClientSession, base: str, store: str, key: str, token: int, body: bytes
) -> tuple[int, dict[str, Any]]:
    async with session.put(
        f"{base}/v1/stores/{store}/{key}", data=body, headers={TOKEN: str(token)}
    ) as response:
        return response.status, await response.json()


def error_code(body: bytes) -> str:
    try:
        return str(json.loads(body).get("error"))
    except ValueError:
        return body[:200].decode(errors="replace")


# -- the load -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Accepted:
    value: int
    token: int
    gateway: int


@dataclass
class Tally:
    accepted: list[Accepted] = field(default_factory=list)
    stale_writes: int = 0
    stale_reads: int = 0
    long_pauses: int = 0
    not_granted: int = 0
    unexpected: list[str] = field(default_factory=list)


async def increment_loop(
    session: aiohttp.ClientSession,
    urls: list[str],
    store: str,
    deadline: float,
    tally: Tally,
    rng: random.Random,
) -> None:
    """Lock, fenced read, +1, maybe pause past the TTL, fenced write, release; until deadline.

    Each step goes to either gateway at random: a token granted through one replica
    is checked by the other (no replica holds state another one needs).
    """
    name = f"{store}/counter"
    while time.monotonic() < deadline:
        status, grant = await acquire(session, rng.choice(urls), name, TTL_MS, WAIT_MS)
        if (status, grant.get("error")) in ((409, "lock_held"), (503, "quorum_unavailable")):
            tally.not_granted += 1  # waited wait_ms in vain, or Redis slow on a busy machine
            continue
        if status != 200:
            tally.unexpected.append(f"acquire {status} {grant}")
            await asyncio.sleep(0.05)
            continue
        token, lease_id = grant["token"], grant["lease_id"]
        try:
            status, body, _ = await read(session, rng.choice(urls), store, "counter", token)
            if status == 404:
                value = 0
            elif status == 200:
                value = int(body)
            elif status == 409 and error_code(body) == "stale_token":
                tally.stale_reads += 1  # a newer holder read or wrote first: nothing to undo
                continue
            else:
                tally.unexpected.append(f"fenced read {status} {body[:200]!r}")
                continue
            if rng.random() < LONG_PAUSE:
                # Past the TTL, mostly just past it: the next holder takes the lock when this
                # lease runs out, so the late write lands around the next holder's read and
                # write, where a read that does not raise the mark would lose an update.
                tally.long_pauses += 1
                await asyncio.sleep(rng.uniform(1.0, 1.2) * TTL_MS / 1000)
            else:
                await asyncio.sleep(rng.uniform(0, 0.04))
            gateway = rng.randrange(len(urls))
            new = b"%d" % (value + 1)
            status, reply = await write(session, urls[gateway], store, "counter", token, new)
            if status == 200:
                tally.accepted.append(Accepted(value + 1, token, gateway))
            elif status == 409 and reply.get("error") == "stale_token":
                tally.stale_writes += 1
            else:
                tally.unexpected.append(f"write {status} {reply}")
        finally:
            status = await release(session, rng.choice(urls), name, lease_id)
            if status not in (204, 409):  # 409 lease_lost: it expired during a pause
                tally.unexpected.append(f"release {status}")


@pytest.mark.parametrize("store", ["kv", "files"])
async def test_fenced_read_modify_write_through_two_gateway_processes_loses_no_update(
    cluster: Cluster, store: str
) -> None:
    tally = Tally()
    deadline = time.monotonic() + DURATION
    loops = [
        increment_loop(cluster.session, cluster.urls, store, deadline, tally, random.Random(i))
        for i in range(CLIENTS)
    ]
    async with asyncio.timeout(DURATION + 30):
        await asyncio.gather(*loops)

    assert not tally.unexpected, tally.unexpected[:10]
    accepted = sorted(tally.accepted, key=lambda a: a.value)
    n = len(accepted)
    assert n >= 20, f"too little load to show anything: {tally}"
    assert {a.gateway for a in accepted} == {0, 1}, "both gateways must have written"
    # Value k was written by the k-th accepted write: each read saw every earlier write.
    values = [a.value for a in accepted]
    lost = n - len(set(values))
    assert values == list(range(1, n + 1)), f"{lost} value(s) written twice: lost updates"
    tokens = [a.token for a in accepted]
    assert all(x < y for x, y in itertools.pairwise(tokens)), f"tokens out of order: {tokens}"
    status, body, headers = await read(cluster.session, cluster.urls[0], store, "counter", None)
    assert status == 200
    assert int(body) == n, f"final counter {int(body)} != {n} accepted writes: an update was lost"
    assert headers.get(TOKEN) == str(tokens[-1])
    # The pauses really happened and fencing refused the paused holders.
    assert tally.stale_writes >= 1, tally


# -- the control experiment ----------------------------------------------------------------------


@dataclass
class Round:
    first_write: int  # status of the paused holder's late write
    second_write: int
    read_first: int
    read_second: int


async def kleppmann_round(
    session: aiohttp.ClientSession, a: str, b: str, store: str, key: str, *, fenced: bool
) -> Round:
    """Holder 1 (gateway a) reads, pauses past its TTL; holder 2 (gateway b) takes the lock
    and reads; holder 1 writes its increment, then holder 2 writes its increment.
    """
    name = f"{store}/{key}"
    status, g1 = await acquire(session, a, name, TTL_MS, WAIT_MS)
    assert status == 200, g1
    status, body, _ = await read(session, a, store, key, g1["token"] if fenced else None)
    assert status in (200, 404), body
    v1 = 0 if status == 404 else int(body)
    await asyncio.sleep(TTL_MS / 1000 + 0.15)  # the pause: holder 1's lease expires
    status, g2 = await acquire(session, b, name, TTL_MS * 10, WAIT_MS)
    assert status == 200, g2
    assert g2["token"] > g1["token"]
    status, body, _ = await read(session, b, store, key, g2["token"] if fenced else None)
    assert status in (200, 404), body
    v2 = 0 if status == 404 else int(body)
    first, _ = await write(session, a, store, key, g1["token"], b"%d" % (v1 + 1))
    second, _ = await write(session, b, store, key, g2["token"], b"%d" % (v2 + 1))
    await release(session, a, name, g1["lease_id"])
    assert await release(session, b, name, g2["lease_id"]) == 204
    return Round(first, second, v1, v2)


@pytest.mark.parametrize("store", ["kv", "files"])
async def test_plain_reads_lose_an_update_that_fenced_reads_prevent(
    cluster: Cluster, store: str
) -> None:
    a, b = cluster.urls
    rounds = 3
    async with asyncio.timeout(30):
        plain = [
            await kleppmann_round(cluster.session, a, b, store, "plain", fenced=False)
            for _ in range(rounds)
        ]
        fenced = [
            await kleppmann_round(cluster.session, a, b, store, "fenced", fenced=True)
            for _ in range(rounds)
        ]

    # Without fenced reads: both writes pass (holder 1's token is still the newest
    # written when it writes), both wrote the same value: one increment is lost per round.
    assert all(r.first_write == 200 and r.second_write == 200 for r in plain), plain
    assert all(r.read_first == r.read_second for r in plain), plain
    accepted = 2 * rounds
    status, body, _ = await read(cluster.session, a, store, "plain", None)
    assert status == 200
    assert int(body) == rounds, f"control: {accepted} accepted writes, counter {int(body)}"
    assert int(body) < accepted, "control: the plain timeline must lose updates"

    # With fenced reads: holder 2's read raised the mark, holder 1's late write is refused.
    assert all(r.first_write == 409 and r.second_write == 200 for r in fenced), fenced
    status, body, _ = await read(cluster.session, a, store, "fenced", None)
    assert status == 200
    assert int(body) == rounds, "every accepted write is counted"
