"""Lock throughput, latency and fairness: fencegate against raw Redis and the peers.

Every number comes from one run, against the same redis-server processes, on
the same event loop (uvloop), and is reported next to ratios against the
baselines of that run: raw redis.asyncio SET NX PX + DEL (the ceiling), the
redis-py ``Lock`` (one node), and the Redlock peers pottery (``AIORedlock``)
and aioredlock (install them with ``pip install -e .[bench]``).

    .venv/bin/python -m benchmarks.locks            # full run (several minutes)
    .venv/bin/python -m benchmarks.locks --quick    # a short smoke run
    .venv/bin/python -m benchmarks.locks --rtt-ms 0.5   # contention over an emulated LAN

Shared locks (``kinds/3node``): a shared acquire+release cycle of one client,
and readers holding a shared lease in a loop while one writer takes the lock.

Results: printed, and written to benchmarks/results/locks.md and locks.json.

``--rtt-ms R`` runs the contention scenario only (fencegate, aioredlock, pottery;
8 workers, 1 ms hold), through ``benchmarks.delay_proxy`` in front of each node
(R/2 each way, pinned to the last core with taskset), in alternating rounds;
it reports the proxy's own CPU and the PING round trip through it, and writes
locks-rtt.md and locks-rtt.json.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import math
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis.asyncio as aredis
import uvloop

from benchmarks._report import command
from benchmarks.gateway import proc_cpu
from lockservice import LockManager
from tests._servers import RedisNode, free_port

RESULTS = Path(__file__).resolve().parent / "results"

Acquire = Callable[[str], Awaitable[Any]]
Release = Callable[[Any], Awaitable[None]]


@dataclass
class Client:
    """One contender's acquire/release pair, plus how to tear it down."""

    acquire: Acquire
    release: Release
    close: Callable[[], Awaitable[None]] = field(default=lambda: asyncio.sleep(0))


# ---------------------------------------------------------------- clients
async def fencegate_client(urls: list[str]) -> Client:
    mgr = await LockManager.connect(urls)
    return Client(lambda n: mgr.acquire(n, ttl=10.0, wait=10.0), mgr.release, mgr.close)


async def raw_client(urls: list[str]) -> Client:
    """SET NX PX on every node at once, then DEL on every node: no token, no safety."""
    conns = [aredis.Redis.from_url(u) for u in urls]

    async def acquire(name: str) -> str:
        while True:
            got = await asyncio.gather(*(c.set(name, "x", nx=True, px=10_000) for c in conns))
            if sum(bool(g) for g in got) > len(conns) // 2:
                return name
            await asyncio.gather(*(c.delete(name) for c in conns))
            await asyncio.sleep(0.001)

    async def release(name: str) -> None:
        await asyncio.gather(*(c.delete(name) for c in conns))

    async def close() -> None:
        for c in conns:
            await c.aclose()

    return Client(acquire, release, close)


async def raw_pipelined_client(urls: list[str]) -> Client:
    """SET NX PX and DEL sent as one pipeline per node: one round trip a cycle (ceiling)."""
    conns = [aredis.Redis.from_url(u) for u in urls]
    pending: dict[str, Any] = {}

    async def acquire(name: str) -> str:
        pending[name] = name
        return name

    async def release(name: str) -> None:
        async def one(c: aredis.Redis) -> None:
            pipe = c.pipeline(transaction=False)
            pipe.set(name, "x", nx=True, px=10_000)
            pipe.delete(name)
            await pipe.execute()

        await asyncio.gather(*(one(c) for c in conns))

    async def close() -> None:
        for c in conns:
            await c.aclose()

    return Client(acquire, release, close)


async def redis_py_lock_client(urls: list[str]) -> Client:
    conn = aredis.Redis.from_url(urls[0])

    async def acquire(name: str) -> Any:
        lock = conn.lock(name, timeout=10.0, sleep=0.1, blocking_timeout=10.0)
        await lock.acquire()
        return lock

    async def release(lock: Any) -> None:
        await lock.release()

    return Client(acquire, release, conn.aclose)


