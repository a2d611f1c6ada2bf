"""``fencegate serve``: start a gateway, say what it runs on, and shut it down as a load
balancer needs.

Shutdown on SIGTERM or SIGINT, within ``shutdown_timeout_ms`` of the signal:

1. At once: ``/readyz`` answers 503, acquires waiting for a lock and any new
   acquire or store write get 503 ``shutting_down``; renew, release, reads and
   requests in flight carry on. The listener stays open.
2. For ``shutdown_grace_ms`` (default 5000, at most half of
   ``shutdown_timeout_ms`` unless set): a load balancer's health check sees
   the 503 and stops sending; clients that still come get an HTTP answer, not
   a refused connection. A second signal ends the grace period early.
3. Then the listener closes (new connections are refused), idle connections
   close, and requests in flight get what is left of ``shutdown_timeout_ms``
   minus a reserve to close Redis and storage connections.
4. ``stopped`` is logged and the process exits 0.

Failures to start (a port in use, an unusable certificate, a store that cannot
start with ``strict_start``) are one line on stderr and exit status 1.

With ``workers`` other than 1 the CLI starts a supervisor of worker processes
instead (``gateway/supervisor.py``); each worker is a gateway as above, listening on
the same address with ``SO_REUSEPORT`` and serving the whole server's metrics.
"""

from __future__ import annotations

import asyncio
import errno
import gc
import logging
import os
import signal
import ssl
import sys
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, Final

from aiohttp import web
from prometheus_client import GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR, CollectorRegistry
from prometheus_client.aiohttp import make_aiohttp_handler

from gateway.app import CONFIG, StartupError, create_app, start_draining
from gateway.config import Address, Config, ConfigError
from gateway.parse_errors import JsonErrorRunner
from gateway.shared import SharedDir, scrape_registry
from gateway.tls import server_ssl_context

__all__ = ["REFUSED", "Signals", "Worker", "app_runner", "fail", "serve_one"]

log = logging.getLogger("fencegate")

REFUSED: Final = 1
_CLOSE_RESERVE: Final = 1.0
"""Seconds of ``shutdown_timeout_ms`` kept for closing Redis and storage connections."""


@dataclass(frozen=True, slots=True)
class Worker:
    """Which worker of a supervised server this process is, and the server's shared dir."""

    index: int
    shared: SharedDir


def serve_one(config: Config, *, access_log: bool = False, worker: Worker | None = None) -> int:
    """Run one gateway process (alone, or as ``worker``) until SIGTERM/SIGINT."""
    try:
        tls = server_ssl_context(config.tls) if config.tls is not None else None
    except ConfigError as exc:
        log.error("cannot start: %s", exc)
        return REFUSED
    try:
        return _run(_serve_until_signal(config, tls, access_log=access_log, worker=worker))
    except StartupError as exc:
        log.error("cannot start: %s", exc)
        return REFUSED


def _run(main: Coroutine[Any, Any, int]) -> int:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - not on every platform
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)


def _announce(config: Config) -> None:
    # The lock backend (Redlock and its nodes, or the in-process one) is announced once,
    # by the lock service itself when it starts.
    if config.auth_keys:
        log.info(
            "auth: %d key(s): %s",
            len(config.auth_keys),
            ", ".join(k.name for k in config.auth_keys),
        )
    else:
        log.warning(
            "auth: none configured; any client that reaches %s may lock and write", config.listen
        )


async def _start_site(runner: web.AppRunner, where: Address, key: str, **kwargs: Any) -> None:
    try:
        await web.TCPSite(runner, where.host, where.port, **kwargs).start()
    except OSError as exc:
        reason = "address already in use" if exc.errno == errno.EADDRINUSE else exc.strerror
        raise StartupError(f"cannot listen on {where} ({key}): {reason or exc}") from None


