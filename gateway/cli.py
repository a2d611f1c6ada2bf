"""The ``fencegate`` command: run a gateway, check a config, and client verbs for a terminal.

::

    fencegate serve [--config F] [--listen H:P] [--redis URL ...]
    fencegate check-config F
    fencegate lock NAME [--ttl-ms N] [--wait-ms N]      fencegate renew NAME --lease-id ID
    fencegate unlock NAME --lease-id ID                 fencegate status NAME
    fencegate put STORE KEY --token N [--file F]        fencegate get STORE KEY [--token N]
    fencegate delete STORE KEY --token N

Client verbs talk to ``--url`` (``$FENCEGATE_URL``, default http://127.0.0.1:8080)
with ``--api-key`` (``$FENCEGATE_API_KEY``). Exit status: 0 done, 1 refused
(the error code is shown), 2 usage, 3 gateway or its backends unavailable.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import ssl
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Final

from aiohttp import web
from prometheus_client import GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR, CollectorRegistry
from prometheus_client.aiohttp import make_aiohttp_handler

from gateway.app import StartupError, create_app, start_draining
from gateway.client import FencegateClient, FencegateError, Lease, LockHeld
from gateway.config import Config, ConfigError, load_config
from lockservice.node import parse_node_url

__all__ = ["main"]

log = logging.getLogger("fencegate")

DEFAULT_URL: Final = "http://127.0.0.1:8080"
REFUSED: Final = 1
UNAVAILABLE: Final = 3


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fencegate`` console script; returns the exit status."""
    args = _parser().parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except KeyboardInterrupt:
        return 130


