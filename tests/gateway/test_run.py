"""``fencegate run``: a command under a lock, with the lease renewed and lost-lease handling.

Against a running gateway over each lock backend; the commands are real
child processes (``python -c``).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from gateway.client import FencegateClient
from gateway.run import LOST, NOT_TAKEN, run_locked
from tests._servers import RedisNode, free_port
from tests.gateway.conftest import Client, Start, make_config

PY = sys.executable


async def release_by_hand(url: str, name: str, lease_id: str) -> None:
    """A DELETE as curl would send it: the lease is gone for its holder's next renew."""
    async with (
        aiohttp.ClientSession() as http,
        http.delete(f"{url}/v1/locks/{name}", headers={"X-Lease-Id": lease_id}) as response,
    ):
        assert response.status == 204


@pytest.fixture
async def server(start: Start, lock_urls: list[str]) -> Client:
    return await start(make_config(lock_urls=lock_urls))


@pytest.fixture
async def gateway(server: Client) -> AsyncIterator[tuple[FencegateClient, str]]:
    url = str(server.make_url("")).rstrip("/")
    async with FencegateClient(url) as client:
        yield client, url


async def test_the_command_runs_under_the_lock_with_its_lease_in_the_environment(
    gateway: tuple[FencegateClient, str], tmp_path: Path
) -> None:
    client, url = gateway
    out = tmp_path / "env.json"
    script = (
        "import json, os, sys; "
        "json.dump({k: v for k, v in os.environ.items() if k.startswith('FENCEGATE_')}, "
        f"open({str(out)!r}, 'w')); sys.exit(7)"
    )
    status = await run_locked(client, "jobs/nightly", [PY, "-c", script], url=url, ttl=1.0, wait=0)
    assert status == 7  # the command's own status
    env = json.loads(out.read_text())
    assert env["FENCEGATE_LOCK"] == "jobs/nightly"
    assert env["FENCEGATE_URL"] == url
    assert len(env["FENCEGATE_LEASE_ID"]) == 32
    assert int(env["FENCEGATE_TOKEN"]) > 0
    assert not (await client.status("jobs/nightly")).held  # released when it exited


async def test_the_lease_is_renewed_while_a_long_command_runs(
    gateway: tuple[FencegateClient, str],
) -> None:
    client, url = gateway
    argv = [PY, "-c", "import time; time.sleep(1.0)"]
    task = asyncio.create_task(run_locked(client, "jobs/long", argv, url=url, ttl=0.3, wait=0))
    await asyncio.sleep(0.7)  # more than twice the ttl
    assert (await client.status("jobs/long")).held
    assert await task == 0


async def test_a_held_lock_is_not_taken_and_the_command_never_runs(
    gateway: tuple[FencegateClient, str], tmp_path: Path
) -> None:
    client, url = gateway
    marker = tmp_path / "ran"
    argv = [PY, "-c", f"open({str(marker)!r}, 'w')"]
    async with client.lock("jobs/busy", ttl=5.0):
        status = await run_locked(client, "jobs/busy", argv, url=url, ttl=1.0, wait=0.2)
    assert status == NOT_TAKEN
    assert not marker.exists()


async def test_a_lost_lease_stops_the_command_and_exits_75(
    gateway: tuple[FencegateClient, str], tmp_path: Path
) -> None:
    client, url = gateway
    lease_file, stopped = tmp_path / "lease", tmp_path / "stopped"
    script = (
        "import os, signal, sys, time\n"
        f"open({str(lease_file)!r}, 'w').write(os.environ['FENCEGATE_LEASE_ID'])\n"
        "def stop(*_):\n"
        f"    open({str(stopped)!r}, 'w').write('SIGTERM'); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "time.sleep(30)\n"
    )
    task = asyncio.create_task(
        run_locked(client, "jobs/lost", [PY, "-c", script], url=url, ttl=0.6, wait=0)
    )
    for _ in range(200):
        if lease_file.exists() and lease_file.read_text():
            break
        await asyncio.sleep(0.02)
    # someone releases the lease (an operator, or it expired): the next renew finds it gone
    http = client._client()
    async with http.delete(
        f"{url}/v1/locks/jobs/lost", headers={"X-Lease-Id": lease_file.read_text()}
    ) as r:
        assert r.status == 204
    assert await asyncio.wait_for(task, 5.0) == LOST
    assert stopped.read_text() == "SIGTERM"


