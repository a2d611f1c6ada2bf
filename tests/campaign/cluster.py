"""The campaign's topology, all on loopback, started and always cleaned up by ``Cluster``.

* three ``redis-server`` nodes (``tests._servers.RedisNode``), each able to take an
  RDB snapshot and to be restarted from it later (a rollback); with ``groups`` G,
  3 G nodes and gateways configured with ``[locks] groups`` of 3 nodes each
  (explicit ids: each gateway reaches the nodes through its own proxies, so ids
  derived from the node addresses would differ between gateways);
* a private PostgreSQL (``tests._pg_server.PgServer``) that may be crash-restarted;
* one ``FaultProxy`` per (gateway, node) link, in this process;
* two gateway processes (``python -m gateway serve --config``), each with its own
  config naming its proxies, and, when libfaketime is installed, its own
  ``FAKETIME_TIMESTAMP_FILE`` so the nemesis can skew its wall clock at run time;
* stores: ``kv`` (postgres), ``ledger`` (postgres legacy table ``ledger(id, v)``,
  its rows inserted before the run, with the fencing trigger installed by
  ``fencegate pg install-fencing`` as a user would: direct writers write it
  too, see ``direct.py``), ``files`` (a folder both gateways share) and
  ``blind`` (files, ``fencing = "none"``: the sabotage store, which checks no token).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Final

import aiohttp
import psycopg

from tests._pg_server import PgServer, pg_bin_dir
from tests._servers import RedisNode, free_port
from tests.campaign.direct import KEY_COLUMN, TABLE
from tests.campaign.proxy import FaultProxy
from tests.campaign.trace import Tracer
from tests.faults.test_gateway_two_processes import toml_document

__all__ = ["FAKETIME_LIB", "LEDGER", "Cluster", "Gateway", "SnapshotNode", "faketime_works"]

ROOT: Final = Path(__file__).resolve().parents[2]
FAKETIME_LIB: Final = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
NODES: Final = 3  # per Redlock group
GATEWAYS: Final = 2
MAX_TTL_MS: Final = 4000  # also how long a restarted node stays in quarantine
LEDGER: Final = "ledger"  # the legacy-table store with the fencing trigger


def faketime_works() -> bool:
    """Whether libfaketime is installed (Debian package ``faketime``)."""
    return FAKETIME_LIB.exists()


def _own_env() -> dict[str, str]:
    """This process's environment without FENCEGATE_* (the run's configs say everything)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("FENCEGATE_")}


class SnapshotNode(RedisNode):
    """A Redis node that can save an RDB snapshot and restart from it (losing newer data)."""

    def snapshot(self) -> None:
        reply = self.command("SAVE")
        if not reply.startswith(b"+OK"):
            raise RuntimeError(f"SAVE on port {self.port} failed: {reply!r}")
        shutil.copy(self.workdir / "dump.rdb", self.workdir / "old.rdb.keep")

    def rollback(self) -> None:
        """kill -9, then start from the snapshot only (``--appendonly no`` loads dump.rdb)."""
        self.kill()
        for name in os.listdir(self.workdir):
            if name not in ("redis.log", "old.rdb.keep"):
                (self.workdir / name).unlink()
        shutil.copy(self.workdir / "old.rdb.keep", self.workdir / "dump.rdb")
        self.start()

    def restart_empty(self) -> None:
        self.kill()
        for name in os.listdir(self.workdir):
            if name not in ("redis.log", "old.rdb.keep"):
                (self.workdir / name).unlink()
        self.start()


class Gateway:
    """One gateway process on a fixed port (a restart keeps it), optionally under faketime."""

    def __init__(self, workdir: Path, raw: dict[str, Any], *, skewable: bool) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        self.port = free_port()
        self.config = workdir / "fencegate.toml"
        self.config.write_text(toml_document({"listen": f"127.0.0.1:{self.port}", **raw}))
        self.logfile = workdir / "gateway.log"
        self.clock = workdir / "faketime"
        self.skewable = skewable
        self.proc: subprocess.Popen[bytes] | None = None
        self.skew(0)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def skew(self, seconds: float) -> None:
        """Offset this gateway's wall clock (read by libfaketime at every clock call)."""
        tmp = self.clock.with_suffix(".tmp")
        tmp.write_text(f"{seconds:+.3f}s\n" if seconds else "+0\n")
        tmp.replace(self.clock)

    def start(self) -> None:
        env = _own_env()
        env["PYTHONPATH"] = str(ROOT)
        if self.skewable:
            env.update(
                LD_PRELOAD=str(FAKETIME_LIB),
                FAKETIME_NO_CACHE="1",
                FAKETIME_DONT_FAKE_MONOTONIC="1",  # validity is measured on the monotonic clock
                FAKETIME_TIMESTAMP_FILE=str(self.clock),
            )
        with open(self.logfile, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gateway", "serve", "--config", str(self.config)],
                cwd=self.workdir, env=env, stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: signal.Signals) -> None:
        if self.alive:
            assert self.proc is not None
            self.proc.send_signal(sig)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGCONT)
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.logfile.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


