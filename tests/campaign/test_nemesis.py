"""The nemesis schedule: seeded, every kind first, then random kinds for the time asked."""

from __future__ import annotations

import random

import pytest

from tests.campaign.nemesis import KINDS, plan


def test_plan_has_every_kind_first_then_fills_the_time() -> None:
    schedule = plan(random.Random(3), KINDS, seconds=120.0, ttl=1.5)
    first = schedule[: len(KINDS)]
    assert sorted(p.kind for p in first) == sorted(KINDS)
    assert all(p.mandatory for p in first)
    assert not any(p.mandatory for p in schedule[len(KINDS) :])
    assert sum(p.seconds + p.gap for p in schedule) >= 120.0
    assert all(1.2 * 1.5 <= p.seconds <= 2.0 * 1.5 for p in schedule)  # past the TTL


def test_plan_is_reproducible_from_its_seed() -> None:
    assert plan(random.Random(5), KINDS, 60.0, 1.0) == plan(random.Random(5), KINDS, 60.0, 1.0)
    assert plan(random.Random(5), KINDS, 60.0, 1.0) != plan(random.Random(6), KINDS, 60.0, 1.0)


def test_plan_refuses_an_unknown_fault_kind() -> None:
    with pytest.raises(ValueError, match="unknown fault kinds"):
        plan(random.Random(1), ["kill_node", "unplug_datacenter"], 10.0, 1.0)
