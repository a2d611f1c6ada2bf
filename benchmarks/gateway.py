"""Gateway throughput and latency: HTTP locks and fenced writes against their baselines.

Every number comes from one run against the same servers: three redis-server
nodes of the run's own (``tests._servers.RedisNode``), the PostgreSQL at
``$FENCEGATE_TEST_PG_DSN`` (default postgresql://postgres@127.0.0.1:5432/test;
a schema created for the run and dropped after it) and a temp folder. The
gateway is its own process (``python -m gateway serve --config``), the load
generator is this one (aiohttp, one pooled session, uvloop), so the two never
share an event loop. The baselines run here, in-process, without HTTP:

* locks: the same ``LockManager`` calls the gateway makes (``acquire``, then
  ``release`` of a ``LockManager.handle``), over the same three nodes; and a
  bare aiohttp app (``BARE``, its own process, no fencegate code) serving the
  same two requests with the same JSON shapes. The HTTP path's overhead is
  gateway CPU per cycle / (bare app CPU + in-process LockManager CPU), with the
  gateway and the bare app driven by this process's aiohttp client and, in
  cases of their own, by ``cyclegen`` (``benchmarks.loadgen``: C, a tenth of
  the client's CPU per cycle, so that the servers' CPU is less the cost of
  sharing two cores with a load generator heavier than themselves);
* fenced PUTs: the same gateway with a second store of the same kind and
  ``fencing = "none"``, the storage adapter called in-process, and plain
  asyncpg upserts into an equivalent table with a pool of the same size.

Each case runs once per round; rounds alternate the order of the cases (ABBA),
and a ratio is the median of the per-round ratios of cases run side by side.
The machine is small and shared by the gateway, the load generator and the
servers: read the ratios and the CPU per operation, not the absolute rates.
Last, the gateway runs once more under cProfile for a short fenced-PUT load,
and the report says where its time goes.

    .venv/bin/python -m benchmarks.gateway            # full run (about 4 minutes)
    .venv/bin/python -m benchmarks.gateway --quick    # a short smoke run
    .venv/bin/python -m benchmarks.gateway --only locks/one_client locks/32_clients \
        --profile-seconds 0                           # the HTTP path overhead alone

Results: printed, and written to benchmarks/results/gateway.md and gateway.json
(gateway-quick.md and .json with --quick).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import platform
import pstats
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import aiohttp
import asyncpg
import uvloop
from prometheus_client.parser import text_string_to_metric_families

from benchmarks._report import command, md_table, save, write_json
from benchmarks.loadgen import LoadGen, prepare
from gateway.config import redact
from gateway.shared import SharedDir
from lockservice import LockManager
from storage_adapters import FencedStore, FileStore, PostgresStore
from tests._servers import RedisNode, free_port

ROOT: Final = Path(__file__).resolve().parent.parent
PG_DSN: Final = os.environ.get("FENCEGATE_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
WORKERS: Final = 32
POOL: Final = 10  # pool_max of every PostgreSQL pool: the gateway's stores and the direct one
MAX_OPS: Final = 200_000  # per worker and case, on top of the time limit
MAX_FAILURES: Final = 100  # per worker and case: a broken case ends early, not never
OCTET: Final = "application/octet-stream"
LOCK_BODY: Final = b'{"ttl_ms": 10000}'
CLK_TCK: Final = os.sysconf("SC_CLK_TCK")
# ``python -c PROFILED OUT serve ...``: the gateway, with cProfile switched on by SIGUSR1 and
# off by SIGUSR2 (which writes OUT.<n>), so that a profile holds the load window only: no
# imports, no start-up, no warm-up. Signal handlers run in the main thread, the loop's own.
PROFILED: Final = """
import cProfile, os, signal, sys
from gateway.cli import main
out, state = sys.argv[1], {"prof": None, "n": 0}
def start(*_):
    state["prof"] = cProfile.Profile()
    state["prof"].enable()
def stop(*_):
    prof, state["prof"] = state["prof"], None
    if prof is not None:
        prof.disable()
        state["n"] += 1
        path = f"{out}.{state['n']}"
        prof.dump_stats(path + ".tmp")
        os.replace(path + ".tmp", path)
signal.signal(signal.SIGUSR1, start)
signal.signal(signal.SIGUSR2, stop)
sys.exit(main(sys.argv[2:]))
"""

# ``python -c BARE PORT``: the floor of the HTTP path, an aiohttp app with no fencegate code
# serving the lock cycle's two requests with the same JSON shapes (uvloop, no access log, as
# ``gateway serve``); its lock is a dict, its lease id a uuid4.
BARE: Final = """
import json, math, sys, uuid
import uvloop
from aiohttp import web
held, counter = {}, [0]
async def acquire(request):
    body = json.loads(await request.read())
    ttl_ms = body.get("ttl_ms", 10000)
    name = request.match_info["name"]
    lease_id = uuid.uuid4().hex
    counter[0] += 1
    held[name] = lease_id
    return web.json_response({"name": name, "token": counter[0], "lease_id": lease_id,
                              "ttl_ms": ttl_ms, "valid_ms": math.floor(ttl_ms * 0.99)})
async def release(request):
    name = request.match_info["name"]
    if held.get(name) != request.headers.get("X-Lease-Id"):
        return web.json_response({"error": "not_lease_holder", "message": "no"}, status=409)
    del held[name]
    return web.Response(status=204)
async def ready(request):
    return web.json_response({"ready": True})
async def main():
    app = web.Application()
    app.router.add_post("/v1/locks/{name:.+}", acquire)
    app.router.add_delete("/v1/locks/{name:.+}", release)
    app.router.add_get("/readyz", ready)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", int(sys.argv[1])).start()
    await asyncio.Event().wait()
import asyncio
uvloop.run(main())
"""

Op = Callable[[int], Awaitable[None]]


class Refused(Exception):
    """A request that did not get the status the case expects."""

    def __init__(self, status: int, body: bytes) -> None:
        try:
            code = json.loads(body).get("error", "?")
        except (ValueError, AttributeError):
            code = body[:40].decode(errors="replace")
        super().__init__(f"{status} {code}")


# ---------------------------------------------------------------- gateway processes
@dataclass
class Gateway:
    """One ``python -m gateway serve`` process and where to reach it."""

    name: str
    proc: subprocess.Popen[bytes]
    url: str
    log: Path
    metrics: bool = True  # serves fencegate's /metrics (the bare app does not)

    def cpu_seconds(self) -> float:
        return proc_cpu(self.proc.pid)

    async def stop(self, grace: float = 60.0) -> int | None:
        """SIGTERM (a graceful shutdown), then SIGKILL after ``grace`` seconds."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(self.proc.wait, grace)
            except subprocess.TimeoutExpired:
                print(f"  gateway {self.name} did not stop in {grace:g} s; killing", flush=True)
                self.proc.kill()
                await asyncio.to_thread(self.proc.wait, 10)
        return self.proc.returncode


