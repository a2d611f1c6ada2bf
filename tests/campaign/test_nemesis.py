"""The nemesis schedule: seeded, every kind first, then random kinds for the time asked."""

from __future__ import annotations

import random
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests._servers import RedisNode
from tests.campaign.nemesis import KINDS, Nemesis, Planned, plan


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


async def test_a_clock_jump_notes_when_it_struck_its_node(tmp_path: Path) -> None:
    """The window of a clock jump says when the keys expired: the checker counts the jump
    there, not all along the window (``checker._strike``)."""
    node = RedisNode(tmp_path / "node")
    node.start()
    try:
        node.command("SET", "lease", "x", "PX", "5000")
        nemesis = Nemesis(
            SimpleNamespace(nodes=[node], heal_all=lambda: None), [], random.Random(1)
        )  # type: ignore[arg-type]
        before = time.monotonic()
        await nemesis.run([Planned("clock_jump_node", 0.5, 0.0)], time.monotonic() + 10)
        (window,) = nemesis.windows
        assert window.struck_from is not None
        assert window.struck_until is not None
        assert before <= window.start <= window.struck_from <= window.struck_until
        assert window.struck_until + 0.4 < window.end  # the rest of the window is a wait
        assert "1 keys expired" in window.detail
        assert node.command("EXISTS", "lease").strip() == b":0"
    finally:
        node.stop()
