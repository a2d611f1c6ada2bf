"""Redlock groups: placement, and changes of groups with gateways of both configurations
running at once (protocol R27-R31), on real redis-server nodes."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from gateway.cli import main
from lockservice import LeaseLost, LockHeld, LockManager
from lockservice.backend import Attempt
from lockservice.carry import CarryFailed, carry_over
from lockservice.groups import Groups
from lockservice.lease import idempotency_tag
from lockservice.placement import GroupSpec, derived_id, owner
from lockservice.protocol import fence_key, holder_keys, lock_key
from tests._servers import RedisNode

NAMES = [f"grp/{i}" for i in range(24)]
QUIET = [f"quiet/{i}" for i in range(24)]  # locked before and after a change, not during
TTL = 1.0
MAX_TTL = 2.0


# placement (R27)
def test_placement_is_stable_and_even() -> None:
    """30 000 names over 3 groups: each share within 5 standard deviations of 1/3, and
    the same owner whatever the order of the groups."""
    groups = ["ga", "gb", "gc"]
    names = [f"orders/{i}" for i in range(30_000)]
    shares = Counter(owner(n, groups) for n in names)
    sd = math.sqrt(len(names) * (1 / 3) * (2 / 3))
    for g in groups:
        assert abs(shares[g] - len(names) / 3) < 5 * sd, shares
    assert all(owner(n, groups) == owner(n, groups[::-1]) for n in names[:2000])


def test_names_of_a_group_keep_their_group_when_others_come_and_go() -> None:
    """Adding a group moves only names to it (about 1/4 of them); removing one moves
    only its own names."""
    names = [f"orders/{i}" for i in range(20_000)]
    three, four = ["ga", "gb", "gc"], ["ga", "gb", "gc", "gd"]
    moved = [n for n in names if owner(n, three) != owner(n, four)]
    assert all(owner(n, four) == "gd" for n in moved)
    sd = math.sqrt(len(names) * 0.25 * 0.75)
    assert abs(len(moved) - len(names) / 4) < 5 * sd
    two = ["ga", "gc"]
    assert all(owner(n, two) == owner(n, three) for n in names if owner(n, three) != "gb")


def test_a_group_id_does_not_depend_on_the_order_of_its_nodes() -> None:
    urls = ["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"]
    assert derived_id(urls) == derived_id(urls[::-1]) != derived_id([*urls[:2], "redis://x"])
    assert GroupSpec.of(urls, "orders").id == "orders"
    with pytest.raises(ValueError, match="group id"):
        GroupSpec.of(urls, "no spaces")


def test_a_node_in_two_groups_is_refused() -> None:
    a = GroupSpec.of(["redis://127.0.0.1:1"])
    b = GroupSpec.of(["redis://127.0.0.1:1", "redis://127.0.0.1:2", "redis://127.0.0.1:3"])
    with pytest.raises(ValueError, match="is in group"):
        Groups([a, b], node_timeout=0.2, max_ttl=1.0, events=_NoEvents())


class _NoEvents:  # the Groups constructor only passes events on
    pass


# changes of groups (R28-R31)
@dataclass
class Ledger:
    """What the critical sections saw: a holder at a time per name, rising tokens."""

    inside: dict[str, tuple[str, float]] = field(default_factory=dict)  # lease id, end
    last: dict[str, int] = field(default_factory=dict)
    overlaps: list[str] = field(default_factory=list)
    backwards: list[tuple[str, int, int]] = field(default_factory=list)
    grants: int = 0

    def enter(self, name: str, lease_id: str, token: int, valid_until: float) -> None:
        now = asyncio.get_running_loop().time()
        if name in self.inside and self.inside[name][1] > now:  # still valid: two holders
            self.overlaps.append(name)
        self.inside[name] = (lease_id, valid_until)
        if token <= self.last.get(name, 0):
            self.backwards.append((name, self.last[name], token))
        self.last[name] = max(token, self.last.get(name, 0))
        self.grants += 1

    def leave(self, name: str, lease_id: str) -> None:
        if self.inside.get(name, ("", 0.0))[0] == lease_id:
            del self.inside[name]


async def _contend(managers: Sequence[LockManager], ledger: Ledger, rounds: int = 6) -> None:
    """Two tasks per name and manager take every name ``rounds`` times each."""

    async def worker(mgr: LockManager, name: str) -> None:
        for _ in range(rounds):
            lease = await mgr.acquire(name, ttl=TTL, wait=10.0)
            ledger.enter(name, lease.lease_id, lease.token, lease.valid_until)
            await asyncio.sleep(0.002)
            ledger.leave(name, lease.lease_id)
            with contextlib.suppress(LeaseLost):  # held past its ttl on a loaded machine
                await mgr.release(lease)

    tasks = [worker(m, n) for m in managers for n in NAMES for _ in range(2)]
    await asyncio.wait_for(asyncio.gather(*tasks), 120)


@pytest.fixture
async def groups(redis_pool: list[RedisNode]) -> dict[str, GroupSpec]:
    for node in redis_pool:
        if not node.alive:
            node.start()
        node.resume()
        node.flushall()
    urls = [n.url for n in redis_pool]
    specs = {
        "a": GroupSpec.of(urls[:3], "a"),
        "b": GroupSpec.of(urls[3:4], "b"),
        "c": GroupSpec.of(urls[4:5], "c"),
    }
    # A new group starts its counters at a wall-clock base (R18), above the older
    # groups' counters: c is synced first, so that its counters start *below* those of
    # a and b, as they do for a group that served before and comes back, and a moved
    # name's counter in its new group is behind unless R29 and R30 carry it.
    await (await LockManager.connect(groups=[specs["c"]], max_ttl=MAX_TTL)).close()
    await asyncio.sleep(0.02)
    for spec in (specs["a"], specs["b"]):
        await (await LockManager.connect(groups=[spec], max_ttl=MAX_TTL)).close()
        await asyncio.sleep(0.02)  # b above a: a name moving from b to a is behind too
    return specs


class Managers:
    def __init__(self) -> None:
        self.open: list[LockManager] = []

    async def make(
        self, groups: Sequence[GroupSpec], previous: Sequence[GroupSpec] = ()
    ) -> LockManager:
        mgr = await LockManager.connect(
            groups=groups, previous_groups=previous, max_ttl=MAX_TTL, node_timeout=1.0
        )
        self.open.append(mgr)
        return mgr

    async def close(self, mgr: LockManager) -> None:
        self.open.remove(mgr)
        await mgr.close()


@pytest.fixture
async def managers() -> AsyncIterator[Managers]:
    made = Managers()
    yield made
    for mgr in made.open:
        await mgr.close()


async def _change(
    made: Managers, old: Sequence[GroupSpec], new: Sequence[GroupSpec], *, carry: bool = True
) -> Ledger:
    """The procedure of README "Adding or removing a group", with the gateways of each two
    neighbouring steps contending for the same names at once."""
    moved = [n for n in NAMES if owner(n, [g.id for g in old]) != owner(n, [g.id for g in new])]
    assert 3 <= len(moved) < len(NAMES), "the names must cover moved and kept ones"
    ledger = Ledger()
    before = await made.make(old)
    await _contend([before], ledger)  # counters of the old groups well above zero
    await _once(before, QUIET, ledger)
    await _hot(old, QUIET)
    changing = await made.make(new, previous=old)
    await _contend([before, changing], ledger)  # step 1: old and changing gateways
    await made.close(before)
    if carry:
        await carry_over(new, old, max_ttl=MAX_TTL)  # step 2
    after = await made.make(new)
    await _contend([changing, after], ledger)  # step 3: changing and new gateways
    await made.close(changing)
    await _once(after, NAMES + QUIET, ledger)  # step 4: the new configuration alone
    return ledger


async def _hot(groups: Sequence[GroupSpec], names: list[str]) -> None:
    """As if each name had been granted 10^9 more times: counters far above any base."""
    ids = [g.id for g in groups]
    for spec in groups:
        for url in spec.urls:
            client = aioredis.from_url(url)
            for name in names:
                if owner(name, ids) == spec.id:
                    await client.incrby(fence_key(name), 10**9)
            await client.aclose()


async def _once(mgr: LockManager, names: list[str], ledger: Ledger) -> None:
    for name in names:
        lease = await mgr.acquire(name, ttl=TTL)
        ledger.enter(name, lease.lease_id, lease.token, lease.valid_until)
        ledger.leave(name, lease.lease_id)
        with contextlib.suppress(LeaseLost):
            await mgr.release(lease)


async def test_tokens_rise_across_adding_and_removing_a_group(
    groups: dict[str, GroupSpec], managers: Managers
) -> None:
    a, b, c = groups["a"], groups["b"], groups["c"]
    added = await _change(managers, [a, b], [a, b, c])
    assert added.overlaps == []
    assert added.backwards == []
    removed = await _change(managers, [a, b, c], [a, b])
    assert removed.overlaps == []
    assert removed.backwards == []
    assert added.grants == removed.grants == len(NAMES) * (6 * 2 * (1 + 2 + 2) + 1) + 2 * len(QUIET)


async def test_a_change_never_grants_a_name_to_two_gateways(
    groups: dict[str, GroupSpec], managers: Managers
) -> None:
    """The moved names are held by gateways of the old configuration while gateways of
    the change ask: none is granted until the old lease is released."""
    a, b = groups["a"], groups["b"]
    before = await managers.make([a])
    changing = await managers.make([a, b], previous=[a])
    moved = [n for n in NAMES if owner(n, ["a", "b"]) == "b"]
    leases = [await before.acquire(n, ttl=MAX_TTL) for n in moved]
    for name in moved:
        with pytest.raises(LockHeld):
            await changing.acquire(name, ttl=TTL)
    for lease in leases:
        await before.release(lease)
    # a release of a lease this process holds is not awaited (README, Waiting): another
    # gateway's try may reach a node before it, so the changing gateway may wait a moment
    got = [await changing.acquire(n, ttl=TTL, wait=MAX_TTL) for n in moved]
    assert all(g.token > old.token for g, old in zip(got, leases, strict=True))


async def test_without_the_old_group_a_change_grants_a_name_twice(
    groups: dict[str, GroupSpec], managers: Managers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R28 is needed: a changing gateway that locked the new group alone grants a moved
    name that a gateway of the old configuration holds, with a lower token."""
    monkeypatch.setattr(
        Groups, "route", lambda self, name: (self.groups[owner(name, self.current)],)
    )
    a, c = groups["a"], groups["c"]  # c's counters are behind a's
    name = next(n for n in NAMES if owner(n, ["a", "c"]) == "c")
    before = await managers.make([a])
    changing = await managers.make([a, c], previous=[a])
    held = await before.acquire(name, ttl=MAX_TTL)
    twice = await changing.acquire(name, ttl=MAX_TTL)
    assert held.remaining() > 0
    assert twice.remaining() > 0
    assert twice.token < held.token