def proc_cpu(pid: int) -> float:
    """CPU seconds of a process so far (every thread), 0 once it is gone.

    From the process's CPU-time clock (clock_gettime with the clock id Linux derives from
    the pid, nanoseconds), else /proc/PID/stat's utime + stime, which tick at 1/CLK_TCK
    (10 ms): too coarse for short cases.
    """
    try:
        return time.clock_gettime(((~pid) << 3) | 2)  # MAKE_PROCESS_CPUCLOCK(pid, SCHED)
    except OSError:
        pass
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(str(value))  # a JSON string is a TOML basic string


def config_toml(
    port: int, redis: list[str], stores: Mapping[str, Mapping[str, object]], workers: int = 1
) -> str:
    lines = [
        f'listen = "127.0.0.1:{port}"',
        "shutdown_timeout_ms = 5000",
        "shutdown_grace_ms = 0",
        f"workers = {workers}",
        "",
        "[locks]",
    ]
    lines.append(f"redis = {_toml(redis)}")
    for name, table in stores.items():
        lines += ["", f"[stores.{name}]"]
        lines += [f"{k} = {_toml(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def _spawn(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    # The TOML is the whole configuration: no FENCEGATE_* variable of ours may override it.
    env = {k: v for k, v in os.environ.items() if not k.startswith("FENCEGATE_")}
    with open(log, "wb") as out:
        return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


async def start_gateway(
    http: aiohttp.ClientSession,
    workdir: Path,
    name: str,
    redis: list[str],
    stores: Mapping[str, Mapping[str, object]],
    *,
    log_level: str = "info",
    profile: Path | None = None,
    workers: int = 1,
) -> Gateway:
    """Start a gateway on a free loopback port and wait until /readyz says 200 (with
    ``workers`` > 1: until every worker listens)."""
    port = free_port()
    config = workdir / f"gateway-{name}.toml"
    config.write_text(config_toml(port, redis, stores, workers))
    log = workdir / f"gateway-{name}.log"
    serve = ["serve", "--config", str(config), "--log-level", log_level]
    if profile is None:
        argv = [sys.executable, "-m", "gateway", *serve]
    else:
        argv = [sys.executable, "-c", PROFILED, str(profile), *serve]
    gw = Gateway(name, _spawn(argv, log), f"http://127.0.0.1:{port}", log)
    await _wait_ready(http, gw)
    deadline = asyncio.get_running_loop().time() + 30.0
    while workers > 1 and not workers_listen(gw.proc.pid, workers):
        if asyncio.get_running_loop().time() > deadline:
            raise RuntimeError(f"{name}: not every worker listens after 30 s; see {log}")
        await asyncio.sleep(0.1)
    return gw


def children(pid: int) -> list[int]:
    """The child processes of ``pid`` (a supervisor's workers)."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def workers_listen(pid: int, count: int) -> bool:
    """``count`` workers of the supervisor ``pid`` marked themselves ready in its shared
    directory: answers to /readyz may all come from the first while another still starts."""
    kids = children(pid)
    if len(kids) != count:
        return False
    key = b"PROMETHEUS_MULTIPROC_DIR="
    for kid in kids:
        try:
            environ = Path(f"/proc/{kid}/environ").read_bytes().split(b"\0")
        except OSError:
            return False
        shared = [e.removeprefix(key).decode() for e in environ if e.startswith(key)]
        if not shared or not SharedDir(shared[0]).is_ready(kid):
            return False
    return True


async def start_bare(http: aiohttp.ClientSession, workdir: Path) -> Gateway:
    """The bare aiohttp app (``BARE``) on a free loopback port, once it answers /readyz."""
    port = free_port()
    log = workdir / "bare.log"
    gw = Gateway("bare", _spawn([sys.executable, "-c", BARE, str(port)], log),
                 f"http://127.0.0.1:{port}", log, metrics=False)  # fmt: skip
    await _wait_ready(http, gw)
    return gw


async def _wait_ready(http: aiohttp.ClientSession, gw: Gateway) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30.0
    while loop.time() < deadline:
        if gw.proc.poll() is not None:
            raise RuntimeError(f"{gw.name} exited:\n{gw.log.read_text(errors='replace')[-3000:]}")
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with http.get(f"{gw.url}/readyz", timeout=aiohttp.ClientTimeout(total=2)) as r:
                await r.read()
                if r.status == 200:
                    return
        await asyncio.sleep(0.1)
    await gw.stop()
    raise RuntimeError(
        f"{gw.name} not ready in 30 s:\n{gw.log.read_text(errors='replace')[-3000:]}"
    )


# ---------------------------------------------------------------- cases
@dataclass
class Case:
    """One thing to measure: ``op(worker)`` done over and over by ``workers`` tasks."""

    label: str
    workers: int
    op: Op
    gateway: Gateway | None = None  # the process that serves it: its CPU and /metrics
    store: str | None = None  # the store whose server-side write time to report
    setup: Callable[[], Awaitable[None]] | None = None
    teardown: Callable[[], Awaitable[None]] | None = None
    # Instead of ``op``: another process drives the load for given seconds (a tag naming
    # the run) and reports its ops and CPU seconds (``cyclegen_case``)
    external: Callable[[float, str], Awaitable[tuple[int, float]]] | None = None


async def _expect(resp: aiohttp.ClientResponse, status: int) -> bytes:
    body = await resp.read()
    if resp.status != status:
        raise Refused(resp.status, body)
    return body


def http_lock_case(label: str, http: aiohttp.ClientSession, gw: Gateway, workers: int) -> Case:
    """POST /v1/locks/{name}, then DELETE it with the lease id: one cycle."""
    names = ["bench/one"] if workers == 1 else [f"bench/w{i}" for i in range(workers)]
    json_type = {"Content-Type": "application/json"}

    async def op(i: int) -> None:
        url = f"{gw.url}/v1/locks/{names[i]}"
        async with http.post(url, data=LOCK_BODY, headers=json_type) as r:
            lease_id = json.loads(await _expect(r, 200))["lease_id"]
        async with http.delete(url, headers={"X-Lease-Id": lease_id}) as r:
            await _expect(r, 204)

    return Case(label, workers, op, gateway=gw)


def cyclegen_case(label: str, gw: Gateway, workers: int, gen: LoadGen) -> Case:
    """The same cycles driven by ``cyclegen`` (C, one epoll loop: ``benchmarks.loadgen``),
    ``workers`` connections, one cycle in flight on each; no latencies."""
    port = int(gw.url.rsplit(":", 1)[1])

    async def external(seconds: float, tag: str) -> tuple[int, float]:
        out = await asyncio.to_thread(gen.run, port, seconds, tag, connections=workers)
        if out.get("other"):
            raise RuntimeError(f"{label}: cyclegen met unexpected answers: {out}")
        return int(out["released"]), float(out["cpu_s"])

    async def op(i: int) -> None:
        raise NotImplementedError("driven by cyclegen")

    return Case(label, workers, op, gateway=gw, external=external)


def inproc_lock_case(
    label: str, mgr: LockManager, workers: int, *, as_gateway: bool, fresh: bool = False
) -> Case:
    """The same cycle without HTTP; ``as_gateway``: release a handle, as the gateway does.

    A handle's release waits for the nodes' answers; the caller's own ``Lease``
    is released without waiting (it is known to be valid), which is faster.
    ``fresh``: a new name every cycle, ``bench/<tag>/<worker>/<n>``, as ``cyclegen``
    names its cycles (the aiohttp client of ``http_lock_case`` keeps one name per
    worker, as here without ``fresh``): the lock service's per-name caches (a name's
    packed keys) then miss for every cycle, as they do in the gateway under cyclegen.
    """
    names = ["bench/one"] if workers == 1 else [f"bench/w{i}" for i in range(workers)]
    tag = uuid.uuid4().hex[:9]  # as long as cyclegen's tags ("m" and 8 hex digits)
    prefixes = [f"bench/{tag}/{i}/" for i in range(workers)]
    cycles = [0] * workers

    async def op(i: int) -> None:
        if fresh:
            cycles[i] += 1
            name = f"{prefixes[i]}{cycles[i]}"
        else:
            name = names[i]
        lease = await mgr.acquire(name, ttl=10.0, wait=0.0)
        await mgr.release(LockManager.handle(lease.name, lease.lease_id) if as_gateway else lease)

    return Case(label, workers, op)


@dataclass
class Holders:
    """One lock per worker, taken over HTTP before a case and released after it."""

    http: aiohttp.ClientSession
    gw: Gateway
    store: str
    workers: int
    ttl_ms: int
    tokens: list[int] = field(default_factory=list)
    lease_ids: list[str] = field(default_factory=list)

    def name(self, i: int) -> str:
        return f"{self.store}/bench/c{i}"  # the default fence scope of key bench/c{i}

    async def take(self) -> None:
        async def one(i: int) -> tuple[int, str]:
            body = json.dumps({"ttl_ms": self.ttl_ms, "wait_ms": 5000}).encode()
            url = f"{self.gw.url}/v1/locks/{self.name(i)}"
            async with self.http.post(url, data=body) as r:
                got = json.loads(await _expect(r, 200))
            return int(got["token"]), str(got["lease_id"])

        grants = await asyncio.gather(*(one(i) for i in range(self.workers)))
        self.tokens = [t for t, _ in grants]
        self.lease_ids = [lid for _, lid in grants]

    async def release(self) -> None:
        async def one(i: int) -> None:
            url = f"{self.gw.url}/v1/locks/{self.name(i)}"
            async with self.http.delete(url, headers={"X-Lease-Id": self.lease_ids[i]}) as r:
                await _expect(r, 204)

        await asyncio.gather(*(one(i) for i in range(len(self.lease_ids))))


def http_put_case(
    label: str,
    http: aiohttp.ClientSession,
    gw: Gateway,
    store: str,
    body: bytes,
    *,
    fenced: bool,
    ttl_ms: int,
    workers: int = WORKERS,
) -> Case:
    """PUT /v1/stores/{store}/bench/c{i}, each worker with its own lock and token.

    The unfenced store ignores the token; the same header goes out all the same.
    """
    holders = Holders(http, gw, store, workers, ttl_ms) if fenced else None

    async def op(i: int) -> None:
        token = holders.tokens[i] if holders is not None else 1
        headers = {"X-Fencing-Token": str(token), "Content-Type": OCTET}
        async with http.put(
            f"{gw.url}/v1/stores/{store}/bench/c{i}", data=body, headers=headers
        ) as r:
            await _expect(r, 200)

    return Case(
        label,
        workers,
        op,
        gateway=gw,
        store=store,
        setup=holders.take if holders else None,
        teardown=holders.release if holders else None,
    )


def inproc_store_case(label: str, store: FencedStore, body: bytes) -> Case:
    """``store.put`` called in-process, fenced, a token per round (marks only grow)."""
    token = 0

    async def setup() -> None:
        nonlocal token
        token += 1

    async def op(i: int) -> None:
        await store.put(f"{store.name}/bench/c{i}", f"bench/c{i}", token, body, content_type=OCTET)

    return Case(label, WORKERS, op, setup=setup)


def direct_upsert_case(label: str, pool: Any, schema_q: str, body: bytes) -> Case:
    """A plain asyncpg upsert into ``bench_kv``: the adapter's unfenced statement, no gateway."""
    sql = (
        f"INSERT INTO {schema_q}.bench_kv AS kv"
        " (store, key, value, content_type, token, updated_at)"
        " VALUES ($1::text, $2::text, $3::bytea, $4::text, NULL, now())"
        " ON CONFLICT (store, key) DO UPDATE SET value = EXCLUDED.value,"
        " content_type = EXCLUDED.content_type, token = EXCLUDED.token,"
        " updated_at = EXCLUDED.updated_at RETURNING kv.token"
    )

    async def op(i: int) -> None:
        async with pool.acquire(timeout=5.0) as conn:
            await conn.fetchrow(sql, "direct", f"bench/c{i}", body, OCTET)

    return Case(label, WORKERS, op)


