"""Real server processes for tests: redis-server nodes on free loopback ports.

Each node runs in its own temp dir with no persistence, so a test can
``pause()`` it (SIGSTOP), ``resume()`` it, ``kill()`` it and ``restart()`` it,
with or without its data. Nothing here fakes Redis.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

__all__ = ["RedisNode", "free_port"]

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisNode:
    """One redis-server process that a test may pause, kill and restart."""

    def __init__(self, workdir: Path, *, persist: bool = False) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.persist = persist
        self.proc: subprocess.Popen[bytes] | None = None
        workdir.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
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
                raise RuntimeError(f"redis-server on port {self.port} exited:\n{log[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(64).startswith(b"+PONG"):
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