async def test_without_the_carry_over_tokens_go_backwards(
    groups: dict[str, GroupSpec], managers: Managers
) -> None:
    """R30 is needed: names nobody locked during the change keep their counters in the
    old group, and the new group starts them again from 1."""
    a, b = groups["a"], groups["b"]
    before = await managers.make([a, b])
    ledger = Ledger()
    await _contend([before], ledger, rounds=2)
    await managers.close(before)
    after = await managers.make([a])
    await _once(after, NAMES, ledger)
    assert ledger.backwards


async def test_carry_over_waits_for_leases_of_the_old_configuration(
    groups: dict[str, GroupSpec], managers: Managers
) -> None:
    """Every lease of a moved name held in the old group is waited out, the longest
    decides: here one held in the old group alone (1.5 s) and a changing gateway's in
    both groups (1 s), which a renew through an old gateway could have extended in the
    old group alone (the next test); the moved counters are copied."""
    a, b = groups["a"], groups["b"]
    moved = [n for n in NAMES if owner(n, ["a", "b"]) == "b"]
    before = await managers.make([a])
    old_lease = await before.acquire(moved[0], ttl=1.5)
    granted = asyncio.get_running_loop().time()
    changing = await managers.make([a, b], previous=[a])
    both = await changing.acquire(moved[1], ttl=1.0)
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    report = await carry_over([a, b], [a], max_ttl=MAX_TTL, sleep=sleep)
    assert len(waits) == 1
    assert 1.5 - (asyncio.get_running_loop().time() - granted) - 0.05 < waits[0] <= 1.5
    assert report.moved == 2  # only these two moved names have counters yet
    await changing.release(both)
    await before.release(old_lease)
    after = await managers.make([a, b])
    lease = await after.acquire(moved[0], ttl=TTL)
    assert lease.token > old_lease.token


