"""The ``fencegate`` client verbs: lock, semaphore, renew, unlock, status, put, get, delete, run.

Their usage is in the docstring of ``gateway/cli.py``, the command itself (``main``,
``serve``, ``check-config``), which registers them with ``add_parser``. They talk to
``--url`` (``$FENCEGATE_URL``, default http://127.0.0.1:8080) with ``--api-key``
(``$FENCEGATE_API_KEY``). Exit status: 0 done, 1 refused (the error code is shown),
2 usage, 3 gateway or its backends unavailable.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import ssl
import sys
from collections.abc import Callable, Coroutine
from typing import Any, Final

from gateway.client import FencegateClient, FencegateError, Lease, LockHeld, TokenRequired
from gateway.exit_codes import REFUSED, UNAVAILABLE, USAGE
from lockservice.lease import MAX_PERMITS

__all__ = ["REFUSED", "UNAVAILABLE", "USAGE", "add_parser"]

DEFAULT_URL: Final = "http://127.0.0.1:8080"


def _named(what: str) -> Any:
    """An argparse type: any non-empty text (an empty one would name no route: 404)."""

    def check(value: str) -> str:
        if not value:
            raise argparse.ArgumentTypeError(f"the {what} must not be empty")
        return value

    return check


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register the client verbs on the ``fencegate`` command's subparsers."""

    connection = argparse.ArgumentParser(add_help=False)
    connection.add_argument(
        "--url",
        default=os.environ.get("FENCEGATE_URL", DEFAULT_URL),
        help=f"the gateway, http:// or https:// ($FENCEGATE_URL, default {DEFAULT_URL})",
    )
    connection.add_argument(
        "--api-key",
        default=os.environ.get("FENCEGATE_API_KEY"),
        help="sent as 'Authorization: Bearer KEY' ($FENCEGATE_API_KEY)",
    )
    connection.add_argument(
        "--cacert", metavar="FILE", help="trust this CA (PEM) for https, e.g. a private CA"
    )
    connection.add_argument(
        "--insecure", action="store_true", help="https without checking the certificate"
    )
    common = argparse.ArgumentParser(add_help=False, parents=[connection])
    common.add_argument("--json", action="store_true", help="print the result as JSON")

    def verb(name: str, func: Any, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=[common], help=help)
        p.set_defaults(handler=_client_verb(func), verb=name)
        return p

    ttl_help = "the lease lasts this long unless renewed (default 10000)"
    wait_help = "wait this long while it is held (default 0)"
    lease_help = "the lease_id printed by 'fencegate lock' or 'fencegate semaphore'"
    key_help = "sent as Idempotency-Key: a retry with the same key gets the same lease"
    permits_help = f"how many leases may hold it at once (1..{MAX_PERMITS}; all holders agree)"
    sem_help = "the lease is a semaphore's (from 'fencegate semaphore')"
    p = verb("lock", _lock, "take a lock and print its token and lease_id")
    p.add_argument("name", type=_named("name"))
    p.add_argument("--ttl-ms", type=int, default=10_000, help=ttl_help)
    p.add_argument("--wait-ms", type=int, default=0, help=wait_help)
    p.add_argument("--shared", action="store_true", help="a shared lock (many holders at once)")
    p.add_argument("--idempotency-key", metavar="KEY", help=key_help)
    p = verb("semaphore", _semaphore, "take one of N leases of a semaphore")
    p.add_argument("name", type=_named("name"))
    p.add_argument("--permits", type=int, required=True, help=permits_help)
    p.add_argument("--ttl-ms", type=int, default=10_000, help=ttl_help)
    p.add_argument("--wait-ms", type=int, default=0, help=wait_help)
    p.add_argument("--idempotency-key", metavar="KEY", help=key_help)
    p = verb("renew", _renew, "extend a lease")
    p.add_argument("name", type=_named("name"))
    p.add_argument("--lease-id", required=True, help=lease_help)
    p.add_argument(
        "--ttl-ms", type=int, default=10_000, help="the new ttl from now (default 10000)"
    )
    p.add_argument("--semaphore", action="store_true", help=sem_help)
    p = verb("unlock", _unlock, "release a lease")
    p.add_argument("name", type=_named("name"))
    p.add_argument("--lease-id", required=True, help=lease_help)
    p.add_argument("--semaphore", action="store_true", help=sem_help)
    p = verb("status", _status, "show whether a lock is held, in which mode, by how many")
    p.add_argument("name", type=_named("name"))
    p = sub.add_parser(
        "run",
        parents=[connection],  # no --json: the command's own output is run's output
        usage="fencegate run NAME [--ttl-ms N] [--wait-ms N] [--shared | --permits N] [options] "
        "-- CMD [ARGS...]",
        help="run a command while holding a lock (renewed; exit 75 if the lease is lost)",
    )
    p.set_defaults(handler=_run, verb="run")
    p.add_argument("name", type=_named("name"))
    p.add_argument("--ttl-ms", type=int, default=10_000, help=ttl_help)
    p.add_argument("--wait-ms", type=int, default=0, help=wait_help)
    kind = p.add_mutually_exclusive_group()
    kind.add_argument("--shared", action="store_true", help="hold a shared lock")
    kind.add_argument("--permits", type=int, help="hold one of N leases of a semaphore")
    p.set_defaults(command=[])  # what follows -- (split off before parsing)
    for name, func, help in (
        ("put", _put, "write a file or stdin at a key, fenced by a token"),
        ("get", _get, "read a key to stdout (--json: text as 'body', binary as 'body_base64')"),
        ("delete", _delete, "delete a key, fenced by a token"),
    ):
        p = verb(name, func, help)
        p.add_argument("store", type=_named("store"))
        p.add_argument("key", type=_named("key"))
        p.add_argument("--token", type=int, help="the fencing token of the lock STORE/KEY")
        p.add_argument("--lock", help="the fence lock, if not STORE/KEY (X-Fencing-Lock)")
        if name == "put":
            p.add_argument("--file", help="read the body from this file (default: stdin)")
            p.add_argument("--content-type")
        if name == "get":
            p.add_argument("--output", "-o", help="write the body to this file")


