"""The hot-lock tracker: bounded memory, hot names ranked first, sliding window."""

from __future__ import annotations

import random
import tracemalloc

from gateway.hotlocks import HotLocks


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
