"""``create_app``: the aiohttp application, its guarded routes and its resources.

Resources live in ``cleanup_ctx`` generators, started in order and closed in
reverse: metrics, then the lock manager (which reports to them), then the
stores. Each is stored under a typed ``web.AppKey`` (``gateway.state``).
The app holds no lock state another replica would need, so any number of
them can serve the same Redis nodes and the same storage.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Callable
from typing import Any, Final

from aiohttp import web
from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
)

from gateway.config import Config
from gateway.errors import StartupError
from gateway.hotlocks import HotLocks
from gateway.metrics import Metrics
from gateway.routes import add_routes
from gateway.shared import SYNC_INTERVAL, SharedDir
from gateway.state import CONFIG, HOT, LOCKS, METRICS, STATE, STORES, GatewayState, StoreEntry
from gateway.store_config import StoreConfig
from lockservice import LockManager
from storage_adapters import (
    FencedStore,
    FileStore,
    MysqlLegacyStore,
    MysqlStore,
    PostgresLegacyStore,
    PostgresStore,
    StorageError,
    StorageUnavailable,
    StoreHooks,
)

__all__ = [
    "CONFIG",
    "LOCKS",
    "METRICS",
    "STATE",
    "STORES",
    "StartupError",
    "build_store",
    "create_app",
    "start_draining",
]

log = logging.getLogger(__name__)

_CLOSE_TIMEOUT: Final = 10.0
_RETRY_FIRST: Final = 0.5
_RETRY_MAX: Final = 5.0


def create_app(
    config: Config,
    *,
    registry: CollectorRegistry | None = None,
    served: CollectorRegistry | None = None,
    shared: SharedDir | None = None,
) -> web.Application:
    """The gateway for ``config``; metrics go to ``registry`` (default: a new one).

    ``GET /metrics`` serves ``served`` (default: ``registry``) and is one of its
    routes unless ``config.metrics_listen`` is set: then the caller serves it on
    that address (``fencegate serve`` does). A worker of several passes the
    server's ``shared`` directory: ``/v1/stats/hot`` then covers every worker.

    Nothing connects until the app starts (``AppRunner.setup`` or the
    ``aiohttp_client`` fixture); a store that cannot start fails the startup
    with ``StartupError``.
    """
    if registry is None:
        registry = CollectorRegistry()
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            registry.register(collector)
    app = web.Application(client_max_size=config.max_body_bytes)
    app[CONFIG] = config
    app[STATE] = GatewayState(config.locks.issued_cache_size, shared)
    add_routes(app, (served or registry) if config.metrics_listen is None else None)
    app.cleanup_ctx.append(_metrics_ctx(registry))
    app.cleanup_ctx.append(_locks_ctx)
    if shared is not None:
        app.cleanup_ctx.append(_sync_ctx)
    app.cleanup_ctx.append(_stores_ctx)
    app.on_shutdown.append(_on_shutdown)
    return app


def start_draining(app: web.Application, *, announce: bool = True) -> None:
    """From now on /readyz answers 503, new acquires and writes are refused (503
    ``shutting_down``), and acquires waiting for a lock are answered 503 at once."""
    state = app[STATE]
    if not state.draining:
        state.draining = True
        state.acquires.drain()
        if announce:
            log.info(
                "draining: /readyz is 503, waiting acquires and new acquires and writes get "
                "503 shutting_down, requests in flight finish"
            )


async def _on_shutdown(app: web.Application) -> None:
    # fencegate serve drains (and says so) before this; a failed start has nothing to drain.
    start_draining(app, announce=False)


def _metrics_ctx(
    registry: CollectorRegistry,
) -> Callable[[web.Application], AsyncIterator[None]]:
    async def metrics_ctx(app: web.Application) -> AsyncIterator[None]:
        app[METRICS] = Metrics.for_config(registry, app[CONFIG])
        yield

    return metrics_ctx


async def _locks_ctx(app: web.Application) -> AsyncIterator[None]:
    locks = app[CONFIG].locks
    app[HOT] = HotLocks()
    manager = await LockManager.connect(
        locks.redis,
        groups=locks.groups,
        previous_groups=locks.previous_groups,
        node_timeout=locks.node_timeout,
        min_ttl=locks.min_ttl,
        max_ttl=locks.max_ttl,
        max_wait=locks.max_wait,
        events=app[METRICS],
        observer=app[HOT],
        batch_writes=True,  # many clients at once: one write per node per loop turn
    )
    app[LOCKS] = manager
    try:
        yield
    finally:
        await manager.close()


async def _sync_ctx(app: web.Application) -> AsyncIterator[None]:
    """A worker of several: publish its hot locks and time-based gauges every second."""
    task = asyncio.create_task(_sync(app))
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def _sync(app: web.Application) -> None:
    shared = app[STATE].shared
    assert shared is not None
    pid, hot, metrics = os.getpid(), app[HOT], app[METRICS]
    empty = True
    while True:
        metrics.refresh()
        snapshot = hot.snapshot()
        if snapshot["entries"] or snapshot["waiting"] or not empty:  # else nothing to say
            try:
                await asyncio.to_thread(shared.write_hot, pid, snapshot)
            except OSError as exc:
                log.warning("cannot write the hot-lock snapshot to %s: %s", shared, exc)
            empty = not (snapshot["entries"] or snapshot["waiting"])
        await asyncio.sleep(SYNC_INTERVAL)


def build_store(config: StoreConfig, hooks: StoreHooks) -> FencedStore:
    """The adapter for ``[stores.<name>]`` (not started)."""
    if config.type == "files":
        assert config.root is not None  # checked by config
        return FileStore(config.name, config.root, hooks=hooks)
    if config.type == "s3":
        from storage_adapters.s3 import S3Store  # loads aiobotocore: only when configured

        assert config.bucket is not None  # checked by config
        return S3Store(
            config.name,
            bucket=config.bucket,
            endpoint=config.endpoint,
            region=config.region,
            prefix=config.prefix,
            access_key_id=config.access_key_id,
            secret_access_key=config.secret_access_key,
            timeout=config.command_timeout,
            hooks=hooks,
        )
    assert config.dsn is not None  # checked by config
    mysql = config.type == "mysql"
    pooled: dict[str, Any] = {
        "pool_min": config.pool_min,
        "pool_max": config.pool_max,
        "command_timeout": config.command_timeout,
        "acquire_timeout": config.acquire_timeout,
        "hooks": hooks,
    }
    if not mysql:
        pooled["schema"] = config.schema
    if config.table is None:
        kv_store = MysqlStore if mysql else PostgresStore
        return kv_store(config.name, config.dsn, **pooled)
    assert config.key_column is not None  # checked by config
    legacy_store = MysqlLegacyStore if mysql else PostgresLegacyStore
    return legacy_store(
        config.name,
        config.dsn,
        table=config.table,
        key_column=config.key_column,
        columns=config.columns,
        **pooled,
    )


async def _stores_ctx(app: web.Application) -> AsyncIterator[None]:
    """Start every store; one whose server is unreachable is retried in the background.

    Unreachable (``StorageUnavailable``: PostgreSQL down or not yet up) does not
    stop the gateway unless ``strict_start``: locks and the other stores serve,
    that store answers 503 ``storage_unavailable`` and ``/readyz`` names it until
    a retry starts it. Any other failure (a wrong password, a missing table) is
    a configuration error and stops the start.
    """
    config = app[CONFIG]
    stores: dict[str, StoreEntry] = {}
    retries: list[asyncio.Task[None]] = []
    try:
        for store_config in config.stores.values():
            try:
                store = build_store(store_config, app[METRICS])
            except ValueError as exc:
                raise StartupError(f"store {store_config.name!r}: {exc}") from exc
            try:
                await store.start()
            except StorageUnavailable as exc:
                if config.strict_start:
                    await _close(store)
                    raise StartupError(
                        f"store {store_config.name!r} could not start: {exc} (strict_start)"
                    ) from exc
                log.warning(
                    "store %r cannot start yet (%s); serving without it: it answers 503 "
                    "storage_unavailable until a retry reaches it",
                    store_config.name,
                    exc,
                )
                retries.append(asyncio.create_task(_start_later(store)))
            except StorageError as exc:
                await _close(store)
                raise StartupError(f"store {store_config.name!r} could not start: {exc}") from exc
            stores[store_config.name] = StoreEntry(store_config, store)
            log.info("%s", store_config.describe())
            if store_config.fencing == "none":
                log.warning(
                    "!!! store %r has fencing = 'none': writes are NOT checked against "
                    "fencing tokens; stale writes WILL be applied (benchmark baseline only) !!!",
                    store_config.name,
                )
        app[STORES] = stores
        yield
    finally:
        for task in retries:
            task.cancel()
        await asyncio.gather(*retries, return_exceptions=True)
        await asyncio.gather(*(_close(entry.store) for entry in stores.values()))


async def _start_later(store: FencedStore) -> None:
    """Retry ``store.start()`` with backoff until it succeeds (or a non-outage error)."""
    delay = _RETRY_FIRST
    while True:
        await asyncio.sleep(delay)
        try:
            await store.start()
        except StorageUnavailable:
            delay = min(delay * 2, _RETRY_MAX)  # logged once, at start: no line per attempt
            continue
        except StorageError as exc:
            log.error("store %r cannot start: %s; it stays unavailable", store.name, exc)
            return
        log.info("store %r is reachable now and started", store.name)
        return


async def _close(store: FencedStore) -> None:
    try:
        async with asyncio.timeout(_CLOSE_TIMEOUT):
            await store.close()
    except (StorageError, TimeoutError, OSError) as exc:
        task = asyncio.current_task()
        if isinstance(exc, TimeoutError) and task is not None and task.cancelling():
            raise
        log.warning("store %r did not close cleanly: %s", store.name, exc)
