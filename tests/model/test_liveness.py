"""Liveness of the lock protocol (``liveness.py``, R33): waiters get a lease.

From every settled state the model reaches, each waiter retrying once, with no
fault and no expiry, ends with a lease made or ready; without R33 the explorer
prints the stall of two waiters split between the live nodes (README of this
folder). The deeper bounds run with FENCEGATE_MODEL_DEEP=1 (about 40 s more).
"""

from __future__ import annotations

import os
import re

import pytest

from tests.model import liveness
from tests.model.explore import replay
from tests.model.protocol_model import Bounds, Model

DEEP = os.environ.get("FENCEGATE_MODEL_DEEP") == "1"
SAFETY_VALVE = 300.0  # only in case a search runs away: the bounds take seconds
pytestmark = pytest.mark.timeout(SAFETY_VALVE + 60)

# Liveness (R33, ``liveness.py``): no fault and no time (nothing expires), and a node
# down in the first: from every settled state (each client waiting with a try left,
# nothing in flight), each waiter retrying once ends with a lease made or ready.
# Three reorderings are what the split of two waiters between the two live nodes
# takes (W1's try reaches C after W2's grant and W2's undo there).
LIVE = {
    "a node down, 3 reorderings": Bounds(
        max_time=0, faults=0, reorders=3, tries=2, down=frozenset({0})
    ),
    "every node up, 2 reorderings": Bounds(max_time=0, faults=0, reorders=2, tries=2),
}
DEEP_LIVE = {
    "a node down, 3 clients, 1 reordering": Bounds(
        clients=3, max_time=0, faults=0, reorders=1, tries=2, down=frozenset({0})
    ),
    "a node down, time 1, 3 reorderings": Bounds(
        max_time=1, faults=0, reorders=3, tries=2, down=frozenset({0})
    ),
    "a node down, 3 tries, 3 reorderings": Bounds(
        max_time=0, faults=0, reorders=3, tries=3, down=frozenset({0})
    ),
    "every node up, 3 reorderings": Bounds(max_time=0, faults=0, reorders=3, tries=2),
}


def _every_schedule_gets_a_lease(bounds: Bounds) -> int:
    """The liveness check over ``bounds``, explored completely; the states it visited."""
    result = liveness.check(Model(bounds), seconds=SAFETY_VALVE)
    print(result.summary())
    assert result.violation is None, "\n".join(result.trace)
    assert result.complete, "the bounds were not explored completely: " + result.summary()
    return result.states


@pytest.mark.parametrize("name", sorted(LIVE))
def test_waiters_that_each_retry_once_get_a_lease(name: str) -> None:
    assert _every_schedule_gets_a_lease(LIVE[name]) > 15_000  # the bounds are not trivial


@pytest.mark.skipif(not DEEP, reason="slow; set FENCEGATE_MODEL_DEEP=1")
@pytest.mark.parametrize("name", sorted(DEEP_LIVE))
def test_waiters_that_each_retry_once_get_a_lease_deep(name: str) -> None:
    _every_schedule_gets_a_lease(DEEP_LIVE[name])


def test_without_the_rule_two_waiters_stay_split() -> None:
    """R33 off (the decider counts a node whose grant the waiter holds as granted
    before it answers): W1 holds node 1, W2 node 2, each queued behind the other;
    W2's retry decides on node 1's "held", its undo gives up the token it knew, but
    its own try re-issued node 2's grant with a new one first (R12): the undo finds
    another token and does nothing (R13). Both retries end as they began."""
    bounds = LIVE["a node down, 3 reorderings"]
    result = liveness.check(Model(bounds, frozenset({"R33"})), seconds=SAFETY_VALVE)
    print(result.summary())
    print("\n".join(result.trace))
    assert result.violation is not None, result.summary()
    assert result.violation.startswith("liveness:"), result.violation
    # the later waiter's undo named the token it knew: the node held a re-issued one
    stale = re.compile(r"runs undo\(L1\.1 grant \d+, give up\) from client 1 -> 0$")
    assert any(stale.search(line) for line in result.trace), result.trace
    # the full model takes the same steps to the same settled state, and from there
    # every schedule of one retry each makes a lease
    full = Model(bounds)
    settled_at = result.trace.index("    settled: every waiter retries once from here")
    taken, state = replay(full, result.steps[:settled_at])
    assert taken == settled_at
    assert liveness.settled(full, state)
    assert liveness.stall(full, state) is None