async def _keep_session(conn: Any) -> None:
    """A pool ``reset`` that sends nothing: asyncpg still rolls back an open transaction.

    The default reset sends ``SELECT pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *;
    RESET ALL`` on every release, a second round trip per write.
    """


# ---------------------------------------------------------------- measuring
def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _self_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)  # every thread of the load generator
    return ru.ru_utime + ru.ru_stime


def _machine_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all cores, from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    total = sum(fields[:8])  # guest time is already in user
    return total - idle, total


async def server_times(http: aiohttp.ClientSession, gw: Gateway, store: str | None) -> list[float]:
    """[handler seconds, handler count, store write seconds, store write count] so far.

    Handler time is what ``metrics_middleware`` measures (routing to response
    object; not parsing or sending); /metrics and /readyz are left out.
    """
    async with http.get(f"{gw.url}/metrics") as r:
        text = (await _expect(r, 200)).decode()
    out = [0.0, 0.0, 0.0, 0.0]
    for family in text_string_to_metric_families(text):
        if family.name == "fencegate_http_request_duration_seconds":
            for s in family.samples:
                if s.labels.get("route") in ("/metrics", "/readyz"):
                    continue
                if s.name.endswith("_sum"):
                    out[0] += s.value
                elif s.name.endswith("_count"):
                    out[1] += s.value
        elif family.name == "fencegate_storage_write_duration_seconds":
            for s in family.samples:
                if s.labels.get("store") != store:
                    continue
                if s.name.endswith("_sum"):
                    out[2] += s.value
                elif s.name.endswith("_count"):
                    out[3] += s.value
    return out


