"""Rough edges of the CLI and the config a new user meets first: each message names its fix."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.cli import main
from gateway.config import ConfigError, load_config, parse_config
from gateway.logs import JsonFormatter
from tests._servers import free_port
from tests.gateway.conftest import API_KEYS, Client, Start, auth_section, make_config

ROOT = Path(__file__).resolve().parents[2]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        status = main(list(argv))
    except SystemExit as exc:  # argparse: --version, --help, usage errors
        status = int(exc.code or 0)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "--version")
    assert status == 0
    assert out.startswith("fencegate ")
    assert out.split()[1][0].isdigit()


def test_client_options_have_help(capsys: pytest.CaptureFixture[str]) -> None:
    _, lock_help, _ = run(capsys, "lock", "--help")
    _, renew_help, _ = run(capsys, "renew", "--help")
    for option in ("--url", "--api-key", "--ttl-ms", "--wait-ms", "--cacert", "--insecure"):
        line = next(line for line in lock_help.splitlines() if line.strip().startswith(option))
        described = line.split(option, 1)[1].split(maxsplit=1)
        assert len(described) == 2 or option in ("--cacert",), (option, line)
    assert "FENCEGATE_URL" in lock_help
    assert "lease_id printed by" in renew_help


def test_every_config_option_says_it_defaults_to_fencegate_config(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # serve, check-config, pg and groups all fall back to $FENCEGATE_CONFIG: each says so.
    for verb in (["serve"], ["check-config"], ["pg", "install-fencing"], ["groups", "carry"]):
        _, out, _ = run(capsys, *verb, "--help")
        assert "$FENCEGATE_CONFIG" in " ".join(out.split()), verb


def test_no_config_at_all_is_a_usage_error_for_every_verb_that_needs_one(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FENCEGATE_CONFIG", raising=False)
    for verb in (["check-config"], ["pg", "install-fencing", "--store", "s"], ["groups", "carry"]):
        status, _, err = run(capsys, *verb)
        assert status == 2, (verb, err)
        assert "FENCEGATE_CONFIG" in err, err


def test_a_url_without_a_scheme_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(capsys, "status", "x", "--url", "localhost:8080")
    assert status == 2
    assert "did you mean 'http://localhost:8080'" in err
    assert err.count("\n") == 1
    for url in ("http://127.0.0.1:99999", "http://127.0.0.1:port"):
        status, _, err = run(capsys, "status", "x", "--url", url)
        assert status == 2
        assert err.startswith(
            f"fencegate: --url (or FENCEGATE_URL): gateway url '{url}' has a bad port"
        )
        assert err.count("\n") == 1


def test_a_lock_name_ending_in_renew_is_refused_by_name(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, _, err = run(capsys, "lock", "a/renew", "--url", f"http://127.0.0.1:{free_port()}")
    assert status == 2
    assert "last segment may not be 'renew'" in err
    assert "wait_ms" not in err


def test_an_empty_name_or_key_is_a_usage_error_not_a_404(
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # never reached
    for argv, what in (
        (("lock", ""), "the name"),
        (("status", ""), "the name"),
        (("get", "files", ""), "the key"),
        (("put", "", "k", "--token", "1"), "the store"),
    ):
        status, _, err = run(capsys, *argv, "--url", url)
        assert status == 2, (argv, err)
        assert f"{what} must not be empty" in err, err


async def served(start: Start, files_root: Path) -> str:
    stores = {"files": {"type": "files", "root": str(files_root)}}
    client: Client = await start(make_config(stores=stores, auth=auth_section()))
    return str(client.make_url("")).rstrip("/")


async def test_put_without_token_names_the_option_and_get_json_keeps_binary_bodies(
    start: Start, files_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import asyncio
    import base64

    url = await served(start, files_root)
    key = ["--url", url, "--api-key", API_KEYS["admin"]]
    body = files_root.parent / "body.bin"
    body.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff")

    def cli(*argv: str) -> tuple[int, str, str]:
        return run(capsys, *argv, *key)

    status, _, err = await asyncio.to_thread(cli, "put", "files", "img", "--file", str(body))
    assert status == 1
    assert "needs --token N" in err
    assert "fencegate lock files/img" in err
    assert "header" not in err.lower()
    status, out, _ = await asyncio.to_thread(cli, "lock", "files/img", "--json")
    token = str(json.loads(out)["token"])
    status, _, _ = await asyncio.to_thread(
        cli, "put", "files", "img", "--file", str(body), "--token", token
    )
    assert status == 0
    status, out, _ = await asyncio.to_thread(cli, "get", "files", "img", "--json")
    assert status == 0
    reply = json.loads(out)
    assert "body" not in reply
    assert base64.b64decode(reply["body_base64"]) == body.read_bytes()


async def test_a_file_that_cannot_be_read_or_written_is_one_line_not_a_traceback(
    start: Start, files_root: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import asyncio

    url = await served(start, files_root)
    key = ["--url", url, "--api-key", API_KEYS["admin"]]

    def cli(*argv: str) -> tuple[int, str, str]:
        return run(capsys, *argv, *key)

    for unreadable in (tmp_path / "missing.bin", tmp_path):  # no such file; a directory
        status, _, err = await asyncio.to_thread(
            cli, "put", "files", "k", "--token", "5", "--file", str(unreadable)
        )
        assert status == 2, err
        assert err.startswith(f"fencegate: --file: cannot read '{unreadable}': "), err
        assert err.count("\n") == 1, err
    status, out, _ = await asyncio.to_thread(cli, "lock", "files/k", "--json")
    token = str(json.loads(out)["token"])
    body = tmp_path / "body.txt"
    body.write_bytes(b"hello")
    status, _, _ = await asyncio.to_thread(
        cli, "put", "files", "k", "--token", token, "--file", str(body)
    )
    assert status == 0
    for unwritable in (tmp_path / "no" / "such" / "dir", tmp_path):
        status, _, err = await asyncio.to_thread(
            cli, "get", "files", "k", "--output", str(unwritable)
        )
        assert status == 2, err
        assert f"fencegate: --output: cannot write '{unwritable}': " in err, err
        assert "Traceback" not in err


async def test_an_acquire_body_on_the_renew_route_says_what_the_route_is(
    start: Start, files_root: Path
) -> None:
    client: Client = await start(make_config())
    for body in ({"ttl_ms": 1000, "wait_ms": 0}, {"ttl_ms": 1000}, {}):
        response = await client.post("/v1/locks/a/renew", json=body)
        message = (await response.json())["message"]
        assert response.status == 400
        assert "renew route of lock 'a'" in message
        assert "last segment is not 'renew'" in message
        assert "unknown field" not in message


async def test_forbidden_messages_read_as_sentences(start: Start, files_root: Path) -> None:
    stores = {"files": {"type": "files", "root": str(files_root)}}
    client: Client = await start(make_config(stores=stores, auth=auth_section()))
    headers = {"Authorization": f"Bearer {API_KEYS['billing']}"}
    response = await client.post("/v1/locks/orders/1", headers=headers)
    message = (await response.json())["message"]
    assert response.status == 403
    assert "may not take the lock 'orders/1'" in message
    assert "'billing/'" in message
    assert "lock lock" not in message
    headers = {"Authorization": f"Bearer {API_KEYS['reader']}"}
    response = await client.put("/v1/stores/files/x", data=b"v", headers=headers)
    message = (await response.json())["message"]
    assert "lacks the verb 'write'" in message


def test_a_misspelled_variable_is_warned_about_with_the_closest_name(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    env = {"FENCEGATE_LISTN": "127.0.0.1:9", "FENCEGATE_URL": "http://x", "PATH": "/bin"}
    config = load_config(None, env=env)
    assert config.warnings == (
        "environment variable FENCEGATE_LISTN is not a fencegate setting and is ignored; "
        "did you mean FENCEGATE_LISTEN?",
    )
    path = tmp_path / "f.toml"
    path.write_text('[stores.files]\ntype = "files"\nroot = "d"\n')
    os.environ["FENCEGATE_SHUTDOWN_TIMOUT_MS"] = "5"
    try:
        status, out, err = run(capsys, "check-config", str(path))
    finally:
        del os.environ["FENCEGATE_SHUTDOWN_TIMOUT_MS"]
    assert status == 0
    assert out.startswith("ok: ")
    assert "FENCEGATE_SHUTDOWN_TIMOUT_MS" in err
    assert "FENCEGATE_SHUTDOWN_TIMEOUT_MS" in err


def test_a_store_from_the_environment_without_a_type_says_what_is_missing() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, env={"FENCEGATE_STORES_KV_DSN": "postgresql://u:secret@h/d"})
    message = str(info.value)
    assert "'stores.kv.type' is not set" in message
    assert "FENCEGATE_STORES_KV_DSN" in message
    assert "FENCEGATE_STORES_KV_TYPE=postgres" in message
    assert "None" not in message
    assert "secret" not in message


def test_lists_in_messages_are_shown_as_written_not_as_python_tuples() -> None:
    raw = {"auth": {"keys": [{"name": "k", "sha256": "a" * 64, "verbs": ["lock", "reed"]}]}}
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    assert '["lock", "reed"]' in str(info.value)
    assert "('lock'" not in str(info.value)


def test_log_level_and_log_format_keys() -> None:
    config = parse_config({"log_level": "warning", "log_format": "json"})
    assert (config.log_level, config.log_format) == ("warning", "json")
    assert parse_config({}).log_format == "text"
    with pytest.raises(ConfigError, match="'log_format'"):
        parse_config({"log_format": "xml"})
    record = logging.LogRecord("fencegate", logging.WARNING, "f", 1, "a %s", ("b",), None)
    line = json.loads(JsonFormatter().format(record))
    assert set(line) == {"time", "level", "logger", "message"}
    assert (line["level"], line["logger"], line["message"]) == ("warning", "fencegate", "a b")
    assert line["time"].endswith("Z")


def test_serve_logs_json_lines_and_announces_the_in_process_backend_once(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FENCEGATE_")}
    env |= {"FENCEGATE_LOG_FORMAT": "json", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--listen", "0.0.0.0:1"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1  # refused before logging starts: a plain line
    assert result.stderr.startswith("fencegate: config 'listen'")
    (tmp_path / "f.toml").write_text(
        f'listen = "127.0.0.1:{free_port()}"\nlog_format = "json"\nshutdown_timeout_ms = 0\n'
        '[stores.files]\ntype = "files"\nroot = "d"\n'
    )
    lines = []
    with subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--config", str(tmp_path / "f.toml")],
        cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True,
    ) as proc:  # fmt: skip
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(json.loads(line))
            if "listening on" in lines[-1]["message"]:
                proc.terminate()
        proc.wait(timeout=30)
    assert proc.returncode == 0
    assert all(set(line) >= {"time", "level", "logger", "message"} for line in lines)
    warnings = [line["message"] for line in lines if line["level"] == "warning"]
    assert sum("in this process only" in m for m in warnings) == 1, warnings
    mentions = [line["message"] for line in lines if "process only" in line["message"]]
    assert len(mentions) == 1, mentions  # not a second time at info
    assert lines[-1]["message"] == "stopped"