async def test_carry_over_with_no_lease_left_does_not_wait(
    groups: dict[str, GroupSpec], managers: Managers
) -> None:
    a, b = groups["a"], groups["b"]
    before = await managers.make([a])
    for name in NAMES:
        await before.release(await before.acquire(name, ttl=TTL))
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    report = await carry_over([a, b], [a], max_ttl=MAX_TTL, sleep=sleep)
    moved = sum(owner(n, ["a", "b"]) == "b" for n in NAMES)
    assert report.moved == moved
    assert report.scanned == len(NAMES)
    assert waits == []
    assert report.raised == moved  # one node in group b


async def test_a_moved_lease_that_lost_one_group_is_lost(
    groups: dict[str, GroupSpec], managers: Managers, redis_pool: list[RedisNode]
) -> None:
    """R31: the old group's grant gone (as when it expired there), extend is refused."""
    a, b = groups["a"], groups["b"]
    changing = await managers.make([a, b], previous=[a])
    name = next(n for n in NAMES if owner(n, ["a", "b"]) == "b")
    lease = await changing.acquire(name, ttl=TTL)
    extended = await changing.extend(lease, ttl=TTL)
    assert extended.token == lease.token
    for node in redis_pool[:3]:  # group a
        node.command("DEL", lock_key(name))
    with pytest.raises(LeaseLost):
        await changing.extend(lease, ttl=TTL)


