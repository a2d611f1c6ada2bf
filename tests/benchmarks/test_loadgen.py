"""benchmarks/loadgen.py: the load generators do real lock cycles, and count them right.

Each runs briefly against a real gateway (``benchmarks.workers.start_server``,
the benchmark's own) on one real redis-server; its counts are checked against
the gateway's ``/metrics`` and against what is left in Redis, cyclegen's also
pipelined (``--depth``) and with workers killed under it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.multiprocess import MultiProcessCollector

from benchmarks.loadgen import (
    agreement,
    build_cyclegen,
    count_delta,
    lock_route_counts,
    prepare,
)
from benchmarks.workers import Server, start_server, stop_server
from tests._servers import RedisNode

CONNECTIONS = 16


def _keys(node: RedisNode, pattern: str) -> int:
    reply = node.command("EVAL", f"return #redis.call('keys', '{pattern}')", "0")
    assert reply.startswith(b":"), reply
    return int(reply[1:].strip())


@pytest.fixture
def two_workers(redis1: list[RedisNode], tmp_path: Path) -> Iterator[Server]:
    """``fencegate serve --workers 2``, as the benchmark starts it."""
    server = start_server("2", list(redis1), tmp_path)
    yield server
    stop_server(server)


NO_CC = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")


def _post(port: int, path: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        grant: dict[str, Any] = json.loads(answer.read())
    return grant


def _release(port: int, name: str, lease_id: str) -> int:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/locks/{name}",
        method="DELETE",
        headers={"X-Lease-Id": lease_id},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        status: int = answer.status
    return status


def _nothing_lost(result: dict[str, Any]) -> tuple[int, ...]:
    return tuple(
        result[k] for k in ("errors", "failed_connects", "unfinished", "lost", "resent", "held")
    )


@NO_CC
@pytest.mark.parametrize("depth", [1, 4])
def test_cyclegen_releases_every_lease_it_took_and_counts_as_the_gateway(
    depth: int, two_workers: Server, redis1: list[RedisNode], tmp_path: Path
) -> None:
    gen = prepare(f"cyclegen:{depth}", tmp_path)
    before = lock_route_counts(two_workers.port)
    result = gen.run(two_workers.port, 1.5, "t", connections=CONNECTIONS)
    counted = count_delta(lock_route_counts(two_workers.port), before)

    assert result["depth"] == depth
    assert result["acquired"] > CONNECTIONS * depth  # several rounds per connection
    assert result["released"] == result["acquired"]
    assert (result["other"], result["codes"]) == (0, {})
    assert _nothing_lost(result) == (0, 0, 0, 0, 0, 0)
    assert result["requests"] == 2 * result["acquired"]
    assert result["syscalls"]["send"] == result["requests"] // depth  # one for each round
    assert counted == {"POST 200": result["acquired"], "DELETE 204": result["released"]}
    assert agreement(result, counted, exact=True) is None
    # every name distinct (one fence counter each), and no lock left held
    assert _keys(redis1[0], "fence:*") == result["acquired"]
    assert _keys(redis1[0], "lock:*") == 0
    assert 0 < result["p50_ms"] <= result["p99_ms"]
    assert result["cpu_s"] > 0
    assert 1.5 <= result["seconds"] < 1.5 + 5


@NO_CC
@pytest.mark.parametrize("depth", [1, 8])
def test_cyclegen_counts_each_refusal_by_its_status(
    depth: int, redis1: list[RedisNode], tmp_path: Path
) -> None:
    server = start_server("1", list(redis1), tmp_path)
    try:
        before = lock_route_counts(server.port)
        # ttl_ms 1 is below [locks] min_ttl_ms (10): every acquire is a 400, answered
        # without Redis: pipelined, several come in one read
        gen = prepare(f"cyclegen:{depth}", tmp_path)
        out = gen.run(server.port, 0.5, "bad", connections=4, ttl_ms=1)
        counted = count_delta(lock_route_counts(server.port), before)
    finally:
        stop_server(server)
    assert out["acquired"] == out["released"] == 0
    assert out["other"] == out["requests"] > 0
    assert out["requests"] % depth == 0  # whole rounds: every POST of each answered
    assert _nothing_lost(out) == (0, 0, 0, 0, 0, 0)
    assert out["codes"] == {"400": out["requests"]}
    assert counted == {"POST 400": out["requests"]}
    assert agreement(out, counted, exact=True) is None
    assert agreement({**out, "other": out["other"] - 1}, counted, exact=True) is not None


@NO_CC
def test_cyclegen_counts_a_refusal_in_the_middle_of_a_pipeline_and_stays_in_step(
    redis1: list[RedisNode], tmp_path: Path
) -> None:
    """Names cyclegen will take second of its first four and third of its next four on
    each connection are held already: those POSTs are answered 409 between 200s; every
    other answer still goes to its own request (a lease to the wrong name would be 409
    on its DELETE, a shifted stream a parse error)."""
    connections, depth, tag = 4, 4, "mid"
    server = start_server("1", list(redis1), tmp_path)
    try:
        taken = {
            f"bench/{tag}/{conn}/{n}": _post(
                server.port, f"/v1/locks/bench/{tag}/{conn}/{n}", {"ttl_ms": 60_000}
            )["lease_id"]
            for conn in range(connections)
            for n in (2, 7)  # cycles are numbered from 1 on each connection
        }
        before = lock_route_counts(server.port)
        gen = prepare(f"cyclegen:{depth}", tmp_path)
        result = gen.run(server.port, 1, tag, connections=connections)
        counted = count_delta(lock_route_counts(server.port), before)
        # still held by the leases taken here: cyclegen released only its own
        assert {_release(server.port, name, lease) for name, lease in taken.items()} == {204}
    finally:
        stop_server(server)
    refused = len(taken)
    assert result["acquired"] > 2 * connections * depth  # past the second round of each
    assert (result["other"], result["codes"]) == (refused, {"409": refused})
    assert result["released"] == result["acquired"]
    assert _nothing_lost(result) == (0, 0, 0, 0, 0, 0)
    assert result["requests"] == 2 * result["acquired"] + refused
    assert counted == {
        "POST 200": result["acquired"],
        "POST 409": refused,
        "DELETE 204": result["released"],
    }
    assert agreement(result, counted, exact=True) is None
    assert _keys(redis1[0], "lock:*") == 0


def _sockets(pid: int) -> int:
    count = 0
    with contextlib.suppress(OSError):  # gone meanwhile
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):  # closed meanwhile
                count += os.readlink(fd).startswith("socket:")
    return count


def _assert_counted_what_it_lost(result: dict[str, Any], redis: RedisNode) -> None:
    """After connections broke under it: every lease cyclegen knew of was released or
    answered 409 on a DELETE sent again (the first had landed); locks left in Redis are
    at most the POSTs whose answers were lost."""
    assert result["unfinished"] == 0
    assert result["errors"] >= 1
    assert 0 <= result["acquired"] - result["released"] == result["held"] <= result["resent"]
    assert set(result["codes"]) <= {"409"}
    assert result["other"] == result["codes"].get("409", 0) <= result["resent"]
    assert result["lost"] <= result["errors"] * result["depth"]
    assert _keys(redis, "lock:*") <= result["lost"]


@NO_CC
@pytest.mark.parametrize("depth", [1, 4])
def test_cyclegen_outlives_a_killed_worker_and_counts_what_it_lost(
    depth: int, two_workers: Server, redis1: list[RedisNode], tmp_path: Path
) -> None:
    gen = prepare(f"cyclegen:{depth}", tmp_path)
    workers = two_workers.pids()[1:]

    def kill_the_busiest() -> None:
        # SO_REUSEPORT spreads connections by hash: it may give one worker all of
        # them, so kill the worker with the most sockets (the generator's land there).
        os.kill(max(workers, key=_sockets), signal.SIGKILL)

    killer = threading.Timer(1.0, kill_the_busiest)
    killer.start()
    try:
        result = gen.run(two_workers.port, 3, "k", connections=CONNECTIONS)
    finally:
        killer.cancel()
    # the killed worker's connections reset: counted, made again (a connect that meets
    # the closing listener's reset is tried again), their DELETEs sent again
    assert result["released"] > CONNECTIONS * depth
    _assert_counted_what_it_lost(result, redis1[0])


def _lock_answers_of(pid: int) -> float:
    """The lock route's answers worker ``pid`` counted, from its own multiprocess file."""
    shared = dict(
        item.split("=", 1)
        for item in Path(f"/proc/{pid}/environ").read_text().split("\0")
        if "=" in item
    )["PROMETHEUS_MULTIPROC_DIR"]
    path = Path(shared) / f"counter_{pid}.db"
    families = MultiProcessCollector.merge([str(path)], accumulate=True)  # type: ignore[no-untyped-call]
    return sum(
        s.value
        for family in families
        for s in family.samples
        if s.name == "fencegate_http_requests_total" and s.labels["route"] == "/v1/locks/{name}"
    )


