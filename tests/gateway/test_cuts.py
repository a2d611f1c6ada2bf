"""``gateway.cuts.Cut``: one cancellation of a request's task, for its first reason,
taken back without leaving anything behind in the task (real asyncio, no server).

The guard (``gateway.guard``) relies on these: a cut taken back before it fires never
fires (the task goes on to write the answer after the handler), and one that fired
leaves the task's cancellation count where it found it.
"""

from __future__ import annotations

import asyncio
import contextlib

from gateway.cuts import Cut


async def test_a_cut_taken_back_before_its_deadline_never_fires() -> None:
    async def request() -> str | None:
        cut = Cut(asyncio.current_task(), 0.05)  # type: ignore[arg-type]
        await asyncio.sleep(0.01)  # the handler: done well before the deadline
        assert cut.take_back() is False
        await asyncio.sleep(0.1)  # later awaits (writing the answer) past the deadline
        return cut.reason

    assert await asyncio.create_task(request()) is None


async def test_a_cut_that_fired_leaves_the_task_as_it_found_it() -> None:
    async def request() -> tuple[bool, int, str]:
        cut = Cut(asyncio.current_task(), 0.01)  # type: ignore[arg-type]
        # a handler that finished all the same (a grant that stands)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(1.0)
        alone = cut.take_back()
        task = asyncio.current_task()
        assert task is not None
        timed_out = "not timed out"
        try:  # an asyncio.timeout after it still times out as it should
            async with asyncio.timeout(0.01):
                await asyncio.sleep(1.0)
        except TimeoutError:
            timed_out = "timed out"
        return alone, task.cancelling(), timed_out

    assert await asyncio.create_task(request()) == (True, 0, "timed out")


async def test_the_first_reason_is_the_one_and_cancels_once() -> None:
    """Drain, then the deadline passes while the cut handler still runs: one
    cancellation, the drain's; the deadline does not cut the cleanup again."""

    async def request() -> tuple[str | None, bool, int]:
        cut = Cut(asyncio.current_task(), 0.02)  # type: ignore[arg-type]
        asyncio.get_running_loop().call_soon(cut.fire, Cut.DRAIN)
        cancels = 0
        for _ in range(2):  # waiting, then its cleanup past the deadline
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                cancels += 1
        return cut.reason, cut.take_back(), cancels

    assert await asyncio.create_task(request()) == (Cut.DRAIN, True, 1)