async def pottery_client(urls: list[str]) -> Client:
    from pottery import AIORedlock

    conns = [aredis.Redis.from_url(u) for u in urls]

    async def acquire(name: str) -> Any:
        lock = AIORedlock(key=name, masters=conns, auto_release_time=10.0)
        if not await lock.acquire(blocking=True, timeout=10.0):
            raise TimeoutError("pottery did not get the lock")
        return lock

    async def release(lock: Any) -> None:
        await lock.release()

    async def close() -> None:
        for c in conns:
            await c.aclose()

    return Client(acquire, release, close)


async def aioredlock_client(urls: list[str]) -> Client:
    from aioredlock import Aioredlock, LockError

    hosts = [{"host": "127.0.0.1", "port": int(u.rsplit(":", 1)[1].split("/")[0])} for u in urls]
    mgr = Aioredlock(hosts, retry_count=1000, retry_delay_min=0.1, retry_delay_max=0.3)

    async def acquire(name: str) -> Any:
        # Its own retry loop, as its users call it. A try that misses a majority keeps
        # (and, retrying, renews) the nodes it got: three workers holding one node each
        # wait for each other until their lock() calls end (aioredlock 0.7.3,
        # algorithm.py _set_lock and redis.py SET_LOCK_SCRIPT); the README says so.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10.0  # the wait every library gets
        while loop.time() < deadline:
            try:  # one lock() call retries up to retry_count times: bound it too
                return await asyncio.wait_for(mgr.lock(name, lock_timeout=10),
                                              deadline - loop.time())  # fmt: skip
            except LockError:
                continue
        raise TimeoutError("aioredlock did not get the lock in 10 s")

    async def release(lock: Any) -> None:
        await mgr.unlock(lock)

    return Client(acquire, release, mgr.destroy)


LIBRARIES: dict[str, Callable[[list[str]], Awaitable[Client]]] = {
    "raw SET NX PX + DEL": raw_client,
    "raw pipelined (ceiling)": raw_pipelined_client,
    "redis-py Lock": redis_py_lock_client,
    "pottery AIORedlock": pottery_client,
    "aioredlock": aioredlock_client,
    "fencegate": fencegate_client,
}
PEERS = ("redis-py Lock", "pottery AIORedlock", "aioredlock")


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# ---------------------------------------------------------------- scenarios
async def one_client(make: Callable[[list[str]], Awaitable[Client]], urls: list[str],
                     seconds: float) -> dict[str, float]:  # fmt: skip
    client = await make(urls)
    lat: list[float] = []
    try:
        for _ in range(50):  # warm up
            await client.release(await client.acquire("bench:one"))
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        start = loop.time()
        cycles = errors = 0
        while loop.time() < end and cycles < 200_000 and errors < 100:
            t0 = time.perf_counter()
            try:
                handle = await client.acquire("bench:one")
                lat.append(time.perf_counter() - t0)
                await client.release(handle)
            except Exception:  # e.g. no quorum when a stalled loop outlasts node_timeout
                errors += 1
                continue
            cycles += 1
        elapsed = loop.time() - start
    finally:
        await client.close()
    return {"cycles_per_s": cycles / elapsed, "p50_ms": pct(lat, 0.5) * 1e3,
            "p99_ms": pct(lat, 0.99) * 1e3, "errors": errors}  # fmt: skip


async def many_workers(make: Callable[[list[str]], Awaitable[Client]], urls: list[str],
                       seconds: float, workers: int = 32) -> dict[str, float]:  # fmt: skip
    client = await make(urls)
    loop = asyncio.get_running_loop()
    cycles = errors = 0
    try:
        end = loop.time() + seconds

        async def worker(i: int) -> None:
            nonlocal cycles, errors
            name = f"bench:w{i}"
            n = failed = 0
            while loop.time() < end and n < 100_000 and failed < 100:
                try:
                    await client.release(await client.acquire(name))
                except Exception:  # e.g. no quorum when a stalled loop outlasts node_timeout
                    errors += 1
                    failed += 1
                    continue
                cycles += 1
                n += 1

        start = loop.time()
        await asyncio.gather(*(worker(i) for i in range(workers)))
        elapsed = loop.time() - start
    finally:
        await client.close()
    return {"cycles_per_s": cycles / elapsed, "errors": errors}


