"""benchmarks/loadgen.py: the load generators do real lock cycles, and count them right.

Each runs briefly against a real gateway (``benchmarks.workers.start_server``,
the benchmark's own) on one real redis-server; its counts are checked against
the gateway's ``/metrics`` and against what is left in Redis.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

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


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_cyclegen_releases_every_lease_it_took_and_counts_as_the_gateway(
    two_workers: Server, redis1: list[RedisNode], tmp_path: Path
) -> None:
    gen = prepare("cyclegen", tmp_path)
    before = lock_route_counts(two_workers.port)
    result = gen.run(two_workers.port, 1.5, "t", connections=CONNECTIONS)
    counted = count_delta(lock_route_counts(two_workers.port), before)

    assert result["acquired"] > CONNECTIONS  # several cycles per connection
    assert result["released"] == result["acquired"]
    assert (result["other"], result["codes"], result["errors"], result["held"]) == (0, {}, 0, 0)
    assert result["requests"] == 2 * result["acquired"]
    assert counted == {"POST 200": result["acquired"], "DELETE 204": result["released"]}
    assert agreement(result, counted, exact=True) is None
    # every name distinct (one fence counter each), and no lock left held
    assert _keys(redis1[0], "fence:*") == result["acquired"]
    assert _keys(redis1[0], "lock:*") == 0
    assert 0 < result["p50_ms"] <= result["p99_ms"]
    assert result["cpu_s"] > 0
    assert 1.5 <= result["seconds"] < 1.5 + 5


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_cyclegen_counts_each_refusal_by_its_status(
    redis1: list[RedisNode], tmp_path: Path
) -> None:
    server = start_server("1", list(redis1), tmp_path)
    try:
        before = lock_route_counts(server.port)
        # ttl_ms 1 is below [locks] min_ttl_ms (10): every acquire is a 400
        gen = prepare("cyclegen", tmp_path)
        out = gen.run(server.port, 0.5, "bad", connections=4, ttl_ms=1)
        counted = count_delta(lock_route_counts(server.port), before)
    finally:
        stop_server(server)
    assert out["acquired"] == out["released"] == 0
    assert out["other"] == out["requests"] > 0
    assert out["codes"] == {"400": out["requests"]}
    assert counted == {"POST 400": out["requests"]}
    assert agreement(out, counted, exact=True) is None
    assert agreement({**out, "other": out["other"] - 1}, counted, exact=True) is not None


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_cyclegen_outlives_a_killed_worker_and_counts_what_it_lost(
    two_workers: Server, tmp_path: Path
) -> None:
    gen = prepare("cyclegen", tmp_path)
    worker = two_workers.pids()[1]
    killer = threading.Timer(1.0, os.kill, (worker, signal.SIGKILL))
    killer.start()
    try:
        result = gen.run(two_workers.port, 3, "k", connections=CONNECTIONS)
    finally:
        killer.cancel()
    # the killed worker's connections reset: counted, reconnected (to the other worker or
    # the restarted one), their DELETEs sent again; a lease is lost only with an error
    assert result["errors"] >= 1
    assert result["released"] > CONNECTIONS
    assert 0 <= result["acquired"] - result["released"] <= result["errors"]
    assert set(result["codes"]) <= {"409"}  # a DELETE sent again after the first one landed


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
