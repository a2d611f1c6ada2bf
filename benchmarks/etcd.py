"""fencegate against etcd, the service its users would otherwise pick for locks.

One run, one load generator against both sides: this process (uvloop) with the
lean HTTP/1.1 client of ``benchmarks/_lean_http.py``, one keep-alive connection per
client to each server it talks to, one request in flight on it. On two shared
cores the generator's CPU is taken from the servers: aiohttp's pooled session
cost ~110 µs of CPU a request (225 µs per fencegate lock cycle at 32 clients,
315 µs per etcd cycle, against 511 and 939 µs of server CPU), which squashed the
throughput ratio toward 1; the lean client sends the same requests for about a
third of that (its CPU per op is the "load-gen CPU" column). aiohttp is left only
for starting the gateway and reading its /metrics, outside the measured window.

* fencegate: one gateway process (``python -m gateway serve``) on three
  redis-server nodes of the run's own, and the PostgreSQL at
  ``$FENCEGATE_TEST_PG_DSN`` for the fenced write (a schema of the run's own);
  for 32 clients and the fenced write also ``serve --workers 2`` (one worker per
  core, as a host runs it) on the same nodes: one gateway process is bound by its
  one core there, while etcd's members use every core;
* etcd: a 3-member cluster on loopback (free ports, temp data dirs), once with
  its WAL fsync (etcd's default) and once with ``--unsafe-no-fsync`` (the
  Redis nodes keep nothing on disk either), reached through etcd's JSON
  gateway (the v3 API over HTTP: ``/v3/lease/grant``, ``/v3/lock/lock``,
  ``/v3/lock/unlock``, ``/v3/kv/txn``).

etcd's locks are taken the way its users take them: one lease per client
session (granted before a case, revoked after it), and a lock + unlock per
cycle. Workers go round-robin to the members, as clientv3 does with all three
endpoints; the one-client case talks to the leader, etcd's best case.

Scenarios: one client acquire + release; 32 clients on distinct names; 8
workers contending for one name with a 1 ms hold (critical sections/s, the
wait from asking to being granted: p50/p99/max, the busiest worker's share);
a fenced write, 32 clients each holding its own lock, 256-byte values
(fencegate ``PUT`` with ``X-Fencing-Token`` to PostgreSQL; etcd a ``Txn``
comparing the lock key's create revision, then a put).

Server CPU per op is read from /proc (utime + stime) of every server process:
fencegate's gateway (with its workers) and Redis nodes, and for the write the
PostgreSQL backends of the gateway's pool (found by ``application_name``, one per
gateway); etcd's three members.
On a small shared machine that ratio survives neighbours better than rates.
Cases alternate their order from round to round; a cell is the median over the
rounds, a ratio the median of per-round ratios with its min..max.

etcd is a bench-only dependency, from Debian's packages: when ``etcd`` is not on
the PATH, the script runs ``apt-get install -y etcd-server etcd-client`` as root
(or through sudo), or prints that command and stops.

    .venv/bin/python -m benchmarks.etcd            # full run (about 4 minutes)
    .venv/bin/python -m benchmarks.etcd --quick    # a short smoke run

Results: printed, and written to benchmarks/results/etcd.md and etcd.json
(etcd-quick.md and .json with --quick).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import aiohttp
import asyncpg
import uvloop

from benchmarks._lean_http import Connection, LeanHTTPError, Pool, Response
from benchmarks._report import command, md_table, save, write_json
from benchmarks.gateway import (
    LOCK_BODY,
    OCTET,
    PG_DSN,
    Case,
    Gateway,
    Refused,
    _rounded,
    children,
    combine,
    pct,
    proc_cpu,
    run_case,
    start_gateway,
)
from gateway.config import redact
from tests._servers import RedisNode, free_port

CLIENTS: Final = 32
CONTENDERS: Final = 8
HOLD: Final = 0.001
POOL: Final = 10
FENCEGATE: Final = "fencegate (3 Redis nodes)"
FENCEGATE_W2: Final = "fencegate --workers 2 (3 Redis nodes)"
FENCEGATES: Final = (FENCEGATE, FENCEGATE_W2)
# where one gateway process is bound by its one core (etcd's members use every core):
# the same load against `serve --workers 2` as well, one worker per core
SCALED: Final = ("32_clients", "fenced_write")
ETCD: Final = "etcd 3-member, fsync"
ETCD_NOFSYNC: Final = "etcd 3-member, --unsafe-no-fsync"
INSTALL: Final = ["apt-get", "install", "-y", "etcd-server", "etcd-client"]
GENERATOR: Final = "lean HTTP/1.1 client (benchmarks/_lean_http.py), a connection per client"
JSON: Final = (("Content-Type", "application/json"),)


def expect(resp: Response, status: int) -> bytes:
    """The body of an answer with ``status``; any other is ``Refused``."""
    if resp.status != status:
        raise Refused(resp.status, resp.body)
    return resp.body


def _b64(text: str | bytes) -> str:
    raw = text.encode() if isinstance(text, str) else text
    return base64.b64encode(raw).decode()


def ensure_etcd() -> str:
    """The etcd binary; installs Debian's etcd-server when missing and allowed to."""
    found = shutil.which("etcd")
    if found:
        return found
    if os.geteuid() == 0:
        argv = INSTALL
    elif shutil.which("sudo"):
        argv = ["sudo", "-n", *INSTALL]
    else:
        raise SystemExit(f"etcd is not installed; as root run: {' '.join(INSTALL)}")
    print(f"etcd is not installed; running {' '.join(argv)}", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if subprocess.run(argv, env=env, check=False).returncode != 0 or not shutil.which("etcd"):
        raise SystemExit(f"could not install etcd; as root run: {' '.join(INSTALL)}")
    return str(shutil.which("etcd"))


# ---------------------------------------------------------------- etcd cluster
@dataclass
class EtcdCluster:
    """Three etcd members on loopback, each its own process and data dir."""

    binary: str
    workdir: Path
    fsync: bool
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    pools: list[Pool] = field(default_factory=list)  # one per member, a connection a client
    api: str = "/v3"
    leader: int = 0  # the index of the leader's member
    version: str = ""

    def start(self) -> None:
        peers = [free_port() for _ in range(3)]
        clients = [free_port() for _ in range(3)]
        initial = ",".join(f"m{i}=http://127.0.0.1:{p}" for i, p in enumerate(peers))
        token = f"fg-bench-{uuid.uuid4().hex[:8]}"
        for i in range(3):
            data = self.workdir / f"m{i}"
            data.mkdir(parents=True)
            argv = [
                self.binary, "--name", f"m{i}", "--data-dir", str(data),
                "--listen-peer-urls", f"http://127.0.0.1:{peers[i]}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{peers[i]}",
                "--listen-client-urls", f"http://127.0.0.1:{clients[i]}",
                "--advertise-client-urls", f"http://127.0.0.1:{clients[i]}",
                "--initial-cluster", initial, "--initial-cluster-state", "new",
                "--initial-cluster-token", token, "--log-level", "error",
            ]  # fmt: skip
            if not self.fsync:
                argv.append("--unsafe-no-fsync")
            with open(self.workdir / f"m{i}.log", "wb") as log:
                self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))
            self.pools.append(Pool("127.0.0.1", clients[i], CLIENTS))

    async def ready(self) -> None:
        """Wait for every member's /health, find the API prefix (3.4: /v3) and the leader."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30.0
        pending = list(range(len(self.pools)))
        while pending and loop.time() < deadline:
            for proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"an etcd member exited; see {self.workdir}")
            with contextlib.suppress(LeanHTTPError, OSError, TimeoutError, ValueError):
                probe = self.pools[pending[0]][0]
                r = await probe.request("GET", "/health")
                if r.status == 200 and json.loads(r.body).get("health") == "true":
                    pending.pop(0)
                    continue
            await asyncio.sleep(0.1)
        if pending:
            raise RuntimeError(f"etcd not healthy in 30 s; see {self.workdir}")
        for prefix in ("/v3", "/v3beta"):
            r = await self.pools[0][0].request("POST", f"{prefix}/maintenance/status", b"{}", JSON)
            if r.status == 200:
                self.api = prefix
                break
        else:
            raise RuntimeError("etcd serves neither /v3 nor /v3beta")
        for m, pool in enumerate(self.pools):
            got = await self.call(pool[0], "/maintenance/status", {})
            self.version = got.get("version", "?")
            if got["leader"] == got["header"]["member_id"]:
                self.leader = m

    async def call(self, conn: Connection, path: str, body: dict[str, Any]) -> dict[str, Any]:
        r = await conn.request("POST", self.api + path, json.dumps(body).encode(), JSON)
        got: dict[str, Any] = json.loads(expect(r, 200))
        if "error" in got:
            raise Refused(r.status, r.body)
        return got

    def conn(self, i: int, *, leader: bool = False) -> Connection:
        """Client ``i``'s connection: to the leader, or to member ``i`` mod 3 (round-robin)."""
        member = self.leader if leader else i % len(self.pools)
        return self.pools[member][i]

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def stop(self) -> None:
        for pool in self.pools:
            pool.close()
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