class CommandCounter:
    """MONITOR on one node: counts the commands clients send, not those scripts run."""

    def __init__(self, node: RedisNode) -> None:
        self.node = node
        self.count = 0
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> CommandCounter:
        reader, self._writer = await asyncio.open_connection("127.0.0.1", self.node.port)
        self._writer.write(b"MONITOR\r\n")
        await reader.readline()  # +OK

        async def read() -> None:
            while line := await reader.readline():
                if b" lua] " not in line and b'"MONITOR"' not in line:
                    self.count += 1

        self._task = asyncio.create_task(read())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.sleep(0.05)
        self._writer.close()
        assert self._task is not None
        await asyncio.gather(self._task, return_exceptions=True)


async def contention(make: Callable[[list[str]], Awaitable[Client]], urls: list[str],
                     nodes: list[RedisNode], seconds: float, workers: int = 8,
                     hold: float = 0.001, count: bool = False) -> dict[str, float]:  # fmt: skip
    """Each worker has its own client (as separate processes would) on one name.

    ``count``: also count the commands clients send (``CommandCounter``), for
    ``round_trips_per_cs``. Not in a measured run: MONITOR streams every command a
    node runs, a script's own calls included, to this process, which reads them in
    the event loop the workers share, so the count costs a library in proportion to
    the calls inside its scripts (about 30 lines a critical section for fencegate's,
    7 for aioredlock's) and slows node 0 as well. ``contention_rounds`` counts in a
    run of its own.
    """
    clients = [await make(urls) for _ in range(workers)]
    loop = asyncio.get_running_loop()
    owners: list[int] = []
    takeover_waits: list[float] = []
    gave_up = 0
    try:
        counter = CommandCounter(nodes[0]) if count else None
        if counter is not None:
            await counter.__aenter__()
        end = loop.time() + seconds

        async def worker(i: int) -> None:
            nonlocal gave_up
            n = 0
            while loop.time() < end and n < 50_000:
                t0 = loop.time()
                try:
                    handle = await clients[i].acquire("bench:hot")
                except TimeoutError:  # the library's own wait ran out: this worker stops
                    gave_up += 1
                    return
                if owners and owners[-1] != i:
                    takeover_waits.append(loop.time() - t0)
                owners.append(i)
                await asyncio.sleep(hold)
                await clients[i].release(handle)
                n += 1

        start = loop.time()
        await asyncio.gather(*(worker(i) for i in range(workers)))
        elapsed = loop.time() - start
        calls = float("nan")
        if counter is not None:
            await counter.__aexit__()
            calls = counter.count * len(nodes)  # every node gets the same commands
    finally:
        for c in clients:
            await c.close()
    counts = Counter(owners)
    same = sum(a == b for a, b in itertools.pairwise(owners))
    total = max(len(owners), 1)
    return {
        "cs_per_s": len(owners) / elapsed,
        "takeover_p50_ms": pct(takeover_waits, 0.5) * 1e3,
        "takeover_p99_ms": pct(takeover_waits, 0.99) * 1e3,
        "takeover_max_ms": max(takeover_waits, default=float("nan")) * 1e3,
        "top_worker_share": max(counts.values(), default=0) / total,
        "workers_served": len(counts),
        "same_owner_again": same / max(total - 1, 1),
        "round_trips_per_cs": calls / total,
        "workers_gave_up": gave_up,
    }