async def test_a_command_that_ignores_sigterm_is_killed(
    gateway: tuple[FencegateClient, str], tmp_path: Path
) -> None:
    client, url = gateway
    lease_file = tmp_path / "lease"
    script = (
        "import os, signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"open({str(lease_file)!r}, 'w').write(os.environ['FENCEGATE_LEASE_ID'])\n"
        "time.sleep(30)\n"
    )
    task = asyncio.create_task(
        run_locked(
            client, "jobs/stubborn", [PY, "-c", script], url=url, ttl=0.6, wait=0, kill_after=0.3
        )
    )
    for _ in range(200):
        if lease_file.exists() and lease_file.read_text():
            break
        await asyncio.sleep(0.02)
    await release_by_hand(url, "jobs/stubborn", lease_file.read_text())
    assert await asyncio.wait_for(task, 5.0) == LOST


async def test_a_command_killed_by_a_signal_exits_128_plus_it(
    gateway: tuple[FencegateClient, str],
) -> None:
    client, url = gateway
    argv = [PY, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]
    assert await run_locked(client, "jobs/killed", argv, url=url, ttl=1.0, wait=0) == 128 + 9


async def test_a_missing_command_is_127_and_the_lock_is_released(
    gateway: tuple[FencegateClient, str],
) -> None:
    client, url = gateway
    argv = ["/nonexistent/fencegate-test-command"]
    assert await run_locked(client, "jobs/missing", argv, url=url, ttl=1.0, wait=0) == 127
    assert not (await client.status("jobs/missing")).held


def test_the_cli_runs_a_command_under_the_lock_and_exits_with_its_status(
    tmp_path: Path, redis3: list[RedisNode]
) -> None:
    """The console script end to end: a gateway process over 3 Redis nodes."""
    config = tmp_path / "fencegate.toml"
    port = free_port()
    urls = ", ".join(f'"{n.url}"' for n in redis3)
    config.write_text(f'listen = "127.0.0.1:{port}"\n[locks]\nredis = [{urls}]\n')
    gateway = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                with urllib.request.urlopen(f"{url}/healthz", timeout=1):
                    break
            except OSError:
                time.sleep(0.05)
        fencegate = [sys.executable, "-m", "gateway", "run", "--url", url]
        script = "import os, sys; print(os.environ['FENCEGATE_TOKEN']); sys.exit(3)"
        done = subprocess.run(
            [*fencegate, "jobs/cli", "--ttl-ms", "2000", "--", PY, "-c", script],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 3, done.stderr
        assert int(done.stdout) > 0
        none = subprocess.run([*fencegate, "jobs/cli"], capture_output=True, text=True, timeout=30)
        assert none.returncode == 2
        assert "needs a command" in none.stderr
        # run prints nothing of its own to shape: --json is refused, not ignored
        flagged = [*fencegate, "jobs/cli", "--json", "--", PY, "-c", "pass"]
        refused = subprocess.run(flagged, capture_output=True, text=True, timeout=30)
        assert refused.returncode == 2
        assert "unrecognized arguments: --json" in refused.stderr
        # a name the lock routes refuse: not taken (exit 1), one line, no traceback
        renew = [*fencegate, "jobs/renew", "--", PY, "-c", "print('ran')"]
        bad = subprocess.run(renew, capture_output=True, text=True, timeout=30)
        assert bad.returncode == 1, bad.stderr
        assert "not taken" in bad.stderr
        assert "Traceback" not in bad.stderr
        assert "ran" not in bad.stdout
    finally:
        gateway.terminate()
        gateway.wait(30)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not reaped yet, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


async def test_a_command_whose_run_is_killed_with_sigkill_gets_sigterm(
    server: Client, tmp_path: Path
) -> None:
    """A SIGKILLed ``run`` renews no more: its command must not outlive it.

    It gets SIGTERM at once (its lease is not lost yet, but nothing keeps it any
    more), as it would on a lost lease.
    """
    url = str(server.make_url("")).rstrip("/")
    pid_file = tmp_path / "pid"
    script = (
        f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    )
    run = await asyncio.create_subprocess_exec(
        *[PY, "-m", "gateway", "run", "--url", url, "jobs/orphan", "--ttl-ms", "1000"],
        *["--", PY, "-c", script],
    )
    command = 0
    try:
        for _ in range(400):
            if pid_file.exists() and pid_file.read_text():
                command = int(pid_file.read_text())
                break
            await asyncio.sleep(0.05)
        assert command, "the command did not start"
        run.kill()
        await run.wait()
        for _ in range(100):
            if not _alive(command):
                break
            await asyncio.sleep(0.05)
        assert not _alive(command), "the command outlived its killed run"
    finally:
        if command and _alive(command):
            os.kill(command, signal.SIGKILL)