def _make_client(args: argparse.Namespace) -> FencegateClient | None:
    """The client the options ask for, or None after saying why not (a usage error)."""
    try:
        return FencegateClient(
            args.url,
            api_key=args.api_key or None,
            ssl=False if args.insecure else args.cacert,
        )
    except ValueError as exc:
        source = "--cacert" if "CA file" in str(exc) else "--url (or FENCEGATE_URL)"
        print(f"fencegate: {source}: {exc}", file=sys.stderr)
        return None


def _untrusted(exc: BaseException) -> bool:
    """The gateway's TLS certificate failed verification (the cause of ``exc``)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _client_verb(
    verb: Callable[[FencegateClient, argparse.Namespace], Coroutine[Any, Any, object]],
) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        client = _make_client(args)
        if client is None:
            return USAGE

        async def call() -> int:
            async with client:
                try:
                    result = await verb(client, args)
                except FencegateError as exc:
                    if _untrusted(exc):  # no retry helps: the client's own trust is wrong
                        print(f"fencegate: {exc}; trust its CA with --cacert FILE "
                              "(or --insecure, tests only)", file=sys.stderr)  # fmt: skip
                        return USAGE
                    print(f"fencegate: {_refusal(exc, args)}", file=sys.stderr)
                    return REFUSED if 400 <= exc.status < 500 else UNAVAILABLE
                except ValueError as exc:
                    print(f"fencegate: {exc}", file=sys.stderr)
                    return USAGE
            if args.json and result is not None:
                print(json.dumps(result, indent=2))
            return 0

        return asyncio.run(call())

    return run


def _run(args: argparse.Namespace) -> int:
    """``fencegate run NAME -- CMD``: exits with the command's status (see gateway/run.py)."""
    from gateway.run import run_locked

    command = args.command
    if not command:
        print(
            "fencegate: run needs a command: fencegate run NAME -- CMD [ARGS...]", file=sys.stderr
        )
        return USAGE
    client = _make_client(args)
    if client is None:
        return USAGE

    async def call() -> int:
        async with client:
            return await run_locked(
                client,
                args.name,
                command,
                url=args.url,
                ttl=args.ttl_ms / 1000,
                wait=args.wait_ms / 1000,
                mode="shared" if args.shared else "exclusive",
                permits=args.permits,
            )

    return asyncio.run(call())


def _refusal(exc: FencegateError, args: argparse.Namespace) -> str:
    if isinstance(exc, TokenRequired):
        return (
            f"{exc.code} ({exc.status}): {args.verb} needs --token N, the fencing token of "
            f"the lock on {args.lock or args.store + '/' + args.key} "
            f"(take it with: fencegate lock {args.lock or args.store + '/' + args.key})"
        )
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
    mode = "shared" if args.shared else "exclusive"
    lease = await client.acquire(args.name, ttl=args.ttl_ms / 1000, wait=args.wait_ms / 1000,
                                 mode=mode, idempotency_key=args.idempotency_key)  # fmt: skip
    return _granted(args, lease, "locked", f"  mode      {mode}")


