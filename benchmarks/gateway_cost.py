"""Gateway cost per op of two checkouts side by side: instructions (callgrind) or CPU.

The same load as ``benchmarks.gateway`` (a lock cycle, POST then DELETE, by 1 or
32 clients; a fenced PUT to PostgreSQL by 32 clients holding their own locks),
served by one gateway process per checkout (``--roots``: each its own
``python -m gateway serve`` started in that folder, the same interpreter), over
the same three redis-server nodes and PostgreSQL schema. A fixed number of ops
per case, so that counts compare:

* ``--mode callgrind``: each gateway runs under ``valgrind --tool=callgrind``
  with instrumentation off until the measured ops start (after a warm-up) and
  off again after them: instructions per op, exact and robust to a loaded
  machine (user space only: a syscall counts its call, not the kernel's work);
* ``--mode cpu``: the gateway's CPU seconds per op (user + system, the
  process's CPU clock), over ``--rounds`` rounds in alternating order (ABBA).

    .venv/bin/python -m benchmarks.gateway_cost --roots /tmp/base . --mode callgrind
    .venv/bin/python -m benchmarks.gateway_cost --roots /tmp/base . --mode cpu --rounds 6

Printed, one line per case and checkout, and the ratio of each to the first.

``--overhead`` also measures, the same way, the two baselines of the HTTP-overhead
ratio of ``benchmarks.gateway`` for the lock cases: the bare aiohttp app
(``benchmarks.gateway.BARE``, one process for all checkouts) serving the same two
requests, and each checkout's in-process ``LockManager`` cycle (``INPROC``, a process
started in that checkout: the lock service's own cost, no HTTP), and prints gateway /
(bare + in-process) per lock case and checkout: in callgrind mode, the ratio in
instructions, which a busy machine does not move.

    .venv/bin/python -m benchmarks.gateway_cost --roots . --overhead --cases one_client 32_clients

``--cache-sim`` (callgrind mode) also simulates the caches (callgrind's
``--cache-sim=yes``, the last level given as ``SIZE,ASSOC,LINE``; the default,
1 MiB 8-way, is one core's L2 here) and prints each process's misses per op:
I1, D1 reads and writes, and last-level instruction, read and write misses, and
with ``--overhead`` the ratio of each. Where the instructions of the gateway and of
its two baselines compare, the misses say which one works from colder caches.

    .venv/bin/python -m benchmarks.gateway_cost --roots . --overhead --cache-sim \
        --cases one_client 32_clients
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final

import aiohttp
import asyncpg
import uvloop

from benchmarks.gateway import (
    BARE,
    LOCK_BODY,
    PG_DSN,
    Case,
    Gateway,
    config_toml,
    http_lock_case,
    http_put_case,
    proc_cpu,
)
from tests._servers import RedisNode, free_port

CASES: Final = ("one_client", "32_clients", "put_pg")
_TOTALS: Final = re.compile(rb"^totals:((?:[ \t]+\d+)+)", re.M)
_EVENTS: Final = re.compile(rb"^events:\s*(.+)$", re.M)
L2: Final = "1048576,8,64"
"""The last-level cache ``--cache-sim`` simulates by default: one core's L2 here (1 MiB,
8-way, 64-byte lines; the L3 behind it is shared with the other processes)."""
_MISSES: Final = ("I1mr", "D1mr", "D1mw", "ILmr", "DLmr", "DLmw")
_LOCK_CASES: Final = {"one_client": 1, "32_clients": 32}

# ``python -c INPROC NODE_TIMEOUT URL...``: benchmarks.gateway's "in-process, the gateway's
# calls" (acquire, then release of a handle), driven from stdin: a line "WORKERS N" runs N
# cycles split over WORKERS tasks and answers "done"; it answers "ready" once connected.
# The loop blocks on stdin between runs: nothing is measured then.
INPROC: Final = """
import asyncio, sys
import uvloop
from lockservice import LockManager
async def main():
    mgr = await LockManager.connect(sys.argv[2:], node_timeout=float(sys.argv[1]))
    async def cycles(name, n):
        for _ in range(n):
            lease = await mgr.acquire(name, ttl=10.0, wait=0.0)
            await mgr.release(LockManager.handle(lease.name, lease.lease_id))
    print("ready", flush=True)
    try:
        while line := sys.stdin.readline().split():
            workers, n = int(line[0]), int(line[1])
            names = ["bench/one"] if workers == 1 else [f"bench/w{i}" for i in range(workers)]
            per = [n // workers + (i < n % workers) for i in range(workers)]
            await asyncio.gather(*(cycles(names[i], k) for i, k in enumerate(per)))
            print("done", flush=True)
    finally:
        await mgr.close()
uvloop.run(main())
"""


_CACHE_SIM: list[str] = []
"""callgrind's cache options, set once from ``--cache-sim`` (none: instructions only)."""


def _grind_argv(workdir: Path, name: str, argv: list[str]) -> list[str]:
    out = workdir / f"callgrind-{name}.out"
    return ["valgrind", "--tool=callgrind", "--instr-atstart=no", *_CACHE_SIM,
            f"--callgrind-out-file={out}", *argv]  # fmt: skip


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FENCEGATE_")}
    env.pop("PYTHONPATH", None)
    return env


def spawn_bare(workdir: Path, grind: bool) -> Gateway:
    """benchmarks.gateway's bare aiohttp app, under callgrind if ``grind``."""
    port = free_port()
    log = workdir / "gateway-bare.log"
    argv = [sys.executable, "-c", BARE, str(port)]
    if grind:
        argv = _grind_argv(workdir, "bare", argv)
    with open(log, "wb") as f:
        proc = subprocess.Popen(argv, env=_env(), stdout=f, stderr=subprocess.STDOUT)
    return Gateway("bare", proc, f"http://127.0.0.1:{port}", log, metrics=False)


class InProc:
    """One checkout's ``INPROC`` process (under callgrind if ``grind``)."""

    def __init__(self, root: Path, name: str, workdir: Path, redis: list[str], grind: bool):
        self.name = name
        argv = [sys.executable, "-c", INPROC, "20" if grind else "0.2", *redis]
        if grind:
            argv = _grind_argv(workdir, name, argv)
        with open(workdir / f"inproc-{name}.log", "wb") as log:  # valgrind's own lines
            self.proc = subprocess.Popen(argv, cwd=root, env=_env(), stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=log, text=True)  # fmt: skip

    def _expect(self, word: str) -> None:
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if line.strip() != word:
            raise RuntimeError(
                f"{self.name}: expected {word!r}, got {line!r} (exit {self.proc.poll()})"
            )

    def ready(self) -> None:
        self._expect("ready")

    def run(self, workers: int, ops: int) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{workers} {ops}\n")
        self.proc.stdin.flush()
        self._expect("done")

    def cpu_seconds(self) -> float:
        return proc_cpu(self.proc.pid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()  # an empty line: it closes its manager and ends
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def spawn(root: Path, name: str, workdir: Path, redis: list[str], stores: Any, grind: bool) -> Any:
    port = free_port()
    config = workdir / f"gateway-{name}.toml"
    text = config_toml(port, redis, stores)
    if grind:  # some 50 times slower: no node may count as failed for that
        text = text.replace("[locks]\n", "[locks]\nnode_timeout_ms = 20000\n", 1)
    config.write_text(text)
    log = workdir / f"gateway-{name}.log"
    argv = [sys.executable, "-m", "gateway", "serve", "--config", str(config)]
    if grind:
        argv = _grind_argv(workdir, name, argv)
    with open(log, "wb") as f:
        proc = subprocess.Popen(argv, cwd=root, env=_env(), stdout=f, stderr=subprocess.STDOUT)
    return Gateway(name, proc, f"http://127.0.0.1:{port}", log)


def _control(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True)


def _dump_total(workdir: Path, name: str, pid: int, keep: Path | None = None) -> dict[str, int]:
    """Dump the counts since the last dump; return their totals by event (``Ir``: the
    instructions; with ``--cache-sim`` the misses too), and drop the file, or move it to
    ``keep``."""
    before = set(workdir.glob(f"callgrind-{name}.out*"))
    _control(pid, "-d")
    new = sorted(set(workdir.glob(f"callgrind-{name}.out*")) - before)
    totals: dict[str, int] = {}
    for path in new:
        for event, count in dump_totals(path.read_bytes()).items():
            totals[event] = totals.get(event, 0) + count
        if keep is None:
            path.unlink()
        else:
            path.replace(keep)
    return totals


def dump_totals(text: bytes) -> dict[str, int]:
    """A callgrind dump's ``totals:`` line by its ``events:`` names (the counts of
    trailing events may be left out: they are 0)."""
    events, m = _EVENTS.search(text), _TOTALS.search(text)
    if not (events and m):
        return {}
    names, counts = events.group(1).decode().split(), [int(c) for c in m.group(1).split()]
    return {name: counts[i] if i < len(counts) else 0 for i, name in enumerate(names)}


async def ready(http: aiohttp.ClientSession, gw: Gateway, within: float) -> None:
    """Wait until the gateway's /readyz says 200 (under valgrind it starts slowly)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while loop.time() < deadline:
        if gw.proc.poll() is not None:
            raise RuntimeError(f"{gw.name} exited:\n{gw.log.read_text(errors='replace')[-3000:]}")
        try:
            async with http.get(f"{gw.url}/readyz", timeout=aiohttp.ClientTimeout(total=5)) as r:
                if r.status == 200:
                    return
        except (aiohttp.ClientError, TimeoutError):
            pass
        await asyncio.sleep(0.5)
    raise RuntimeError(f"{gw.name} not ready in {within:g} s")


async def drive(case: Case, ops: int) -> None:
    """``ops`` ops in all, split over the case's workers; any failure is fatal."""
    per = [ops // case.workers + (i < ops % case.workers) for i in range(case.workers)]

    async def one(i: int) -> None:
        for _ in range(per[i]):
            await case.op(i)

    await asyncio.gather(*(one(i) for i in range(case.workers)))


async def measure(
    case: Case, ops: int, warm: int, before: Callable[[], Any], after: Callable[[], Any]
) -> dict[str, float]:
    if case.setup is not None:
        await case.setup()
    try:
        await drive(case, warm)
        await asyncio.to_thread(before)
        await drive(case, ops)
        return dict(await asyncio.to_thread(after))
    finally:
        if case.teardown is not None:
            await case.teardown()


def make_case(kind: str, http: aiohttp.ClientSession, gw: Gateway, body: bytes) -> Case:
    if kind == "one_client":
        return http_lock_case(kind, http, gw, 1)
    if kind == "32_clients":
        return http_lock_case(kind, http, gw, 32)
    return http_put_case(kind, http, gw, "pg", body, fenced=True, ttl_ms=300_000)


def _meter(
    grind: bool, workdir: Path, name: str, pid: int, cpu: Callable[[], float], keep: Path | None
) -> tuple[Callable[[], Any], Callable[[], dict[str, float]]]:
    """What to call before and after the measured ops of one process: its callgrind
    totals by event (``Ir``, and misses with ``--cache-sim``; dumped to ``keep`` if
    given) or its CPU microseconds (``us``)."""
    if grind:

        def before() -> None:
            _dump_total(workdir, name, pid)
            _control(pid, "-i", "on")

        def after() -> dict[str, float]:
            _control(pid, "-i", "off")
            return {k: float(v) for k, v in _dump_total(workdir, name, pid, keep).items()}

        return before, after
    box: list[float] = []
    return (lambda: box.append(cpu())), (lambda: {"us": (cpu() - box[0]) * 1e6})


async def measure_inproc(
    proc: InProc,
    workers: int,
    ops: int,
    warm: int,
    before: Callable[[], Any],
    after: Callable[[], dict[str, float]],
) -> dict[str, float]:
    await asyncio.to_thread(proc.run, workers, warm)
    await asyncio.to_thread(before)
    await asyncio.to_thread(proc.run, workers, ops)
    return await asyncio.to_thread(after)


async def main(args: argparse.Namespace, roots: list[Path]) -> None:
    grind = args.mode == "callgrind"
    workdir = Path(tempfile.mkdtemp(prefix="fencegate-gwcost-"))
    nodes = [RedisNode(workdir / f"redis{i}") for i in range(3)]
    schema = f"fg_cost_{uuid.uuid4().hex[:10]}"
    body = bytes(i % 251 for i in range(256))
    conn = await asyncpg.connect(PG_DSN)
    gws: list[Gateway] = []
    inprocs: list[InProc] = []
    closers: list[Callable[[], Awaitable[Any]]] = []
    overhead = args.overhead and any(kind in _LOCK_CASES for kind in args.cases)
    try:
        await conn.execute(f'CREATE SCHEMA "{schema}"')
        for node in nodes:
            node.start()
        redis = [n.url for n in nodes]
        pg: dict[str, object] = {"type": "postgres", "dsn": PG_DSN, "schema": schema}
        pg |= {"pool_max": 10, "acquire_timeout_ms": 60_000, "command_timeout_ms": 60_000}
        stores = {"pg": pg}
        connector = aiohttp.TCPConnector(limit=64, limit_per_host=64)
        http = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600))
        closers.append(http.close)
        for i, root in enumerate(roots):
            gws.append(spawn(root, f"g{i}", workdir, redis, stores, grind))
        bare = spawn_bare(workdir, grind) if overhead else None
        if overhead:
            for i, root in enumerate(roots):
                inprocs.append(InProc(root, f"p{i}", workdir, redis, grind))
            for proc in inprocs:
                await asyncio.wait_for(asyncio.to_thread(proc.ready), 600)
        for gw in gws + ([bare] if bare else []):
            await ready(http, gw, 600.0 if grind else 60.0)
        # the gateways' first requests (a name's first lock, the store's table) before any count
        for gw in gws:
            async with http.post(f"{gw.url}/v1/locks/warm", data=LOCK_BODY) as r:
                lease = json.loads(await r.read())["lease_id"]
            async with http.delete(f"{gw.url}/v1/locks/warm", headers={"X-Lease-Id": lease}):
                pass
        results: dict[tuple[str, str], list[float]] = {}
        misses: dict[tuple[str, str, str], list[float]] = {}  # --cache-sim: per op

        def keep(kind: str, who: str) -> Path | None:
            return None if args.keep is None else Path(args.keep) / f"{kind}-{who}.out"

        def note(kind: str, who: str, label: str, totals: dict[str, float], ops: int) -> None:
            total = totals["Ir" if grind else "us"]
            results.setdefault((kind, who), []).append(total / ops)
            for event in _MISSES:
                if event in totals:
                    misses.setdefault((kind, who, event), []).append(totals[event] / ops)
            print(f"round {rnd} {kind} {label}: {total / ops:,.0f}", flush=True)

        for rnd in range(args.rounds):
            order = list(range(len(gws)))
            if rnd % 2:
                order.reverse()
            for kind in args.cases:
                ops = args.ops if kind == "one_client" else args.ops * 2
                for i in order:
                    gw = gws[i]
                    before, after = _meter(grind, workdir, gw.name, gw.proc.pid,
                                           gw.cpu_seconds, keep(kind, str(i)))  # fmt: skip
                    total = await measure(make_case(kind, http, gw, body), ops, args.warm,
                                          before, after)  # fmt: skip
                    note(kind, str(i), str(roots[i]), total, ops)
                if not overhead or kind not in _LOCK_CASES:
                    continue
                assert bare is not None
                workers = _LOCK_CASES[kind]
                before, after = _meter(grind, workdir, "bare", bare.proc.pid, bare.cpu_seconds,
                                       keep(kind, "bare"))  # fmt: skip
                case = http_lock_case(kind, http, bare, workers)
                note(kind, "bare", "bare aiohttp app",
                     await measure(case, ops, args.warm, before, after), ops)  # fmt: skip
                for i in order:
                    proc = inprocs[i]
                    before, after = _meter(grind, workdir, proc.name, proc.proc.pid,
                                           proc.cpu_seconds, keep(kind, f"inproc{i}"))  # fmt: skip
                    total = await measure_inproc(proc, workers, ops, args.warm, before, after)
                    note(kind, f"inproc{i}", f"in-process LockManager, {roots[i]}", total, ops)
        unit = "instructions/op" if grind else "CPU us/op"
        print(f"\n{unit}, median over {args.rounds} round(s); ratio to {roots[0]}")
        for kind in args.cases:
            base = statistics.median(results[kind, "0"])
            for i, root in enumerate(roots):
                med = statistics.median(results[kind, str(i)])
                print(f"{kind:12} {root!s:40} {med:14,.1f}  {med / base:.3f}x")
        if overhead:
            print(f"\nHTTP path overhead ({unit}): gateway / (bare aiohttp app + in-process cycle)")
            for kind in (k for k in args.cases if k in _LOCK_CASES):
                bare_op = statistics.median(results[kind, "bare"])
                for i, root in enumerate(roots):
                    gw_op = statistics.median(results[kind, str(i)])
                    lm_op = statistics.median(results[kind, f"inproc{i}"])
                    print(f"{kind:12} {root!s:40} {gw_op:12,.1f} / ({bare_op:,.1f} + "
                          f"{lm_op:,.1f}) = {gw_op / (bare_op + lm_op):.3f}x")  # fmt: skip
        if misses:
            _print_misses(args.cases, roots, misses, overhead)
    finally:
        for close in closers:
            await close()
        for gw in gws + ([bare] if overhead and bare else []):
            await gw.stop(120)
        for proc in inprocs:
            await asyncio.to_thread(proc.stop)
        for node in nodes:
            node.stop()
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await conn.close()
        shutil.rmtree(workdir, ignore_errors=True)  # --keep holds the dumps asked for


def _print_misses(
    cases: list[str],
    roots: list[Path],
    misses: dict[tuple[str, str, str], list[float]],
    overhead: bool,
) -> None:
    """Cache misses per op (medians), each process; with ``overhead`` the ratio of each
    kind of miss, gateway / (bare app + in-process cycle), as for the instructions."""
    print(f"\ncache misses per op (callgrind --cache-sim, last level {_CACHE_SIM[-1][5:]})")
    print(f"{'case':12} {'process':40} " + " ".join(f"{e:>8}" for e in _MISSES))

    def med(kind: str, who: str, event: str) -> float:
        return statistics.median(misses.get((kind, who, event)) or [float("nan")])

    for kind in cases:
        whos = [(str(i), str(root)) for i, root in enumerate(roots)]
        if overhead and kind in _LOCK_CASES:
            whos.append(("bare", "bare aiohttp app"))
            whos += [(f"inproc{i}", f"in-process cycle {i}") for i in range(len(roots))]
        for who, label in whos:
            print(f"{kind:12} {label[-40:]:40} "  # a checkout's path: its end
                  + " ".join(f"{med(kind, who, e):8,.0f}" for e in _MISSES))  # fmt: skip
        if overhead and kind in _LOCK_CASES:
            for i, root in enumerate(roots):
                ratios = [
                    med(kind, str(i), e) / (med(kind, "bare", e) + med(kind, f"inproc{i}", e))
                    for e in _MISSES
                ]
                print(f"{kind:12} {'overhead ratio, ' + str(root):40} "
                      + " ".join(f"{r:7.2f}x" for r in ratios))  # fmt: skip


def cli() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--roots", nargs="+", required=True, help="checkouts; the first is the base")
    p.add_argument("--mode", choices=("callgrind", "cpu"), default="callgrind")
    p.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    p.add_argument("--ops", type=int, default=300, help="ops per case (doubled for 32 clients)")
    p.add_argument("--warm", type=int, default=64)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--keep", help="a folder for the callgrind dumps (callgrind_annotate)")
    p.add_argument(
        "--cache-sim",
        nargs="?",
        const=L2,
        metavar="SIZE,ASSOC,LINE",
        help=f"callgrind mode: simulate the caches, this last level (default {L2}); misses per op",
    )
    p.add_argument(
        "--overhead",
        action="store_true",
        help="also the bare aiohttp app and the in-process cycle: the HTTP overhead",
    )
    args = p.parse_args()
    if args.cache_sim:
        if args.mode != "callgrind":
            p.error("--cache-sim needs --mode callgrind")
        _CACHE_SIM[:] = ["--cache-sim=yes", f"--LL={args.cache_sim}"]
    uvloop.run(main(args, [Path(r).resolve() for r in args.roots]))


if __name__ == "__main__":
    cli()