@dataclass
class Sessions:
    """One etcd lease per client session, granted before a case and revoked after it."""

    etcd: EtcdCluster
    count: int
    ttl: int
    ids: list[str] = field(default_factory=list)

    def conn(self, i: int) -> Connection:
        return self.etcd.conn(i, leader=self.count == 1)

    async def grant(self) -> None:
        async def one(i: int) -> str:
            got = await self.etcd.call(self.conn(i), "/lease/grant", {"TTL": self.ttl})
            return str(got["ID"])

        self.ids = await asyncio.gather(*(one(i) for i in range(self.count)))

    async def revoke(self) -> None:
        async def one(i: int) -> None:
            with contextlib.suppress(Refused, LeanHTTPError, OSError, TimeoutError):
                await self.etcd.call(self.conn(i), "/lease/revoke", {"ID": self.ids[i]})

        await asyncio.gather(*(one(i) for i in range(len(self.ids))))
        self.ids = []


# ---------------------------------------------------------------- cases
@dataclass
class Waits:
    """What the contention case records in its measured window: waits and owners."""

    waits: list[float] = field(default_factory=list)
    owners: list[int] = field(default_factory=list)

    def clear(self) -> None:
        self.waits.clear()
        self.owners.clear()

    def row(self) -> dict[str, Any]:
        counts = Counter(self.owners)
        return {
            "wait_p50_ms": pct(self.waits, 0.5) * 1e3,
            "wait_p99_ms": pct(self.waits, 0.99) * 1e3,
            "wait_max_ms": max(self.waits, default=float("nan")) * 1e3,
            "top_share": max(counts.values(), default=0) / max(len(self.owners), 1),
        }