async def contention_rounds(
    libs: dict[str, Callable[[list[str]], Awaitable[Client]]],
    urls: list[str],
    nodes: list[RedisNode],
    seconds: float,
    rounds: int,
    *,
    label: str = "contention",
    after: Callable[[str, dict[str, float]], None] | None = None,
) -> dict[str, list[dict[str, float]]]:
    """``contention`` for each library in ``rounds`` alternating rounds, then a short
    run each that counts commands (its ``round_trips_per_cs`` goes into every round).
    ``after(lib, row)``: called after each measured run (a proxy's CPU, say)."""
    rows: dict[str, list[dict[str, float]]] = {lib: [] for lib in libs}
    names = list(libs)
    for rnd in range(rounds):
        for lib in names if rnd % 2 == 0 else names[::-1]:
            for n in nodes:
                n.flushall()
            r = await contention(libs[lib], urls, nodes, seconds)
            if after is not None:
                after(lib, r)
            rows[lib].append(r)
            print(f"round {rnd + 1} {label} {lib:20} {json.dumps(r)}", flush=True)
    for lib in names:
        for n in nodes:
            n.flushall()
        counted = await contention(libs[lib], urls, nodes, min(seconds, 1.0), count=True)
        for r in rows[lib]:
            r["round_trips_per_cs"] = counted["round_trips_per_cs"]
    return rows


async def cycle_rounds(
    libs: dict[str, Callable[[list[str]], Awaitable[Client]]],
    nodes: list[RedisNode],
    seconds: float,
    rounds: int,
) -> dict[str, dict[str, list[dict[str, float]]]]:
    """``one_client`` and ``many_workers`` on 1 and on 3 nodes, every library in each
    of ``rounds`` rounds, the libraries' order reversed every other round: a library
    measured in a quiet (or busy) minute of this shared machine is not alone in it."""
    rows: dict[str, dict[str, list[dict[str, float]]]] = {}
    names = list(libs)
    for rnd in range(rounds):
        for count in (1, 3):
            urls = [n.url for n in nodes[:count]]
            for scenario in ("one_client", "32_workers"):
                key = f"{scenario}/{count}node"
                by_lib = rows.setdefault(key, {})
                for lib in names if rnd % 2 == 0 else names[::-1]:
                    if lib == "redis-py Lock" and count > 1:
                        continue  # one node only: not a Redlock
                    for n in nodes:
                        n.flushall()
                    if scenario == "one_client":
                        r = await one_client(libs[lib], urls, seconds)
                    else:
                        r = await many_workers(libs[lib], urls, seconds)
                    by_lib.setdefault(lib, []).append(r)
                    print(f"round {rnd + 1} {key:18} {lib:26} {json.dumps(r)}", flush=True)
    return rows


COUNTED: tuple[str, ...] = ("errors", "workers_gave_up")
"""Summed over the rounds, not their median: one round's failures are not outvoted."""


def median_row(rows: list[dict[str, float]]) -> dict[str, float]:
    """Each metric's median over the rounds that have it (a round with no takeover has
    NaN latencies), NaN if none has; counts of failures (``COUNTED``) summed."""

    def median(m: str) -> float:
        known = [r[m] for r in rows if not math.isnan(r[m])]
        return statistics.median(known) if known else math.nan

    return {m: sum(r[m] for r in rows) if m in COUNTED else median(m) for m in rows[0]}