@NO_CC
def test_cyclegen_connects_again_while_no_worker_listens(
    redis1: list[RedisNode], tmp_path: Path
) -> None:
    """The one worker of a supervisor killed: nothing listens until it is started again,
    so cyclegen's connects are refused for a while; it tries again (bounded) and goes on
    with the new worker."""
    server = start_server("1s", list(redis1), tmp_path)
    try:
        victim = server.pids()[1]
        killer = threading.Timer(0.5, os.kill, (victim, signal.SIGKILL))
        killer.start()
        try:
            result = prepare("cyclegen:4", tmp_path).run(server.port, 5, "r", connections=8)
        finally:
            killer.cancel()
        (restarted,) = server.pids()[1:]
        assert restarted != victim
        served_after = _lock_answers_of(restarted)
    finally:
        stop_server(server)
    assert result["failed_connects"] >= 1
    assert result["errors"] >= result["failed_connects"]
    _assert_counted_what_it_lost(result, redis1[0])
    assert served_after > 0  # the cycles went on with the restarted worker


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed")
@pytest.mark.parametrize("name", ["wrk-lean", "wrk"])
def test_wrk_scripts_do_cycles_and_trail_the_gateway_by_at_most_a_request_a_connection(
    name: str, two_workers: Server, redis1: list[RedisNode], tmp_path: Path
) -> None:
    gen = prepare(name, tmp_path)
    before = lock_route_counts(two_workers.port)
    result = gen.run(two_workers.port, 1, "w", connections=CONNECTIONS)
    counted = count_delta(lock_route_counts(two_workers.port), before)

    assert result["acquired"] > CONNECTIONS
    assert (result["other"], result["errors"]) == (0, 0)
    # wrk stops with requests in flight: at most one lease per connection is left held
    assert 0 <= result["acquired"] - result["released"] <= CONNECTIONS
    assert _keys(redis1[0], "lock:*") <= CONNECTIONS
    assert agreement(result, counted, exact=False, connections=CONNECTIONS) is None
    # the gateway answers 499 to a request whose client left (wrk exiting)
    assert set(counted) <= {"POST 200", "DELETE 204", "POST 499", "DELETE 499"}


def test_cyclegen_is_built_once_per_source(tmp_path: Path) -> None:
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    first = build_cyclegen(tmp_path)
    built = first.stat().st_mtime_ns
    assert build_cyclegen(tmp_path) == first
    assert first.stat().st_mtime_ns == built  # not compiled again
    assert os.access(first, os.X_OK)
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no partial file left
