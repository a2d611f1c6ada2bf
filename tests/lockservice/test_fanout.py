"""Rounds end at their node timeout, on one timer for every round over the nodes."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from lockservice.events import NoEvents
from lockservice.fanout import Deadlines, Rounds
from lockservice.resp import Reply

TIMEOUT = 0.05


def _all(replies: Sequence[object]) -> bool:
    return None not in replies


def _rounds() -> Rounds:
    return Rounds(("a:1", "b:1", "c:1"), node_timeout=TIMEOUT, events=NoEvents())


def _futures(loop: asyncio.AbstractEventLoop) -> list[asyncio.Future[Reply]]:
    return [loop.create_future() for _ in range(3)]


async def test_a_round_a_node_never_answers_ends_at_the_timeout() -> None:
    loop = asyncio.get_running_loop()
    rounds = _rounds()
    futures = _futures(loop)
    futures[0].set_result(1)
    start = loop.time()
    rnd = await rounds.run(futures, lambda r: r, _all)
    took = loop.time() - start
    assert rnd.timed_out
    assert rnd.replies == (1, None, None)
    assert TIMEOUT - 0.002 <= took < TIMEOUT + 0.5
    assert rnd.errors(lambda r: True) == {
        label: f"no reply within the node timeout ({TIMEOUT:g} s)" for label in ("b:1", "c:1")
    }


async def test_rounds_decided_early_leave_the_later_ones_their_own_timeout() -> None:
    """The timer waits for the first round; that round decided, it still ends every
    later round at that round's own timeout, not earlier, not never."""
    loop = asyncio.get_running_loop()
    rounds = _rounds()
    first = _futures(loop)
    first_round = asyncio.ensure_future(rounds.run(first, lambda r: r, _all))
    await asyncio.sleep(TIMEOUT / 2)
    second = _futures(loop)
    start = loop.time()
    second_round = asyncio.ensure_future(rounds.run(second, lambda r: r, _all))
    await asyncio.sleep(0)
    for fut in first:
        fut.set_result(1)
    assert not (await first_round).timed_out
    rnd = await second_round
    took = loop.time() - start
    assert rnd.timed_out
    assert TIMEOUT - 0.002 <= took < TIMEOUT + 0.5


async def test_a_cancelled_round_leaves_the_timer_to_the_others() -> None:
    loop = asyncio.get_running_loop()
    rounds = _rounds()
    cancelled = asyncio.ensure_future(rounds.run(_futures(loop), lambda r: r, _all))
    await asyncio.sleep(0)
    cancelled.cancel()
    await asyncio.sleep(0)
    later = _futures(loop)
    later[1].set_result(2)
    rnd = await rounds.run(later, lambda r: r, _all)
    assert cancelled.cancelled()
    assert rnd.timed_out
    assert rnd.replies == (None, 2, None)


def test_deadlines_start_afresh_on_another_loop() -> None:
    """A round queued on a loop that is gone neither holds nor blocks the next loop's."""
    deadlines = Deadlines(TIMEOUT)

    async def one() -> bool:
        loop = asyncio.get_running_loop()
        finished: asyncio.Future[bool] = loop.create_future()
        deadlines.add(loop, finished)
        return await finished

    old = asyncio.new_event_loop()
    try:
        stuck = old.create_future()
        deadlines.add(old, stuck)  # its timer never runs: the loop stops
    finally:
        old.close()
    assert asyncio.run(one()) is True
    assert asyncio.run(one()) is True