async def _semaphore(client: FencegateClient, args: argparse.Namespace) -> object:
    lease = await client.acquire_semaphore(
        args.name,
        args.permits,
        ttl=args.ttl_ms / 1000,
        wait=args.wait_ms / 1000,
        idempotency_key=args.idempotency_key,
    )
    return _granted(args, lease, "acquired semaphore", f"  permits   {lease.permits}")


def _valid_ms(lease: Lease) -> int:
    """The validity the gateway computed, else what is left of it here."""
    return lease.valid_ms if lease.valid_ms is not None else max(0, int(lease.remaining() * 1000))


def _granted(args: argparse.Namespace, lease: Lease, what: str, kind: str) -> object:
    # ttl_ms and valid_ms as the HTTP answer has them: the ttl granted (the one asked
    # for) and the validity the gateway computed, which is the one to act on.
    ttl_ms, valid_ms = args.ttl_ms, _valid_ms(lease)
    _say(args, f"{what} {lease.name}\n  token     {lease.token}\n  lease_id  {lease.lease_id}")
    _say(args, f"  ttl_ms    {ttl_ms}\n  valid_ms  {valid_ms}\n{kind}")
    flag = " --semaphore" if lease.mode == "semaphore" else ""
    _say(args, f"release with: fencegate unlock {lease.name} --lease-id {lease.lease_id}{flag}")
    reply = {"name": lease.name, "token": lease.token, "lease_id": lease.lease_id}
    extra = {"permits": lease.permits} if lease.mode == "semaphore" else {"mode": lease.mode}
    return {**reply, "ttl_ms": ttl_ms, "valid_ms": valid_ms, **extra}


def _handle(args: argparse.Namespace) -> Lease:
    """The lease named on the command line (renew, unlock)."""
    mode = "semaphore" if args.semaphore else "exclusive"
    return Lease(args.name, 0, args.lease_id, 0.0, mode=mode)


async def _renew(client: FencegateClient, args: argparse.Namespace) -> object:
    lease = await client.extend(_handle(args), ttl=args.ttl_ms / 1000)
    ttl_ms, valid_ms = args.ttl_ms, _valid_ms(lease)
    _say(args, f"renewed {lease.name}: token {lease.token}, ttl_ms {ttl_ms}, valid_ms {valid_ms}")
    return {"name": lease.name, "token": lease.token, "ttl_ms": ttl_ms, "valid_ms": valid_ms}


async def _unlock(client: FencegateClient, args: argparse.Namespace) -> object:
    await client.release(_handle(args))
    _say(args, f"released {args.name}")
    return {"name": args.name, "released": True}


async def _status(client: FencegateClient, args: argparse.Namespace) -> object:
    s = await client.inspect(args.name)
    if s.held:
        kind = f"semaphore of {s.permits} permits" if s.mode == "semaphore" else s.mode
        leases = "1 lease" if s.holders == 1 else f"{s.holders} leases"
        _say(args, f"{s.name}: held ({kind}, {leases}), token {s.token}, {s.ttl:.3f} s left")
    else:
        _say(args, f"{s.name}: free (newest token issued: {s.token})")
    reply = {"name": s.name, "held": s.held, "token": s.token, "ttl_ms": round(s.ttl * 1000)}
    return {**reply, "mode": s.mode, "holders": s.holders, "permits": s.permits}


def _read_file(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:  # a usage error, said in one line (ValueError: exit 2)
        raise ValueError(f"--file: cannot read {path!r}: {exc.strerror or exc}") from exc


def _write_file(path: str, body: bytes) -> None:
    try:
        with open(path, "wb") as f:
            f.write(body)
    except OSError as exc:
        raise ValueError(f"--output: cannot write {path!r}: {exc.strerror or exc}") from exc


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
        reply: dict[str, object] = {"store": args.store, "key": args.key, "token": token}
        try:
            reply["body"] = body.decode()
        except UnicodeDecodeError:  # binary: never mangled, never ambiguous
            reply["body_base64"] = base64.b64encode(body).decode()
        return reply
    return None


async def _delete(client: FencegateClient, args: argparse.Namespace) -> object:
    await client.delete(args.store, args.key, token=args.token, lock=args.lock)
    _say(args, f"deleted {args.store}/{args.key}")
    return {"store": args.store, "key": args.key, "deleted": True}