# serve
def _serve(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    overrides: dict[str, object] = {}
    if args.listen:
        overrides["listen"] = args.listen
    if args.redis:
        overrides["locks.redis"] = args.redis
    if args.metrics_listen:
        overrides["metrics_listen"] = args.metrics_listen
    if args.allow_remote:
        overrides["allow_remote"] = True
    try:
        config = load_config(args.config, env=os.environ, overrides=overrides)
    except ConfigError as exc:
        print(f"fencegate: {exc}", file=sys.stderr)
        return REFUSED
    try:
        return _run(_serve_until_signal(config, access_log=args.access_log))
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
    if not config.locks.redis:
        log.warning(
            "lock backend: IN-PROCESS MEMORY. Locks live in this process only: run exactly "
            "ONE gateway, or configure [locks] redis (or --redis) for several."
        )
    else:
        labels = ", ".join(parse_node_url(u).label for u in config.locks.redis)
        log.info("lock backend: Redlock over %d redis node(s): %s", len(config.locks.redis), labels)
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


async def _serve_until_signal(config: Config, *, access_log: bool = False) -> int:
    _announce(config)
    registry = CollectorRegistry()
    for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
        registry.register(collector)
    app = create_app(config, registry=registry)
    # No access log unless asked: it costs ~10% of a request, and /metrics counts requests.
    runner = (
        web.AppRunner(app, shutdown_timeout=config.shutdown_timeout)
        if access_log
        else web.AppRunner(app, shutdown_timeout=config.shutdown_timeout, access_log=None)
    )
    runners = [runner]
    await runners[0].setup()
    tls = None
    if config.tls is not None:
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(config.tls.cert, config.tls.key)
    try:
        await web.TCPSite(
            runners[0], config.listen.host, config.listen.port, ssl_context=tls
        ).start()
        if config.metrics_listen is not None:
            metrics_app = web.Application()
            metrics_app.router.add_get("/metrics", make_aiohttp_handler(registry))
            runners.append(web.AppRunner(metrics_app, access_log=None))
            await runners[1].setup()
            where = config.metrics_listen
            await web.TCPSite(runners[1], where.host, where.port).start()
        scheme = "https" if tls else "http"
        for address in runners[0].addresses:
            log.info("fencegate listening on %s://%s", scheme, _address(address))
        if len(runners) > 1:
            log.info("metrics on http://%s/metrics", _address(runners[1].addresses[0]))
        await _wait_for_signal()
        start_draining(app)
        log.info(
            "shutting down: finishing requests in flight (up to %.0f s)", config.shutdown_timeout
        )
    finally:
        for runner in reversed(runners):
            await runner.cleanup()
    log.info("stopped")
    return 0


def _address(address: Any) -> str:
    host, port = address[0], address[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def _wait_for_signal() -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def _check_config(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.file, env=os.environ)
    except ConfigError as exc:
        print(f"fencegate: {exc}", file=sys.stderr)
        return REFUSED
    locks = f"{len(config.locks.redis)} redis node(s)" if config.locks.redis else "in-process"
    stores = ", ".join(config.stores) or "none"
    print(f"OK: {args.file}: listen {config.listen}, locks {locks}, stores {stores}")
    return 0


# client verbs
def _client_verb(
    verb: Callable[[FencegateClient, argparse.Namespace], Coroutine[Any, Any, object]],
) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        async def call() -> int:
            async with FencegateClient(args.url, api_key=args.api_key or None) as client:
                try:
                    result = await verb(client, args)
                except FencegateError as exc:
                    print(f"fencegate: {_refusal(exc)}", file=sys.stderr)
                    return REFUSED if 400 <= exc.status < 500 else UNAVAILABLE
            if args.json and result is not None:
                print(json.dumps(result, indent=2))
            return 0

        return asyncio.run(call())

    return run


def _refusal(exc: FencegateError) -> str:
    line = f"{exc.code}"
    if exc.status:
        line += f" ({exc.status})"
    line += f": {exc.message}"
    if isinstance(exc, LockHeld):
        line += f" [retry after {exc.retry_after:.3f} s]"
    return line


def _say(args: argparse.Namespace, text: str) -> None:
    if not args.json:
        print(text)


async def _lock(client: FencegateClient, args: argparse.Namespace) -> object:
    lease = await client.acquire(args.name, ttl=args.ttl_ms / 1000, wait=args.wait_ms / 1000)
    ttl_ms = round(lease.remaining() * 1000)
    _say(args, f"locked {lease.name}\n  token     {lease.token}\n  lease_id  {lease.lease_id}")
    _say(args, f"  ttl_ms    {ttl_ms}")
    _say(args, f"release with: fencegate unlock {lease.name} --lease-id {lease.lease_id}")
    return {"name": lease.name, "token": lease.token, "lease_id": lease.lease_id, "ttl_ms": ttl_ms}


async def _renew(client: FencegateClient, args: argparse.Namespace) -> object:
    lease = await client.renew(Lease(args.name, 0, args.lease_id, 0.0), ttl=args.ttl_ms / 1000)
    ttl_ms = round(lease.remaining() * 1000)
    _say(args, f"renewed {lease.name}: token {lease.token}, ttl_ms {ttl_ms}")
    return {"name": lease.name, "token": lease.token, "ttl_ms": ttl_ms}


async def _unlock(client: FencegateClient, args: argparse.Namespace) -> object:
    await client.release(Lease(args.name, 0, args.lease_id, 0.0))
    _say(args, f"released {args.name}")
    return {"name": args.name, "released": True}


async def _status(client: FencegateClient, args: argparse.Namespace) -> object:
    s = await client.status(args.name)
    if s.held:
        _say(args, f"{s.name}: held, token {s.token}, {s.ttl:.3f} s left")
    else:
        _say(args, f"{s.name}: free (newest token issued: {s.token})")
    return {"name": s.name, "held": s.held, "token": s.token, "ttl_ms": round(s.ttl * 1000)}


def _read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _write_file(path: str, body: bytes) -> None:
    with open(path, "wb") as f:
        f.write(body)


async def _put(client: FencegateClient, args: argparse.Namespace) -> object:
    if args.file and args.file != "-":
        body = await asyncio.to_thread(_read_file, args.file)
    else:
        body = await asyncio.to_thread(sys.stdin.buffer.read)
    token = await client.put(
        args.store, args.key, body, token=args.token, lock=args.lock, content_type=args.content_type
    )
    _say(args, f"stored {args.store}/{args.key} ({len(body)} bytes) with token {token}")
    return {"store": args.store, "key": args.key, "token": token}


async def _get(client: FencegateClient, args: argparse.Namespace) -> object:
    body, token = await client.get(args.store, args.key, token=args.token, lock=args.lock)
    if args.output:
        await asyncio.to_thread(_write_file, args.output, body)
    elif not args.json:
        sys.stdout.buffer.write(body)
        sys.stdout.buffer.flush()
    print(f"fencegate: {args.store}/{args.key}: {len(body)} bytes, token {token}", file=sys.stderr)
    if args.json:
        return {
            "store": args.store,
            "key": args.key,
            "token": token,
            "body": body.decode(errors="replace"),
        }
    return None


async def _delete(client: FencegateClient, args: argparse.Namespace) -> object:
    await client.delete(args.store, args.key, token=args.token, lock=args.lock)
    _say(args, f"deleted {args.store}/{args.key}")
    return {"store": args.store, "key": args.key, "deleted": True}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fencegate", description="Distributed locks with fencing tokens, and fenced storage."
    )
    sub = parser.add_subparsers(required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="run a gateway")
    serve.add_argument("--config", default=os.environ.get("FENCEGATE_CONFIG"), help="TOML file")
    serve.add_argument("--listen", help="host:port (default 127.0.0.1:8080)")
    serve.add_argument(
        "--redis", action="append", metavar="URL", help="a redis node; repeat for 3 or 5"
    )
    serve.add_argument("--metrics-listen", help="host:port for /metrics alone")
    serve.add_argument(
        "--allow-remote", action="store_true", help="listen beyond loopback without auth"
    )
    serve.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    serve.add_argument(
        "--access-log", action="store_true", help="log every request (off: /metrics counts them)"
    )
    serve.set_defaults(handler=_serve)

    check = sub.add_parser("check-config", help="validate a config file (and FENCEGATE_* env)")
    check.add_argument("file")
    check.set_defaults(handler=_check_config)

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=os.environ.get("FENCEGATE_URL", DEFAULT_URL))
    common.add_argument("--api-key", default=os.environ.get("FENCEGATE_API_KEY"))
    common.add_argument("--json", action="store_true", help="print the result as JSON")

    def verb(name: str, func: Any, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=[common], help=help)
        p.set_defaults(handler=_client_verb(func))
        return p

    p = verb("lock", _lock, "take a lock and print its token and lease_id")
    p.add_argument("name")
    p.add_argument("--ttl-ms", type=int, default=10_000)
    p.add_argument("--wait-ms", type=int, default=0)
    p = verb("renew", _renew, "extend a lease")
    p.add_argument("name")
    p.add_argument("--lease-id", required=True)
    p.add_argument("--ttl-ms", type=int, default=10_000)
    p = verb("unlock", _unlock, "release a lease")
    p.add_argument("name")
    p.add_argument("--lease-id", required=True)
    p = verb("status", _status, "show whether a lock is held")
    p.add_argument("name")
    for name, func, help in (
        ("put", _put, "write a file or stdin at a key, fenced by a token"),
        ("get", _get, "read a key to stdout"),
        ("delete", _delete, "delete a key, fenced by a token"),
    ):
        p = verb(name, func, help)
        p.add_argument("store")
        p.add_argument("key")
        p.add_argument("--token", type=int, help="the lock's fencing token")
        p.add_argument("--lock", help="the fence lock, if not STORE/KEY")
        if name == "put":
            p.add_argument("--file", help="read the body from this file (default: stdin)")
            p.add_argument("--content-type")
        if name == "get":
            p.add_argument("--output", "-o", help="write the body to this file")
    return parser
