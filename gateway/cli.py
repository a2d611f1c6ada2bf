"""The ``fencegate`` command: run a gateway, check a config, and client verbs for a terminal.

::

    fencegate serve [--config F] [--listen H:P] [--workers N]
                    [--redis URL ... | --group URL,URL,URL ...]
    fencegate check-config [F | --config F]              (default: $FENCEGATE_CONFIG)
    fencegate lock NAME [--ttl-ms N] [--wait-ms N] [--shared] [--idempotency-key K]
    fencegate semaphore NAME --permits N [--ttl-ms N] [--wait-ms N] [--idempotency-key K]
    fencegate renew NAME --lease-id ID [--semaphore]    fencegate status NAME
    fencegate unlock NAME --lease-id ID [--semaphore]
    fencegate put STORE KEY --token N [--file F]        fencegate get STORE KEY [--token N]
    fencegate delete STORE KEY --token N
    fencegate run NAME [--ttl-ms N] [--wait-ms N] [--shared | --permits N] -- CMD [ARGS...]
    fencegate pg install-fencing|uninstall-fencing --config F --store NAME
    fencegate groups carry --config F

Client verbs talk to ``--url`` (``$FENCEGATE_URL``, default http://127.0.0.1:8080)
with ``--api-key`` (``$FENCEGATE_API_KEY``). Exit status: 0 done, 1 refused
(the error code is shown), 2 usage, 3 gateway or its backends unavailable. The client
verbs live in ``gateway/client_cli.py``, ``pg`` and ``groups`` in ``pg_cli.py`` and
``groups_cli.py``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING

from gateway.client_cli import REFUSED, UNAVAILABLE, USAGE  # noqa: F401  # the exit statuses
from gateway.client_cli import add_parser as add_client_parser
from gateway.groups_cli import add_parser as add_groups_parser
from gateway.pg_cli import add_parser as add_pg_parser

if TYPE_CHECKING:
    from gateway.config import Config

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fencegate`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "run" in argv and "--" in argv:  # fencegate run NAME [OPTIONS] -- CMD [ARGS...]
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1 :]
    args = _parser().parse_args(argv)
    if getattr(args, "verb", None) == "run":
        args.command = command
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except KeyboardInterrupt:
        return 130


def _version() -> str:
    try:
        return version("fencegate")
    except PackageNotFoundError:  # pragma: no cover - run from a source tree
        return "unknown (not installed)"


# serve
def _serve(args: argparse.Namespace) -> int:
    from gateway.config import ConfigError, load_config  # the server's modules, only for serve
    from gateway.logs import setup_logging
    from gateway.serve import fail, serve_one

    overrides: dict[str, object] = {}
    if args.listen:
        overrides["listen"] = args.listen
    if args.redis:
        overrides["locks.redis"] = args.redis
    if args.group:
        overrides["locks.groups"] = [_urls(g) for g in args.group]
    if args.previous_group:
        overrides["locks.previous_groups"] = [_urls(g) for g in args.previous_group]
    if args.metrics_listen:
        overrides["metrics_listen"] = args.metrics_listen
    if args.allow_remote:
        overrides["allow_remote"] = True
    if args.strict_start:
        overrides["strict_start"] = True
    if args.workers is not None:
        overrides["workers"] = args.workers
    if args.log_format:
        overrides["log_format"] = args.log_format
    try:
        config = load_config(args.config, env=os.environ, overrides=overrides)
    except ConfigError as exc:
        return fail(str(exc))
    setup_logging(args.log_level or config.log_level, config.log_format)
    for warning in config.warnings:
        logging.getLogger("fencegate").warning("%s", warning)
    if config.worker_count > 1:
        from gateway.supervisor import supervise

        return supervise(config, access_log=args.access_log, log_level=args.log_level)
    return serve_one(config, access_log=args.access_log)


def _check_config(args: argparse.Namespace) -> int:
    from gateway.config import ConfigError, load_config
    from gateway.tls import server_ssl_context

    if args.file is not None and args.config_file is not None:
        print("fencegate check-config: give the config file once: F or --config F", file=sys.stderr)
        return USAGE
    # As serve, pg and groups take it: the argument, else $FENCEGATE_CONFIG.
    args.file = args.file or args.config_file or os.environ.get("FENCEGATE_CONFIG") or None
    if args.file is None:
        print(
            "fencegate check-config: give the config file: F or --config F (or FENCEGATE_CONFIG)",
            file=sys.stderr,
        )
        return USAGE
    try:
        config = load_config(args.file, env=os.environ)
        if config.tls is not None:
            server_ssl_context(config.tls)
    except ConfigError as exc:
        print(f"fencegate: {exc}", file=sys.stderr)
        return REFUSED
    for warning in config.warnings:
        print(f"fencegate: warning: {warning}", file=sys.stderr)
    locks = _describe_locks(config)
    stores = ", ".join(config.stores) or "none"
    tls = ", tls" if config.tls is not None else ""
    workers = "" if config.workers == 1 else f", {config.worker_count} workers"
    print(f"ok: {args.file}: listen {config.listen}{tls}{workers}, locks {locks}, stores {stores}")
    return 0


def _urls(text: str) -> list[str]:
    return [u.strip() for u in text.split(",") if u.strip()]


def _describe_locks(config: Config) -> str:
    locks = config.locks
    if locks.groups:
        text = f"{len(locks.groups)} redlock group(s) " + ", ".join(
            f"{g.id} ({len(g.urls)} node(s))" for g in locks.groups
        )
    elif locks.redis:
        text = f"{len(locks.redis)} redis node(s)"
    else:
        return "in-process"
    if locks.previous_groups:
        text += ", changing from " + ", ".join(g.id for g in locks.previous_groups)
    return text


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fencegate", description="Distributed locks with fencing tokens, and fenced storage."
    )
    parser.add_argument("--version", action="version", version=f"fencegate {_version()}")
    sub = parser.add_subparsers(required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="run a gateway")
    serve.add_argument(
        "--config", default=os.environ.get("FENCEGATE_CONFIG"), help="TOML file ($FENCEGATE_CONFIG)"
    )
    serve.add_argument("--listen", help="host:port (default 127.0.0.1:8080)")
    serve.add_argument(
        "--redis", action="append", metavar="URL", help="a redis node; repeat for 3 or 5"
    )
    serve.add_argument(
        "--group",
        action="append",
        metavar="URL,URL,URL",
        help="a redlock group (instead of --redis); repeat for more groups",
    )
    serve.add_argument(
        "--previous-group",
        action="append",
        metavar="URL,URL,URL",
        help="a group before a change of groups (locks.previous_groups); repeat",
    )
    serve.add_argument("--metrics-listen", help="host:port for /metrics alone")
    serve.add_argument(
        "--allow-remote", action="store_true", help="listen beyond loopback without auth"
    )
    serve.add_argument(
        "--log-level", choices=("debug", "info", "warning", "error"), help="default: log_level"
    )
    serve.add_argument("--log-format", choices=("text", "json"), help="default: log_format")
    serve.add_argument(
        "--access-log", action="store_true", help="log every request (off: /metrics counts them)"
    )
    serve.add_argument(
        "--strict-start",
        action="store_true",
        help="refuse to start while a store cannot start (default: serve, that store answers 503)",
    )
    serve.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="gateway processes on the one address (default: workers, 1; 0: one per core); "
        "more than one needs [locks] redis or groups",
    )
    serve.set_defaults(handler=_serve)

    check = sub.add_parser("check-config", help="validate a config file (and FENCEGATE_* env)")
    check.add_argument("file", nargs="?", help="the TOML file (or --config F)")
    check.add_argument(
        "--config",
        dest="config_file",
        metavar="F",
        default=None,
        help="the TOML file, as serve and pg take it ($FENCEGATE_CONFIG)",
    )
    check.set_defaults(handler=_check_config)
    add_pg_parser(sub)
    add_groups_parser(sub)

    add_client_parser(sub)
    return parser