async def test_inspect_and_issued_of_a_moved_name_cover_both_groups(
    groups: dict[str, GroupSpec], managers: Managers
) -> None:
    a, b = groups["a"], groups["b"]
    name = next(n for n in NAMES if owner(n, ["a", "b"]) == "b")
    before = await managers.make([a])
    for _ in range(3):
        await before.release(await before.acquire(name, ttl=TTL))
    last = await before.acquire(name, ttl=TTL)
    await before.release(last)
    changing = await managers.make([a, b], previous=[a])
    assert await changing.issued(name) >= last.token
    lease = await changing.acquire(name, ttl=TTL)
    assert lease.token > last.token
    info = await changing.inspect(name)
    assert info.held
    assert info.token == lease.token
    assert await changing.issued(name) == lease.token


@pytest.mark.parametrize("change", [False, True], ids=["groups", "changing"])
async def test_inspect_over_groups_says_mode_holders_and_permits(
    groups: dict[str, GroupSpec], managers: Managers, change: bool
) -> None:
    """As over one group (GET /v1/locks/{name} shows them): found by the audit, where
    every held name read as mode '' with 0 holders under [locks] groups."""
    a, b = groups["a"], groups["b"]
    mgr = await managers.make([a, b], previous=[a] if change else ())
    names = [n for n in NAMES if owner(n, ["a", "b"]) == "b"][:3]
    excl = await mgr.acquire(names[0], ttl=MAX_TTL)
    shared = [await mgr.acquire(names[1], ttl=MAX_TTL, mode="shared") for _ in range(2)]
    sems = [await mgr.acquire_semaphore(names[2], 3, ttl=MAX_TTL) for _ in range(2)]
    seen = [await mgr.inspect(n) for n in names]
    assert [(i.held, i.mode, i.holders, i.permits) for i in seen] == [
        (True, "exclusive", 1, 0),
        (True, "shared", 2, 0),
        (True, "semaphore", 2, 3),
    ]
    assert [i.token for i in seen] == [excl.token, shared[1].token, sems[1].token]
    for lease in (excl, *shared, *sems):
        await mgr.release(lease)
    assert (await mgr.inspect(names[0])).mode == ""


