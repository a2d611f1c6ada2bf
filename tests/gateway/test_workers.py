"""``fencegate serve --workers N``: real supervisor and worker processes on a free port.

Every worker binds the port with SO_REUSEPORT, so fresh connections (one per
request, as a load balancer's) land on both; which worker counted what is read
from its own prometheus-client multiprocess file in the server's shared dir.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from gateway.cli import main
from gateway.config import ConfigError, load_config, parse_config
from gateway.hotlocks import HotLocks
from tests._servers import RedisNode, free_port
from tests.gateway._tls import make_cert

ROOT = Path(__file__).resolve().parents[2]


class Server:
    """A ``fencegate serve`` process (a supervisor when workers > 1), logging to a file."""

    def __init__(self, tmp_path: Path, redis: list[RedisNode] | None, *lines: str) -> None:
        self.port = free_port()
        self.host = "127.0.0.1"
        self.tmp_path = tmp_path
        self.log = tmp_path / "gateway.log"
        self.config = tmp_path / "fencegate.toml"
        self.lines = [f'listen = "127.0.0.1:{self.port}"', *lines]
        if redis is not None:
            urls = ", ".join(f'"{node.url}"' for node in redis)
            self.lines += ["[locks]", f"redis = [{urls}]"]
        self.lines += ["[stores.files]", 'type = "files"', f'root = "{tmp_path / "data"}"']
        self.scheme = "http"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    def start(self, *args: str) -> Server:
        self.config.write_text("\n".join(self.lines) + "\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith("FENCEGATE_")}
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gateway", "serve", "--config", str(self.config), *args],
                cwd=self.tmp_path, env={**env, "PYTHONPATH": str(ROOT)}, stdout=log, stderr=log,
            )  # fmt: skip
        return self

    def text(self) -> str:
        return self.log.read_text()

    def workers(self) -> dict[int, int]:
        """Worker index -> pid of the newest start of each, from the log."""
        found = re.findall(r"worker (\d+) started: pid (\d+)", self.text())
        return {int(index): int(pid) for index, pid in found}

    def shared_dir(self) -> Path:
        found = re.search(r"metrics merged in (\S+)", self.text())
        assert found, self.text()
        return Path(found[1])

    async def listening(self, count: int, within: float = 60.0) -> None:
        """Wait until ``count`` workers log that they listen (or the single process does)."""
        deadline = time.monotonic() + within
        while len(re.findall(r" listening on ", self.text())) < count:
            assert self.proc is not None
            assert self.proc.poll() is None, self.text()
            assert time.monotonic() < deadline, "the workers did not start:\n" + self.text()
            await asyncio.sleep(0.05)

    async def ready(self, pids: Iterable[int], within: float = 60.0) -> None:
        """Wait until the supervisor counts each worker of ``pids`` ready (its mark file)."""
        deadline = time.monotonic() + within
        shared = self.shared_dir()
        while not all((shared / f"ready-{pid}").exists() for pid in pids):
            assert time.monotonic() < deadline, "the workers did not get ready:\n" + self.text()
            await asyncio.sleep(0.02)

    async def exited(self, within: float = 40.0) -> int:
        assert self.proc is not None
        return await asyncio.to_thread(self.proc.wait, within)

    def stop(self) -> None:
        """Kill what is left (after a failed test): the supervisor, then its workers."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pid in self.workers().values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    # A fresh connection per request, so that SO_REUSEPORT spreads them over the workers.
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=40)
    ) as session:
        yield session


async def scrape(session: aiohttp.ClientSession, url: str) -> dict[tuple[str, str], float]:
    """``/metrics`` as {(sample name, sorted labels): value}."""
    async with session.get(url + "/metrics") as response:
        assert response.status == 200
        text = await response.text()
    return {
        (s.name, ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def per_worker(shared: Path, pid: int, name: str, labels: str) -> float:
    """What worker ``pid`` alone counted, from its own multiprocess file."""
    path = shared / f"counter_{pid}.db"
    for family in MultiProcessCollector.merge([str(path)], accumulate=True):  # type: ignore[no-untyped-call]
        for s in family.samples:
            if s.name == name and ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())) == (
                labels
            ):
                return float(s.value)
    return 0.0


