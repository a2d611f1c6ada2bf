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
    LOCK_BODY,
    PG_DSN,
    Case,
    Gateway,
    config_toml,
    http_lock_case,
    http_put_case,
)
from tests._servers import RedisNode, free_port

CASES: Final = ("one_client", "32_clients", "put_pg")
_TOTALS: Final = re.compile(rb"^totals:\s*(\d+)", re.M)


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
        out = workdir / f"callgrind-{name}.out"
        argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                f"--callgrind-out-file={out}", *argv]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("FENCEGATE_")}
    env.pop("PYTHONPATH", None)
    with open(log, "wb") as f:
        proc = subprocess.Popen(argv, cwd=root, env=env, stdout=f, stderr=subprocess.STDOUT)
    return Gateway(name, proc, f"http://127.0.0.1:{port}", log)


def _control(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True)


def _dump_total(workdir: Path, name: str, pid: int, keep: Path | None = None) -> int:
    """Dump the counts since the last dump; return their instructions (and drop the file,
    or move it to ``keep``)."""
    before = set(workdir.glob(f"callgrind-{name}.out*"))
    _control(pid, "-d")
    new = sorted(set(workdir.glob(f"callgrind-{name}.out*")) - before)
    total = 0
    for path in new:
        m = _TOTALS.search(path.read_bytes())
        total += int(m.group(1)) if m else 0
        if keep is None:
            path.unlink()
        else:
            path.replace(keep)
    return total


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
) -> float:
    if case.setup is not None:
        await case.setup()
    try:
        await drive(case, warm)
        await asyncio.to_thread(before)
        await drive(case, ops)
        return float(await asyncio.to_thread(after))
    finally:
        if case.teardown is not None:
            await case.teardown()


def make_case(kind: str, http: aiohttp.ClientSession, gw: Gateway, body: bytes) -> Case:
    if kind == "one_client":
        return http_lock_case(kind, http, gw, 1)
    if kind == "32_clients":
        return http_lock_case(kind, http, gw, 32)
    return http_put_case(kind, http, gw, "pg", body, fenced=True, ttl_ms=300_000)


async def main(args: argparse.Namespace, roots: list[Path]) -> None:
    grind = args.mode == "callgrind"
    workdir = Path(tempfile.mkdtemp(prefix="fencegate-gwcost-"))
    nodes = [RedisNode(workdir / f"redis{i}") for i in range(3)]
    schema = f"fg_cost_{uuid.uuid4().hex[:10]}"
    body = bytes(i % 251 for i in range(256))
    conn = await asyncpg.connect(PG_DSN)
    gws: list[Gateway] = []
    closers: list[Callable[[], Awaitable[Any]]] = []
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
            gw = spawn(root, f"g{i}", workdir, redis, stores, grind)
            gws.append(gw)
        for gw in gws:
            await ready(http, gw, 600.0 if grind else 60.0)
        # the gateways' first requests (a name's first lock, the store's table) before any count
        for gw in gws:
            async with http.post(f"{gw.url}/v1/locks/warm", data=LOCK_BODY) as r:
                lease = json.loads(await r.read())["lease_id"]
            async with http.delete(f"{gw.url}/v1/locks/warm", headers={"X-Lease-Id": lease}):
                pass
        results: dict[tuple[str, int], list[float]] = {}
        for rnd in range(args.rounds):
            order = list(range(len(gws)))
            if rnd % 2:
                order.reverse()
            for kind in args.cases:
                ops = args.ops if kind == "one_client" else args.ops * 2
                for i in order:
                    gw = gws[i]
                    case = make_case(kind, http, gw, body)
                    pid = gw.proc.pid
                    if grind:

                        def before(pid: int = pid, name: str = gw.name) -> None:
                            _dump_total(workdir, name, pid)
                            _control(pid, "-i", "on")

                        keep = None if args.keep is None else Path(args.keep) / f"{kind}-{i}.out"

                        def after(
                            pid: int = pid, name: str = gw.name, keep: Path | None = keep
                        ) -> int:
                            _control(pid, "-i", "off")
                            return _dump_total(workdir, name, pid, keep)

                        total = await measure(case, ops, args.warm, before, after)
                    else:
                        box: list[float] = []

                        def start(gw: Gateway = gw, box: list[float] = box) -> None:
                            box.append(gw.cpu_seconds())

                        def stop(gw: Gateway = gw, box: list[float] = box) -> float:
                            return (gw.cpu_seconds() - box[0]) * 1e6

                        total = await measure(case, ops, args.warm, start, stop)
                    results.setdefault((kind, i), []).append(total / ops)
                    print(f"round {rnd} {kind} {roots[i]}: {total / ops:,.0f}", flush=True)
        unit = "instructions/op" if grind else "CPU us/op"
        print(f"\n{unit}, median over {args.rounds} round(s); ratio to {roots[0]}")
        for kind in args.cases:
            base = statistics.median(results[kind, 0])
            for i, root in enumerate(roots):
                med = statistics.median(results[kind, i])
                print(f"{kind:12} {root!s:40} {med:14,.1f}  {med / base:.3f}x")
    finally:
        for close in closers:
            await close()
        for gw in gws:
            await gw.stop(120)
        for node in nodes:
            node.stop()
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await conn.close()
        shutil.rmtree(workdir, ignore_errors=True)  # --keep holds the dumps asked for


def cli() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--roots", nargs="+", required=True, help="checkouts; the first is the base")
    p.add_argument("--mode", choices=("callgrind", "cpu"), default="callgrind")
    p.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    p.add_argument("--ops", type=int, default=300, help="ops per case (doubled for 32 clients)")
    p.add_argument("--warm", type=int, default=64)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--keep", help="a folder for the callgrind dumps (callgrind_annotate)")
    args = p.parse_args()
    uvloop.run(main(args, [Path(r).resolve() for r in args.roots]))


if __name__ == "__main__":
    cli()
