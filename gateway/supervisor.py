"""``fencegate serve --workers N``: a supervisor process and N gateway workers on one address.

The supervisor checks that nothing listens on ``listen`` (and
``metrics_listen``) yet, creates the server's shared directory
(``gateway/shared.py``: prometheus-client's multiprocess files and the
hot-lock snapshots), and starts N worker processes (``gateway/worker.py``), each
in a session of its own (a terminal's Ctrl-C reaches the supervisor only).
Every worker binds the address with ``SO_REUSEPORT``, so the kernel spreads
connections over them; each has its own ``/healthz`` and ``/readyz`` as a
single gateway has.

* SIGTERM or SIGINT: passed on to every worker, which drains as a single
  gateway does (``gateway/serve.py``); a second signal is passed on too (it
  ends the grace period early). Once all have exited the supervisor removes
  the shared directory, logs ``stopped`` and exits 0. A worker still running
  ``shutdown_timeout_ms`` plus ``_KILL_MARGIN`` after the signal is killed.
* A worker that exits on its own (crashed, killed) is logged at WARNING with
  its pid and exit status and started again: at once if it had run for
  ``_STABLE`` seconds, else after a backoff that doubles from
  ``_BACKOFF_FIRST`` to ``_BACKOFF_MAX``. After ``_GIVE_UP`` quick failures in
  a row the supervisor logs an ERROR, stops the other workers and exits 1.
* A worker that cannot start at all (a port taken, a bad certificate, a store
  with ``strict_start``) stops the server at once with exit status 1, as a
  single gateway refuses to start.
* The supervisor dies (SIGKILL): each worker sees its stdin pipe end and
  drains itself (``gateway/worker.py``); nothing is left running, and the
  next supervisor to start removes the shared directory left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
from pathlib import Path
from typing import Final

from gateway.config import Address, Config
from gateway.errors import StartupError
from gateway.serve import REFUSED, Signals
from gateway.shared import SharedDir
from gateway.worker import Setup

__all__ = ["WorkersFailed", "supervise"]

log = logging.getLogger("fencegate")

_STABLE: Final = 10.0
"""Seconds a worker must have run for its exit not to count as a failure at start."""
_GIVE_UP: Final = 5
_BACKOFF_FIRST: Final = 0.25
_BACKOFF_MAX: Final = 8.0
_KILL_MARGIN: Final = 5.0
_PREFIX: Final = "fencegate-workers-"
# not ``-m gateway.worker``: as ``__main__`` its Setup would not be the class pickled here
_WORKER: Final = "from gateway.worker import main; raise SystemExit(main())"


class WorkersFailed(Exception):
    """The workers cannot be kept running: one could not start, or they keep crashing."""


def supervise(config: Config, *, access_log: bool = False, log_level: str | None = None) -> int:
    """Run ``config.worker_count`` workers until SIGTERM/SIGINT; the exit status."""
    try:
        for where, key in ((config.listen, "listen"), (config.metrics_listen, "metrics_listen")):
            if where is not None:
                _check_free(where, key)
    except StartupError as exc:
        log.error("cannot start: %s", exc)
        return REFUSED
    _remove_orphans()
    with tempfile.TemporaryDirectory(prefix=_PREFIX) as path:
        setup = Setup(
            config=dataclasses.replace(config, warnings=()),  # logged here, once
            index=0,
            shared=path,
            access_log=access_log,
            log_level=log_level or config.log_level,
        )
        return asyncio.run(_Supervisor(setup, config.worker_count).run())


def _remove_orphans() -> None:
    """Remove the shared dirs of supervisors that died without cleaning up (SIGKILL)."""
    for path in Path(tempfile.gettempdir()).glob(f"{_PREFIX}*"):
        pids = SharedDir(path).pids()
        if pids and not _alive(pids[0]):
            shutil.rmtree(path, ignore_errors=True)  # another user's: not ours to remove


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _check_free(where: Address, key: str) -> None:
    """Bind ``where`` once without SO_REUSEPORT: it fails if anything listens there,
    including another server's workers, which would otherwise share the port with ours."""
    try:
        infos = socket.getaddrinfo(
            where.host, where.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as exc:
        raise StartupError(f"cannot listen on {where} ({key}): {exc.strerror}") from None
    for family, kind, proto, _, sockaddr in infos:
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(sockaddr)
            except OSError as exc:
                in_use = exc.errno == errno.EADDRINUSE
                reason = "address already in use" if in_use else (exc.strerror or str(exc))
                raise StartupError(f"cannot listen on {where} ({key}): {reason}") from None


def _status(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


class _Supervisor:
    def __init__(self, setup: Setup, count: int) -> None:
        self._setup = setup
        self._count = count
        self._shared = SharedDir(setup.shared)
        self._procs: dict[int, asyncio.subprocess.Process] = {}
        self._stopping = False
        self._quick = 0  # failures at start in a row, over all workers

    async def run(self) -> int:
        signals = Signals()
        self._publish()
        log.info(
            "supervisor (pid %d): starting %d workers on %s; metrics merged in %s",
            os.getpid(),
            self._count,
            self._setup.config.listen,
            self._shared,
        )
        slots = [asyncio.create_task(self._keep(i)) for i in range(self._count)]
        first_signal = asyncio.create_task(signals.next())
        status = 0
        try:
            done, _ = await asyncio.wait({first_signal, *slots}, return_when="FIRST_COMPLETED")
            if first_signal not in done:
                for task in done:
                    log.error("%s; stopping the other workers", task.exception())
                status = REFUSED
            else:
                log.info("signal: draining %d workers", len(self._procs))
            first_signal.cancel()
            await self._stop(slots, signals)
        finally:
            signals.close()
            for proc in self._procs.values():  # only after a bug: never leave one behind
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
        log.info("stopped")
        return status

    async def _stop(self, slots: list[asyncio.Task[None]], signals: Signals) -> None:
        self._stopping = True
        self._signal_all(signal.SIGTERM)
        for index, task in enumerate(slots):
            if index not in self._procs:
                task.cancel()  # waiting to restart a worker: nothing to stop
        forward = asyncio.create_task(self._forward(signals))
        limit = self._setup.config.shutdown_timeout + _KILL_MARGIN
        try:
            _, late = await asyncio.wait(slots, timeout=limit)
            if late:
                log.warning("workers still running after %.1f s: killing them", limit)
                self._signal_all(signal.SIGKILL)
                await asyncio.wait(slots)
        finally:
            forward.cancel()

    async def _forward(self, signals: Signals) -> None:
        while True:
            await signals.next()
            log.info("second signal: passed on to the workers")
            self._signal_all(signal.SIGTERM)

    def _signal_all(self, sig: int) -> None:
        for proc in self._procs.values():
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)

    def _publish(self) -> None:
        self._shared.set_pids([os.getpid(), *(p.pid for p in self._procs.values())])

    async def _keep(self, index: int) -> None:
        """Run worker ``index``; start it again when it exits, until stopping."""
        loop = asyncio.get_running_loop()
        first = True
        while not self._stopping:
            proc = await self._spawn(index)
            started = loop.time()
            code = await proc.wait()
            lived = loop.time() - started
            ready = self._shared.is_ready(proc.pid)
            del self._procs[index]
            self._shared.forget(proc.pid)
            self._publish()
            what = f"worker {index} (pid {proc.pid}) {_status(code)}"
            if self._stopping:
                if code not in (0, -signal.SIGTERM):
                    log.warning("%s while stopping", what)
                return
            if first and not ready:
                raise WorkersFailed(f"{what} before it could serve (see above)")
            first = False
            if ready and lived >= _STABLE:
                self._quick, delay = 0, 0.0
            else:
                self._quick += 1
                if self._quick >= _GIVE_UP:
                    raise WorkersFailed(
                        f"{what}; workers failed {self._quick} times in a row within "
                        f"{_STABLE:.0f} s of starting: giving up"
                    )
                delay = min(_BACKOFF_FIRST * 2 ** (self._quick - 1), _BACKOFF_MAX)
            log.warning("%s; starting it again in %.2f s", what, delay)
            self._shared.count_restart()
            await asyncio.sleep(delay)

    async def _spawn(self, index: int) -> asyncio.subprocess.Process:
        env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(self._shared)}
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _WORKER,
            stdin=asyncio.subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
        self._procs[index] = proc
        self._publish()
        assert proc.stdin is not None
        proc.stdin.write(dataclasses.replace(self._setup, index=index).encode())
        with contextlib.suppress(ConnectionError):  # it died at once: proc.wait() says how
            await proc.stdin.drain()
        # proc.stdin stays open: its end tells the worker that the supervisor is gone
        log.info("worker %d started: pid %d", index, proc.pid)
        if self._stopping:
            proc.send_signal(signal.SIGTERM)
        return proc