@pytest.mark.parametrize("new_id", ["b", "c"])
async def test_a_changing_gateways_token_is_raised_in_both_groups(
    groups: dict[str, GroupSpec], managers: Managers, new_id: str
) -> None:
    """R29: group b's counters run ahead of a's, c's behind. Whichever of the two
    grants of a moved name has the larger token, the other group is raised to it: the
    next grant by the old configuration (a alone) or by the new one (the new group
    alone) is above it."""
    a, new = groups["a"], groups[new_id]
    name = next(n for n in NAMES if owner(n, ["a", new_id]) == new_id)
    before = await managers.make([a])
    await before.release(await before.acquire(name, ttl=TTL))
    changing = await managers.make([a, new], previous=[a])
    lease = await changing.acquire(name, ttl=TTL)
    await changing.release(lease)
    later = await before.acquire(name, ttl=TTL)
    await before.release(later)
    assert later.token > lease.token
    lease = await changing.acquire(name, ttl=TTL)
    await changing.release(lease)
    after = await managers.make([a, new])
    last = await after.acquire(name, ttl=TTL)
    assert last.token > lease.token > later.token


def _toml(groups: Sequence[GroupSpec], previous: Sequence[GroupSpec]) -> str:
    def listed(specs: Sequence[GroupSpec]) -> str:
        return "[" + ", ".join(f'{{id = "{g.id}", redis = {list(g.urls)!r}}}' for g in specs) + "]"

    return f"[locks]\ngroups = {listed(groups)}\nprevious_groups = {listed(previous)}\n".replace(
        "'", '"'
    )