async def kinds(urls: list[str], seconds: float, readers: int = 16) -> dict[str, dict[str, float]]:
    """fencegate's shared locks: one client's shared acquire+release cycles (against the
    exclusive ones of ``one_client``), and ``readers`` reader tasks holding a shared
    lease for 1 ms in a loop while one writer takes the exclusive lock in a loop: how
    many cycles each side makes, and how long the writer waits (no writer starvation)."""
    mgr = await LockManager.connect(urls)
    loop = asyncio.get_running_loop()
    out: dict[str, dict[str, float]] = {}
    try:
        for _ in range(50):  # warm up
            await mgr.release(await mgr.acquire("bench:shared", ttl=10.0, mode="shared"))
        lat: list[float] = []
        cycles, start = 0, loop.time()
        while loop.time() < start + seconds and cycles < 200_000:
            t0 = time.perf_counter()
            lease = await mgr.acquire("bench:shared", ttl=10.0, mode="shared")
            lat.append(time.perf_counter() - t0)
            await mgr.release(lease)
            cycles += 1
        out["shared one_client"] = {
            "cycles_per_s": cycles / (loop.time() - start),
            "p50_ms": pct(lat, 0.5) * 1e3, "p99_ms": pct(lat, 0.99) * 1e3,
        }  # fmt: skip
        end = loop.time() + seconds
        done = {"reader": 0, "writer": 0}
        writer_waits: list[float] = []

        async def reader() -> None:
            while loop.time() < end:
                lease = await mgr.acquire("bench:rw", ttl=10.0, wait=10.0, mode="shared")
                await asyncio.sleep(0.001)
                await mgr.release(lease)
                done["reader"] += 1

        async def writer() -> None:
            while loop.time() < end:
                t0 = time.perf_counter()
                lease = await mgr.acquire("bench:rw", ttl=10.0, wait=10.0)
                writer_waits.append(time.perf_counter() - t0)
                await mgr.release(lease)
                done["writer"] += 1

        start = loop.time()
        await asyncio.gather(writer(), *(reader() for _ in range(readers)))
        elapsed = loop.time() - start
        out[f"{readers} readers + 1 writer"] = {
            "reader_cycles_per_s": done["reader"] / elapsed,
            "writer_cycles_per_s": done["writer"] / elapsed,
            "writer_wait_p50_ms": pct(writer_waits, 0.5) * 1e3,
            "writer_wait_p99_ms": pct(writer_waits, 0.99) * 1e3,
        }
    finally:
        await mgr.close()
    return out


async def memory_flat(urls: list[str], names: int) -> dict[str, float]:
    mgr = await LockManager.connect(urls)
    loop = asyncio.get_running_loop()
    done = errors = 0
    marks: list[tuple[int, float]] = []

    def rss_mb() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize() / 2**20

    async def worker(i: int, step: int) -> None:
        nonlocal done, errors
        for k in range(i, names, step):
            try:
                await mgr.release(await mgr.acquire(f"bench:mem:{k}", ttl=10.0))
            except Exception:  # no quorum on a stalled loop: counted, the name is skipped
                errors += 1
                if errors > 1000:
                    raise
                continue
            done += 1

    start = loop.time()
    task = asyncio.gather(*(worker(i, 128) for i in range(128)))
    while not task.done():
        await asyncio.wait([task], timeout=2.0)
        gc.collect()
        marks.append((done, rss_mb()))
        print(f"  memory: {done:>9,} names, rss {marks[-1][1]:.1f} MiB", flush=True)
    await task
    elapsed = loop.time() - start
    await mgr.close()
    early = next((m for d, m in marks if d >= names * 0.1), marks[0][1])
    return {"names": names, "rss_at_10pct_mib": early, "rss_end_mib": marks[-1][1],
            "growth_mib": marks[-1][1] - early, "cycles_per_s": done / elapsed,
            "errors": errors}  # fmt: skip


# ---------------------------------------------------------------- emulated round trips
RTT_LIBS: tuple[str, ...] = ("fencegate", "aioredlock", "pottery AIORedlock")


class DelayProxy:
    """``benchmarks.delay_proxy`` in front of each node, pinned to the last core."""

    def __init__(self, nodes: list[RedisNode], rtt_ms: float) -> None:
        self.ports = [free_port() for _ in nodes]
        pairs = [f"{p}:{n.port}" for p, n in zip(self.ports, nodes, strict=True)]
        argv = [sys.executable, "-m", "benchmarks.delay_proxy", "--delay-ms", f"{rtt_ms / 2:g}"]
        self.core = (os.cpu_count() or 1) - 1
        if shutil.which("taskset"):
            argv = ["taskset", "-c", str(self.core), *argv]
        root = Path(__file__).resolve().parent.parent
        self.proc = subprocess.Popen([*argv, *pairs], cwd=root, stdout=subprocess.PIPE)
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != b"ready":
            raise RuntimeError("the delay proxy did not start")

    @property
    def urls(self) -> list[str]:
        return [f"redis://127.0.0.1:{p}/0" for p in self.ports]

    def cpu(self) -> float:
        return proc_cpu(self.proc.pid)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


