"""Real server processes for tests: redis-server nodes on free loopback ports.

Each node runs in its own temp dir with no persistence, so a test can
``pause()`` it (SIGSTOP), ``resume()`` it, ``kill()`` it and ``restart()`` it,
with or without its data. Nothing here fakes Redis.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = ["RedisNode", "free_port"]

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _own_ports() -> Iterator[int]:
    """This process's share of the ports below the kernel's ephemeral range, in turn.

    A port handed out here is bound later (by a server process that takes a second to
    start): below the ephemeral range, no outgoing connection and no ``bind(0)`` can
    take it meanwhile, and each pytest-xdist worker draws from a slice of its own.
    """
    low, high = 20000, max(_ephemeral_low(), 20000 + 1000)
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    size = (high - low) // max(workers, 1)
    first = low + size * (worker % max(workers, 1))
    start = random.randrange(size)  # other test runs on this machine start elsewhere
    while True:
        for i in range(size):
            yield first + (start + i) % size


_PORTS = _own_ports()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (see ``_own_ports``)."""
    for _ in range(1000):
        port = next(_PORTS)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


class PortTaken(RuntimeError):
    """redis-server could not listen: something else took its port."""


class RedisNode:
    """One redis-server process that a test may pause, kill and restart."""

    def __init__(self, workdir: Path, *, persist: bool = False) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.persist = persist
        self.proc: subprocess.Popen[bytes] | None = None
        self._started = False
        workdir.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        for attempt in range(3):
            try:
                self._start()
                break
            except PortTaken:
                if self._started or attempt == 2:  # a restart keeps its address: tests rely on it
                    raise
                # Another process (a parallel test worker) took the free port first.
                self.port = free_port()
        self._started = True

    def _start(self) -> None:
        args = [
            REDIS_SERVER,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.workdir),
            "--save", "",
            "--appendonly", "yes" if self.persist else "no",
            "--appendfsync", "always",
            "--daemonize", "no",
            "--logfile", str(self.workdir / "redis.log"),
        ]  # fmt: skip
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._wait_ready()

    def _wait_ready(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                log = (self.workdir / "redis.log").read_text(errors="replace")
                error = PortTaken if "Address already in use" in log[-500:] else RuntimeError
                raise error(f"redis-server on port {self.port} exited:\n{log[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                    # ours, not a server of another test worker that took the port first
                    sock.sendall(b"INFO server\r\n")
                    if f"process_id:{self.proc.pid}\r\n".encode() in sock.recv(1 << 16):
                        return
            except OSError:
                pass
            time.sleep(0.02)
        raise RuntimeError(f"redis-server on port {self.port} did not start")

    def command(self, *args: str) -> bytes:
        """Send one command over a fresh socket and return the raw reply."""
        payload = f"*{len(args)}\r\n".encode()
        for arg in args:
            data = arg.encode()
            payload += b"$%d\r\n%s\r\n" % (len(data), data)
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock:
            sock.sendall(payload)
            return sock.recv(1 << 20)

    def flushall(self) -> None:
        self.command("FLUSHALL")
        self.command("CONFIG", "RESETSTAT")

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(timeout=10)
        self.proc = None

    def restart(self, *, lose_data: bool = True) -> None:
        """Kill and start again on the same port; with ``lose_data`` nothing survives."""
        self.kill()
        if lose_data:
            for name in os.listdir(self.workdir):
                path = self.workdir / name
                if name != "redis.log":
                    shutil.rmtree(path) if path.is_dir() else path.unlink()
        self.start()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        self.kill()