async def test_the_carry_command_copies_and_says_what_it_did(
    groups: dict[str, GroupSpec],
    managers: Managers,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    a, b = groups["a"], groups["b"]
    before = await managers.make([a])
    await _once(before, NAMES, Ledger())
    await managers.close(before)
    path = tmp_path / "change.toml"
    path.write_text(_toml([a, b], [a]))
    assert await asyncio.to_thread(main, ["groups", "carry", "--config", str(path)]) == 0
    moved = sum(owner(n, ["a", "b"]) == "b" for n in NAMES)
    assert f"carried: {moved} moved name(s) of {len(NAMES)} counter(s) read" in (
        capsys.readouterr().out
    )
    path.write_text(_toml([a, b], [])[: -len("previous_groups = []\n")])
    assert await asyncio.to_thread(main, ["groups", "carry", "--config", str(path)]) == 1
    assert "no [locks] previous_groups" in capsys.readouterr().err
    dead = GroupSpec.of(["redis://127.0.0.1:1"], "dead")
    path.write_text(_toml([a, dead], [a]))
    assert await asyncio.to_thread(main, ["groups", "carry", "--config", str(path)]) == 3
    assert "run it again" in capsys.readouterr().err


async def test_a_changing_gateway_waits_for_a_moved_name_in_either_group(
    groups: dict[str, GroupSpec], managers: Managers
) -> None:
    """Waiting acquires of a moved name: behind a holder of the old group (a gateway of
    the old configuration) and behind one of the new group (of the new configuration);
    each is served when that holder releases, and the old group's grant it keeps
    meanwhile is given up when it is cancelled."""
    a, b = groups["a"], groups["b"]
    name = next(n for n in NAMES if owner(n, ["a", "b"]) == "b")
    before = await managers.make([a])
    changing = await managers.make([a, b], previous=[a])
    after = await managers.make([a, b])
    for holder in (before, after):
        held = await holder.acquire(name, ttl=MAX_TTL)
        waiting = asyncio.create_task(changing.acquire(name, ttl=TTL, wait=MAX_TTL))
        await asyncio.sleep(0.2)
        assert not waiting.done()
        await holder.release(held)
        lease = await asyncio.wait_for(waiting, MAX_TTL)
        assert lease.token > held.token
        await changing.release(lease)
    held = await after.acquire(name, ttl=MAX_TTL)
    waiting = asyncio.create_task(changing.acquire(name, ttl=MAX_TTL, wait=MAX_TTL))
    clients = [aioredis.from_url(url) for url in a.urls]
    try:

        async def held_in_a() -> int:
            return sum([await c.get(lock_key(name)) is not None for c in clients])

        async def until(check: Callable[[int], bool], seconds: float) -> int:
            for _ in range(int(seconds / 0.01)):  # bounded polling: no fixed sleep
                if check(await held_in_a()):
                    break
                await asyncio.sleep(0.01)
            return await held_in_a()

        quorum = len(a.urls) // 2 + 1
        assert await until(lambda n: n >= quorum, 1.0) >= quorum  # it holds a, waits for b
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        # group a is given back at once: well before its grant of MAX_TTL would expire
        assert await until(lambda n: n == 0, MAX_TTL / 2) == 0
    finally:
        for c in clients:
            await c.aclose()


async def test_lock_kinds_of_a_moved_name_hold_in_both_groups(
    groups: dict[str, GroupSpec], managers: Managers
) -> None:
    """Shared leases and idempotent acquires of a moved name during a change: shared
    leases hold together and exclude an exclusive acquire of the old configuration; a
    repeat with the same idempotency key returns the same lease."""
    a, b = groups["a"], groups["b"]
    name = next(n for n in NAMES if owner(n, ["a", "b"]) == "b")
    before = await managers.make([a])
    changing = await managers.make([a, b], previous=[a])
    one = await changing.acquire(name, ttl=MAX_TTL, mode="shared")
    two = await changing.acquire(name, ttl=MAX_TTL, mode="shared")
    assert one.lease_id != two.lease_id
    with pytest.raises(LockHeld):
        await before.acquire(name, ttl=TTL)
    await changing.release(one)
    await changing.release(two)
    other = next(n for n in NAMES if owner(n, ["a", "b"]) == "b" and n != name)
    first = await changing.acquire(other, ttl=MAX_TTL, idempotency_key="k-1")
    again = await changing.acquire(other, ttl=MAX_TTL, idempotency_key="k-1")
    assert (again.lease_id, again.token) == (first.lease_id, first.token)


async def test_a_lease_renewed_through_an_old_gateway_is_waited_out_by_the_carry_over(
    groups: dict[str, GroupSpec], managers: Managers
) -> None:
    """R30 (the groups model's finding): a changing gateway's lease renewed through a
    gateway of the old configuration is extended in the old group alone, so it holds
    the old group longer than the new one. The carry-over waits it out; had it skipped
    the leases the new group holds, a gateway of the new configuration would take the
    name as soon as the new group's grant expired, while the lease is still valid."""
    a, b = groups["a"], groups["b"]
    name = next(n for n in NAMES if owner(n, ["a", "b"]) == "b")
    before = await managers.make([a])
    changing = await managers.make([a, b], previous=[a])
    lease = await changing.acquire(name, ttl=0.3)
    renewed = await before.extend(lease, ttl=MAX_TTL)  # the old group alone
    await managers.close(before)
    await carry_over([a, b], [a], max_ttl=MAX_TTL)
    after = await managers.make([a, b])
    other = await after.acquire(name, ttl=TTL, wait=MAX_TTL)
    assert renewed.remaining() <= 0, "two valid leases of one name"
    assert other.token > renewed.token


async def test_the_carry_over_waits_out_shared_leases_of_the_old_configuration(
    groups: dict[str, GroupSpec], managers: Managers
) -> None:
    """R30 for a group of holders: a shared lease of the old configuration (old group
    alone) beside a changing gateway's shared lease (both groups) is waited out, though
    both groups' lock:{name} read "=shared 0" (not a lease id to compare)."""
    a, b = groups["a"], groups["b"]
    name = next(n for n in NAMES if owner(n, ["a", "b"]) == "b")
    before = await managers.make([a])
    changing = await managers.make([a, b], previous=[a])
    old_reader = await before.acquire(name, ttl=MAX_TTL, mode="shared")
    new_reader = await changing.acquire(name, ttl=0.3, mode="shared")
    await managers.close(before)
    await carry_over([a, b], [a], max_ttl=MAX_TTL)
    with contextlib.suppress(LeaseLost):  # expired while the carry-over waited
        await changing.release(new_reader)
    after = await managers.make([a, b])
    writer = await after.acquire(name, ttl=TTL, wait=MAX_TTL)
    assert old_reader.remaining() <= 0, "an exclusive lease beside a valid shared one"
    assert writer.token > old_reader.token


async def _drop(spec: GroupSpec, name: str) -> None:
    """The name's hold gone in one group (as when it expired there)."""
    for url in spec.urls:
        client = aioredis.from_url(url)
        await client.delete(lock_key(name), *holder_keys(name))
        await client.aclose()


@pytest.mark.parametrize("lost", ["a", "b"])
async def test_a_repeat_never_answers_a_moved_lease_one_group_lost(
    groups: dict[str, GroupSpec], managers: Managers, lost: str
) -> None:
    """R31, R26: a moved name's tagged lease that one group no longer holds is no lease:
    neither the repeat's look-up nor its try answers it."""
    a, b = groups["a"], groups["b"]
    name = next(n for n in NAMES if owner(n, ["a", "b"]) == "b")
    changing = await managers.make([a, b], previous=[a])
    lease = await changing.acquire(name, ttl=MAX_TTL, idempotency_key="K")
    await _drop(groups[lost], name)
    tag = idempotency_tag("K", "exclusive", 0)
    backend = changing.backend
    assert isinstance(backend, Groups)
    assert await backend.find(name, tag) is None
    attempt = await backend.try_acquire(name, "f" * 32, TTL, "", tag=tag)
    assert attempt.lease_id != lease.lease_id
    backend.abandon(name, "f" * 32)
    if lost == "a":  # an old-config gateway takes the name: the repeat waits for it
        before = await managers.make([a])
        await before.acquire(name, ttl=TTL)
        with pytest.raises(LockHeld):
            await changing.acquire(name, ttl=TTL, idempotency_key="K")


async def test_a_moved_lease_is_extended_in_its_new_group_only_after_its_old_one(
    groups: dict[str, GroupSpec], managers: Managers
) -> None:
    """R31: an extend the old group refuses does not stretch the new group's grant (it
    gives it up: the next test)."""
    a, b = groups["a"], groups["b"]
    name = next(n for n in NAMES if owner(n, ["a", "b"]) == "b")
    changing = await managers.make([a, b], previous=[a])
    lease = await changing.acquire(name, ttl=TTL)
    await _drop(a, name)
    with pytest.raises(LeaseLost):
        await changing.extend(lease, ttl=MAX_TTL)
    client = aioredis.from_url(b.urls[0])
    assert await client.pttl(lock_key(name)) <= TTL * 1000
    await client.aclose()


def _slow_commit(mgr: LockManager, gid: str, delay: float) -> None:
    """This gateway's commits reach group ``gid`` ``delay`` seconds late."""
    backend = mgr.backend
    assert isinstance(backend, Groups)
    group = backend.groups[gid]
    real = group.commit

    async def slow(name: str, lease_id: str, token: int, tag: str) -> Attempt | None:
        await asyncio.sleep(delay)
        return await real(name, lease_id, token, tag)

    group.commit = slow  # type: ignore[method-assign]


async def test_crossed_commits_of_one_key_end_with_one_held_lease(
    groups: dict[str, GroupSpec], managers: Managers
) -> None:
    """R26 with R28: two shared acquires with one key through two changing gateways,
    whose commits cross (one reaches the old group first, the other the new group):
    both are answered with one lease that is held, and an exclusive acquire waits."""
    a, b = groups["a"], groups["b"]
    name = next(n for n in NAMES if owner(n, ["a", "b"]) == "b")
    one = await managers.make([a, b], previous=[a])
    two = await managers.make([a, b], previous=[a])
    _slow_commit(one, "b", 0.2)
    _slow_commit(two, "a", 0.2)
    got = await asyncio.gather(
        one.acquire(name, ttl=MAX_TTL, mode="shared", idempotency_key="K"),
        two.acquire(name, ttl=MAX_TTL, mode="shared", idempotency_key="K"),
    )
    assert got[0].lease_id == got[1].lease_id
    await asyncio.sleep(0.1)  # the lease given up is released meanwhile
    for mgr, lease in zip((one, two), got, strict=True):
        await mgr.extend(lease, ttl=MAX_TTL)  # held in both groups: no LeaseLost
    with pytest.raises(LockHeld):
        await two.acquire(name, ttl=TTL)


@pytest.mark.parametrize("case", ["shared", "semaphore", "extended_by_old"])
async def test_carry_over_waits_for_every_lease_of_a_moved_name_in_its_old_group(
    groups: dict[str, GroupSpec], managers: Managers, case: str
) -> None:
    """R30: a shared or semaphore lease of the old configuration (old group alone) is
    waited out though a changing gateway's lease of the same kind holds both groups (one
    holder group each); and a changing gateway's lease extended through a gateway of the
    old configuration (in the old group alone) is waited out too."""
    a, b = groups["a"], groups["b"]
    name = next(n for n in NAMES if owner(n, ["a", "b"]) == "b")
    before = await managers.make([a])
    changing = await managers.make([a, b], previous=[a])
    if case == "shared":
        held = await before.acquire(name, ttl=1.5, mode="shared")
        await changing.acquire(name, ttl=0.5, mode="shared")
    elif case == "semaphore":
        held = await before.acquire_semaphore(name, 2, ttl=1.5)
        await changing.acquire_semaphore(name, 2, ttl=0.5)
    else:
        held = await before.extend(await changing.acquire(name, ttl=0.5), ttl=1.5)
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    await carry_over([a, b], [a], max_ttl=MAX_TTL, sleep=sleep)
    assert len(waits) == 1
    assert waits[0] >= held.remaining()


async def test_carry_over_waits_as_long_as_any_gateway_may_grant(
    groups: dict[str, GroupSpec], managers: Managers
) -> None:
    """R30 with R19: a gateway of the old configuration with a longer max_ttl than the
    carry's config granted a longer lease; the carry waits for it, not for its own
    max_ttl alone (the nodes record the largest max_ttl of any gateway)."""
    a, b = groups["a"], groups["b"]
    name = next(n for n in NAMES if owner(n, ["a", "b"]) == "b")
    before = await LockManager.connect(groups=[a], max_ttl=4 * MAX_TTL)
    try:
        held = await before.acquire(name, ttl=2 * MAX_TTL)
    finally:
        await before.close()
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    await carry_over([a, b], [a], max_ttl=MAX_TTL, sleep=sleep)
    assert waits
    assert waits[0] >= held.remaining() > MAX_TTL


async def test_carry_over_refuses_a_node_not_synced_in_its_run(
    groups: dict[str, GroupSpec],
    managers: Managers,
    redis_pool: list[RedisNode],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """R30 with R17: group b is removed (its names move to c, whose counters are behind).
    b's node restarts empty before any gateway resynced it: the carry must not read it
    (it would copy nothing and c would issue lower tokens); it refuses, exit 3, until a
    gateway resynced the node, and then carries."""
    b, c = groups["b"], groups["c"]
    name = next(n for n in NAMES if owner(n, ["b", "c"]) == "b")
    before = await managers.make([b, c])
    for _ in range(3):
        last = await before.acquire(name, ttl=TTL)
        await before.release(last)
    await managers.close(before)
    redis_pool[3].restart(lose_data=True)  # group b's node
    with pytest.raises(CarryFailed, match="resync pending"):
        await carry_over([c], [b, c], max_ttl=MAX_TTL)
    path = tmp_path / "change.toml"
    path.write_text(_toml([c], [b, c]))
    assert await asyncio.to_thread(main, ["groups", "carry", "--config", str(path)]) == 3
    assert "resync pending" in capsys.readouterr().err
    changing = await managers.make([c], previous=[b, c])  # resyncs b's node
    await carry_over([c], [b, c], max_ttl=MAX_TTL)
    await managers.close(changing)
    after = await managers.make([c])
    lease = await after.acquire(name, ttl=TTL)
    assert lease.token > last.token


@pytest.mark.parametrize("lost", ["a", "b"])
async def test_a_moved_lease_lost_in_one_group_frees_the_other(
    groups: dict[str, GroupSpec], managers: Managers, lost: str
) -> None:
    """R31: an extend that finds the lease gone in one group gives up its grant in the
    other: the name is free at once, not held there until the lease's ttl."""
    a, b = groups["a"], groups["b"]
    name = next(n for n in NAMES if owner(n, ["a", "b"]) == "b")
    changing = await managers.make([a, b], previous=[a])
    lease = await changing.acquire(name, ttl=MAX_TTL)
    await _drop(groups[lost], name)
    with pytest.raises(LeaseLost):
        await changing.extend(lease, ttl=MAX_TTL)
    await asyncio.sleep(0.05)  # the release goes out without waiting for its answer
    again = await changing.acquire(name, ttl=TTL)
    assert again.token > lease.token