async def ping_rtt(url: str, count: int = 500) -> dict[str, float]:
    conn = aredis.Redis.from_url(url)
    lat = []
    try:
        await conn.ping()
        for _ in range(count):
            t0 = time.perf_counter()
            await conn.ping()
            lat.append(time.perf_counter() - t0)
    finally:
        await conn.aclose()
    return {"p50_ms": pct(lat, 0.5) * 1e3, "p99_ms": pct(lat, 0.99) * 1e3}


async def rtt_main(args: argparse.Namespace) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="fencegate-bench-rtt-"))
    nodes = [RedisNode(workdir / f"n{i}") for i in range(3)]
    for node in nodes:
        node.start()
    proxy = DelayProxy(nodes, args.rtt_ms)
    libs = [lib for lib in RTT_LIBS if not args.only or lib in args.only]
    results: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, uvloop",
        "seconds_per_case": args.seconds * 2,
        "rounds": args.rounds,
        "rtt_ms": args.rtt_ms,
        "proxy_core": proxy.core,
    }
    try:
        results["ping_direct"] = await ping_rtt(nodes[0].url)
        results["ping_proxied"] = await ping_rtt(proxy.urls[0])
        print(f"PING direct {results['ping_direct']}, through the proxy "
              f"{results['ping_proxied']}", flush=True)  # fmt: skip
        cpu_at = [proxy.cpu()]

        def proxy_cpu(lib: str, r: dict[str, float]) -> None:
            cpu_at.append(proxy.cpu())
            cpu = cpu_at[-1] - cpu_at[-2]
            r["proxy_cpu_us_per_cs"] = cpu / max(r["cs_per_s"] * args.seconds * 2, 1) * 1e6

        rows = await contention_rounds(
            {lib: LIBRARIES[lib] for lib in libs}, proxy.urls, nodes, args.seconds * 2,
            args.rounds, label="rtt", after=proxy_cpu,
        )  # fmt: skip
    finally:
        proxy.stop()
        for node in nodes:
            node.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    key = f"contention/3node/rtt{args.rtt_ms:g}ms"
    results[key] = {
        lib: {m: statistics.median(r[m] for r in rs) for m in rs[0]} for lib, rs in rows.items()
    }
    results["cs_per_s_rounds"] = {lib: [r["cs_per_s"] for r in rs] for lib, rs in rows.items()}
    results["machine_load"] = os.getloadavg()
    write_rtt_report(results, key, args)


