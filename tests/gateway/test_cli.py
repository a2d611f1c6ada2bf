"""The fencegate command: check-config, and serve + client verbs against a real process."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.cli import main
from tests._servers import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_check_config_ok(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "ok.toml"
    path.write_text('listen = "127.0.0.1:9999"\n[stores.docs]\ntype = "files"\nroot = "/tmp/d"\n')
    assert main(["check-config", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ok: ")
    assert "docs" in out
    assert "in-process" in out


def test_check_config_takes_the_file_as_config_option_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FENCEGATE_CONFIG", raising=False)
    path = tmp_path / "ok.toml"
    path.write_text('listen = "127.0.0.1:9999"\n')
    assert main(["check-config", "--config", str(path)]) == 0
    assert capsys.readouterr().out.startswith(f"ok: {path}: ")
    assert main(["check-config", "--config", str(path), str(path)]) == 2
    assert main(["check-config"]) == 2
    assert "F or --config F" in capsys.readouterr().err


def test_check_config_reads_fencegate_config_as_serve_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # serve, pg and groups take the file from $FENCEGATE_CONFIG; check-config checks that file.
    path = tmp_path / "env.toml"
    path.write_text('listen = "127.0.0.1:9998"\n')
    monkeypatch.setenv("FENCEGATE_CONFIG", str(path))
    assert main(["check-config"]) == 0
    assert capsys.readouterr().out.startswith(f"ok: {path}: listen 127.0.0.1:9998")
    path.write_text('listen = "nowhere"\n')
    assert main(["check-config"]) == 1
    assert "'listen'" in capsys.readouterr().err


def test_check_config_of_deeply_nested_toml_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "deep.toml"
    path.write_text("x = " + "[" * 3000 + "]" * 3000 + "\n")
    assert main(["check-config", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "nested too deeply" in err


def test_check_config_error_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[stores.kv]\ntype = "postgres"\ndsn = "mysql://u:hunter2@h/d"\n')
    assert main(["check-config", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "'stores.kv.dsn'" in err
    assert "hunter2" not in err


def test_serve_refuses_a_bad_config(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--listen", "0.0.0.0:1"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=30,
    )  # fmt: skip
    assert result.returncode == 1
    assert "'listen'" in result.stderr
    assert "allow_remote" in result.stderr


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """``fencegate serve`` with no config (the zero-config default) on a free port."""
    cwd = tmp_path_factory.mktemp("serve")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FENCEGATE_")}
    env["FENCEGATE_SHUTDOWN_GRACE_MS"] = "0"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--listen", f"127.0.0.1:{port}"],
        cwd=cwd, env={**env, "PYTHONPATH": str(ROOT)}, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 15
    while True:
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=1) as response:
                if response.status == 200:
                    break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(
                    f"fencegate serve did not start:\n{proc.communicate()[1]}"
                ) from None
            time.sleep(0.05)
    yield url, proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    if proc.stderr is not None:
        proc.stderr.close()


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_verbs_against_a_running_gateway(
    served: tuple[str, subprocess.Popen[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = served
    status, out, _ = run(capsys, "lock", "files/doc", "--ttl-ms", "20000", "--url", url, "--json")
    assert status == 0
    grant = json.loads(out)
    token, lease_id = str(grant["token"]), grant["lease_id"]

    status, out, _ = run(capsys, "status", "files/doc", "--url", url)
    assert status == 0
    assert "held" in out
    assert token in out
    assert lease_id not in out

    status, out, err = run(capsys, "lock", "files/doc", "--url", url)
    assert status == 1
    assert "lock_held" in err
    assert "409" in err

    body = tmp_path / "body.txt"
    body.write_bytes(b"hello from the cli\n")
    status, out, _ = run(
        capsys, "put", "files", "doc", "--token", token, "--file", str(body), "--url", url
    )
    assert status == 0
    assert "stored files/doc" in out
    assert token in out

    status, out, err = run(capsys, "get", "files", "doc", "--url", url)
    assert status == 0
    assert out == "hello from the cli\n"
    assert token in err

    status, out, err = run(
        capsys, "put", "files", "doc", "--token", "1", "--file", str(body), "--url", url
    )
    assert status == 1
    assert "stale_token" in err

    status, out, _ = run(capsys, "renew", "files/doc", "--lease-id", lease_id, "--url", url)
    assert status == 0
    assert "renewed files/doc" in out

    status, out, _ = run(capsys, "delete", "files", "doc", "--token", token, "--url", url)
    assert status == 0
    assert "deleted" in out
    status, out, err = run(capsys, "get", "files", "doc", "--url", url)
    assert status == 1
    assert "not_found" in err

    status, out, _ = run(capsys, "unlock", "files/doc", "--lease-id", lease_id, "--url", url)
    assert status == 0
    assert "released" in out
    status, out, err = run(capsys, "unlock", "files/doc", "--lease-id", lease_id, "--url", url)
    assert status == 1
    assert "lease_lost" in err


def test_json_ttl_ms_is_the_ttl_granted_as_in_the_http_answer(
    served: tuple[str, subprocess.Popen[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    """``--json`` prints the fields of the HTTP answer with their meaning: ``ttl_ms`` is
    the ttl granted, ``valid_ms`` the validity left; neither is the other."""
    url, _ = served
    status, out, _ = run(capsys, "lock", "cli/ttl", "--ttl-ms", "5000", "--url", url, "--json")
    assert status == 0
    grant = json.loads(out)
    assert grant["ttl_ms"] == 5000, grant
    assert 0 < grant["valid_ms"] < 5000, grant
    status, out, _ = run(capsys, "lock", "cli/ttl", "--ttl-ms", "5000", "--url", url)
    assert status == 1
    lease_id = grant["lease_id"]
    renew = ["renew", "cli/ttl", "--lease-id", lease_id, "--ttl-ms", "7000", "--url", url]
    status, out, _ = run(capsys, *renew, "--json")
    assert status == 0
    renewal = json.loads(out)
    assert renewal["ttl_ms"] == 7000, renewal
    assert 5000 < renewal["valid_ms"] < 7000, renewal
    status, out, _ = run(capsys, *renew)
    assert "ttl_ms 7000" in out, out
    assert main(["unlock", "cli/ttl", "--lease-id", lease_id, "--url", url]) == 0


def test_unreachable_gateway_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(capsys, "status", "x", "--url", f"http://127.0.0.1:{free_port()}")
    assert status == 3
    assert "gateway_unavailable" in err


def test_serve_says_it_uses_the_in_process_backend_and_stops_on_sigterm(
    served: tuple[str, subprocess.Popen[str]],
) -> None:
    url, proc = served
    proc.send_signal(signal.SIGTERM)
    _, log = proc.communicate(timeout=20)
    assert proc.returncode == 0, log
    assert "in this process only" in log
    assert "store 'files': files under ./fencegate-data" in log
    assert f"listening on {url}" in log
    assert "draining" in log
    assert "stopped" in log


def test_serve_with_tls_auth_and_a_metrics_listener(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
         "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key),
         "-out", str(cert)],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    port, metrics_port = free_port(), free_port()
    secret = "s3cret-api-key"
    config = tmp_path / "fencegate.toml"
    config.write_text(
        f'listen = "127.0.0.1:{port}"\nmetrics_listen = "127.0.0.1:{metrics_port}"\n'
        "shutdown_grace_ms = 0\n"
        f'[tls]\ncert = "{cert}"\nkey = "{key}"\n'
        f'[stores.docs]\ntype = "files"\nroot = "{tmp_path / "docs"}"\n'
        f'[[auth.keys]]\nname = "ops"\nsha256 = "{hashlib.sha256(secret.encode()).hexdigest()}"\n'
        'locks = [""]\nstores = [""]\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("FENCEGATE_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--config", str(config)],
        cwd=tmp_path, env={**env, "PYTHONPATH": str(ROOT)}, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    tls = ssl.create_default_context(cafile=str(cert))
    try:
        url = f"https://127.0.0.1:{port}"
        deadline = time.monotonic() + 15
        while True:
            try:
                with urllib.request.urlopen(url + "/healthz", timeout=1, context=tls) as response:
                    assert response.status == 200
                    break
            except OSError:
                assert proc.poll() is None, "fencegate serve exited"
                assert time.monotonic() < deadline, "fencegate serve did not start"
                time.sleep(0.05)
        request = urllib.request.Request(url + "/v1/locks/x", method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=5, context=tls)
        refused.value.close()
        assert refused.value.code == 401
        request.add_header("Authorization", f"Bearer {secret}")
        with urllib.request.urlopen(request, timeout=5, context=tls) as response:
            assert json.load(response)["token"] > 0
        metrics = f"http://127.0.0.1:{metrics_port}/metrics"
        with urllib.request.urlopen(metrics, timeout=5) as response:
            text = response.read().decode()
        assert 'fencegate_lock_acquisitions_total{result="granted"} 1.0' in text
    finally:
        proc.send_signal(signal.SIGTERM)
        _, log = proc.communicate(timeout=20)
    assert proc.returncode == 0, log
    assert secret not in log
    assert "auth: 1 key(s): ops" in log
    assert f"listening on {url}" in log
