"""What this process knows of each node's state, reported once per change.

The state moves only on a connection event, an acquire's answer or a resync
(see ``protocol.NodeState``); read-only scripts never move it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from lockservice.events import LockEvents
from lockservice.protocol import NodeState
from lockservice.replies import AcquireReply, Failure, Granted, Held, Quarantined, Unsynced

__all__ = ["Health"]

log = logging.getLogger(__name__)


class Health:
    """Node states by index; ``events.node_state`` hears every change."""

    def __init__(self, labels: Sequence[str], events: LockEvents) -> None:
        self._labels = list(labels)
        self._events = events
        self.states: list[NodeState | None] = [None] * len(labels)

    def set(self, index: int, state: NodeState) -> None:
        if self.states[index] is not state:
            self.states[index] = state
            self._events.node_state(self._labels[index], state.value)

    def note(self, index: int, reply: AcquireReply) -> None:
        """What an acquire's answer says of the node."""
        if isinstance(reply, Failure):
            if reply.down:
                self.set(index, NodeState.DOWN)
        elif isinstance(reply, Unsynced):
            self.set(index, NodeState.UNSYNCED)
        elif isinstance(reply, Quarantined):
            self.set(index, NodeState.QUARANTINED)
        elif isinstance(reply, Granted | Held):
            self.set(index, NodeState.HEALTHY)
