"""The hot-lock tracker: bounded memory, hot names ranked first, sliding window."""

from __future__ import annotations

import asyncio
import random
import tracemalloc

import pytest

from gateway.hotlocks import HotLocks
from tests.gateway.conftest import Start, auth_section, bearer, make_config


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_hot_lock_ranks_first_among_a_million_cold_names() -> None:
    clock = Clock()
    hot = HotLocks(window=60.0, slices=6, capacity=256, clock=clock)
    rng = random.Random(7)
    for i in range(1_000_000):
        if i % 50 == 0:
            hot.record("orders/hot", 0.020)
        else:
            hot.record(f"cold/{i}", rng.random() * 0.010)
        if i % 100_000 == 0:
            clock.now += 1.0
    assert hot.size() <= 6 * 2 * 256
    tracemalloc.start()  # the tracker's own footprint, measured as it keeps running
    for i in range(20_000):
        hot.record(f"late/{i}", 0.001)
    hot.top(10)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 2 * 2**20, f"peak {peak / 2**20:.1f} MiB"
    by_time = hot.top(5)
    by_waits = hot.top(5, by="waits")
    assert by_time[0].name == "orders/hot"
    assert by_waits[0].name == "orders/hot"
    assert by_waits[0].waits == 20_000  # never pruned: counted exactly


def test_window_forgets_old_contention() -> None:
    clock = Clock()
    hot = HotLocks(window=60.0, slices=6, clock=clock)
    hot.record("a", 1.0)
    clock.now += 30
    hot.record("b", 0.5)
    assert [h.name for h in hot.top()] == ["a", "b"]
    clock.now += 45  # "a" left the window, "b" did not
    assert [h.name for h in hot.top()] == ["b"]
    clock.now += 60
    assert hot.top() == []


def test_current_waiters_count_and_timeouts() -> None:
    hot = HotLocks()
    hot.started_waiting("x")
    hot.started_waiting("x")
    hot.record("x", 0.1, timed_out=True)
    line = hot.top(1, by="waits")[0]
    assert (line.waiting_now, line.timeouts) == (2, 1)
    hot.stopped_waiting("x")
    hot.stopped_waiting("x")
    assert hot.top(1)[0].waiting_now == 0
    assert hot.top(1)[0].as_json() == {
        "name": "x",
        "waits": 1,
        "wait_ms": 100.0,
        "timeouts": 1,
        "waiting_now": 0,
    }


async def test_stats_hot_ranks_the_contended_lock_first(start: Start, lock_urls: list[str]) -> None:
    client = await start(make_config(lock_urls=lock_urls))
    held = await client.post("/v1/locks/orders/hot", json={"ttl_ms": 5000})
    assert held.status == 200
    for name in ("orders/cold", "orders/other"):
        assert (await client.post(f"/v1/locks/{name}", json={"ttl_ms": 5000})).status == 200

    async def waiter() -> int:
        resp = await client.post("/v1/locks/orders/hot", json={"ttl_ms": 1000, "wait_ms": 300})
        return resp.status

    statuses = await asyncio.gather(*(waiter() for _ in range(4)))
    assert statuses == [409] * 4
    resp = await client.get("/v1/stats/hot", params={"n": "2"})
    assert resp.status == 200
    body = await resp.json()
    assert body["window_s"] == 60.0
    top = body["by_wait_time"][0]
    assert top["name"] == "orders/hot"
    assert top["waits"] == 4
    assert top["timeouts"] == 4
    assert top["wait_ms"] >= 4 * 290
    assert body["by_waits"][0]["name"] == "orders/hot"
    assert all(line["name"] != "orders/cold" for line in body["by_wait_time"])


@pytest.mark.parametrize("n", ["0", "101", "x", "-1"])
async def test_stats_hot_refuses_a_bad_n(start: Start, n: str) -> None:
    client = await start(make_config())
    resp = await client.get("/v1/stats/hot", params={"n": n})
    assert resp.status == 400
    assert (await resp.json())["error"] == "bad_request"


async def test_stats_hot_needs_any_valid_key_with_auth(start: Start) -> None:
    client = await start(make_config(auth=auth_section()))
    assert (await client.get("/v1/stats/hot")).status == 401
    resp = await client.get("/v1/stats/hot", headers=bearer("reader"))
    assert resp.status == 200
