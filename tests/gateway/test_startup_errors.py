"""``fencegate serve`` that cannot start: one line naming the cause, exit 1, no traceback."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.cli import main
from tests._servers import free_port
from tests.conftest import with_credentials
from tests.gateway._tls import make_cert

ROOT = Path(__file__).resolve().parents[2]


def serve(cwd: Path, *args: str, config: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FENCEGATE_")}
    argv = [sys.executable, "-m", "gateway", "serve", *args]
    if config is not None:
        (cwd / "fencegate.toml").write_text(config)
        argv += ["--config", str(cwd / "fencegate.toml")]
    return subprocess.run(
        argv, cwd=cwd, env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip


def assert_one_clear_line(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert "draining" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1, result.stderr
    for needle in needles:
        assert needle in errors[0], (needle, errors[0])


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_a_busy_listen_port(tmp_path: Path, busy_port: int) -> None:
    result = serve(tmp_path, "--listen", f"127.0.0.1:{busy_port}")
    assert_one_clear_line(
        result, f"cannot listen on 127.0.0.1:{busy_port} (listen)", "address already in use"
    )


def test_a_busy_metrics_listen_port(tmp_path: Path, busy_port: int) -> None:
    listen = f"127.0.0.1:{free_port()}"
    result = serve(tmp_path, "--listen", listen, "--metrics-listen", f"127.0.0.1:{busy_port}")
    assert_one_clear_line(result, f"127.0.0.1:{busy_port} (metrics_listen)", "already in use")


def tls_config(cert: Path, key: Path) -> str:
    return (
        f'listen = "127.0.0.1:{free_port()}"\n[tls]\ncert = "{cert}"\nkey = "{key}"\n'
        f'[stores.files]\ntype = "files"\nroot = "data"\n'
    )


def test_a_garbage_certificate(tmp_path: Path) -> None:
    _, key = make_cert(tmp_path)
    garbage = tmp_path / "garbage.crt"
    garbage.write_text("this is not a certificate\n")
    result = serve(tmp_path, config=tls_config(garbage, key))
    assert_one_clear_line(result, "'tls.cert'", str(garbage), "not a readable PEM certificate")


def test_a_key_that_does_not_match_the_certificate(tmp_path: Path) -> None:
    cert, _ = make_cert(tmp_path, "one")
    _, other_key = make_cert(tmp_path, "two")
    result = serve(tmp_path, config=tls_config(cert, other_key))
    assert_one_clear_line(result, "'tls.key'", str(other_key), "matching tls.cert")


def test_check_config_rejects_a_garbage_certificate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, key = make_cert(tmp_path)
    garbage = tmp_path / "garbage.crt"
    garbage.write_text("-----BEGIN CERTIFICATE-----\nbm9wZQ==\n-----END CERTIFICATE-----\n")
    path = tmp_path / "fencegate.toml"
    path.write_text(tls_config(garbage, key))
    assert main(["check-config", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "'tls.cert'" in err
    assert str(garbage) in err
    cert, key = make_cert(tmp_path, "good")
    path.write_text(tls_config(cert, key))
    assert main(["check-config", str(path)]) == 0
    assert capsys.readouterr().out.startswith(f"ok: {path}")


def mysql_config(dsn: str, **store: object) -> str:
    lines = [
        f'listen = "127.0.0.1:{free_port()}"',
        "[stores.db]",
        'type = "mysql"',
        f'dsn = "{dsn}"',
    ]
    for key, value in store.items():
        lines.append(f"{key} = {json.dumps(value)}")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("store", "needles"),
    [
        ({}, ["store 'db' could not start", "Access denied", "1045"]),
        ({"table": "nope", "key_column": "id", "columns": ["v"]}, ["nope' does not exist"]),
        ({"table": "t", "key_column": "id", "columns": ["v", "gone"]},
         ["column 'gone' does not exist"]),
    ],
)  # fmt: skip
def test_mysql_store_misconfigured(
    tmp_path: Path, mysql_dsn: str, store: dict[str, object], needles: list[str]
) -> None:
    dsn = mysql_dsn
    if not store:  # wrong credentials
        dsn = with_credentials(mysql_dsn, "fencegate_nobody", "hunter2")
    else:
        subprocess.run(
            [sys.executable, "-c", CREATE_T, mysql_dsn], check=True, timeout=60,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
    result = serve(tmp_path, config=mysql_config(dsn, **store))
    assert_one_clear_line(result, *needles)
    assert "hunter2" not in result.stderr


CREATE_T = """
import asyncio, sys
from tests.conftest import mysql_connect
async def main():
    conn = await mysql_connect(sys.argv[1])
    async with conn.cursor() as cur:
        await cur.execute("CREATE TABLE t (id INT PRIMARY KEY, v INT) ENGINE=InnoDB")
    conn.close()
asyncio.run(main())
"""


def test_mysql_store_unreachable_with_strict_start(tmp_path: Path) -> None:
    dsn = f"mysql://root@127.0.0.1:{free_port()}/test"
    result = serve(tmp_path, "--strict-start", config=mysql_config(dsn))
    assert_one_clear_line(result, "store 'db' could not start", "strict_start")


def test_an_unknown_store_type(tmp_path: Path) -> None:
    config = f'listen = "127.0.0.1:{free_port()}"\n[stores.db]\ntype = "mongodb"\n'
    result = serve(tmp_path, config=config)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "'stores.db.type'" in lines[0]
    assert "'mongodb'" in lines[0]
