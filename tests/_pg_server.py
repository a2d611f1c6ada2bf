"""A PostgreSQL server of a test's own, on a free loopback port, that it may stop and restart.

``initdb`` into a fresh temp dir (trust auth, no fsync: a killed *process* loses
nothing that reached the kernel), ``pg_ctl start`` with
``listen_addresses=127.0.0.1`` and its socket in the same dir. As root, every
PostgreSQL binary runs as the ``postgres`` OS user (``runuser``), which owns
the dir. Nothing here fakes PostgreSQL.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from tests._servers import free_port

__all__ = ["PgServer", "pg_bin_dir"]


def pg_bin_dir() -> Path | None:
    """The newest ``/usr/lib/postgresql/<version>/bin`` with initdb, pg_ctl and postgres."""
    found = []
    for initdb in glob.glob("/usr/lib/postgresql/*/bin/initdb"):
        bin_dir = Path(initdb).parent
        version = bin_dir.parent.name
        if all((bin_dir / b).exists() for b in ("pg_ctl", "postgres")) and version.isdigit():
            found.append((int(version), bin_dir))
    if not found and shutil.which("pg_ctl") and shutil.which("initdb"):
        return Path(shutil.which("pg_ctl") or "").parent
    return max(found)[1] if found else None


class PgServer:
    """One PostgreSQL cluster in a temp dir; ``start``, ``stop``, ``restart``, ``cleanup``."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.port = free_port()
        # Not under pytest's tmp_path: its parents are 0700 root, the postgres user
        # could not reach the data dir. A short path also keeps the socket name short.
        self.workdir = Path(tempfile.mkdtemp(prefix="fg-pg-"))
        self.data = self.workdir / "data"
        self.log = self.workdir / "server.log"
        self._as: list[str] = []
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(self.workdir, user.pw_uid, user.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, timeout: float = 60.0) -> None:
        result = subprocess.run(
            [*self._as, *args], capture_output=True, text=True, timeout=timeout, check=False
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"{' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
                f"\n{self.log_text()[-3000:]}"
            )

    def init(self) -> None:
        self._run(
            str(self.bin_dir / "initdb"), "-D", str(self.data), "-U", "postgres",
            "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C",
        )  # fmt: skip

    def start(self) -> None:
        options = (
            f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.workdir}"
            " -c fsync=off -c full_page_writes=off -c max_connections=100"
        )
        self._run(
            str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log),
            "-w", "-t", "60", "-o", options, "start",
        )  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m mode``: ``immediate`` kills every server process, as a crash does."""
        self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-w", "-m", mode, "stop")

    def restart(self, *, mode: str = "immediate", down: float = 1.0) -> None:
        """Stop (by default as a crash), stay down ``down`` seconds, start again."""
        self.stop(mode)
        time.sleep(down)
        self.start()

    @property
    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def cleanup(self) -> None:
        if self.running:
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                self.stop("immediate")
        shutil.rmtree(self.workdir, ignore_errors=True)