def write_rtt_report(results: dict[str, Any], key: str, args: argparse.Namespace) -> None:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "locks-rtt.json").write_text(json.dumps(results, indent=2))
    direct, proxied, load = results["ping_direct"], results["ping_proxied"], results["machine_load"]
    lines = [
        f"# Lock contention over emulated round trips ({args.rtt_ms:g} ms)",
        "",
        f"Run: `{command()}` on {results['machine']}, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {args.seconds * 2:g} s a case, "
        f"{args.rounds} rounds in alternating order (a cell is the median over the rounds). "
        f"Every client reaches the 3 redis-server nodes through `benchmarks/delay_proxy.py` "
        f"({args.rtt_ms / 2:g} ms each way, one process pinned to core {results['proxy_core']}). "
        f"PING round trip: direct p50 {direct['p50_ms']:.3f} ms, p99 {direct['p99_ms']:.3f} ms; "
        f"through the proxy p50 {proxied['p50_ms']:.3f} ms, p99 {proxied['p99_ms']:.3f} ms. "
        f"Load average at the end: {load[0]:.2f} on {os.cpu_count()} cores.",
        "",
        "8 workers, each its own client, on one name; 1 ms hold. proxy_cpu_us_per_cs: the "
        "proxy's own CPU per critical section (what the emulation costs, not the library).",
        "",
    ]
    table = results[key]
    metrics = list(next(iter(table.values())).keys())
    lines.append("| library | " + " | ".join(metrics) + " |")
    lines.append("| --- |" + " --- |" * len(metrics))
    for lib, row in table.items():
        cells = [f"{row[m]:.3g}" for m in metrics]
        lines.append(f"| {lib} | " + " | ".join(cells) + " |")
    fg = table.get("fencegate", {}).get("cs_per_s")
    peers = [row["cs_per_s"] for lib, row in table.items() if lib != "fencegate"]
    if fg and peers:
        rounds = results["cs_per_s_rounds"]
        others = [rounds[lib] for lib in table if lib != "fencegate"]
        per_round = [f / max(p) for f, *p in zip(rounds["fencegate"], *others, strict=True)]
        lines += [
            "",
            f"fencegate / best peer: **{fg / max(peers):.2f}x** (per round "
            f"{min(per_round):.2f}..{max(per_round):.2f}); target >= 1.2",
            "",
        ]
    (RESULTS / "locks-rtt.md").write_text("\n".join(lines))
    print("\n".join(lines))
    print(f"wrote {RESULTS / 'locks-rtt.md'}")


# ---------------------------------------------------------------- driver
async def main(args: argparse.Namespace) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="fencegate-bench-"))
    nodes = [RedisNode(workdir / f"n{i}") for i in range(3)]
    for node in nodes:
        node.start()
    machine = f"{platform.machine()}, Python {platform.python_version()}, uvloop"
    results: dict[str, Any] = {"machine": machine, "seconds_per_case": args.seconds}
    libs = {k: v for k, v in LIBRARIES.items() if not args.only or k in args.only}
    try:
        rows = await cycle_rounds(libs, nodes, args.seconds, args.rounds)
        for key, by_lib in rows.items():
            results[key] = {lib: median_row(rs) for lib, rs in by_lib.items()}
        results["cycles_per_s_rounds"] = {
            key: {lib: [r["cycles_per_s"] for r in rs] for lib, rs in by_lib.items()}
            for key, by_lib in rows.items()
        }
        urls = [n.url for n in nodes]
        contenders = {
            lib: make
            for lib, make in libs.items()
            if not lib.startswith("raw") and lib != "redis-py Lock"
        }
        rows = await contention_rounds(
            contenders, urls, nodes, args.seconds, args.contention_rounds
        )
        results["contention/3node"] = {lib: median_row(rs) for lib, rs in rows.items()}
        results["contention_cs_per_s_rounds"] = {
            lib: [r["cs_per_s"] for r in rs] for lib, rs in rows.items()
        }
        if "fencegate" in libs:
            for n in nodes:
                n.flushall()
            results["kinds/3node"] = await kinds(urls, args.seconds)
            print(f"{'kinds/3node':22} {json.dumps(results['kinds/3node'])}", flush=True)
        if args.names:
            for n in nodes:
                n.flushall()
            results["memory/3node"] = await memory_flat(urls, args.names)
            print(f"memory/3node {json.dumps(results['memory/3node'])}", flush=True)
    finally:
        for node in nodes:
            node.stop()
    write_report(results, args)


def ratio_line(table: dict[str, dict[str, float]], metric: str) -> str:
    fg = table.get("fencegate", {}).get(metric)
    peers = [table[p][metric] for p in PEERS if p in table]
    if fg is None or not peers:
        return ""
    best = max(peers)
    return f"fencegate / fastest peer: **{fg / best:.2f}x**"


