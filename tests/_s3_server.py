"""A real S3-compatible server for tests: moto's server mode on a free loopback port.

moto (``moto[server]``, 5.1+) keeps objects in memory and honours conditional
writes (``If-Match`` / ``If-None-Match`` on PutObject, ``If-Match`` on
DeleteObject). A test may ``kill()`` it and ``start()`` it again on the same
port (an outage; its objects are gone). Nothing here fakes S3.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import boto3

from tests._servers import free_port

__all__ = ["CREDENTIALS", "MotoServer", "new_bucket_name"]

CREDENTIALS = {"access_key_id": "fencegate-test", "secret_access_key": "fencegate-test-secret"}


def new_bucket_name() -> str:
    return f"fg-{uuid.uuid4().hex[:16]}"


class MotoServer:
    """One moto server process; ``env`` adds settings (``INITIAL_NO_AUTH_ACTION_COUNT``)."""

    def __init__(self, workdir: Path, *, env: dict[str, str] | None = None) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        workdir.mkdir(parents=True, exist_ok=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(self.env)
        with open(self.workdir / "moto.log", "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=log, stderr=log, env=env, cwd=self.workdir,
            )  # fmt: skip
        self._wait_ready()

    def _wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                log = (self.workdir / "moto.log").read_text(errors="replace")
                raise RuntimeError(f"moto server on port {self.port} exited:\n{log[-2000:]}")
            try:
                with urllib.request.urlopen(self.endpoint + "/moto-api/data.json", timeout=1):
                    return
            except OSError:
                time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"moto server on port {self.port} did not start")

    def client(self, **credentials: str) -> Any:
        """A boto3 (sync) client for setting up buckets."""
        creds = credentials or CREDENTIALS
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=creds["access_key_id"],
            aws_secret_access_key=creds["secret_access_key"],
        )

    def create_bucket(self, name: str | None = None) -> str:
        bucket = name or new_bucket_name()
        self.client().create_bucket(Bucket=bucket)
        return bucket

    def kill(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait(timeout=10)
        self.proc = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None
