"""The fencegate HTTP gateway: locks with fencing tokens in front of fenced storage.

Names are imported on first use, so ``import gateway.client`` does not load
the server (aiohttp.web, redis, asyncpg, prometheus_client, storage_adapters),
and ``gateway.SyncFencegateClient`` loads only the standard library.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.app import create_app
    from gateway.client import FencegateClient
    from gateway.config import Config, ConfigError, load_config
    from gateway.sync_client import SyncFencegateClient

__all__ = [
    "Config",
    "ConfigError",
    "FencegateClient",
    "SyncFencegateClient",
    "create_app",
    "load_config",
]

_WHERE = {
    "Config": "gateway.config",
    "ConfigError": "gateway.config",
    "load_config": "gateway.config",
    "create_app": "gateway.app",
    "FencegateClient": "gateway.client",
    "SyncFencegateClient": "gateway.sync_client",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'gateway' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
