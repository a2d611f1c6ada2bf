"""``gateway.deadlines.Deadlines``: every request's deadline on one timer (real asyncio).

The guard adds each request's ``Cut`` and marks it done before taking it back; a
request still running at its deadline is cut (``Cut.DEADLINE``), one done before
never is, whatever the order the requests end in.
"""

from __future__ import annotations

import asyncio
import contextlib

from gateway.cuts import Cut
from gateway.deadlines import Deadlines


async def _request(deadlines: Deadlines, seconds: float) -> str | None:
    """A request that takes ``seconds`` (unless cut): the reason it was cut, if it was."""
    cut = Cut(asyncio.current_task())  # type: ignore[arg-type]
    place = deadlines.add(cut)
    try:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(seconds)
    finally:
        deadlines.done(place)
        cut.take_back()
    return cut.reason


async def test_only_the_requests_past_their_deadline_are_cut() -> None:
    deadlines = Deadlines(0.1)
    quick = asyncio.create_task(_request(deadlines, 0.01))
    slow = asyncio.create_task(_request(deadlines, 1.0))
    await asyncio.sleep(0.05)
    later = asyncio.create_task(_request(deadlines, 0.1 - 0.05 + 1.0))  # due 0.05 s after slow
    started = asyncio.get_running_loop().time()
    assert await quick is None
    assert await slow == Cut.DEADLINE
    assert len(deadlines) == 1  # later runs on, its deadline still ahead
    assert await later == Cut.DEADLINE
    assert asyncio.get_running_loop().time() - started < 0.5  # at its deadline, not its end
    assert len(deadlines) == 0


async def test_the_timer_moves_on_to_the_next_deadline_when_the_oldest_is_done() -> None:
    deadlines = Deadlines(0.1)
    first = asyncio.create_task(_request(deadlines, 0.02))  # arms the timer, then is done
    await asyncio.sleep(0.05)
    second = asyncio.create_task(_request(deadlines, 1.0))  # due at 0.15 s, not cut at 0.1 s
    assert await first is None
    await asyncio.sleep(0.07)  # past the first deadline: the second still runs
    assert not second.done()
    assert await second == Cut.DEADLINE


async def test_requests_done_behind_a_long_one_do_not_pile_up() -> None:
    deadlines = Deadlines(30.0)
    long = asyncio.create_task(_request(deadlines, 0.2))
    await asyncio.sleep(0)
    for _ in range(3000):  # done in order behind the long one
        await _request(deadlines, 0)
    assert len(deadlines) == 1
    assert len(deadlines._queue) < 2100  # compacted, not 3001 places
    assert await long is None
    assert len(deadlines) == 0
    assert len(deadlines._queue) == 0


async def test_a_request_done_after_its_cut_fired_leaves_the_count_right() -> None:
    deadlines = Deadlines(0.01)

    async def cleanup_after_the_cut() -> str | None:
        cut = Cut(asyncio.current_task())  # type: ignore[arg-type]
        place = deadlines.add(cut)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(1.0)
        await asyncio.sleep(0.02)  # its cleanup, past the deadline: not cut again
        deadlines.done(place)
        cut.take_back()
        return cut.reason

    assert await asyncio.create_task(cleanup_after_the_cut()) == Cut.DEADLINE
    assert len(deadlines) == 0
    assert await asyncio.create_task(_request(deadlines, 0)) is None
    assert len(deadlines) == 0