INSPECT = "fencegate_http_requests_total", "method=GET,route=/v1/locks/{name},status=200"
HELD = "fencegate_lock_acquisitions_total", "result=held"


async def test_two_workers_both_serve_and_one_scrape_adds_their_counters(
    tmp_path: Path, redis1: list[RedisNode], session: aiohttp.ClientSession
) -> None:
    server = Server(tmp_path, redis1, "workers = 2").start()
    try:
        await server.listening(2)
        pids = server.workers()
        assert sorted(pids) == [0, 1]
        assert server.proc is not None
        assert server.proc.pid not in pids.values()
        for i in range(60):
            async with session.get(f"{server.url}/v1/locks/some/{i}") as response:
                assert response.status == 200
        leases = []
        for i in range(8):
            async with session.post(f"{server.url}/v1/locks/held/{i}", json={"ttl_ms": 30_000}):
                leases.append(i)

        metrics = await scrape(session, server.url)
        assert metrics[INSPECT] == 60
        shared = server.shared_dir()
        served = [per_worker(shared, pid, *INSPECT) for pid in pids.values()]
        assert all(count > 0 for count in served), served  # both workers answered
        assert sum(served) == 60
        granted = ("fencegate_lock_acquisitions_total", "result=granted")
        assert metrics[granted] == 8
        assert metrics[("fencegate_workers", "")] == 2
        assert metrics[("fencegate_worker_restarts_total", "")] == 0
        assert metrics[("process_cpu_seconds_total", "")] > 0

        deadline = time.monotonic() + 10  # leases_held is refreshed every second per worker
        while (await scrape(session, server.url))[("fencegate_leases_held", "")] != 8:
            assert time.monotonic() < deadline, "leases_held never summed to 8"
            await asyncio.sleep(0.2)

        server.proc.send_signal(signal.SIGTERM)
        assert await server.exited() == 0
        assert not shared.exists()  # the supervisor removed the shared directory
    finally:
        server.stop()
    assert "Traceback" not in server.text()


async def test_hot_stats_of_any_worker_cover_every_worker(
    tmp_path: Path, redis1: list[RedisNode], session: aiohttp.ClientSession
) -> None:
    server = Server(tmp_path, redis1, "workers = 2", "shutdown_grace_ms = 0").start()
    try:
        await server.listening(2)
        async with session.post(f"{server.url}/v1/locks/hot/a", json={"ttl_ms": 30_000}) as r:
            assert r.status == 200
        waiters = 24

        async def wait_once() -> int:
            body = {"ttl_ms": 1000, "wait_ms": 300}
            async with session.post(f"{server.url}/v1/locks/hot/a", json=body) as response:
                return response.status

        assert await asyncio.gather(*(wait_once() for _ in range(waiters))) == [409] * waiters
        shared = server.shared_dir()
        held = [per_worker(shared, pid, *HELD) for pid in server.workers().values()]
        assert all(count > 0 for count in held), held  # both workers saw waiters
        assert sum(held) == waiters

        deadline = time.monotonic() + 10  # each worker publishes its snapshot every second
        answers: list[Any] = []
        while len(answers) < 8:  # eight answers in a row, from either worker: all of them
            async with session.get(f"{server.url}/v1/stats/hot?n=5") as response:
                assert response.status == 200
                top = (await response.json())["by_waits"][0]
            if top["waits"] == waiters:
                answers.append(top)
            else:
                answers.clear()
                assert time.monotonic() < deadline, f"hot stats not merged: {top}"
                await asyncio.sleep(0.2)
        assert all(a["name"] == "hot/a" and a["timeouts"] == waiters for a in answers)
    finally:
        server.stop()