def etcd_lock_case(label: str, etcd: EtcdCluster, n: int) -> Case:
    """lock + unlock of a name per cycle, each client its own lease (session)."""
    sessions = Sessions(etcd, n, ttl=120)
    names = [_b64("bench/one")] if n == 1 else [_b64(f"bench/w{i}") for i in range(n)]

    async def op(i: int) -> None:
        conn = sessions.conn(i)
        got = await etcd.call(conn, "/lock/lock", {"name": names[i], "lease": sessions.ids[i]})
        await etcd.call(conn, "/lock/unlock", {"key": got["key"]})

    return Case(label, n, op, setup=sessions.grant, teardown=sessions.revoke)


def etcd_contention_case(label: str, etcd: EtcdCluster, waits: Waits) -> Case:
    sessions = Sessions(etcd, CONTENDERS, ttl=120)
    name = _b64("bench/hot")

    async def op(i: int) -> None:
        conn = sessions.conn(i)
        t0 = time.perf_counter()
        got = await etcd.call(conn, "/lock/lock", {"name": name, "lease": sessions.ids[i]})
        waits.waits.append(time.perf_counter() - t0)
        waits.owners.append(i)
        await asyncio.sleep(HOLD)
        await etcd.call(conn, "/lock/unlock", {"key": got["key"]})

    return Case(label, CONTENDERS, op, setup=sessions.grant, teardown=sessions.revoke)