Hook = Callable[[], Awaitable[None]]


async def run_case(
    case: Case,
    http: aiohttp.ClientSession,
    seconds: float,
    warm_ops: int,
    *,
    window: tuple[Hook, Hook] | None = None,
) -> dict[str, Any]:
    """Warm up, then ``seconds`` of ``case.op`` by every worker; ``window``: hooks around it."""
    loop = asyncio.get_running_loop()
    errors: Counter[str] = Counter()
    lat: list[float] = []

    async def drive(i: int, until: float, limit: int, record: bool) -> int:
        done = failures = 0
        while loop.time() < until and done < limit and failures < MAX_FAILURES:
            t0 = time.perf_counter()
            try:
                await case.op(i)
            except (Refused, aiohttp.ClientError, TimeoutError, OSError) as exc:
                errors[f"{type(exc).__name__}: {exc}"[:120]] += 1
                failures += 1
                continue
            except Exception as exc:  # a lock or storage error in-process: counted as well
                errors[f"{type(exc).__name__}: {exc}"[:120]] += 1
                failures += 1
                continue
            if record:
                lat.append(time.perf_counter() - t0)
            done += 1
        return done

    if case.external is not None:
        return await _run_external(case, case.external, seconds)
    if case.setup is not None:
        await case.setup()
    try:
        warm_until = loop.time() + min(1.0, seconds)
        await asyncio.gather(*(drive(i, warm_until, warm_ops, False) for i in range(case.workers)))
        gw = case.gateway
        srv0 = await server_times(http, gw, case.store) if gw and gw.metrics else None
        gw0 = gw.cpu_seconds() if gw else 0.0
        if window is not None:
            await window[0]()
        me0, (busy0, total0) = _self_cpu(), _machine_ticks()
        start = loop.time()
        end = start + seconds
        counts = await asyncio.gather(*(drive(i, end, MAX_OPS, True) for i in range(case.workers)))
        elapsed = loop.time() - start
        me1, (busy1, total1) = _self_cpu(), _machine_ticks()
        if window is not None:
            await window[1]()
        gw1 = gw.cpu_seconds() if gw else 0.0
        srv1 = await server_times(http, gw, case.store) if gw and gw.metrics else None
    finally:
        if case.teardown is not None:
            await case.teardown()
    ops = sum(counts)
    per_op = 1e6 / ops if ops else float("nan")
    row: dict[str, Any] = {
        "ops_per_s": ops / elapsed,
        "p50_ms": pct(lat, 0.5) * 1e3,
        "p99_ms": pct(lat, 0.99) * 1e3,
        "gw_cpu_us": (gw1 - gw0) * per_op if gw else None,
        "gen_cpu_us": (me1 - me0) * per_op,
        "busy": (busy1 - busy0) / max(total1 - total0, 1),
        "srv_ms": None,
        "store_ms": None,
        "errors": sum(errors.values()),
        "ops": ops,
    }
    if srv0 is not None and srv1 is not None:
        d = [b - a for a, b in zip(srv0, srv1, strict=True)]
        row["srv_ms"] = d[0] / ops * 1e3 if ops else None  # per op (a lock cycle is 2 requests)
        row["store_ms"] = d[2] / d[3] * 1e3 if d[3] else None
    if errors:
        row["error_kinds"] = dict(errors.most_common(5))
    return row


async def _run_external(
    case: Case, external: Callable[[float, str], Awaitable[tuple[int, float]]], seconds: float
) -> dict[str, Any]:
    """A case another process drives: a second of warm-up, then ``seconds`` measured."""
    tag = uuid.uuid4().hex[:8]
    await external(min(1.0, seconds), f"w{tag}")
    gw = case.gateway
    gw0 = gw.cpu_seconds() if gw else 0.0
    busy0, total0 = _machine_ticks()
    start = time.perf_counter()
    ops, gen_cpu = await external(seconds, f"m{tag}")
    elapsed = time.perf_counter() - start
    busy1, total1 = _machine_ticks()
    gw1 = gw.cpu_seconds() if gw else 0.0
    per_op = 1e6 / ops if ops else float("nan")
    return {
        "ops_per_s": ops / elapsed,
        "p50_ms": None,  # cyclegen reports no latencies
        "p99_ms": None,
        "gw_cpu_us": (gw1 - gw0) * per_op if gw else None,
        "gen_cpu_us": gen_cpu * per_op,
        "busy": (busy1 - busy0) / max(total1 - total0, 1),
        "srv_ms": None,
        "store_ms": None,
        "errors": 0,
        "ops": ops,
    }


# ---------------------------------------------------------------- profile
def _group(file: str, func: str) -> str:
    """Where a profiled function belongs, roughly; the first match wins."""
    path = file.replace("\\", "/")
    if path == "~":  # a C function: its name says whose it is
        if "_json" in func:
            return "JSON"
        if "asyncpg" in func:
            return "asyncpg"
        if any(s in func for s in ("aiohttp", "multidict", "yarl", "propcache", "_http_")):
            return "aiohttp request handling"
        if any(s in func for s in ("hiredis", "redis")):
            return "lock service + redis client"
        if any(s in func for s in ("uvloop", "_asyncio", "_contextvars")):
            return "asyncio / uvloop"
        if any(s in func for s in ("strftime", "time.localtime", "posix.write")):
            return "logging (aiohttp access log, log records)"  # access-log formatting
        return "other C built-ins"
    if path.endswith("gateway/routes.py") and func == "_fence":
        return "lock guard + issued cache"
    rules = (
        ("logging (aiohttp access log, log records)", ("/logging/", "aiohttp/web_log.py")),
        ("JSON", ("/json/",)),
        ("gateway guard (metrics, errors, auth, drain)", ("gateway/guard.py", "gateway/cuts.py")),
        ("lock guard + issued cache", ("gateway/state.py",)),
        ("gateway routes (parse, validate, shape)", ("gateway/routes.py", "gateway/errors.py")),
        ("prometheus metrics", ("prometheus_client/", "gateway/metrics.py")),
        ("lock service + redis client", ("lockservice/", "/redis/")),
        ("storage adapter", ("storage_adapters/",)),
        ("asyncpg", ("asyncpg/",)),
        ("aiohttp request handling", ("aiohttp/", "multidict/", "yarl/", "propcache/")),
        ("asyncio / uvloop", ("asyncio/", "uvloop/", "contextlib.py")),
    )
    for label, needles in rules:
        if any(n in path for n in needles):
            return label
    return "other Python"


