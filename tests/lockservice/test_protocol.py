"""protocol.py's state tables, and the check that holds every acquire to them."""

from __future__ import annotations

import logging

import pytest

from lockservice.handover import Pending
from lockservice.protocol import (
    ATTEMPT_TRANSITIONS,
    NODE_TRANSITIONS,
    AttemptState,
    NodeState,
)


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