def etcd_put_case(label: str, etcd: EtcdCluster, body: bytes) -> Case:
    """Each client holds its lock; a write is a Txn: lock key still there, then put."""
    sessions = Sessions(etcd, CLIENTS, ttl=120)
    keys: list[str] = []
    value = _b64(body)

    async def setup() -> None:
        await sessions.grant()

        async def one(i: int) -> str:
            req = {"name": _b64(f"pg/bench/c{i}"), "lease": sessions.ids[i]}
            got = await etcd.call(sessions.conn(i), "/lock/lock", req)
            return str(got["key"])

        keys[:] = await asyncio.gather(*(one(i) for i in range(CLIENTS)))

    async def teardown() -> None:
        await sessions.revoke()  # revoking the lease deletes its lock keys

    async def op(i: int) -> None:
        txn = {
            "compare": [{"key": keys[i], "target": "CREATE", "result": "GREATER",
                         "create_revision": "0"}],
            "success": [{"request_put": {"key": _b64(f"bench/c{i}"), "value": value}}],
        }  # fmt: skip
        got = await etcd.call(sessions.conn(i), "/kv/txn", txn)
        if not got.get("succeeded"):
            raise Refused(409, b'{"error": "lock_lost"}')

    return Case(label, CLIENTS, op, setup=setup, teardown=teardown)


def fencegate_lock_case(label: str, pool: Pool, gw: Gateway, workers: int) -> Case:
    """POST /v1/locks/{name}, then DELETE it with the lease id: one cycle (as
    ``benchmarks.gateway.http_lock_case``, through the lean client)."""
    names = ["bench/one"] if workers == 1 else [f"bench/w{i}" for i in range(workers)]
    paths = [f"/v1/locks/{name}" for name in names]

    async def op(i: int) -> None:
        conn, path = pool[i], paths[i]
        lease_id = json.loads(expect(await conn.request("POST", path, LOCK_BODY, JSON), 200))
        release = (("X-Lease-Id", lease_id["lease_id"]),)
        expect(await conn.request("DELETE", path, headers=release), 204)

    return Case(label, workers, op, gateway=gw)


def fencegate_contention_case(label: str, pool: Pool, gw: Gateway, waits: Waits) -> Case:
    path = "/v1/locks/bench/hot"
    body = json.dumps({"ttl_ms": 10_000, "wait_ms": 10_000}).encode()

    async def op(i: int) -> None:
        conn = pool[i]
        t0 = time.perf_counter()
        lease_id = json.loads(expect(await conn.request("POST", path, body, JSON), 200))
        waits.waits.append(time.perf_counter() - t0)
        waits.owners.append(i)
        await asyncio.sleep(HOLD)
        release = (("X-Lease-Id", lease_id["lease_id"]),)
        expect(await conn.request("DELETE", path, headers=release), 204)

    return Case(label, CONTENDERS, op, gateway=gw)


def fencegate_put_case(
    label: str, pool: Pool, gw: Gateway, store: str, body: bytes, ttl_ms: int
) -> Case:
    """PUT /v1/stores/{store}/bench/c{i} with X-Fencing-Token, each client holding its own
    lock (as ``benchmarks.gateway.http_put_case(fenced=True)``, through the lean client)."""
    paths = [f"/v1/locks/{store}/bench/c{i}" for i in range(CLIENTS)]  # the key's fence scope
    take = json.dumps({"ttl_ms": ttl_ms, "wait_ms": 5000}).encode()
    headers: list[tuple[tuple[str, str], ...]] = []
    lease_ids: list[str] = []

    async def setup() -> None:
        async def one(i: int) -> dict[str, Any]:
            got: dict[str, Any] = json.loads(
                expect(await pool[i].request("POST", paths[i], take, JSON), 200)
            )
            return got

        grants = await asyncio.gather(*(one(i) for i in range(CLIENTS)))
        lease_ids[:] = [str(g["lease_id"]) for g in grants]
        headers[:] = [
            (("X-Fencing-Token", str(g["token"])), ("Content-Type", OCTET)) for g in grants
        ]

    async def teardown() -> None:
        async def one(i: int) -> None:
            release = (("X-Lease-Id", lease_ids[i]),)
            expect(await pool[i].request("DELETE", paths[i], headers=release), 204)

        await asyncio.gather(*(one(i) for i in range(len(lease_ids))))
        lease_ids.clear()

    async def op(i: int) -> None:
        put = f"/v1/stores/{store}/bench/c{i}"
        expect(await pool[i].request("PUT", put, body, headers[i]), 200)

    return Case(label, CLIENTS, op, gateway=gw, store=store, setup=setup, teardown=teardown)