def _where(file: str, line: int, func: str) -> str:
    if file == "~":
        return func
    for marker in ("site-packages/", "/lib/python3.11/", f"{ROOT}/"):
        if marker in file:
            file = file.split(marker, 1)[1]
            break
    return f"{file}:{line}({func})"


def summarize_profile(path: Path, ops: int, top: int = 15) -> dict[str, Any]:
    """Self time summed by group (self times add up; cumulative ones do not), and top lists."""
    stats = pstats.Stats(str(path))
    raw: dict[tuple[str, int, str], tuple[int, int, float, float, Any]]
    raw = stats.stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in raw.values())
    groups: dict[str, float] = {}
    for (file, _line, func), (_cc, _nc, tt, _ct, _callers) in raw.items():
        group = _group(file, func)
        groups[group] = groups.get(group, 0.0) + tt
    per_op = 1e6 / max(ops, 1)

    def rows(key: int) -> list[dict[str, Any]]:
        ordered = sorted(raw.items(), key=lambda kv: kv[1][key], reverse=True)[:top]
        return [
            {
                "function": _where(*k),
                "calls": v[1],
                "tottime_s": round(v[2], 4),
                "cumtime_s": round(v[3], 4),
                "group": _group(k[0], k[2]),
            }
            for k, v in ordered
        ]

    return {
        "total_s": total,
        "ops": ops,
        "groups": {
            g: {"self_s": round(t, 4), "share": t / total, "us_per_op": t * per_op}
            for g, t in sorted(groups.items(), key=lambda kv: kv[1], reverse=True)
        },
        "top_total": rows(2),
        "top_cumulative": rows(3),
    }


async def profile_gateway(
    http: aiohttp.ClientSession,
    workdir: Path,
    redis: list[str],
    stores: Mapping[str, Mapping[str, object]],
    body: bytes,
    seconds: float,
) -> dict[str, Any]:
    """One gateway process; cProfile on during each load window only (SIGUSR1 .. SIGUSR2)."""
    prof = workdir / "gateway.prof"
    gw = await start_gateway(http, workdir, "profiled", redis, stores, profile=prof)
    windows = 0

    async def begin() -> None:
        gw.proc.send_signal(signal.SIGUSR1)
        await asyncio.sleep(0.05)  # the handler runs on the gateway's next loop turn

    async def end() -> None:
        nonlocal windows
        windows += 1
        gw.proc.send_signal(signal.SIGUSR2)
        written = Path(f"{prof}.{windows}")
        for _ in range(1200):  # up to a minute for the profile to be written
            if await asyncio.to_thread(written.exists):
                return
            await asyncio.sleep(0.05)

    cases = {
        "put": http_put_case(
            "fenced PUT to PostgreSQL", http, gw, "pg", body,
            fenced=True, ttl_ms=int((seconds + 60) * 1000),
        ),
        "locks": http_lock_case("lock cycle (POST + DELETE)", http, gw, WORKERS),
    }  # fmt: skip
    out: dict[str, Any] = {}
    try:
        for key, case in cases.items():
            row = await run_case(case, http, seconds, warm_ops=5, window=(begin, end))
            print(f"profile {key:5} {json.dumps(_rounded(row))}", flush=True)
            path = Path(f"{prof}.{windows}")
            if not await asyncio.to_thread(path.exists):
                raise RuntimeError(f"the profiled gateway wrote no profile for {key}")
            ops = round(row["ops_per_s"] * seconds)
            out[key] = {"label": case.label, "load": row, **summarize_profile(path, ops)}
    finally:
        await gw.stop()
    return out


# ---------------------------------------------------------------- driver
def _rounded(row: Mapping[str, Any]) -> dict[str, Any]:
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}


