"""Lock kinds from the Python clients (async and sync), the CLI and ``fencegate run --shared``.

Against a gateway in the test's event loop, over each lock backend; the
CLI's verbs run in a worker thread (they start their own event loop).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from prometheus_client import CollectorRegistry

from gateway.cli import main
from gateway.client import (
    FencegateClient,
    GatewayUnavailable,
    Lease,
    LockHeld,
    PermitsMismatch,
    SyncFencegateClient,
)
from gateway.run import NOT_TAKEN, run_locked
from tests.gateway.conftest import Start, make_config

PY = sys.executable


@pytest.fixture
async def served(start: Start, lock_urls: list[str]) -> tuple[str, CollectorRegistry]:
    registry = CollectorRegistry()
    server = await start(make_config(lock_urls=lock_urls), registry)
    return str(server.make_url("")).rstrip("/"), registry


def requests_to(registry: CollectorRegistry, route: str, method: str = "POST") -> float:
    total = 0.0
    for family in registry.collect():
        if family.name == "fencegate_http_requests":
            for s in family.samples:
                if s.name.endswith("_total") and s.labels["route"] == route:
                    total += s.value if s.labels["method"] == method else 0
    return total


async def test_async_client_shared_locks_semaphores_and_idempotency(
    served: tuple[str, CollectorRegistry],
) -> None:
    url, registry = served
    async with FencegateClient(url) as client:
        first = await client.acquire("c/shared", ttl=5.0, mode="shared")
        second = await client.acquire("c/shared", ttl=5.0, mode="shared")
        assert (first.mode, second.mode) == ("shared", "shared")
        assert first.token < second.token  # every grant a new token, a shared one too
        status = await client.inspect("c/shared")
        assert (status.held, status.mode, status.holders, status.permits) == (
            True, "shared", 2, 0,
        )  # fmt: skip
        with pytest.raises(LockHeld):
            await client.acquire("c/shared", ttl=5.0)
        await client.release(first)
        await client.release(second)

        lease = await client.acquire_semaphore("c/pool", 2, ttl=5.0)
        assert (lease.mode, lease.permits) == ("semaphore", 2)
        with pytest.raises(PermitsMismatch) as mismatch:
            await client.acquire_semaphore("c/pool", 3, ttl=5.0, wait=1.0)
        assert mismatch.value.permits == 2
        assert mismatch.value.code == "permits_mismatch"
        renewed = await client.extend(lease, ttl=5.0)
        assert (renewed.token, renewed.mode, renewed.permits) == (lease.token, "semaphore", 2)
        await client.release(renewed)
        assert requests_to(registry, "/v1/semaphores/{name}/renew") == 1
        assert requests_to(registry, "/v1/semaphores/{name}", "DELETE") == 1
        assert not (await client.inspect("c/pool")).held

        taken = await client.acquire("c/idem", ttl=5.0, idempotency_key="job-41")
        again = await client.acquire("c/idem", ttl=5.0, idempotency_key="job-41")
        assert (again.lease_id, again.token) == (taken.lease_id, taken.token)
        await client.release(again)


async def test_a_shared_lock_cannot_join_semaphore_holders_and_contexts_release(
    served: tuple[str, CollectorRegistry],
) -> None:
    url, _ = served
    async with FencegateClient(url) as client:
        async with client.semaphore("c/ctx", 2, ttl=1.0) as one:
            await asyncio.sleep(1.3)  # past the ttl: renewed meanwhile
            assert (await client.inspect("c/ctx")).holders == 1
            with pytest.raises(LockHeld):
                await client.acquire("c/ctx", ttl=1.0, mode="shared")
            async with client.semaphore("c/ctx", 2, ttl=1.0) as two:
                assert two.token > one.token
                assert (await client.inspect("c/ctx")).holders == 2
        assert not (await client.inspect("c/ctx")).held
        async with client.lock("c/ctx", ttl=1.0, mode="shared") as shared:
            assert shared.mode == "shared"
        assert not (await client.inspect("c/ctx")).held


async def test_sync_client_has_the_same_lock_kinds(served: tuple[str, CollectorRegistry]) -> None:
    url, registry = served

    def work() -> None:
        with SyncFencegateClient(url, timeout=10.0) as client:
            with client.lock("s/shared", ttl=1.0, mode="shared") as first:
                time_left = client.inspect("s/shared")
                assert (time_left.mode, time_left.holders) == ("shared", 1)
                second = client.acquire("s/shared", ttl=5.0, mode="shared")
                assert second.token > first.token
                assert client.inspect("s/shared").holders == 2
                client.release(second)
            with client.semaphore("s/pool", 1, ttl=5.0) as lease:
                assert lease.permits == 1
                with pytest.raises(PermitsMismatch) as mismatch:
                    client.acquire_semaphore("s/pool", 4)
                assert mismatch.value.permits == 1
                client.extend(lease, ttl=5.0)
            key = "sync:retry-1"
            taken = client.acquire_semaphore("s/pool", 1, ttl=5.0, idempotency_key=key)
            again = client.acquire_semaphore("s/pool", 1, ttl=5.0, idempotency_key=key)
            assert again.lease_id == taken.lease_id
            client.release(again)
            assert not client.inspect("s/pool").held

    await asyncio.to_thread(work)
    assert requests_to(registry, "/v1/semaphores/{name}/renew") == 1
    assert requests_to(registry, "/v1/semaphores/{name}", "DELETE") == 2


async def test_cli_lock_shared_semaphore_unlock_and_status(
    served: tuple[str, CollectorRegistry], capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = served

    errors: list[str] = []

    async def cli(*args: str) -> tuple[int, dict[str, object]]:
        code = await asyncio.to_thread(main, [*args, "--url", url, "--json"])
        out, err = capsys.readouterr()
        errors.append(err)
        return code, json.loads(out) if out.strip() else {}

    code, shared = await cli("lock", "cli/r", "--shared", "--idempotency-key", "k1")
    assert code == 0
    assert shared["mode"] == "shared"
    code, again = await cli("lock", "cli/r", "--shared", "--idempotency-key", "k1")
    assert again["lease_id"] == shared["lease_id"]
    code, other = await cli("lock", "cli/r", "--shared")
    assert code == 0
    code, status = await cli("status", "cli/r")
    assert (status["mode"], status["holders"]) == ("shared", 2)
    assert await asyncio.to_thread(main, ["lock", "cli/r", "--url", url]) == 1  # exclusive: held
    assert "lock_held" in capsys.readouterr().err
    for grant in (shared, other):
        code, _ = await cli("unlock", "cli/r", "--lease-id", str(grant["lease_id"]))
        assert code == 0

    code, sem = await cli("semaphore", "cli/pool", "--permits", "2", "--ttl-ms", "5000")
    assert code == 0
    assert sem["permits"] == 2
    assert "mode" not in sem
    code, _ = await cli("semaphore", "cli/pool", "--permits", "3")
    assert code == 1
    assert "permits_mismatch" in errors[-1]
    code, renewed = await cli("renew", "cli/pool", "--lease-id", str(sem["lease_id"]),
                              "--semaphore")  # fmt: skip
    assert code == 0
    assert renewed["token"] == sem["token"]
    code, _ = await cli("unlock", "cli/pool", "--lease-id", str(sem["lease_id"]), "--semaphore")
    assert code == 0
    code, status = await cli("status", "cli/pool")
    assert (status["held"], status["mode"]) == (False, "")

    assert await asyncio.to_thread(main, ["lock", "cli/bad", "--url", url,
                                          "--idempotency-key", "no spaces"]) == 1  # fmt: skip
    assert "Idempotency-Key" in capsys.readouterr().err


# fencegate run --shared
async def test_run_shared_runs_beside_other_shared_holders_and_not_beside_a_writer(
    served: tuple[str, CollectorRegistry], tmp_path: Path
) -> None:
    url, _ = served
    out = tmp_path / "token"
    script = f"import os; open({str(out)!r}, 'w').write(os.environ['FENCEGATE_TOKEN'])"
    async with FencegateClient(url) as client:
        reader = await client.acquire("jobs/report", ttl=5.0, mode="shared")
        status = await run_locked(client, "jobs/report", [PY, "-c", script], url=url,
                                  ttl=1.0, wait=0, mode="shared")  # fmt: skip
        assert status == 0
        assert int(out.read_text()) > reader.token  # a shared grant: the newest token issued
        assert (await client.inspect("jobs/report")).holders == 1  # run released its own
        # An exclusive run waits for the reader, here not at all: not taken, not run.
        out.unlink()
        status = await run_locked(client, "jobs/report", [PY, "-c", script], url=url,
                                  ttl=1.0, wait=0)  # fmt: skip
        assert status == NOT_TAKEN
        assert not out.exists()
        await client.release(reader)

        # Two shared runs at once: both inside together.
        both = tmp_path / "both"
        script = (
            "import os, sys, time; p = sys.argv[1]; open(p + os.environ['FENCEGATE_LEASE_ID'], "
            "'w').close(); deadline = time.time() + 5\n"
            "while len([f for f in os.listdir(os.path.dirname(p)) if f.startswith("
            "os.path.basename(p))]) < 2 and time.time() < deadline: time.sleep(0.02)\n"
            "sys.exit(0 if time.time() < deadline else 9)"
        )
        runs = [
            run_locked(client, "jobs/report", [PY, "-c", script, str(both)], url=url,
                       ttl=2.0, wait=2.0, mode="shared")
            for _ in range(2)
        ]  # fmt: skip
        assert await asyncio.gather(*runs) == [0, 0]


async def test_run_permits_holds_one_lease_of_a_semaphore(
    served: tuple[str, CollectorRegistry], tmp_path: Path
) -> None:
    url, _ = served
    out = tmp_path / "token"
    script = f"import os; open({str(out)!r}, 'w').write(os.environ['FENCEGATE_TOKEN'])"
    argv = [PY, "-c", script]
    async with FencegateClient(url) as client:
        held = await client.acquire_semaphore("jobs/pool", 2, ttl=5.0)
        code = await run_locked(client, "jobs/pool", argv, url=url, ttl=1.0, wait=0, permits=2)
        assert code == 0
        assert int(out.read_text()) > held.token  # a semaphore grant: a new, larger token
        assert (await client.inspect("jobs/pool")).holders == 1
        assert await run_locked(client, "jobs/pool", argv, url=url, ttl=1.0, wait=0,
                                permits=3) == NOT_TAKEN  # fmt: skip
        await client.release(held)


def test_run_shared_and_permits_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["run", "x", "--shared", "--permits", "2", "--", PY, "-c", "pass"])
    assert exited.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


class DroppingProxy:
    """A TCP proxy to the gateway that loses the answers of the first ``drop`` requests:
    it forwards the request, waits for the gateway's answer, and resets the client's
    connection instead of passing the answer on."""

    def __init__(self, upstream: str, drop: int) -> None:
        parts = urlsplit(upstream)
        self.host, self.port = parts.hostname or "", parts.port or 80
        self.drop = drop
        self.requests = 0
        self.server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aenter__(self) -> DroppingProxy:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(self.host, self.port)

        async def requests() -> None:
            while data := await reader.read(65536):
                self.requests += sum(data.startswith(m) for m in (b"GET ", b"POST ", b"DELETE "))
                up_writer.write(data)
                await up_writer.drain()

        async def answers() -> None:
            while data := await up_reader.read(65536):
                if self.drop > 0:
                    self.drop -= 1
                    writer.transport.abort()  # the answer is lost
                    return
                writer.write(data)
                await writer.drain()

        pumps = [asyncio.create_task(requests()), asyncio.create_task(answers())]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            up_writer.close()
            writer.close()


@pytest.mark.parametrize("kind", ["exclusive", "semaphore"])
async def test_an_acquire_with_a_key_retries_a_lost_answer_and_gets_its_lease(
    served: tuple[str, CollectorRegistry], kind: str
) -> None:
    url, _ = served
    name = f"lost/{kind}"

    async def take(client: FencegateClient, key: str | None) -> Lease:
        if kind == "semaphore":
            return await client.acquire_semaphore(name, 1, ttl=5.0, idempotency_key=key)
        return await client.acquire(name, ttl=5.0, idempotency_key=key)

    async with DroppingProxy(url, drop=1) as proxy, FencegateClient(proxy.url) as client:
        lease = await take(client, "job-7")
        assert proxy.requests == 2  # the lost answer, then the retry
        status = await client.inspect(name)
        assert (status.holders, status.token) == (1, lease.token)
        await client.release(lease)

    async with DroppingProxy(url, drop=1) as proxy, FencegateClient(proxy.url) as client:
        with pytest.raises(GatewayUnavailable):  # no key: no retry
            await take(client, None)
        with pytest.raises(LockHeld):  # a retry by hand queues behind its own lost lease
            await take(client, None)


async def test_the_sync_client_retries_a_lost_answer_with_its_key(
    served: tuple[str, CollectorRegistry],
) -> None:
    url, _ = served
    async with DroppingProxy(url, drop=1) as proxy:

        def work() -> tuple[str, int]:
            with SyncFencegateClient(proxy.url, timeout=10.0) as client:
                lease = client.acquire("lost/sync", ttl=5.0, mode="shared", idempotency_key="s-1")
                holders = client.inspect("lost/sync").holders
                client.release(lease)
                return lease.mode, holders

        assert await asyncio.to_thread(work) == ("shared", 1)
        assert proxy.requests == 4  # lost, retried, inspect, release


async def test_run_survives_a_lost_answer_to_its_acquire(
    served: tuple[str, CollectorRegistry],
) -> None:
    url, _ = served
    async with DroppingProxy(url, drop=1) as proxy, FencegateClient(proxy.url) as client:
        argv = [PY, "-c", "import sys; sys.exit(5)"]
        status = await run_locked(client, "jobs/lost", argv, url=proxy.url, ttl=1.0, wait=0)
        assert status == 5  # it got its lease back and ran the command
        assert not (await client.inspect("jobs/lost")).held  # and released it