# ---------------------------------------------------------------- server CPU
@dataclass
class Servers:
    """The processes whose CPU one side's cases are charged with."""

    pids: Callable[[], Awaitable[list[int]]]
    cpu0: dict[int, float] = field(default_factory=dict)
    cpu: float = 0.0

    async def begin(self) -> None:
        self.cpu0 = {pid: proc_cpu(pid) for pid in await self.pids()}

    async def end(self) -> None:
        now = {pid: proc_cpu(pid) for pid in await self.pids()}
        self.cpu = sum(c - self.cpu0.get(pid, 0.0) for pid, c in now.items())


def fixed(pids: Iterable[int]) -> Callable[[], Awaitable[list[int]]]:
    listed = list(pids)

    async def get() -> list[int]:
        return listed

    return get


async def measure(
    case: Case,
    http: aiohttp.ClientSession,
    servers: Servers,
    seconds: float,
    warm_ops: int,
    waits: Waits | None,
) -> dict[str, Any]:
    async def begin() -> None:
        if waits is not None:
            waits.clear()
        await servers.begin()

    row = await run_case(case, http, seconds, warm_ops, window=(begin, servers.end))
    ops = row["ops"]
    row["server_cpu_us"] = servers.cpu / ops * 1e6 if ops else None
    if waits is not None:
        row.update(waits.row())
    return row


# ---------------------------------------------------------------- driver
Entry = tuple[str, Case, Servers, Waits | None]  # a side of a scenario: label, case, CPU


async def main(args: argparse.Namespace) -> None:
    binary = ensure_etcd()
    workdir = Path(tempfile.mkdtemp(prefix="fencegate-etcdbench-"))
    nodes = [RedisNode(workdir / f"redis{i}") for i in range(3)]
    clusters = {
        ETCD: EtcdCluster(binary, workdir / "etcd-fsync", fsync=True),
        ETCD_NOFSYNC: EtcdCluster(binary, workdir / "etcd-nofsync", fsync=False),
    }
    schema = f"fg_etcdbench_{uuid.uuid4().hex[:10]}"
    # each gateway's PostgreSQL backends carry its own name: their CPU is that side's
    app_names = {FENCEGATE: schema, FENCEGATE_W2: f"{schema}_w2"}
    body = bytes(i % 251 for i in range(args.body_bytes))
    results: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, uvloop",
        "seconds_per_case": args.seconds,
        "rounds": args.rounds,
        "body_bytes": args.body_bytes,
        "postgres": redact(PG_DSN),
        "load_generator": GENERATOR,
    }
    conn = await asyncpg.connect(PG_DSN)
    gateways: dict[str, Gateway] = {}
    http: aiohttp.ClientSession | None = None
    pools: dict[str, Pool] = {}
    try:
        for node in nodes:
            node.start()
        for cluster in clusters.values():
            cluster.start()
        # aiohttp only starts the gateway and reads its /metrics, outside the measured window
        http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        for cluster in clusters.values():
            await cluster.ready()
        results["etcd"] = {"version": clusters[ETCD].version, "api": clusters[ETCD].api}
        redis_urls = [n.url for n in nodes]
        redis_pids = [n.proc.pid for n in nodes if n.proc is not None]
        fg_servers: dict[str, Servers] = {}
        fg_put_servers: dict[str, Servers] = {}
        for side, workers in ((FENCEGATE, 1), (FENCEGATE_W2, 2)):
            dsn = f"{PG_DSN}{'&' if '?' in PG_DSN else '?'}application_name={app_names[side]}"
            stores = {"pg": {"type": "postgres", "dsn": dsn, "schema": schema, "pool_max": POOL}}
            gw = gateways[side] = await start_gateway(
                http, workdir, f"etcd-bench-w{workers}", redis_urls, stores, workers=workers
            )
            pools[side] = Pool.for_url(gw.url, CLIENTS)
            # the gateway process and its workers (their pids stay: none is restarted)
            gw_pids = [gw.proc.pid, *children(gw.proc.pid)]

            async def put_pids(
                gw_pids: list[int] = gw_pids, name: str = app_names[side]
            ) -> list[int]:
                rows = await conn.fetch(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = $1", name
                )
                return [*gw_pids, *redis_pids, *(r["pid"] for r in rows)]

            fg_servers[side] = Servers(fixed([*gw_pids, *redis_pids]))
            fg_put_servers[side] = Servers(put_pids)
        etcd_servers = {k: Servers(fixed(c.pids())) for k, c in clusters.items()}
        waits = Waits()
        ttl_ms = int((args.seconds + 60) * 1000)

        scenarios: dict[str, list[Entry]] = {key: [] for key in NOTES}
        for side in FENCEGATES:
            pool, gw, srv = pools[side], gateways[side], fg_servers[side]
            entries = {
                "one_client": (fencegate_lock_case(side, pool, gw, 1), srv, None),
                "32_clients": (fencegate_lock_case(side, pool, gw, CLIENTS), srv, None),
                "contention": (fencegate_contention_case(side, pool, gw, waits), srv, waits),
                "fenced_write": (
                    fencegate_put_case(side, pool, gw, "pg", body, ttl_ms),
                    fg_put_servers[side],
                    None,
                ),
            }
            for key, (case, servers, w) in entries.items():
                if side == FENCEGATE or key in SCALED:
                    scenarios[key].append((side, case, servers, w))
        for label, cluster in clusters.items():
            srv = etcd_servers[label]
            scenarios["one_client"].append((label, etcd_lock_case(label, cluster, 1), srv, None))
            scenarios["32_clients"].append(
                (label, etcd_lock_case(label, cluster, CLIENTS), srv, None)
            )
            scenarios["contention"].append(
                (label, etcd_contention_case(label, cluster, waits), srv, waits)
            )
            scenarios["fenced_write"].append((label, etcd_put_case(label, cluster, body), srv,
                                              None))  # fmt: skip
        if args.only:
            scenarios = {k: v for k, v in scenarios.items() if k in args.only}

        per_round: list[dict[str, dict[str, dict[str, Any]]]] = []
        for rnd in range(args.rounds):
            this: dict[str, dict[str, dict[str, Any]]] = {}
            for key, entries in scenarios.items():
                this[key] = {}
                for label, case, servers, w in entries if rnd % 2 == 0 else entries[::-1]:
                    row = await measure(case, http, servers, args.seconds, args.warm_ops, w)
                    this[key][label] = row
                    print(f"round {rnd + 1} {key:12} {label:34} {json.dumps(_rounded(row))}",
                          flush=True)  # fmt: skip
            per_round.append(this)
        for key, entries in scenarios.items():
            results[key] = {e[0]: combine([r[key][e[0]] for r in per_round]) for e in entries}
        results["ratios"] = ratios(per_round)
        results["per_round"] = per_round
        results["machine_load"] = os.getloadavg()
    finally:
        for pool in pools.values():
            pool.close()
        for gw in gateways.values():
            await gw.stop()
        if http is not None:
            await http.close()
        for cluster in clusters.values():
            cluster.stop()
        for node in nodes:
            node.stop()
        with contextlib.suppress(Exception):
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await conn.close()
        shutil.rmtree(workdir, ignore_errors=True)
    write_report(results, args)