async def test_sigterm_drains_every_worker_and_finishes_a_request_in_flight(
    tmp_path: Path, redis1: list[RedisNode], session: aiohttp.ClientSession
) -> None:
    server = Server(
        tmp_path, redis1, "workers = 2", "shutdown_timeout_ms = 8000", "shutdown_grace_ms = 2000"
    ).start()
    try:
        await server.listening(2)
        pids = list(server.workers().values())
        async with session.post(f"{server.url}/v1/locks/files/k", json={"ttl_ms": 30_000}) as r:
            token = (await r.json())["token"]

        async def waiter() -> tuple[int, Any]:
            body = {"ttl_ms": 1000, "wait_ms": 25_000}
            async with session.post(f"{server.url}/v1/locks/files/k", json=body) as response:
                return response.status, await response.json()

        waiting = [asyncio.create_task(waiter()) for _ in range(10)]
        # a PUT whose body is still coming when the signal arrives
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        body = b"written while draining"
        writer.write(
            f"PUT /v1/stores/files/k HTTP/1.1\r\nHost: x\r\nX-Fencing-Token: {token}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body[:5]
        )
        await writer.drain()
        await asyncio.sleep(0.5)
        assert not any(task.done() for task in waiting)

        assert server.proc is not None
        server.proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.2)  # draining now; the listener stays open for the grace period
        writer.write(body[5:])  # the request in flight at the signal finishes: 200, written
        await writer.drain()
        answers = await asyncio.gather(*waiting)
        assert all(a == (503, a[1]) and a[1]["error"] == "shutting_down" for a in answers), answers
        status_line = await asyncio.wait_for(reader.readline(), 10)
        writer.close()
        assert status_line.startswith(b"HTTP/1.1 200"), status_line
        while True:  # both workers keep the listener open for the grace period, then close
            try:
                async with session.get(server.url + "/readyz") as response:
                    assert response.status == 503
            except aiohttp.ClientConnectionError:
                break
            await asyncio.sleep(0.05)
        assert await server.exited() == 0
        for pid in pids:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
        assert (tmp_path / "data" / "k").read_bytes() == body
    finally:
        server.stop()
    log = server.text()
    assert log.count("draining: /readyz is 503") == 2
    assert log.rstrip().endswith("fencegate: stopped")
    assert "Traceback" not in log


async def test_a_killed_worker_is_restarted_and_its_counts_stay(
    tmp_path: Path, redis1: list[RedisNode], session: aiohttp.ClientSession
) -> None:
    server = Server(tmp_path, redis1, "workers = 2", "shutdown_grace_ms = 0").start()
    try:
        await server.listening(2)
        for i in range(20):
            async with session.get(f"{server.url}/v1/locks/x/{i}") as response:
                assert response.status == 200
        victim = server.workers()[1]
        os.kill(victim, signal.SIGKILL)
        await server.listening(3)  # the new worker 1
        assert server.workers()[1] != victim
        log = server.text()
        assert re.search(
            rf"WARNING fencegate: worker 1 \(pid {victim}\) was killed by SIGKILL; "
            r"starting it again in [\d.]+ s",
            log,
        ), log
        metrics = await scrape(session, server.url)
        assert metrics[INSPECT] == 20  # the dead worker's requests still count
        assert metrics[("fencegate_workers", "")] == 2
        assert metrics[("fencegate_worker_restarts_total", "")] == 1
        assert server.proc is not None
        server.proc.send_signal(signal.SIGTERM)
        assert await server.exited() == 0
    finally:
        server.stop()


