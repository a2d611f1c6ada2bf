"""What a running gateway shares between its handlers, under typed ``web.AppKey`` s.

Nothing here is lock state another replica would need: the lock manager
talks to Redis, stores talk to their storage, and the issued-token cache only
ever answers "yes, issued" for a token at or below a counter Redis returned.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

from aiohttp import web

from gateway.config import ApiKey, Config
from gateway.cuts import Acquires
from gateway.hotlocks import HotLocks
from gateway.logs import Throttle
from gateway.metrics import Metrics
from gateway.shared import SharedDir
from gateway.store_config import StoreConfig
from lockservice import LockManager
from storage_adapters.base import FencedStore

__all__ = [
    "API_KEY",
    "CONFIG",
    "HOT",
    "LOCKS",
    "METRICS",
    "STATE",
    "STORES",
    "GatewayState",
    "IssuedCache",
    "StoreEntry",
]


@dataclass(frozen=True, slots=True)
class StoreEntry:
    """A started store and its configuration (fencing mode)."""

    config: StoreConfig
    store: FencedStore

    @property
    def name(self) -> str:
        return self.config.name


class IssuedCache:
    """A bounded LRU of ``issued(name)`` counters, for the forged-token guard.

    Counters only grow, so a token at or below a cached counter was issued;
    a token above it sends the guard back to the lock service before refusing.
    """

    def __init__(self, limit: int) -> None:
        self._limit = max(1, limit)
        self._counters: OrderedDict[str, int] = OrderedDict()

    def covers(self, name: str, token: int) -> bool:
        counter = self._counters.get(name)
        if counter is None:
            return False
        self._counters.move_to_end(name)
        return token <= counter

    def update(self, name: str, counter: int) -> None:
        self._counters[name] = max(counter, self._counters.get(name, 0))
        self._counters.move_to_end(name)
        while len(self._counters) > self._limit:
            self._counters.popitem(last=False)

    def __len__(self) -> int:
        return len(self._counters)


class GatewayState:
    """Per-process flags and caches."""

    def __init__(self, issued_cache_size: int, shared: SharedDir | None = None) -> None:
        self.shared = shared
        """The server's shared directory, for a worker of several (``gateway/shared.py``)."""
        self.draining = False
        self.acquires = Acquires()
        """The acquires in flight: draining cuts them, so that they answer 503 at once."""
        self.issued = IssuedCache(issued_cache_size)
        self.log_5xx = Throttle()
        """5xx answers are logged once a second per route and code (``gateway.guard``)."""


CONFIG: Final = web.AppKey("config", Config)
LOCKS: Final = web.AppKey("lock_manager", LockManager)
HOT: Final = web.AppKey("hot_locks", HotLocks)
METRICS: Final = web.AppKey("metrics", Metrics)
STORES: Final = web.AppKey("stores", dict[str, StoreEntry])
STATE: Final = web.AppKey("state", GatewayState)
API_KEY: Final = web.RequestKey("api_key", ApiKey)
"""The bearer key that authenticated the request (only when ``[auth]`` is configured)."""
