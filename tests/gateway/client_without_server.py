"""Use a Python client with the server's dependencies refused at import.

Run as a script: ``python client_without_server.py async|sync|cli URL``. It
installs an import hook that refuses the server's dependencies and every project
module the clients do not need, imports the client (``sync``: with everything
outside the standard library refused, aiohttp too; ``cli``: the ``fencegate``
command), then takes, renews, inspects and releases a lock at the gateway
``URL``. It prints ``ok`` and exits 0, or exits 1 with the reason on stderr.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

SERVER_DEPENDENCIES = frozenset(
    {
        "aiobotocore",
        "asyncmy",
        "asyncpg",
        "botocore",
        "hiredis",
        "prometheus_client",
        "psycopg",
        "redis",
        "storage_adapters",
        "uvloop",
    }
)
# The project modules a client may load: the clients, and the lease and its
# renewal watchdog, which lockservice owns and the async client reuses.
CLIENT_MODULES = frozenset(
    {
        "gateway",
        "gateway._client_base",
        "gateway.cli",
        "gateway.client",
        "gateway.client_cli",
        "gateway.exit_codes",
        "gateway.groups_cli",
        "gateway.pg_cli",
        "gateway.run",
        "gateway.sync_client",
        "lockservice",
        "lockservice.lease",
        "lockservice.renew",
    }
)
PROJECT = frozenset({"gateway", "lockservice", "tests"})


class Refuse:
    """A meta-path finder that refuses what a client must not need."""

    def __init__(self, stdlib_only: bool) -> None:
        self.stdlib_only = stdlib_only

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        top = name.partition(".")[0]
        if top in PROJECT:
            refused = name not in CLIENT_MODULES
        elif self.stdlib_only:
            refused = top not in sys.stdlib_module_names
        else:
            refused = top in SERVER_DEPENDENCIES or name.startswith("aiohttp.web")
        if refused:
            raise ImportError(f"refused by the test: {name}", name=name)
        return None


def main(argv: list[str]) -> int:
    mode, url = argv
    loaded = sorted(SERVER_DEPENDENCIES.intersection(sys.modules))
    if loaded:  # a module loaded already is never looked up again: the hook could not see it
        print(f"loaded before the hook: {loaded}", file=sys.stderr)
        return 1
    sys.meta_path.insert(0, Refuse(stdlib_only=mode == "sync"))
    try:
        import redis  # noqa: F401
    except ImportError:
        pass
    else:
        print("the hook did not refuse redis", file=sys.stderr)
        return 1
    try:
        if mode == "sync":
            run_sync(url)
        elif mode == "cli":
            run_cli(url)
        else:
            run_async(url)
    except ImportError as exc:
        print(f"import failed: {exc!r}", file=sys.stderr)
        return 1
    print("ok")
    return 0


def run_sync(url: str) -> None:
    import time

    from gateway.sync_client import LeaseLost, SyncFencegateClient

    with SyncFencegateClient(url, timeout=10.0) as client:
        with client.lock("no-server-deps/sync", ttl=1.0) as lease:
            time.sleep(1.3)  # past the ttl: the renewer kept it
            status = client.inspect("no-server-deps/sync")
            assert (status.held, status.token) == (True, lease.token), status
        assert not client.inspect("no-server-deps/sync").held
        lease = client.acquire("no-server-deps/sync", ttl=5.0)
        client.release(lease)
        try:
            client.release(lease)
        except LeaseLost:
            pass
        else:
            raise AssertionError("a second release did not raise LeaseLost")


def run_cli(url: str) -> None:
    import contextlib
    import io
    import json

    from gateway.cli import main as fencegate

    def verb(*argv: str) -> dict[str, object]:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = fencegate([*argv, "--url", url, "--json"])
        assert code == 0, (argv, code, out.getvalue())
        reply: dict[str, object] = json.loads(out.getvalue())
        return reply

    grant = verb("lock", "no-server-deps/cli", "--ttl-ms", "5000")
    lease_id = str(grant["lease_id"])
    verb("renew", "no-server-deps/cli", "--lease-id", lease_id)
    assert verb("status", "no-server-deps/cli")["held"] is True
    verb("unlock", "no-server-deps/cli", "--lease-id", lease_id)
    assert verb("status", "no-server-deps/cli")["held"] is False
    assert fencegate(["run", "no-server-deps/cli", "--url", url, "--", "true"]) == 0


def run_async(url: str) -> None:
    import asyncio

    import gateway

    async def work() -> None:
        async with gateway.FencegateClient(url, timeout=10.0) as client:
            async with client.lock("no-server-deps/async", ttl=1.0) as lease:
                await asyncio.sleep(1.3)  # past the ttl: the watchdog kept it
                status = await client.inspect("no-server-deps/async")
                assert (status.held, status.token) == (True, lease.token), status
            assert not (await client.inspect("no-server-deps/async")).held

    asyncio.run(work())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
