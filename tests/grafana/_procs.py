"""A real ``python -m gateway serve`` and a real Prometheus, each on a free loopback port."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from tests._servers import free_port
from tests.grafana._assets import PROMETHEUS, ROOT

__all__ = ["GatewayProcess", "PrometheusProcess", "http_get"]


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _wait_for(url: str, proc: subprocess.Popen[bytes], log: Path, limit: float) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: the process exited:\n{log.read_text(errors='replace')}")
        with contextlib.suppress(OSError):
            if http_get(url, timeout=1.0)[0] == 200:
                return
        time.sleep(0.05)
    raise RuntimeError(f"{url} did not answer 200 within {limit} s")


def _stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


class GatewayProcess:
    """``python -m gateway serve --config <file>``; ``FENCEGATE_*`` of the test run left out."""

    def __init__(self, workdir: Path, toml: str) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.config = workdir / "fencegate.toml"
        # shutdown_grace_ms = 0: no load balancer to tell, close at once on SIGTERM
        self.config.write_text(f'listen = "127.0.0.1:{self.port}"\nshutdown_grace_ms = 0\n{toml}')
        self.log = workdir / "gateway.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FENCEGATE_")}
        args = [sys.executable, "-m", "gateway", "serve", "--config", str(self.config)]
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [*args, "--log-level", "warning"], cwd=ROOT, env=env, stdout=log, stderr=log
            )
        _wait_for(f"{self.url}/readyz", self.proc, self.log, 30.0)

    def stop(self) -> None:
        _stop(self.proc)


class PrometheusProcess:
    """Prometheus with a temp storage dir, scraping ``targets`` every ``interval_ms``."""

    def __init__(
        self, workdir: Path, targets: list[str], *, rule_files: list[Path], interval_ms: int = 1000
    ) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.log = workdir / "prometheus.log"
        self.proc: subprocess.Popen[bytes] | None = None
        every = f"{interval_ms}ms"
        config = {  # JSON is YAML: no YAML writer needed
            "global": {"scrape_interval": every, "evaluation_interval": every},
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": [
                {
                    "job_name": "fencegate",
                    "scrape_interval": every,
                    "scrape_timeout": every,
                    "static_configs": [{"targets": targets}],
                }
            ],
        }
        self.config = workdir / "prometheus.yml"
        self.config.write_text(json.dumps(config, indent=2))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        args = [
            str(PROMETHEUS),
            f"--config.file={self.config}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn",
        ]
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(args, cwd=self.workdir, stdout=log, stderr=log)
        _wait_for(f"{self.url}/-/ready", self.proc, self.log, 30.0)

    def stop(self) -> None:
        _stop(self.proc)

    def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/<path>; the ``data`` of a success, else an AssertionError."""
        query = urllib.parse.urlencode(params)
        status, body = http_get(f"{self.url}/api/v1/{path}?{query}")
        reply = json.loads(body)
        assert status == 200, (path, params, reply)
        assert reply["status"] == "success", (path, params, reply)
        return reply["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query; the result vector (a scalar comes back as one sample)."""
        data = self.api("query", query=expr)
        if data["resultType"] == "vector":
            result: list[dict[str, Any]] = data["result"]
            return result
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        raise AssertionError(f"{expr}: unexpected result type {data['resultType']}")

    def value(self, expr: str) -> float:
        """The single value of ``expr`` (NaN-free sum of its samples)."""
        return sum(float(s["value"][1]) for s in self.query(expr))