async def _serve_until_signal(
    config: Config,
    tls: ssl.SSLContext | None,
    *,
    access_log: bool = False,
    worker: Worker | None = None,
) -> int:
    registry = CollectorRegistry()
    if worker is None:
        _announce(config)
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            registry.register(collector)
        served, shared = registry, None
    else:  # this worker's metrics go to the shared dir; /metrics serves all workers'
        if worker.index == 0:
            _announce(config)
        served, shared = scrape_registry(worker.shared), worker.shared
    app = create_app(config, registry=registry, served=served, shared=shared)
    grace, in_flight = _shutdown_periods(config)
    runners = [app_runner(app, access_log=access_log)]
    # workers share the address; the supervisor made sure nothing else listens on it
    reuse = {"reuse_port": True} if worker is not None else {}
    signals = Signals()
    try:
        await runners[0].setup()
        await _start_site(runners[0], config.listen, "listen", ssl_context=tls, **reuse)
        if config.metrics_listen is not None:
            metrics_app = web.Application()
            metrics_app.router.add_get("/metrics", make_aiohttp_handler(served))
            runners.append(web.AppRunner(metrics_app, access_log=None))
            await runners[1].setup()
            await _start_site(runners[1], config.metrics_listen, "metrics_listen", **reuse)
        scheme = "https" if tls else "http"
        who = "fencegate" if worker is None else f"worker {worker.index} (pid {os.getpid()})"
        for address in runners[0].addresses:
            log.info("%s listening on %s://%s", who, scheme, _address(address))
        if len(runners) > 1:
            log.info("metrics on http://%s/metrics", _address(runners[1].addresses[0]))
        if worker is not None:
            worker.shared.mark_ready(os.getpid())
        _tune_garbage_collection()
        await signals.next()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + config.shutdown_timeout
        start_draining(app)
        if grace > 0:
            log.info(
                "shutting down: the listener stays open for %.1f s (shutdown_grace_ms), then "
                "requests in flight get up to %.1f s more (shutdown_timeout_ms %.1f s in all)",
                grace,
                in_flight,
                config.shutdown_timeout,
            )
            if await signals.next(within=grace):
                log.info("second signal: ending the grace period early")
        log.info("closing the listener; finishing requests in flight (up to %.1f s)", in_flight)
        await _cleanup(runners, deadline)
    finally:
        signals.close()
        await _cleanup(runners, None)
    log.info("stopped" if worker is None else f"{who} stopped")
    return 0


def app_runner(app: web.Application, *, access_log: bool = False) -> web.AppRunner:
    """The runner ``fencegate serve`` serves ``app`` (a ``create_app`` app) with.

    - ``handler_cancellation`` off (aiohttp's default, stated because aiohttp's test
      server turns it on): a client that disconnects does not cancel its handler, so
      a store write is never cut half-way; a waiting acquire is cut by the gateway
      itself (``gateway.guard``).
    - No access log unless asked: it costs ~10% of a request, and /metrics counts
      requests.
    - Requests in flight at shutdown get ``shutdown_timeout_ms`` less the grace
      period and the time kept for closing connections.
    - A request aiohttp's parser refuses is answered in JSON too (``parse_errors``).

    In-process tests serve the app through this too (``tests/_gateway.py``).
    """
    options: dict[str, Any] = {} if access_log else {"access_log": None}
    _, in_flight = _shutdown_periods(app[CONFIG])
    return JsonErrorRunner(app, handler_cancellation=False, shutdown_timeout=in_flight, **options)


def _shutdown_periods(config: Config) -> tuple[float, float]:
    """Seconds of the shutdown's grace period, and then for requests in flight."""
    grace = min(config.shutdown_grace, config.shutdown_timeout)
    return grace, max(0.0, config.shutdown_timeout - grace - _CLOSE_RESERVE)


async def _cleanup(runners: list[web.AppRunner], deadline: float | None) -> None:
    """Close ``runners`` (newest first); past ``deadline`` the rest is abandoned."""
    loop = asyncio.get_running_loop()
    while runners:
        runner = runners.pop()
        left = None if deadline is None else max(0.0, deadline - loop.time())
        try:
            async with asyncio.timeout(left):
                await runner.cleanup()
        except TimeoutError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            log.warning("shutdown_timeout_ms reached: exiting without finishing the shutdown")
            runners.clear()


_GC_THRESHOLDS: Final = (10_000, 20, 20)
"""Collections of the youngest generation every 10,000 allocations, not 700.

A collection walks every young object still alive: with 32 requests in flight
that is their request, lease and Redis objects, again every 700 allocations, a
lock cycle making a few hundred. 5 % of the gateway's instructions per lock cycle
at 32 clients went to it (callgrind, as with the collector off); at one client,
none. Objects freed by their reference count, nearly all, are not affected; the
cost is up to 10,000 young objects in unreachable cycles living a little longer."""


def _tune_garbage_collection() -> None:
    """Keep what start-up allocated (modules, config, routes, metrics) out of every
    later garbage collection: a full collection then walks what requests left, not
    the whole process (start-up objects live as long as the process anyway); and
    collect young objects less often (``_GC_THRESHOLDS``)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*_GC_THRESHOLDS)


def _address(address: Any) -> str:
    host, port = address[0], address[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Signals:
    """SIGTERM and SIGINT as events the serve loop waits for."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[int] = asyncio.Queue()
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._loop.add_signal_handler(sig, self._queue.put_nowait, sig)

    async def next(self, within: float | None = None) -> bool:
        """Wait for a signal; False when ``within`` seconds passed first."""
        try:
            async with asyncio.timeout(within):
                await self._queue.get()
        except TimeoutError:
            return False
        return True

    def close(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._loop.remove_signal_handler(sig)


def fail(message: str) -> int:
    """Print one ``fencegate: ...`` line to stderr; the exit status for a refusal."""
    print(f"fencegate: {message}", file=sys.stderr)
    return REFUSED
