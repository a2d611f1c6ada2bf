"""Measured durations are not quantized by the event loop's clock.

uvloop's ``loop.time()`` advances in whole milliseconds, so a sub-millisecond
acquire measured with it reads 0.0 or 0.001: the histogram's sub-millisecond
buckets would mean nothing. Durations come from ``time.perf_counter()``.
"""

from __future__ import annotations

import asyncio

import uvloop

from lockservice import LockManager, NoEvents


class Waits(NoEvents):
    def __init__(self) -> None:
        self.seconds: list[float] = []

    def acquire_done(self, result: str, wait_seconds: float, *, kind: str = "exclusive") -> None:
        self.seconds.append(wait_seconds)


def test_acquire_durations_are_finer_than_the_uvloop_clock() -> None:
    events = Waits()

    async def cycles() -> None:
        mgr = await LockManager.connect([], events=events)
        for i in range(50):
            await mgr.release(await mgr.acquire(f"d/{i}", ttl=1.0))
        await mgr.close()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(cycles())
    assert len(events.seconds) == 50
    quantized = [s for s in events.seconds if abs(s * 1000 - round(s * 1000)) < 1e-9]
    assert len(quantized) < 10, events.seconds  # ms multiples only by chance