async def test_workers_that_crash_at_start_in_a_loop_make_the_supervisor_give_up(
    tmp_path: Path, redis1: list[RedisNode], session: aiohttp.ClientSession
) -> None:
    cert, key = make_cert(tmp_path / "tls")
    server = Server(
        tmp_path, redis1, "workers = 2", "shutdown_grace_ms = 0", f'[tls]\ncert = "{cert}"',
        f'key = "{key}"',
    )  # fmt: skip
    server.start()
    try:
        await server.listening(2)  # https, on both
        first = server.workers()
        # A worker logs "listening" just before it marks itself ready; killed in between,
        # it would count as failing to start (the supervisor stops at once, no backoff).
        await server.ready(first.values())
        cert.write_text("not a certificate\n")  # every worker started from now on fails
        os.kill(first[0], signal.SIGKILL)
        started = time.monotonic()
        assert await server.exited(within=60) == 1
        took = time.monotonic() - started
        for pid in first.values():
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
    finally:
        server.stop()
    log = server.text()
    delays = [float(d) for d in re.findall(r"starting it again in ([\d.]+) s", log)]
    assert delays == [0.25, 0.5, 1.0, 2.0], log  # backs off, then stops trying
    assert took >= sum(delays)
    assert re.search(
        r"ERROR fencegate: worker 0 \(pid \d+\) exited with status 1; .*giving up", log
    )
    assert log.count("cannot start: ") == 4  # each restart says why it failed
    assert "Traceback" not in log


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


async def test_workers_0_is_one_per_core(
    tmp_path: Path, redis1: list[RedisNode], session: aiohttp.ClientSession
) -> None:
    metrics_port = free_port()
    server = Server(
        tmp_path, redis1, "shutdown_grace_ms = 0", f'metrics_listen = "127.0.0.1:{metrics_port}"'
    )
    if _ipv6_loopback():  # and an IPv6 address, which SO_REUSEPORT serves as well
        server.host = "::1"
        server.lines[0] = f'listen = "[::1]:{server.port}"'
    orphan = Path(tempfile.gettempdir()) / "fencegate-workers-test-orphan"
    orphan.mkdir(exist_ok=True)
    (orphan / "workers").write_text(f"{_dead_pid()}\n")  # as a SIGKILLed supervisor leaves it
    server.start("--workers", "0")
    cores = len(os.sched_getaffinity(0))
    try:
        await server.listening(cores)
        assert f"starting {cores} workers" in server.text()
        assert not orphan.exists()
        async with session.get(server.url + "/readyz") as response:
            assert response.status == 200
        async with session.get(server.url + "/metrics") as response:
            assert response.status == 404  # metrics_listen: on that address alone
        metrics = await scrape(session, f"http://127.0.0.1:{metrics_port}")
        assert metrics[("fencegate_workers", "")] == cores
        assert server.proc is not None
        server.proc.send_signal(signal.SIGINT)  # Ctrl-C drains as SIGTERM does
        assert await server.exited() == 0
    finally:
        server.stop()


async def test_a_port_in_use_is_refused_before_any_worker_starts(
    tmp_path: Path, redis1: list[RedisNode]
) -> None:
    server = Server(tmp_path, redis1, "workers = 2")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", server.port))
        taken.listen()
        server.start()
        assert await server.exited() == 1
    log = server.text()
    refusal = f"cannot listen on 127.0.0.1:{server.port} (listen): address already in use"
    assert f"cannot start: {refusal}" in log
    assert "worker 0 started" not in log


async def test_one_worker_runs_no_supervisor(
    tmp_path: Path, redis1: list[RedisNode], session: aiohttp.ClientSession
) -> None:
    server = Server(tmp_path, redis1, "workers = 1", "shutdown_grace_ms = 0").start()
    try:
        await server.listening(1)
        assert "fencegate listening on" in server.text()
        assert "supervisor" not in server.text()
        metrics = await scrape(session, server.url)
        assert ("fencegate_workers", "") not in metrics
        assert ("python_gc_collections_total", "generation=0") in metrics
        assert server.proc is not None
        server.proc.send_signal(signal.SIGTERM)
        assert await server.exited() == 0
    finally:
        server.stop()


# configuration
REDIS = {"redis": ["redis://127.0.0.1:7101"]}


