"""The fencing contract of base.py, shown for every kind of store over real storage."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from storage_adapters import (
    BadValue,
    FencedStore,
    NotFound,
    Record,
    StaleToken,
    StorageUnavailable,
)
from tests.storage_adapters.conftest import Backend, Recorder

SCOPE = "orders/42"
KEY = "orders/42"


async def test_stale_token_is_rejected_and_nothing_is_applied(
    store: FencedStore, backend: Backend
) -> None:
    assert await store.put(SCOPE, KEY, 7, backend.body(7)) == 7
    with pytest.raises(StaleToken) as caught:
        await store.put(SCOPE, KEY, 6, backend.body(6))
    assert (caught.value.token, caught.value.high_water, caught.value.scope) == (6, 7, SCOPE)
    assert caught.value.code == "stale_token"
    assert str(caught.value) == f"token 6 is older than the high-water mark 7 of scope {SCOPE!r}"
    record = await store.get(SCOPE, KEY, None)
    assert backend.value(record) == 7
    assert record.token == 7


async def test_equal_token_is_accepted_for_many_writes(
    store: FencedStore, backend: Backend
) -> None:
    for n in range(5):
        assert await store.put(SCOPE, KEY, 3, backend.body(100 + n)) == 3
    assert backend.value(await store.get(SCOPE, KEY, None)) == 104


async def test_higher_token_raises_the_mark(store: FencedStore, backend: Backend) -> None:
    await store.put(SCOPE, KEY, 1, backend.body(1))
    await store.put(SCOPE, KEY, 9, backend.body(9))
    with pytest.raises(StaleToken) as caught:
        await store.put(SCOPE, KEY, 8, backend.body(8))
    assert caught.value.high_water == 9
    assert backend.value(await store.get(SCOPE, KEY, None)) == 9


async def test_the_mark_is_per_scope(store: FencedStore, backend: Backend) -> None:
    await store.put("lock-a", "a", 50, backend.body(1))
    assert await store.put("lock-b", "b", 1, backend.body(2)) == 1
    # A coarser scope fences several keys together.
    await store.put("table", "c", 10, backend.body(3))
    with pytest.raises(StaleToken):
        await store.put("table", "d", 9, backend.body(4))
    with pytest.raises(NotFound):
        await store.get("table", "d", None)


async def test_fenced_read_prevents_the_lost_update(store: FencedStore, backend: Backend) -> None:
    """The read-modify-write of DESIGN.md: holder 2's read must stop holder 1's late write."""
    await store.put("counter", "counter", 1, backend.body(10))
    # holder 1 (token 7) reads, then pauses past its TTL
    first = await store.get("counter", "counter", 7)
    # holder 2 (token 8) reads the same value: its read raises the mark to 8
    second = await store.get("counter", "counter", 8)
    assert backend.value(first) == backend.value(second) == 10
    # holder 1 wakes up and writes: refused, although nobody has written with 8 yet
    with pytest.raises(StaleToken) as caught:
        await store.put("counter", "counter", 7, backend.body(backend.value(first) + 1))
    assert caught.value.high_water == 8
    await store.put("counter", "counter", 8, backend.body(backend.value(second) + 1))
    assert backend.value(await store.get("counter", "counter", None)) == 11


async def test_fenced_read_with_a_stale_token_is_refused(
    store: FencedStore, backend: Backend
) -> None:
    await store.put(SCOPE, KEY, 5, backend.body(5))
    with pytest.raises(StaleToken) as caught:
        await store.get(SCOPE, KEY, 4)
    assert caught.value.high_water == 5
    record = await store.get(SCOPE, KEY, 5)  # equal: allowed
    assert (backend.value(record), record.token) == (5, 5)


async def test_fenced_read_of_a_missing_key_still_raises_the_mark(store: FencedStore) -> None:
    with pytest.raises(NotFound) as caught:
        await store.get(SCOPE, "missing", 6)
    assert caught.value.key == "missing"
    assert caught.value.code == "not_found"
    with pytest.raises(StaleToken):
        await store.put(SCOPE, "missing", 5, b"{}")


async def test_plain_read_does_not_touch_the_mark(store: FencedStore, backend: Backend) -> None:
    await store.put(SCOPE, KEY, 5, backend.body(5))
    assert (await store.get(SCOPE, KEY, None)).token == 5
    assert await store.put(SCOPE, KEY, 5, backend.body(6)) == 5


async def test_delete_is_fenced_and_idempotent(store: FencedStore, backend: Backend) -> None:
    await store.put(SCOPE, KEY, 5, backend.body(5))
    with pytest.raises(StaleToken):
        await store.delete(SCOPE, KEY, 4)
    assert backend.value(await store.get(SCOPE, KEY, None)) == 5  # nothing deleted
    await store.delete(SCOPE, KEY, 6)
    with pytest.raises(NotFound):
        await store.get(SCOPE, KEY, None)
    await store.delete(SCOPE, KEY, 6)  # missing: not an error
    await store.delete(SCOPE, "never-written", 8)  # ... and the mark still moves
    with pytest.raises(StaleToken) as caught:
        await store.put(SCOPE, KEY, 7, backend.body(7))
    assert caught.value.high_water == 8


async def test_token_none_bypasses_fencing(store: FencedStore, backend: Backend) -> None:
    await store.put(SCOPE, KEY, 10, backend.body(10))
    assert await store.put(SCOPE, KEY, None, backend.body(1)) is None
    record = await store.get(SCOPE, KEY, None)
    assert (backend.value(record), record.token) == (1, None)
    # no mark update either way: 10 still passes, 9 still fails
    await store.put(SCOPE, KEY, 10, backend.body(10))
    with pytest.raises(StaleToken):
        await store.put(SCOPE, KEY, 9, backend.body(9))
    await store.delete(SCOPE, KEY, None)
    with pytest.raises(NotFound):
        await store.get(SCOPE, KEY, None)


@pytest.mark.parametrize("token", [0, -1, 2**63, True, 1.5, "5"])
async def test_malformed_tokens_are_bad_values(store: FencedStore, token: object) -> None:
    with pytest.raises(BadValue):
        await store.put(SCOPE, KEY, token, b"{}")  # type: ignore[arg-type]
    with pytest.raises(BadValue):
        await store.get(SCOPE, KEY, token)  # type: ignore[arg-type]


async def test_largest_token_fits(store: FencedStore, backend: Backend) -> None:
    top = 2**63 - 1
    assert await store.put(SCOPE, KEY, top, backend.body(1)) == top
    assert (await store.get(SCOPE, KEY, top)).token == top


async def test_hooks_see_writes_and_rejections(backend: Backend) -> None:
    hooks = Recorder()
    async with backend.make(hooks=hooks) as store:
        name = store.name
        await store.put(SCOPE, KEY, 2, backend.body(2))
        with pytest.raises(StaleToken):
            await store.put(SCOPE, KEY, 1, backend.body(1))
        with pytest.raises(StaleToken):
            await store.get(SCOPE, KEY, 1)
        await store.delete(SCOPE, KEY, 3)
    assert hooks.writes == [(name, True), (name, False), (name, True)]
    assert hooks.rejections == [(name, "stale_token"), (name, "stale_token")]


async def test_calls_before_start_are_unavailable(backend: Backend) -> None:
    store = backend.make()
    with pytest.raises(StorageUnavailable):
        await store.put(SCOPE, KEY, 1, backend.body(1))
    with pytest.raises(StorageUnavailable):
        await store.ping()


async def test_start_is_idempotent_and_ping_answers(backend: Backend) -> None:
    async with backend.make() as store:
        await store.start()
        await store.ping()
        await store.put(SCOPE, KEY, 1, backend.body(1))
    async with backend.make() as again:  # the tables / folders already exist
        assert backend.value(await again.get(SCOPE, KEY, None)) == 1


@dataclass
class Attempt:
    token: int
    start: float
    end: float
    accepted: bool


async def _writer(store: FencedStore, backend: Backend, tokens: list[int]) -> list[Attempt]:
    attempts = []
    for token in tokens:
        start = time.monotonic()
        try:
            await store.put("race", "race", token, backend.body(token))
            accepted = True
        except StaleToken:
            accepted = False
        attempts.append(Attempt(token, start, time.monotonic(), accepted))
    return attempts


async def watch_values(
    store: FencedStore, stop: asyncio.Event, value: Callable[[Record], int]
) -> list[int]:
    """Read the race key until ``stop``; return every value seen, in order."""
    seen: list[int] = []
    while not stop.is_set():
        with contextlib.suppress(NotFound):
            seen.append(value(await store.get("race", "race", None)))
        await asyncio.sleep(0)
    return seen


def check_fenced_history(attempts: list[Attempt], seen: list[int], final: int) -> None:
    """The invariants of fenced writes, from outside.

    * the value never goes back: the sequence a reader observes is non-decreasing;
    * an accepted write never carries a token older than one accepted before it started;
    * the last value is the one of the highest accepted token.
    """
    for before, after in itertools.pairwise(seen):
        assert before <= after, f"token {after} landed after token {before}"
    accepted = [a for a in attempts if a.accepted]
    assert accepted
    assert len(accepted) < len(attempts), "no write was rejected: the test proves nothing"
    for later in accepted:
        for earlier in accepted:
            if earlier.end < later.start:
                assert earlier.token <= later.token, (earlier, later)
    assert final == max(a.token for a in accepted)


async def test_interleaved_writers_on_two_instances_keep_token_order(backend: Backend) -> None:
    """Two store instances (two pools / two FileStore objects) as two gateway replicas."""
    # Roughly increasing with local disorder: what racing holders look like.
    rng = random.Random(7)
    tokens = sorted(range(1, 241), key=lambda t: t + rng.uniform(-25, 25))
    lanes = [tokens[i::6] for i in range(6)]
    async with backend.make() as one, backend.make() as two:
        stop = asyncio.Event()
        watcher = asyncio.create_task(watch_values(one, stop, backend.value))
        results = await asyncio.gather(
            *(_writer(one if i % 2 else two, backend, lane) for i, lane in enumerate(lanes))
        )
        stop.set()
        seen = await watcher
        final = backend.value(await two.get("race", "race", None))
    check_fenced_history([a for lane in results for a in lane], seen, final)


async def test_record_is_frozen(store: FencedStore, backend: Backend) -> None:
    await store.put(SCOPE, KEY, 1, backend.body(1))
    record = await store.get(SCOPE, KEY, None)
    assert isinstance(record, Record)
    with pytest.raises(AttributeError):
        record.token = 2  # type: ignore[misc]
