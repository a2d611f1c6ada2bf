"""What this process knows of each node's state, reported once per change.

The state moves only on a connection event, an acquire's answer or a resync
(see ``protocol.NodeState``); read-only scripts never move it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Final

from lockservice.events import LockEvents
from lockservice.protocol import NodeState
from lockservice.replies import (
    AcquireReply,
    Failure,
    Granted,
    Held,
    Quarantined,
    StateReply,
    Unsynced,
    describe,
)

__all__ = ["Health"]

log = logging.getLogger(__name__)
_HEALTHY_ALREADY: Final = frozenset({Granted, Held})  # answers that keep a healthy node so


class Health:
    """Node states by index; ``events.node_state`` hears every change."""

    def __init__(self, labels: Sequence[str], events: LockEvents) -> None:
        self._labels = list(labels)
        self._events = events
        self.states: list[NodeState | None] = [None] * len(labels)

    def set(self, index: int, state: NodeState, reason: str = "") -> None:
        """Record ``state``; a change is reported to the hooks and logged once."""
        if self.states[index] is state:
            return
        before, self.states[index] = self.states[index], state
        self._events.node_state(self._labels[index], state.value)
        why = f": {reason}" if reason else ""
        if state is NodeState.QUARANTINED:
            log.warning("redis node %s is quarantined%s", self._labels[index], why)
        elif state is NodeState.UNSYNCED:  # at every first start too; resync.py says more
            log.info("redis node %s is not synced%s", self._labels[index], why)
        elif state is NodeState.HEALTHY and before not in (None, NodeState.DOWN):
            log.info("redis node %s counts in quorums again", self._labels[index])
        # DOWN and REFUSED: node.py logs the cause where it sees it

    def observe(self, index: int, reply: StateReply | None, *, refused: bool) -> None:
        """What state.lua (readiness) found: the node's state, read directly."""
        if refused:
            self.set(index, NodeState.REFUSED, "its maxmemory-policy evicts keys")
        elif isinstance(reply, Failure):
            if reply.down:
                self.set(index, NodeState.DOWN)
        elif isinstance(reply, Quarantined | Unsynced):
            self.note(index, reply)
        elif reply is True:
            self.set(index, NodeState.HEALTHY)

    def note(self, index: int, reply: AcquireReply) -> None:
        """What an acquire's answer says of the node."""
        if self.states[index] is NodeState.HEALTHY and type(reply) in _HEALTHY_ALREADY:
            return  # the common answer: nothing to change
        if isinstance(reply, Failure):
            if reply.down:
                self.set(index, NodeState.DOWN)
        elif isinstance(reply, Unsynced | Quarantined):
            state = NodeState.UNSYNCED if isinstance(reply, Unsynced) else NodeState.QUARANTINED
            self.set(index, state, describe(reply))
        elif isinstance(reply, Granted | Held):
            self.set(index, NodeState.HEALTHY)