def rounds_note(rounds: dict[str, list[float]], metric: str = "cs_per_s") -> str:
    """The rounds behind a table's medians, and fencegate's ratio per round."""
    peers = [p for p in PEERS if p in rounds]
    if "fencegate" not in rounds or not peers:
        return ""
    per_round = [fg / max(rounds[p][i] for p in peers) for i, fg in enumerate(rounds["fencegate"])]
    note = (
        f"Medians of {len(per_round)} alternating rounds; fencegate / fastest peer per round "
        f"{min(per_round):.2f}..{max(per_round):.2f}"
        f" (median {statistics.median(per_round):.2f}); errors and workers_gave_up summed over"
        " the rounds."
    )
    if metric == "cs_per_s":
        note += (
            " round_trips_per_cs is counted (MONITOR on node 0) in a separate 1 s run per"
            " library, not in the measured ones."
        )
    return note


def write_report(results: dict[str, Any], args: argparse.Namespace) -> None:
    RESULTS.mkdir(exist_ok=True)
    suffix = "-quick" if args.quick else ""
    (RESULTS / f"locks{suffix}.json").write_text(json.dumps(results, indent=2))
    lines = [
        "# Lock benchmark",
        "",
        f"Run: `{command()}` on {results['machine']}, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {args.seconds:g} s a case, "
        "all libraries against the same redis-server processes in one run.",
        "",
    ]
    for key, table in results.items():
        if not isinstance(table, dict) or key.startswith(
            ("memory", "kinds", "contention_cs", "cycles_per_s")
        ):
            continue
        lines.append(f"## {key}")
        lines.append("")
        metrics = list(next(iter(table.values())).keys())
        lines.append("| library | " + " | ".join(metrics) + " |")
        lines.append("| --- |" + " --- |" * len(metrics))
        for lib, row in table.items():
            cells = [f"{row[m]:.3g}" if isinstance(row[m], float) else str(row[m]) for m in metrics]
            lines.append(f"| {lib} | " + " | ".join(cells) + " |")
        metric = "cs_per_s" if key.startswith("contention") else "cycles_per_s"
        line = ratio_line(table, metric)
        if line:
            lines += ["", line]
        if key == "contention/3node":
            lines += ["", rounds_note(results.get("contention_cs_per_s_rounds", {}))]
        elif key in results.get("cycles_per_s_rounds", {}):
            lines += ["", rounds_note(results["cycles_per_s_rounds"][key], metric)]
        raw = table.get("raw SET NX PX + DEL", {}).get(metric)
        if raw and "fencegate" in table:
            lines.append(
                f"; fencegate / raw SET NX PX + DEL: {table['fencegate'][metric] / raw:.2f}x"
            )
        lines.append("")
    for case, row in results.get("kinds/3node", {}).items():
        cells = ", ".join(f"{metric} {value:.3g}" for metric, value in row.items())
        lines += [f"## kinds/3node: {case} (fencegate)", "", cells + ".", ""]
    if "memory/3node" in results:
        m = results["memory/3node"]
        lines += [
            "## memory over distinct names (3 nodes, fencegate)",
            "",
            f"{m['names']:,} distinct names acquired and released: RSS "
            f"{m['rss_at_10pct_mib']:.1f} MiB at 10% → {m['rss_end_mib']:.1f} MiB at the end "
            f"(growth {m['growth_mib']:+.1f} MiB), {m['cycles_per_s']:.0f} cycles/s.",
            "",
        ]
    (RESULTS / f"locks{suffix}.md").write_text("\n".join(lines))
    print(f"wrote {RESULTS / f'locks{suffix}.md'}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 s a case, 20k names")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--names", type=int, default=1_000_000)
    parser.add_argument("--only", nargs="*", help="library names to run")
    parser.add_argument("--rtt-ms", type=float, help="contention through a delay proxy only")
    parser.add_argument(
        "--rounds", type=int, default=3,
        help="alternating rounds of one_client and 32_workers, or of the --rtt-ms run",
    )  # fmt: skip
    parser.add_argument(
        "--contention-rounds", type=int, default=3, help="alternating rounds of contention"
    )
    ns = parser.parse_args()
    if ns.quick:
        ns.seconds, ns.names, ns.rounds, ns.contention_rounds = 1.0, 20_000, 2, 2
    uvloop.run(rtt_main(ns) if ns.rtt_ms else main(ns))
