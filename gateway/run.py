"""``fencegate run NAME -- CMD``: run a command while holding a lock (like ``flock(1)``).

The lock is exclusive, shared (``--shared``) or one lease of a semaphore
(``--permits N``), taken with an ``Idempotency-Key`` of its own (a lost
answer is retried and the lease comes back). It is taken first (exit 1
without running anything if it cannot be); the command then runs in a
process group of its own with ``FENCEGATE_LOCK``, ``FENCEGATE_TOKEN``,
``FENCEGATE_LEASE_ID`` and ``FENCEGATE_URL`` in its environment, while the
lease is renewed every ttl/3. SIGINT, SIGTERM and SIGHUP sent to ``run`` are
passed on to the command's group. When the command exits, the lease is
released and ``run`` exits with the command's status (128 + N for a command
killed by signal N). If the lease is lost while the command runs, the
command's group gets SIGTERM, SIGKILL ``kill_after`` seconds later if it is
still there, and ``run`` exits 75 (EX_TEMPFAIL): its work may have
overlapped another holder's and should be retried.
If ``run`` itself dies without ending the command (SIGKILL, a crash), a
guard process it started beside the command sends the command's group
SIGTERM, and SIGKILL ``kill_after`` seconds later: nothing renews the lease
any more.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import sys
from collections.abc import Sequence

from gateway.client import FencegateClient, FencegateError, LeaseLost

__all__ = ["LOST", "NOT_TAKEN", "run_locked"]

NOT_TAKEN = 1  # the lock could not be taken: the command did not run
LOST = 75  # EX_TEMPFAIL: the lease was lost while the command ran
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


async def run_locked(
    client: FencegateClient,
    name: str,
    argv: Sequence[str],
    *,
    url: str,
    ttl: float,
    wait: float,
    kill_after: float = 10.0,
    mode: str = "exclusive",
    permits: int | None = None,
) -> int:
    """Run ``argv`` under the lock ``name``; return the exit status ``run`` should have.

    ``mode``: ``"exclusive"`` or ``"shared"``; with ``permits``, one of that many
    leases of the semaphore ``name`` instead.
    """
    if not argv:
        raise ValueError("no command to run: fencegate run NAME -- CMD [ARGS...]")
    started = False
    status = NOT_TAKEN
    # A lost answer to the acquire is retried with this key: the lease it granted comes
    # back instead of a second place in the queue behind it.
    key = f"fencegate-run:{secrets.token_hex(16)}"
    held = (
        client.lock(name, ttl=ttl, wait=wait, auto_renew=True, mode=mode, idempotency_key=key)
        if permits is None
        else client.semaphore(name, permits, ttl=ttl, wait=wait, idempotency_key=key)
    )
    try:
        async with held as lease:
            started = True
            env = {
                **os.environ,
                "FENCEGATE_LOCK": name,
                "FENCEGATE_TOKEN": str(lease.token),
                "FENCEGATE_LEASE_ID": lease.lease_id,
                "FENCEGATE_URL": url,
            }
            status = await _run(argv, env, kill_after)
    except LeaseLost as exc:
        if not started:
            _say(f"lock {name!r} not taken: {exc}")
            return NOT_TAKEN
        _say(f"lease on {name!r} lost while the command ran ({exc}); it was stopped")
        return LOST
    except FencegateError as exc:
        if not started:
            _say(f"lock {name!r} not taken: {exc}")
            return NOT_TAKEN
        # the command ran under the lock; only the release failed (the lease expires)
        _say(f"release of {name!r} failed, the lease will expire: {exc}")
    except ValueError as exc:  # a name or value the client refuses before sending it
        if started:
            raise
        _say(f"lock {name!r} not taken: {exc}")
        return NOT_TAKEN
    return status


async def _run(argv: Sequence[str], env: dict[str, str], kill_after: float) -> int:
    guard = await _guard(kill_after)
    try:
        try:
            proc = await asyncio.create_subprocess_exec(*argv, env=env, start_new_session=True)
        except OSError as exc:
            _say(f"cannot run {argv[0]!r}: {exc.strerror or exc}")
            return 127 if isinstance(exc, FileNotFoundError) else 126
        _tell(guard, f"{proc.pid}\n")
        loop = asyncio.get_running_loop()
        for sig in _FORWARDED:
            loop.add_signal_handler(sig, _forward, proc.pid, sig)
        try:
            code = await proc.wait()
        except asyncio.CancelledError:
            # the renewal watchdog found the lease lost: stop the command, then let the
            # lock's context raise LeaseLost
            await asyncio.shield(_stop(proc, kill_after))
            raise
        finally:
            for sig in _FORWARDED:
                loop.remove_signal_handler(sig)
        return 128 - code if code < 0 else code
    finally:
        _tell(guard, "done\n")  # the command has ended: the guard has nothing to do
        await _close(guard)


# The guard: a process of its own that stops the command's process group when ``run``
# dies without saying that the command ended (SIGKILL, a crash, the OOM killer): then
# nothing renews the lease any more, and the command must not run on past it. It reads
# the group's id, then waits for "done" or the end of its input (``run`` gone, whatever
# killed it); on the latter it sends SIGTERM, and SIGKILL ``kill_after`` seconds later.
_GUARD = """\
import os, signal, sys, time
lines = sys.stdin.readline(), sys.stdin.readline()
if not lines[0].strip().isdigit() or lines[1] == "done\\n":
    sys.exit(0)
group, kill_after = int(lines[0]), float(sys.argv[1])
def signal_group(sig):
    try:
        os.killpg(group, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False
if signal_group(signal.SIGTERM):
    end = time.monotonic() + kill_after
    while time.monotonic() < end and signal_group(0):
        time.sleep(0.1)
    signal_group(signal.SIGKILL)
"""


async def _guard(kill_after: float) -> asyncio.subprocess.Process | None:
    """Start the guard of the command's group (None if it cannot start: run unguarded)."""
    try:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-I", "-S", "-c", _GUARD, str(kill_after),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
            start_new_session=True,  # out of the terminal's reach: Ctrl-C is for run
        )  # fmt: skip
    except OSError as exc:
        _say(f"cannot start the guard that stops the command if run dies: {exc}")
        return None


def _tell(guard: asyncio.subprocess.Process | None, line: str) -> None:
    if guard is not None and guard.stdin is not None and not guard.stdin.is_closing():
        guard.stdin.write(line.encode())


async def _close(guard: asyncio.subprocess.Process | None) -> None:
    if guard is None or guard.stdin is None:
        return
    guard.stdin.close()
    with contextlib.suppress(ConnectionError):
        await guard.stdin.wait_closed()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(guard.wait(), 5.0)


async def _stop(proc: asyncio.subprocess.Process, kill_after: float) -> None:
    _forward(proc.pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), kill_after)
    except TimeoutError:
        _forward(proc.pid, signal.SIGKILL)
        await proc.wait()


def _forward(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)


def _say(message: str) -> None:
    print(f"fencegate run: {message}", file=sys.stderr)