# (scenario, metric, fsync target, no-fsync target): fencegate / etcd by rate, and etcd's
# server CPU per op / fencegate's (above 1: fencegate is cheaper).
TARGETS: Final = {"ops_per_s": (2.0, 1.5), "server_cpu_us": (2.0, 2.0)}


def ratios(per_round: list[dict[str, dict[str, dict[str, Any]]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    scenarios = list(per_round[0])
    for key, side, other, which, metric in (
        (key, side, other, which, metric)
        for key in scenarios
        for side in FENCEGATES
        for other, which in ((ETCD, 0), (ETCD_NOFSYNC, 1))
        for metric in TARGETS
    ):
        targets = TARGETS[metric]
        values = []
        for r in per_round:
            fg = r[key].get(side, {}).get(metric)
            et = r[key].get(other, {}).get(metric)
            if fg and et:
                values.append(fg / et if metric == "ops_per_s" else et / fg)
        if values:
            med = statistics.median(values)
            scenario = key if side == FENCEGATE else f"{key}, --workers 2"
            out[f"{scenario} vs {other} by {metric}"] = {
                "scenario": scenario,
                "versus": other,
                "metric": metric,
                "median": med,
                "min": min(values),
                "max": max(values),
                "target": targets[which],
                "ok": med >= targets[which],
            }
    return out


COLUMNS: Final = (
    ("ops_per_s", "ops/s"),
    ("p50_ms", "p50 ms"),
    ("p99_ms", "p99 ms"),
    ("server_cpu_us", "server CPU µs/op"),
    ("gen_cpu_us", "load-gen CPU µs/op"),
    ("busy", "machine busy"),
    ("errors", "errors"),
)
WAIT_COLUMNS: Final = (
    ("wait_p50_ms", "wait p50 ms"),
    ("wait_p99_ms", "wait p99 ms"),
    ("wait_max_ms", "wait max ms"),
    ("top_share", "busiest worker"),
)
NOTES: Final = {
    "one_client": "One client, sequential; an op is an acquire and a release of one name "
    "(fencegate: POST + DELETE /v1/locks; etcd: /v3/lock/lock + /v3/lock/unlock under the "
    "client's lease, against the leader).",
    "32_clients": f"{CLIENTS} concurrent clients, each its own name and (etcd) its own lease; "
    "etcd clients spread round-robin over the three members.",
    "contention": f"{CONTENDERS} workers on one name, {HOLD * 1e3:g} ms hold; an op is one "
    "critical section (ops/s = critical sections/s). Wait: from asking for the lock to being "
    "granted it.",
    "fenced_write": f"{CLIENTS} clients, each holding its own lock, writing its own key "
    "(256-byte values): fencegate PUT with X-Fencing-Token to PostgreSQL; etcd a Txn "
    "comparing the lock key's create revision, then a put. fencegate's server CPU includes "
    "the PostgreSQL backends of its pool (not PostgreSQL's WAL writer or checkpointer).",
}


def write_report(results: dict[str, Any], args: argparse.Namespace) -> None:
    suffix = "-quick" if args.quick else ""
    write_json(f"etcd{suffix}", results)
    etcd = results.get("etcd", {})
    load = results.get("machine_load")
    lines = [
        "# fencegate against etcd",
        "",
        f"Run: `{command()}` on {results['machine']}, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {args.seconds:g} s a case, "
        f"{args.rounds} round(s) in alternating order (a cell is the median over the rounds). "
        f"etcd {etcd.get('version', '?')} from Debian, 3 members on loopback, JSON gateway "
        f"at `{etcd.get('api', '?')}`; fencegate: one gateway process on 3 redis-server nodes "
        f"(for {' and '.join(SCALED)} also `serve --workers 2`, one worker per core, as "
        "etcd's members use every core), "
        f"PostgreSQL at `{results['postgres']}`. One load generator for both: "
        f"{results['load_generator']}, not aiohttp, so that it takes little of the servers' "
        "CPU on a small machine (its own CPU per op is a column). Server CPU: utime + stime "
        "from /proc of the servers per op "
        "(fencegate: gateway + Redis nodes [+ PostgreSQL backends]; etcd: its members).",
        "",
    ]
    if load:
        lines += [
            f"Load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on "
            f"{os.cpu_count()} cores (other work shares this machine).",
            "",
        ]
    for key, note in NOTES.items():
        rows = results.get(key)
        if not rows:
            continue
        cols = COLUMNS + (WAIT_COLUMNS if key == "contention" else ())
        lines += [f"## {key}", "", note, ""]
        lines += md_table("side", cols, rows)
        lines.append("")
    if results.get("ratios"):
        lines += [
            "## Ratios (median of per-round ratios, min..max)",
            "",
            "By ops/s: fencegate / etcd. By server CPU: etcd's CPU per op / fencegate's "
            "(above 1: fencegate spends less).",
            "",
            "| scenario | versus | by | median | range | target |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for r in results["ratios"].values():
            verdict = "met" if r["ok"] else "MISSED"
            lines.append(
                f"| {r['scenario']} | {r['versus']} | {r['metric']} | **{r['median']:.2f}x** | "
                f"{r['min']:.2f}..{r['max']:.2f} | >= {r['target']:g}: **{verdict}** |"
            )
        lines.append("")
    save(f"etcd{suffix}", lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 s a case, 2 rounds")
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds a case")
    parser.add_argument("--rounds", type=int, default=5, help="rounds, alternating the order")
    parser.add_argument("--warm-ops", type=int, default=10, help="warm-up ops per client")
    parser.add_argument("--body-bytes", type=int, default=256)
    parser.add_argument("--only", nargs="*", help="scenarios to run (default: all)")
    ns = parser.parse_args()
    if ns.quick:
        ns.seconds, ns.rounds, ns.warm_ops = 1.0, 2, 5
    uvloop.run(main(ns))