def combine(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each metric over the rounds; errors are summed."""
    out: dict[str, Any] = {}
    for metric in rows[0]:
        if metric == "error_kinds":
            continue
        values = [r[metric] for r in rows if r.get(metric) is not None]
        if metric == "errors":
            out[metric] = sum(values)
        else:
            out[metric] = statistics.median(values) if values else None
    kinds: Counter[str] = Counter()
    for r in rows:
        kinds.update(r.get("error_kinds", {}))
    if kinds:
        out["error_kinds"] = dict(kinds.most_common(5))
    out["ops_per_s_rounds"] = [round(r["ops_per_s"], 1) for r in rows]
    return out


# (key, group, case A, case B, target, metric). For ops_per_s the ratio is A / B; for a CPU
# cost per op (gw_cpu_us, gen_cpu_us) it is B / A, so that on both, above 1 means A is better:
# the CPU ratio is the throughput ratio a CPU-bound process would show, and it is much less
# disturbed than throughput by the disk (PostgreSQL's WAL fsync) and by neighbours.
RATIOS: Final = (
    ("locks_http_over_inproc_1", "locks/one_client", "HTTP (gateway process)",
     "in-process, the gateway's calls", None, "ops_per_s"),
    ("locks_http_over_inproc_32", "locks/32_clients", "HTTP (gateway process)",
     "in-process, the gateway's calls", None, "ops_per_s"),
    ("pg_fenced_over_unfenced", "put/postgres", "HTTP fenced", "HTTP fencing = none", 0.85,
     "ops_per_s"),
    ("pg_fenced_over_unfenced_by_gateway_cpu", "put/postgres", "HTTP fenced",
     "HTTP fencing = none", 0.85, "gw_cpu_us"),
    ("pg_fenced_over_direct_asyncpg", "put/postgres", "HTTP fenced", "direct asyncpg upsert",
     None, "ops_per_s"),
    ("pg_fenced_http_over_inproc_adapter", "put/postgres", "HTTP fenced",
     "in-process adapter, fenced", None, "ops_per_s"),
    ("pg_inproc_adapter_over_direct_asyncpg", "put/postgres", "in-process adapter, fenced",
     "direct asyncpg upsert", None, "ops_per_s"),
    ("pg_no_access_log_over_fenced", "put/postgres", "HTTP fenced, --log-level warning",
     "HTTP fenced", None, "ops_per_s"),
    ("pg_no_access_log_over_fenced_by_gateway_cpu", "put/postgres",
     "HTTP fenced, --log-level warning", "HTTP fenced", None, "gw_cpu_us"),
    ("pg_direct_no_reset_over_direct", "put/postgres", "direct asyncpg upsert, pool reset = no-op",
     "direct asyncpg upsert", None, "ops_per_s"),
    ("pg_direct_no_reset_over_direct_by_client_cpu", "put/postgres",
     "direct asyncpg upsert, pool reset = no-op", "direct asyncpg upsert", None, "gen_cpu_us"),
    ("files_fenced_over_unfenced", "put/files", "HTTP fenced", "HTTP fencing = none", 0.85,
     "ops_per_s"),
    ("files_fenced_over_unfenced_by_gateway_cpu", "put/files", "HTTP fenced",
     "HTTP fencing = none", 0.85, "gw_cpu_us"),
    ("files_fenced_http_over_inproc_adapter", "put/files", "HTTP fenced",
     "in-process adapter, fenced", None, "ops_per_s"),
)  # fmt: skip


def ratios(per_round: list[dict[str, dict[str, dict[str, Any]]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, group, a, b, target, metric in RATIOS:
        values = []
        for r in per_round:
            rows = r.get(group, {})
            x = rows.get(a, {}).get(metric)
            y = rows.get(b, {}).get(metric)
            if x and y:
                values.append(x / y if metric == "ops_per_s" else y / x)
        if not values:
            continue
        med = statistics.median(values)
        out[key] = {
            "a": f"{group}: {a}",
            "b": f"{group}: {b}",
            "metric": metric,
            "median": med,
            "min": min(values),
            "max": max(values),
            "target": target,
            "ok": None if target is None else med >= target,
        }
    return out


BARE_CASE: Final = "bare aiohttp app (no fencegate code)"
HTTP_CASE: Final = "HTTP (gateway process)"
HTTP_LEAN_CASE: Final = "HTTP (gateway process), driven by cyclegen"
BARE_LEAN_CASE: Final = "bare aiohttp app, driven by cyclegen"
INPROC_CASE: Final = "in-process, the gateway's calls"
INPROC_FRESH_CASE: Final = "in-process, the gateway's calls, a new name each cycle"
OVERHEAD_TARGET: Final = 1.2


def http_overhead(per_round: list[dict[str, dict[str, dict[str, Any]]]]) -> dict[str, Any]:
    """Gateway CPU per cycle / (bare aiohttp app's CPU + in-process LockManager CPU), per round.

    The denominator is the floor of the HTTP path: what aiohttp alone costs to serve the two
    requests, plus what the lock service's calls cost without HTTP (the load generator's CPU
    in the in-process case, which does nothing else). Redis's CPU is in neither side. The
    in-process calls are the ones each load generator makes the gateway make: on a new
    name every cycle for cyclegen, on one name per client for the aiohttp client.
    """
    out: dict[str, Any] = {}
    drivers = (
        ("cyclegen", HTTP_LEAN_CASE, BARE_LEAN_CASE, INPROC_FRESH_CASE),
        ("aiohttp", HTTP_CASE, BARE_CASE, INPROC_CASE),
    )
    for (driver, http_case, bare_case, inproc_case), group in itertools.product(
        drivers, ("locks/one_client", "locks/32_clients")
    ):
        values, parts = [], []
        for r in per_round:
            rows = r.get(group, {})
            gw = rows.get(http_case, {}).get("gw_cpu_us")
            bare = rows.get(bare_case, {}).get("gw_cpu_us")
            inproc = rows.get(inproc_case, {}).get("gen_cpu_us")
            if gw and bare and inproc:
                values.append(gw / (bare + inproc))
                parts.append((gw, bare, inproc))
        if not values:
            continue
        med = statistics.median(values)
        out[f"{group}, {driver}"] = {
            "group": group,
            "driver": driver,
            "median": med,
            "min": min(values),
            "max": max(values),
            "gateway_cpu_us": statistics.median(p[0] for p in parts),
            "bare_cpu_us": statistics.median(p[1] for p in parts),
            "lockmanager_cpu_us": statistics.median(p[2] for p in parts),
            "target": OVERHEAD_TARGET,
            "ok": med <= OVERHEAD_TARGET,
        }
    return out


async def main(args: argparse.Namespace) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="fencegate-gwbench-"))
    nodes = [RedisNode(workdir / f"redis{i}") for i in range(3)]
    schema = f"fg_bench_{uuid.uuid4().hex[:10]}"
    schema_q = f'"{schema}"'
    body = bytes(i % 251 for i in range(args.body_bytes))
    machine = (
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        "uvloop in both processes"
    )
    results: dict[str, Any] = {
        "machine": machine,
        "seconds_per_case": args.seconds,
        "rounds": args.rounds,
        "workers": WORKERS,
        "pool_max": POOL,
        "body_bytes": args.body_bytes,
        "postgres": redact(PG_DSN),
    }
    gateways: list[Gateway] = []
    closers: list[Callable[[], Awaitable[Any]]] = []
    conn = await asyncpg.connect(PG_DSN)
    try:
        await conn.execute(f"CREATE SCHEMA {schema_q}")
        await conn.execute(
            f"CREATE TABLE {schema_q}.bench_kv (store text NOT NULL, key text NOT NULL,"
            " value bytea NOT NULL, content_type text NOT NULL, token bigint,"
            " updated_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (store, key))"
        )  # the same columns and key as the adapter's fencegate_kv
        for node in nodes:
            node.start()
        redis = [n.url for n in nodes]
        pg: dict[str, object] = {
            "type": "postgres", "dsn": PG_DSN, "schema": schema, "pool_max": POOL
        }  # fmt: skip
        stores: dict[str, dict[str, object]] = {
            "pg": pg,
            "pg_nf": {**pg, "fencing": "none"},
            "files": {"type": "files", "root": str(workdir / "files")},
            "files_nf": {"type": "files", "root": str(workdir / "files-nf"), "fencing": "none"},
        }
        connector = aiohttp.TCPConnector(limit=2 * WORKERS, limit_per_host=2 * WORKERS)
        http = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=15))
        closers.append(http.close)
        gw = await start_gateway(http, workdir, "main", redis, stores)
        gateways.append(gw)
        quiet = await start_gateway(http, workdir, "quiet", redis, {"pgq": pg}, log_level="warning")
        gateways.append(quiet)
        bare = await start_bare(http, workdir)
        gateways.append(bare)
        mgr = await LockManager.connect(redis)
        closers.append(mgr.close)
        pg_store = PostgresStore("inproc", PG_DSN, schema=schema, pool_max=POOL)
        await pg_store.start()
        closers.append(pg_store.close)
        file_store = FileStore("inproc", workdir / "files-inproc")
        await file_store.start()
        closers.append(file_store.close)
        pool = await asyncpg.create_pool(PG_DSN, min_size=1, max_size=POOL)
        closers.append(pool.close)
        lean = await asyncpg.create_pool(PG_DSN, min_size=1, max_size=POOL, reset=_keep_session)
        closers.append(lean.close)

        ttl_ms = min(300_000, int((args.seconds + 60) * 1000))
        gen = prepare("cyclegen", workdir)
        groups: dict[str, list[Case]] = {}
        for workers, key in ((1, "locks/one_client"), (WORKERS, "locks/32_clients")):
            groups[key] = [
                http_lock_case("HTTP (gateway process)", http, gw, workers),
                inproc_lock_case(INPROC_CASE, mgr, workers, as_gateway=True),
                inproc_lock_case(INPROC_FRESH_CASE, mgr, workers, as_gateway=True, fresh=True),
                inproc_lock_case("in-process, own Lease (release not awaited)", mgr, workers,
                                 as_gateway=False),
                http_lock_case(BARE_CASE, http, bare, workers),
                cyclegen_case(HTTP_LEAN_CASE, gw, workers, gen),
                cyclegen_case(BARE_LEAN_CASE, bare, workers, gen),
            ]  # fmt: skip
        groups["put/postgres"] = [
            http_put_case("HTTP fenced", http, gw, "pg", body, fenced=True, ttl_ms=ttl_ms),
            http_put_case("HTTP fencing = none", http, gw, "pg_nf", body, fenced=False,
                          ttl_ms=ttl_ms),
            http_put_case("HTTP fenced, --log-level warning", http, quiet, "pgq", body,
                          fenced=True, ttl_ms=ttl_ms),
            inproc_store_case("in-process adapter, fenced", pg_store, body),
            direct_upsert_case("direct asyncpg upsert", pool, schema_q, body),
            direct_upsert_case("direct asyncpg upsert, pool reset = no-op", lean, schema_q, body),
        ]  # fmt: skip
        groups["put/files"] = [
            http_put_case("HTTP fenced", http, gw, "files", body, fenced=True, ttl_ms=ttl_ms),
            http_put_case("HTTP fencing = none", http, gw, "files_nf", body, fenced=False,
                          ttl_ms=ttl_ms),
            inproc_store_case("in-process adapter, fenced", file_store, body),
        ]  # fmt: skip

        if args.only:
            groups = {k: v for k, v in groups.items() if k in args.only}
        per_round: list[dict[str, dict[str, dict[str, Any]]]] = []
        for rnd in range(args.rounds):
            this: dict[str, dict[str, dict[str, Any]]] = {}
            for key, cases in groups.items():
                this[key] = {}
                for case in cases if rnd % 2 == 0 else list(reversed(cases)):
                    row = await run_case(case, http, args.seconds, args.warm_ops)
                    this[key][case.label] = row
                    print(f"round {rnd + 1} {key:17} {case.label:44} "
                          f"{json.dumps(_rounded(row))}", flush=True)  # fmt: skip
            per_round.append(this)
        for key, cases in groups.items():
            results[key] = {c.label: combine([r[key][c.label] for r in per_round]) for c in cases}
        results["ratios"] = ratios(per_round)
        results["http_overhead"] = http_overhead(per_round)
        results["per_round"] = per_round

        for g in gateways:
            await g.stop()
        if args.profile_seconds > 0:
            results["profile"] = await profile_gateway(
                http, workdir, redis, {"pg": pg}, body, args.profile_seconds
            )
    finally:
        for g in gateways:
            await g.stop()
        for close in reversed(closers):
            with contextlib.suppress(Exception):
                await close()
        for node in nodes:
            node.stop()
        with contextlib.suppress(Exception):
            await conn.execute(f"DROP SCHEMA IF EXISTS {schema_q} CASCADE")
        await conn.close()
        shutil.rmtree(workdir, ignore_errors=True)
    write_report(results, args)


# ---------------------------------------------------------------- report
COLUMNS: Final = (
    ("ops_per_s", "ops/s"),
    ("p50_ms", "p50 ms"),
    ("p99_ms", "p99 ms"),
    ("gw_cpu_us", "gateway CPU µs/op"),
    ("gen_cpu_us", "load-gen CPU µs/op"),
    ("busy", "machine busy"),
    ("srv_ms", "handler ms/op"),
    ("store_ms", "store write ms"),
    ("errors", "errors"),
)
NOTES: Final = {
    "locks/one_client": "One client, sequential: an op is an acquire and a release (HTTP: "
    "POST then DELETE) of one name.",
    "locks/32_clients": "32 concurrent clients, each its own name (HTTP: pooled keep-alive "
    "connections).",
    "put/postgres": f"{WORKERS} concurrent clients, each holding its own lock and writing its "
    "own key with its token; PostgreSQL pools of the same size everywhere.",
    "put/files": f"{WORKERS} concurrent clients as above, to a files store (temp file, fsync, "
    "rename, fsync of the folder, metadata the same way).",
}


def write_report(results: dict[str, Any], args: argparse.Namespace) -> None:
    suffix = "-quick" if args.quick else ""
    write_json(f"gateway{suffix}", results)
    lines = [
        "# Gateway benchmark",
        "",
        f"Run: `{command()}` on {results['machine']}, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {args.seconds:g} s a case, "
        f"{args.rounds} round(s) in alternating order (each cell is the median over the "
        f"rounds), {args.body_bytes}-byte bodies. One run, the same servers: 3 redis-server "
        f"nodes, PostgreSQL at `{results['postgres']}` (a schema of the run's own), a temp "
        "folder. The gateway is a separate process (`python -m gateway serve`, default "
        "`--log-level info`); the load generator uses one pooled aiohttp session.",
        "",
        "Columns: gateway CPU and load-gen CPU are CPU seconds of that process per op; machine "
        "busy is the share of all cores in use; handler ms/op is the gateway's own "
        "`fencegate_http_request_duration_seconds` (guard to response object) per op; "
        "store write ms is `fencegate_storage_write_duration_seconds` per write.",
        "",
    ]
    for key, note in NOTES.items():
        table = results.get(key)
        if not table:
            continue
        lines += [f"## {key}", "", note, ""]
        lines += md_table("case", COLUMNS, table)
        ceilings = [
            f"{label}: {1e6 / row['gw_cpu_us']:.0f} ops/s"
            for label, row in table.items()
            if row.get("gw_cpu_us")
        ]
        if ceilings:
            lines += ["", "One gateway process saturates one core (1 / gateway CPU per op) at "
                      + "; ".join(ceilings) + "."]  # fmt: skip
        if key.startswith("locks/"):
            http_row = table.get("HTTP (gateway process)", {})
            base = table.get("in-process, the gateway's calls", {})
            if http_row.get("ops_per_s") and base.get("ops_per_s"):
                extra = 1e6 / http_row["ops_per_s"] - 1e6 / base["ops_per_s"]
                lines += ["", f"HTTP adds {extra:.0f} µs of wall time per cycle "
                          "(1/rate, HTTP minus in-process)."]  # fmt: skip
        lines.append("")
    if results.get("ratios"):
        lines += [
            "## Ratios (median of the per-round ratios of cases run side by side, min..max)",
            "",
            "By ops/s: A / B. By CPU per op (`_by_..._cpu`): B's CPU / A's CPU, the "
            "throughput ratio if that process were the bottleneck; steadier than throughput "
            "on this machine, whose disk (WAL fsync) and neighbours swing PostgreSQL rates "
            "by up to 2x from one case to the next.",
            "",
            "| ratio | by | median | range | target |",
            "| --- | --- | --- | --- | --- |",
        ]
        for key, r in results["ratios"].items():
            target = "-"
            if r["target"] is not None:
                target = f">= {r['target']:.2f}: **{'met' if r['ok'] else 'MISSED'}**"
            lines.append(
                f"| {key} | {r['metric']} | **{r['median']:.2f}x** | "
                f"{r['min']:.2f}..{r['max']:.2f} | {target} |"
            )
        lines.append("")
    if results.get("http_overhead"):
        lines += [
            "## HTTP path overhead",
            "",
            "Gateway CPU per acquire + release cycle / (the bare aiohttp app's CPU per cycle + "
            "the in-process LockManager cycle's CPU): 1.0 would be an HTTP path that costs "
            "nothing beyond aiohttp itself and the lock service. Medians of per-round "
            "ratios, min..max; CPU columns are medians over the rounds. Two load generators "
            "drive the gateway and the bare app: `cyclegen` (C, one epoll loop, some 20 µs of "
            "CPU per cycle: `benchmarks/loadgen.py`) and this process's aiohttp client "
            "(200-400 µs per cycle, more than either server, on the same two cores). "
            "The LockManager column is the in-process cycle on the names that load generator "
            "makes the gateway lock: a new name every cycle for cyclegen (the in-process case "
            '"a new name each cycle"), one name per client for the aiohttp client.',
            "",
            "| clients | load generator | gateway µs | bare aiohttp µs | LockManager µs | ratio "
            "| range | target |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for o in results["http_overhead"].values():
            verdict = "met" if o["ok"] else "MISSED"
            lines.append(
                f"| {o['group']} | {o['driver']} | {o['gateway_cpu_us']:.0f} | "
                f"{o['bare_cpu_us']:.0f} | "
                f"{o['lockmanager_cpu_us']:.0f} | **{o['median']:.2f}x** | "
                f"{o['min']:.2f}..{o['max']:.2f} | <= {o['target']:g}: **{verdict}** |"
            )
        lines.append("")
    prof = results.get("profile")
    if prof:
        lines += _profile_lines(prof, args)
    save(f"gateway{suffix}", lines)


def _profile_lines(prof: Mapping[str, Any], args: argparse.Namespace) -> list[str]:
    put, locks = prof.get("put"), prof.get("locks")
    loads = ", ".join(
        f"{p['label']}: {p['load']['ops_per_s']:.0f} ops/s ({p['ops']} ops, "
        f"{p['total_s']:.2f} s of profiled self time)"
        for p in (put, locks)
        if p
    )
    lines = [
        "## Where the time goes: the gateway under cProfile",
        "",
        f"One more gateway process, cProfile switched on for each {args.profile_seconds:g} s "
        f"load window only ({WORKERS} clients; no start-up or warm-up in it): {loads}. "
        "Self time of every function, summed by group (self times add up). cProfile makes "
        "Python calls dearer than they are, and does not see inside uvloop's or asyncpg's "
        "Cython methods: socket writes count in the aiohttp function that calls "
        "`transport.write`, protocol work in the asyncpg method that calls it. "
        "An op is one PUT, or one lock cycle (2 requests). Calls of a coroutine count "
        "each time it resumes.",
        "",
        "| group | PUT: µs/op | PUT: share | lock cycle: µs/op | lock cycle: share |",
        "| --- | --- | --- | --- | --- |",
    ]
    names = list((put or locks or {"groups": {}})["groups"])
    for extra in (locks or {"groups": {}})["groups"]:
        if extra not in names:
            names.append(extra)
    for name in names:
        cells = []
        for p in (put, locks):
            g = p["groups"].get(name) if p else None
            cells += ["-", "-"] if g is None else [f"{g['us_per_op']:.0f}", f"{g['share']:.1%}"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    tops = (
        (put, "top_cumulative", "fenced PUT, top functions by cumulative time"),
        (put, "top_total", "fenced PUT, top functions by self time"),
        (locks, "top_total", "lock cycle, top functions by self time"),
    )
    for p, key, title in tops:
        if not p:
            continue
        lines += ["", f"{title}:", ""]
        lines += [
            "| function | calls | self s | cum s | group |",
            "| --- | --- | --- | --- | --- |",
        ]
        for f in p[key]:
            lines.append(
                f"| `{f['function']}` | {f['calls']} | {f['tottime_s']:.3f} | "
                f"{f['cumtime_s']:.3f} | {f['group']} |"
            )
    lines.append("")
    return lines


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 s a case, 2 rounds, 2 s profile")
    parser.add_argument("--seconds", type=float, default=2.0, help="measured seconds a case")
    parser.add_argument("--rounds", type=int, default=5, help="rounds, alternating the order")
    parser.add_argument("--warm-ops", type=int, default=10, help="warm-up ops per client")
    parser.add_argument("--body-bytes", type=int, default=256)
    parser.add_argument("--profile-seconds", type=float, help="0: no profile (default 5)")
    parser.add_argument("--only", nargs="*", help="groups to run, e.g. locks/one_client")
    ns = parser.parse_args()
    if ns.quick:
        ns.seconds, ns.rounds, ns.warm_ops = 1.0, 2, 5
    if ns.profile_seconds is None:
        ns.profile_seconds = 2.0 if ns.quick else 5.0
    uvloop.run(main(ns))
