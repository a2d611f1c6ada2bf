"""protocol.py's state tables, and the check that holds every acquire to them."""

from __future__ import annotations

import logging

import pytest

from lockservice.acquire import found_lease
from lockservice.handover import Pending
from lockservice.protocol import (
    ATTEMPT_TRANSITIONS,
    NODE_TRANSITIONS,
    AttemptState,
    NodeState,
)
from lockservice.replies import Tagged


def test_every_state_has_its_transitions_and_terminal_states_are_final() -> None:
    assert set(NODE_TRANSITIONS) == set(NodeState)
    assert set(ATTEMPT_TRANSITIONS) == set(AttemptState)
    assert ATTEMPT_TRANSITIONS[AttemptState.GRANTED] == frozenset()
    assert ATTEMPT_TRANSITIONS[AttemptState.ABANDONED] == frozenset()
    for state, nexts in ATTEMPT_TRANSITIONS.items():
        if state is not AttemptState.GRANTED:
            assert AttemptState.ABANDONED in nexts or state is AttemptState.ABANDONED


def test_a_forbidden_move_of_an_attempt_is_reported_as_a_bug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pending = Pending("p/x", 3, 1.0, start=0.0)
    pending.move(AttemptState.QUEUED)
    pending.move(AttemptState.TRYING)
    pending.move(AttemptState.GRANTED)
    assert not caplog.records
    with caplog.at_level(logging.ERROR):
        pending.move(AttemptState.TRYING)  # a granted attempt never tries again
    assert [r.getMessage() for r in caplog.records] == [
        "lock protocol bug: attempt on 'p/x' moved granted -> trying"
    ]
    caplog.clear()  # (the autouse check would fail this test otherwise)


def test_a_repeat_answers_the_decided_token_not_a_vote_of_the_nodes() -> None:
    """S4: the committed token is the decided one; a tie or a majority of stale
    per-node tokens must not pick another."""
    tagged = [Tagged(7, 5_000, "w"), Tagged(5, 5_000, "w"), Tagged(5, 5_000, "w")]
    found = found_lease(tagged[1:2] + tagged[:1], 2, 0.0, 0.0)
    assert found is not None
    assert (found.lease_id, found.token) == ("w", 7)
    assert found_lease(tagged, 3, 0.0, 0.0).token == 7  # type: ignore[union-attr]