@pytest.mark.parametrize(
    ("raw", "names"),
    [
        ({"workers": 2}, ["'workers'", "[locks] redis or groups", "in-process"]),
        ({"workers": 0}, ["'workers'", "[locks] redis or groups"]),
        ({"workers": -1, "locks": REDIS}, ["'workers'", "at least 0"]),
        ({"workers": "2", "locks": REDIS}, ["'workers'", "whole number"]),
        ({"workers": 1000, "locks": REDIS}, ["'workers'", "at most 256"]),
        ({"workers": 2, "locks": REDIS, "listen": "127.0.0.1:0"}, ["'workers'", "fixed port"]),
        ({"workers": 2, "locks": REDIS, "metrics_listen": "127.0.0.1:0"}, ["fixed port"]),
    ],
)
def test_workers_config_errors_name_the_key(raw: dict[str, Any], names: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    for name in names:
        assert name in str(info.value), (name, str(info.value))


def test_workers_run_over_redis_or_redlock_groups() -> None:
    groups = {"groups": [["redis://127.0.0.1:7101"], ["redis://127.0.0.1:7102"]]}
    for locks in (REDIS, groups):
        assert parse_config({"listen": "127.0.0.1:8080", "workers": 2, "locks": locks}).workers == 2


def test_workers_from_file_environment_and_command_line(tmp_path: Path) -> None:
    path = tmp_path / "fencegate.toml"
    path.write_text('workers = 3\n[locks]\nredis = ["redis://127.0.0.1:7101"]\n')
    assert load_config(path).workers == 3
    assert load_config(path, env={"FENCEGATE_WORKERS": "4"}).workers == 4
    assert load_config(path, env={"FENCEGATE_WORKERS": "4"}, overrides={"workers": 2}).workers == 2
    zero = load_config(path, env={"FENCEGATE_WORKERS": "0"})
    assert zero.worker_count == len(os.sched_getaffinity(0))
    assert load_config(None).workers == 1  # the default: one process, no supervisor
    with pytest.raises(ConfigError, match="FENCEGATE_WORKERS"):
        load_config(path, env={"FENCEGATE_WORKERS": "many"})


def test_check_config_shows_workers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "fencegate.toml"
    path.write_text('workers = 2\n[locks]\nredis = ["redis://127.0.0.1:7101"]\n')
    assert main(["check-config", str(path)]) == 0
    assert ", 2 workers, locks 1 redis node(s)" in capsys.readouterr().out
    path.write_text("workers = 2\n")
    assert main(["check-config", str(path)]) == 1
    assert "'workers' has value 2" in capsys.readouterr().err


def test_hot_snapshots_of_other_workers_add_to_this_ones() -> None:
    mine, other = HotLocks(), HotLocks()
    for _ in range(3):
        mine.record("a", 0.5)
        other.record("a", 0.25, timed_out=True)
    other.record("b", 2.0)
    other.started_waiting("a")
    snapshot = json.loads(json.dumps(other.snapshot()))  # as a worker writes and reads it
    by_waits = mine.top(5, by="waits", others=[snapshot])
    assert [(h.name, h.waits, h.timeouts, h.waiting_now) for h in by_waits] == [
        ("a", 6, 3, 1),
        ("b", 1, 0, 0),
    ]
    by_time = mine.top(5, others=[snapshot])
    assert [(h.name, h.wait_seconds) for h in by_time] == [("a", 2.25), ("b", 2.0)]
    assert [h.waits for h in mine.top(5)] == [3]  # alone: this worker's own counts


async def test_workers_drain_and_exit_when_the_supervisor_is_killed(
    tmp_path: Path, redis1: list[RedisNode]
) -> None:
    server = Server(tmp_path, redis1, "workers = 2", "shutdown_grace_ms = 0").start()
    try:
        await server.listening(2)
        assert server.proc is not None
        server.proc.kill()  # SIGKILL: the supervisor cannot pass anything on
        server.proc.wait()
        deadline = time.monotonic() + 20
        for pid in server.workers().values():
            while b"Z" not in _state(pid):  # gone, or a zombie: it exited
                assert time.monotonic() < deadline, f"worker {pid} outlived its supervisor"
                await asyncio.sleep(0.05)
    finally:
        server.stop()
    assert server.text().count(") stopped") == 2  # each drained: "worker N (pid P) stopped"


def _state(pid: int) -> bytes:
    """The state field of /proc/PID/stat; "Z" once the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rpartition(b")")[2][:3]
    except OSError:
        return b"Z"