class Cluster:
    """Everything the campaign runs against; ``async with Cluster(workdir):``."""

    def __init__(
        self, workdir: Path, *, skew: bool | None = None, rows: tuple[str, ...] = (),
        split_nodes: bool = False, groups: int = 0, trace: Tracer | None = None,
    ) -> None:  # fmt: skip
        self.workdir = workdir
        self.trace = trace  # every proxy logs the traced name's traffic (``trace.py``)
        self.split_nodes = split_nodes  # sabotage: gateway g locks on node g alone
        self.groups = groups  # 0: one Redlock over [locks] redis; else [locks] groups
        self.rows = rows  # keys of the ledger table, inserted with v = 0 before the trigger
        self.skewable = faketime_works() if skew is None else skew
        count = NODES * max(groups, 1)
        self.nodes = [SnapshotNode(workdir / f"redis{i}") for i in range(count)]
        bin_dir = pg_bin_dir()
        if bin_dir is None:
            raise RuntimeError("no PostgreSQL binaries (initdb, pg_ctl) found")
        self.pg = PgServer(bin_dir)
        self.proxies: list[list[FaultProxy]] = []  # [gateway][node]
        self.gateways: list[Gateway] = []

    @property
    def urls(self) -> list[str]:
        return [g.url for g in self.gateways]

    async def __aenter__(self) -> Cluster:
        try:
            await asyncio.to_thread(self._start_servers)
            for g in range(GATEWAYS):
                links = [
                    FaultProxy(node.port, trace=None if self.trace is None else (self.trace, g, n))
                    for n, node in enumerate(self.nodes)
                ]
                for proxy in links:
                    await proxy.start()
                self.proxies.append(links)
            for g, links in enumerate(self.proxies):
                used = [links[g]] if self.split_nodes else links
                gateway = Gateway(
                    self.workdir / f"gw{g}", self._config(used), skewable=self.skewable
                )
                self.gateways.append(gateway)
            await asyncio.to_thread(self.fencing, "install-fencing")
            for gateway in self.gateways:
                gateway.start()
            await self.wait_ready(within=60.0)
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _start_servers(self) -> None:
        for node in self.nodes:
            node.start()
        self.pg.init()
        self.pg.start()
        with psycopg.connect(self.pg.dsn, autocommit=True, connect_timeout=10) as conn:
            conn.execute(f"CREATE TABLE {TABLE} ({KEY_COLUMN} text PRIMARY KEY, v bigint NOT NULL)")
            for key in self.rows:
                conn.execute(f"INSERT INTO {TABLE} VALUES (%s, 0)", (key,))

    def fencing(self, verb: str, *options: str) -> str:
        """``fencegate pg VERB --store ledger`` with the first gateway's config, as a user
        would run it; its output line."""
        done = subprocess.run(
            [sys.executable, "-m", "gateway", "pg", verb, "--config", str(self.gateways[0].config),
             "--store", LEDGER, *options],
            cwd=ROOT, env={**_own_env(), "PYTHONPATH": str(ROOT)},
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"fencegate pg {verb} failed: {done.stdout}{done.stderr}")
        return done.stdout.strip()

    def group_nodes(self, rng: random.Random) -> list[int]:
        """The nodes of one Redlock group (a random one when there are several)."""
        if self.groups <= 1:
            return list(range(len(self.nodes)))
        first = NODES * rng.randrange(self.groups)
        return list(range(first, first + NODES))

    def _locks(self, links: list[FaultProxy]) -> dict[str, Any]:
        if not self.groups:
            return {"redis": [p.url for p in links]}
        groups = [
            {"id": f"g{j}", "redis": [p.url for p in links[NODES * j : NODES * (j + 1)]]}
            for j in range(self.groups)
        ]
        return {"groups": groups}

    def _config(self, links: list[FaultProxy]) -> dict[str, Any]:
        files = self.workdir / "files-root"
        blind = self.workdir / "blind-root"
        pg = {"type": "postgres", "dsn": self.pg.dsn, "command_timeout_ms": 3000,
              "acquire_timeout_ms": 2000, "pool_max": 5}  # fmt: skip
        return {
            "shutdown_timeout_ms": 2000,
            "request_timeout_ms": 20000,
            "locks": {
                **self._locks(links),
                "node_timeout_ms": 300,
                "max_ttl_ms": MAX_TTL_MS,
                "default_ttl_ms": 1500,
                "max_wait_ms": 10000,
            },
            "stores": {
                "kv": pg,
                LEDGER: {**pg, "table": TABLE, "key_column": KEY_COLUMN, "columns": ["v"]},
                "files": {"type": "files", "root": str(files)},
                "blind": {"type": "files", "root": str(blind), "fencing": "none"},
            },
        }

    async def wait_ready(self, within: float) -> None:
        """Until every gateway answers 200 on ``/readyz``."""
        deadline = time.monotonic() + within
        timeout = aiohttp.ClientTimeout(total=3)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            for gateway in self.gateways:
                while True:
                    if not gateway.alive:
                        raise RuntimeError(f"gateway exited:\n{gateway.log_tail()}")
                    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                        async with session.get(gateway.url + "/readyz") as response:
                            if response.status == 200:
                                break
                    if time.monotonic() > deadline:
                        raise RuntimeError(
                            f"gateway not ready in {within} s:\n{gateway.log_tail()}"
                        )
                    await asyncio.sleep(0.1)

    def heal_all(self) -> None:
        """Undo every fault that may still be in place (idempotent)."""
        for links in self.proxies:
            for proxy in links:
                proxy.heal()
        for gateway in self.gateways:
            gateway.skew(0)
            gateway.signal(signal.SIGCONT)
            if not gateway.alive:
                gateway.start()
        for node in self.nodes:
            if node.alive:
                node.resume()
            else:
                node.start()
        if not self.pg.running:
            self.pg.start()

    async def close(self) -> None:
        for gateway in self.gateways:
            await asyncio.to_thread(gateway.stop)
        for links in self.proxies:
            for proxy in links:
                await proxy.close()
        for node in self.nodes:
            node.stop()
        await asyncio.to_thread(self.pg.cleanup)
