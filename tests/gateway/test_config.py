"""Configuration: TOML keys, FENCEGATE_* overrides, defaults, and one-line errors naming the key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.config import Address, ConfigError, load_config, parse_config

HASH = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"

DESIGN_EXAMPLE = f"""
listen = "127.0.0.1:8080"

[locks]
redis = ["redis://127.0.0.1:7101", "redis://127.0.0.1:7102", "redis://127.0.0.1:7103"]

[stores.kv]
type = "postgres"
dsn = "postgresql://postgres@127.0.0.1:5432/test"

[stores.accounts]
type = "postgres"
dsn = "postgresql://postgres@127.0.0.1:5432/test"
table = "accounts"
key_column = "id"
columns = ["balance", "note"]

[stores.files]
type = "files"
root = "./fencegate-data"
fencing = "lease"

[[auth.keys]]
name = "billing"
sha256 = "{HASH}"
locks = ["billing/"]
stores = ["kv/billing/", "accounts/"]
verbs = ["lock", "read", "write"]
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fencegate.toml"
    path.write_text(text)
    return path


def test_the_design_example_parses(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, DESIGN_EXAMPLE), env={})
    assert config.listen == Address("127.0.0.1", 8080)
    assert len(config.locks.redis) == 3
    assert config.locks.node_timeout == 0.2
    assert config.locks.max_wait == 30.0
    assert config.locks.default_ttl == 10.0
    assert config.locks.min_ttl == 0.01
    assert config.locks.max_ttl == 300.0
    assert list(config.stores) == ["kv", "accounts", "files"]
    assert config.stores["kv"].fencing == "token"
    assert config.stores["accounts"].columns == ("balance", "note")
    assert config.stores["files"].fencing == "lease"
    key = config.auth_keys[0]
    assert key.name == "billing"
    assert key.sha256 == bytes.fromhex(HASH)
    assert key.verbs == {"lock", "read", "write"}
    assert key.stores == ("kv/billing/", "accounts/")
    assert config.max_body_bytes == 8 * 1024 * 1024


def test_zero_config_default() -> None:
    config = load_config(None, env={})
    assert str(config.listen) == "127.0.0.1:8080"
    assert config.locks.redis == ()
    assert list(config.stores) == ["files"]
    assert config.stores["files"].type == "files"
    assert config.stores["files"].root == "./fencegate-data"
    assert config.auth_keys == ()


def test_environment_overrides_the_file(tmp_path: Path) -> None:
    env = {
        "FENCEGATE_LISTEN": "127.0.0.1:9000",
        "FENCEGATE_LOCKS_REDIS": "redis://a:1, redis://b:2,redis://c:3",
        "FENCEGATE_LOCKS_MAX_WAIT_MS": "5000",
        "FENCEGATE_STORES_KV_DSN": "postgresql://u:pw@db:5432/x",
        "FENCEGATE_STORES_KV_POOL_MAX": "3",
        "FENCEGATE_STORES_ACCOUNTS_KEY_COLUMN": "account_id",
        "FENCEGATE_STORES_ACCOUNTS_COLUMNS": "balance",
        "FENCEGATE_URL": "http://elsewhere",  # a client setting: ignored by the server
        "PATH": "/bin",
    }
    config = load_config(write(tmp_path, DESIGN_EXAMPLE), env=env)
    assert config.listen.port == 9000
    assert config.locks.redis == ("redis://a:1", "redis://b:2", "redis://c:3")
    assert config.locks.max_wait == 5.0
    assert config.stores["kv"].dsn == "postgresql://u:pw@db:5432/x"
    assert config.stores["kv"].pool_max == 3
    assert config.stores["accounts"].key_column == "account_id"
    assert config.stores["accounts"].columns == ("balance",)


def test_environment_alone_defines_stores() -> None:
    env = {"FENCEGATE_STORES_MY_DATA_TYPE": "files", "FENCEGATE_STORES_MY_DATA_ROOT": "/tmp/x"}
    config = load_config(None, env=env)
    assert list(config.stores) == ["my_data"]


def test_command_line_overrides_the_environment() -> None:
    config = load_config(
        None,
        env={"FENCEGATE_LISTEN": "127.0.0.1:9000"},
        overrides={"listen": "127.0.0.1:9001", "locks.redis": ["redis://x:1"]},
    )
    assert config.listen.port == 9001
    assert config.locks.redis == ("redis://x:1",)


def test_extra_knobs() -> None:
    config = parse_config({
        "metrics_listen": "[::1]:9108",
        "request_timeout_ms": 45000,
        "locks": {"node_timeout_ms": 50, "min_ttl_ms": 100, "max_ttl_ms": 60000,
                  "max_wait_ms": 10000, "default_ttl_ms": 2000},
    })  # fmt: skip
    assert config.metrics_listen == Address("::1", 9108)
    assert str(config.metrics_listen) == "[::1]:9108"
    assert config.request_timeout == 45.0
    assert (config.locks.node_timeout, config.locks.min_ttl, config.locks.max_ttl) == (
        0.05,
        0.1,
        60.0,
    )


def test_mysql_stores_parse() -> None:
    config = parse_config({"stores": {
        "kv": {"type": "mysql", "dsn": "mysql://fg:secret@127.0.0.1:3306/app", "pool_max": 4},
        "accounts": {"type": "mysql", "dsn": "mysql://fg@db/app", "table": "accounts",
                     "key_column": "id", "columns": ["balance"], "command_timeout_ms": 2000},
    }})  # fmt: skip
    kv, accounts = config.stores["kv"], config.stores["accounts"]
    assert (kv.type, kv.pool_max, kv.table) == ("mysql", 4, None)
    assert (accounts.type, accounts.table, accounts.columns) == ("mysql", "accounts", ("balance",))
    assert accounts.command_timeout == 2.0
    assert "secret" not in kv.describe()
    assert kv.describe().startswith("store 'kv': mysql key-value at mysql://fg:***@127.0.0.1")
    assert "mysql table accounts (id; balance)" in accounts.describe()


@pytest.mark.parametrize(
    ("raw", "names"),
    [
        ({"listen": "nohost"}, ["'listen'", "'nohost'"]),
        ({"listen": "127.0.0.1:99999"}, ["'listen'", "99999"]),
        ({"listen": 8080}, ["'listen'", "8080"]),
        ({"listen": "0.0.0.0:8080"}, ["'listen'", "'0.0.0.0:8080'", "allow_remote"]),
        ({"lisen": "x"}, ["'lisen'", "unknown"]),
        ({"locks": {"redis": ["redis://a:1", "redis://b:2"]}}, ["'locks.redis'", "2 nodes"]),
        ({"locks": {"redis": ["http://a:1"]}}, ["'locks.redis'", "scheme"]),
        ({"locks": {"redis": ["redis://a:1", "redis://a:1", "redis://b:1"]}},
         ["'locks.redis'", "twice"]),
        ({"locks": {"max_ttl_ms": "long"}}, ["'locks.max_ttl_ms'", "'long'", "whole number"]),
        ({"locks": {"max_ttl_ms": 0}}, ["'locks.max_ttl_ms'", "at least"]),
        ({"locks": {"max_ttl_ms": 5, "min_ttl_ms": 10}}, ["'locks.max_ttl_ms'"]),
        ({"locks": {"default_ttl_ms": 400000}}, ["'locks.default_ttl_ms'", "400000"]),
        ({"locks": {"node_timeout_ms": True}}, ["'locks.node_timeout_ms'", "True"]),
        ({"locks": {"redsi": []}}, ["'locks.redsi'", "unknown"]),
        ({"locks": "redis://x"}, ["'locks'", "table"]),
        ({"request_timeout_ms": 1000}, ["'request_timeout_ms'", "max_wait_ms"]),
        ({"max_body_bytes": -1}, ["'max_body_bytes'", "-1"]),
        ({"allow_remote": "yes"}, ["'allow_remote'", "true or false"]),
        ({"stores": {"kv": {"type": "mongodb"}}}, ["'stores.kv.type'", "'mongodb'"]),
        ({"stores": {"kv": {"type": "mysql"}}}, ["'stores.kv.dsn'", "mysql://"]),
        ({"stores": {"kv": {"type": "mysql", "dsn": "postgresql://h/d"}}},
         ["'stores.kv.dsn'", "mysql://"]),
        ({"stores": {"kv": {"type": "mysql", "dsn": "mysql://u:hunter2@h"}}},
         ["'stores.kv.dsn'", "***", "no database"]),
        ({"stores": {"kv": {"type": "mysql", "dsn": "mysql://h:70000/d"}}}, ["'stores.kv.dsn'"]),
        ({"stores": {"kv": {"type": "mysql", "dsn": "mysql://h/d?ssl=1"}}},
         ["'stores.kv.dsn'", "options"]),
        ({"stores": {"kv": {"type": "mysql", "dsn": "mysql://h/d", "schema": "s"}}},
         ["'stores.kv.schema'", "database"]),
        ({"stores": {"kv": {"type": "mysql", "dsn": "mysql://h/d", "table": "t"}}},
         ["'stores.kv.key_column'"]),
        ({"stores": {"kv": {"type": "files", "root": "/x", "pool_max": 3}}},
         ["'stores.kv.pool_max'", "'mysql'"]),
        ({"stores": {"kv": {"dsn": "postgresql://x/y"}}}, ["'stores.kv.type'", "is not set"]),
        ({"stores": {"kv": {"type": "postgres"}}}, ["'stores.kv.dsn'", "dsn"]),
        ({"stores": {"kv": {"type": "postgres", "dsn": "mysql://u:hunter2@h/d"}}},
         ["'stores.kv.dsn'", "***"]),
        ({"stores": {"kv": {"type": "postgres", "dsn": "postgresql://u:hunter2@h:notaport/d"}}},
         ["'stores.kv.dsn'", "***", "'notaport'"]),
        ({"stores": {"kv": {"type": "postgres", "dsn": "postgresql://h1:5432,h2:x/d"}}},
         ["'stores.kv.dsn'", "'x'"]),
        ({"stores": {"kv": {"type": "postgres", "dsn": "postgresql://h:99999/d"}}},
         ["'stores.kv.dsn'", "'99999'"]),
        ({"stores": {"kv": {"type": "postgres", "dsn": "postgresql://h/d?port=abc"}}},
         ["'stores.kv.dsn'", "'abc'"]),
        ({"stores": {"kv": {"type": "postgres", "dsn": "postgresql://u@[::1:5432/d"}}},
         ["'stores.kv.dsn'", "IPv6"]),
        ({"stores": {"m": {"type": "s3", "bucket": "media", "endpoint": "http://[::1:9000"}}},
         ["'stores.m.endpoint'", "IPv6"]),
        ({"stores": {"m": {"type": "s3", "bucket": "media", "endpoint": "http://h:notaport"}}},
         ["'stores.m.endpoint'", "notaport"]),
        ({"stores": {"kv": {"type": "files"}}}, ["'stores.kv.root'"]),
        ({"stores": {"kv": {"type": "files", "root": "/x", "dsn": "postgresql://h/d"}}},
         ["'stores.kv.dsn'", "postgres"]),
        ({"stores": {"kv": {"type": "files", "root": "/x", "fencing": "strict"}}},
         ["'stores.kv.fencing'", "'strict'"]),
        ({"stores": {"a/b": {"type": "files", "root": "/x"}}}, ["'stores.a/b'"]),
        ({"stores": {"t": {"type": "postgres", "dsn": "postgresql://h/d", "table": "t"}}},
         ["'stores.t.key_column'"]),
        ({"stores": {"t": {"type": "postgres", "dsn": "postgresql://h/d", "table": "t",
                           "key_column": "id"}}}, ["'stores.t.columns'"]),
        ({"stores": {"t": {"type": "postgres", "dsn": "postgresql://h/d", "table": "t",
                           "key_column": "id", "columns": ["id"]}}}, ["'stores.t.columns'"]),
        ({"stores": {"t": {"type": "postgres", "dsn": "postgresql://h/d", "columns": ["a"]}}},
         ["'stores.t.columns'", "table"]),
        ({"stores": {"t": {"type": "postgres", "dsn": "postgresql://h/d", "pool_min": 5,
                           "pool_max": 2}}}, ["'stores.t.pool_min'"]),
        ({"auth": {"keys": [{"name": "k", "sha256": "abc"}]}}, ["'auth.keys[0].sha256'", "'abc'"]),
        ({"auth": {"keys": [{"sha256": HASH}]}}, ["'auth.keys[0].name'"]),
        ({"auth": {"keys": [{"name": "k", "sha256": HASH, "verbs": ["admin"]}]}},
         ["'auth.keys[0].verbs'", "admin"]),
        ({"auth": {"keys": [{"name": "a", "sha256": HASH}, {"name": "b", "sha256": HASH}]}},
         ["'auth.keys[1].sha256'", "twice"]),
        ({"auth": {"keys": {"name": "a"}}}, ["'auth.keys'", "[[auth.keys]]"]),
        ({"tls": {"cert": "/no/such/cert.pem", "key": "/no/such/key.pem"}},
         ["'tls.cert'", "no such file"]),
        ({"tls": {"cert": "/etc/hostname"}}, ["'tls.key'"]),
    ],
)  # fmt: skip
def test_errors_are_one_line_naming_key_and_value(raw: dict[str, Any], names: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    message = str(info.value)
    assert "\n" not in message
    for name in names:
        assert name in message, (name, message)


def test_a_dsn_password_is_never_printed() -> None:
    dsn = "postgresql://admin:hunter2@db:5432/x"
    raw = {"stores": {"kv": {"type": "postgres", "dsn": dsn, "pool_max": "many"}}}
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    assert "hunter2" not in str(info.value)
    with pytest.raises(ConfigError) as info:
        parse_config({"locks": {"redis": ["redis://:hunter2@a:1", "redis://b:1"]}})
    assert "hunter2" not in str(info.value)
    assert "'locks.redis'" in str(info.value)
    config = parse_config({"stores": {"kv": {"type": "postgres", "dsn": dsn}}})
    assert "hunter2" not in config.stores["kv"].describe()
    assert "hunter2" not in repr(config)


def test_postgres_dsns_that_asyncpg_takes_pass() -> None:
    # A host list, IPv6 hosts, no port, a unix socket directory: what libpq's URIs allow.
    for dsn in (
        "postgresql://u:p@h1:5432,h2/db",
        "postgresql://[::1]:5432/db",
        "postgresql://[::1]/db",
        "postgres://h/db?port=5433",
        "postgresql:///db?host=/run/postgresql",
    ):
        config = parse_config({"stores": {"kv": {"type": "postgres", "dsn": dsn}}})
        assert config.stores["kv"].dsn == dsn


def test_remote_listen_is_allowed_with_auth_or_allow_remote() -> None:
    assert parse_config({"listen": "0.0.0.0:8080", "allow_remote": True}).allow_remote
    keys = {"keys": [{"name": "k", "sha256": HASH}]}
    assert parse_config({"listen": "0.0.0.0:8080", "auth": keys}).listen.host == "0.0.0.0"
    assert parse_config({"listen": "localhost:1"}).listen.loopback
    assert parse_config({"listen": "[::1]:1"}).listen.loopback


def test_environment_errors_name_the_variable() -> None:
    with pytest.raises(
        ConfigError, match=r"'locks.max_ttl_ms' \(from FENCEGATE_LOCKS_MAX_TTL_MS\)"
    ):
        load_config(None, env={"FENCEGATE_LOCKS_MAX_TTL_MS": "soon"})
    with pytest.raises(ConfigError, match="FENCEGATE_LOCKS_REDIS_URLS"):
        load_config(None, env={"FENCEGATE_LOCKS_REDIS_URLS": "redis://x"})
    with pytest.raises(ConfigError, match="FENCEGATE_STORES_KV"):
        load_config(None, env={"FENCEGATE_STORES_KV": "x"})
    # a boolean variable takes 1/0 and yes/no too, and its error says so
    assert load_config(None, env={"FENCEGATE_STRICT_START": "yes"}).strict_start is True
    with pytest.raises(ConfigError, match=r"true or false \(or 1/0, yes/no\)"):
        load_config(None, env={"FENCEGATE_STRICT_START": "maybe"})


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot be read"):
        load_config(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(write(tmp_path, "listen = "))


def test_a_dsn_password_in_the_query_is_never_shown() -> None:
    """DESIGN: secrets (DSN passwords) are never logged: the store's start line and a
    config error hide a ``password`` or ``sslpassword`` of the DSN's query as well."""
    dsn = "postgresql://postgres:hunter2@127.0.0.1:1/test?sslmode=disable&password=hunter3"
    config = parse_config({"stores": {"kv": {"type": "postgres", "dsn": dsn}}})
    line = config.stores["kv"].describe()
    assert "hunter" not in line
    assert "sslmode=disable&password=***" in line
    bad = dsn.replace(":1/", ":notaport/").replace("disable", "disable&SSLPASSWORD=s3cret")
    with pytest.raises(ConfigError) as err:
        parse_config({"stores": {"kv": {"type": "postgres", "dsn": bad}}})
    assert "hunter" not in str(err.value)
    assert "s3cret" not in str(err.value)


_LEGACY: dict[str, Any] = {
    "type": "postgres", "dsn": "postgresql://h/d", "table": "t", "key_column": "id",
    "columns": ["v"],
}  # fmt: skip


@pytest.mark.parametrize(
    ("stores", "words"),
    [
        ({"a": {"type": "files", "root": "/srv/fg"}, "b": {"type": "files", "root": "/srv/fg/b"}},
         ["'stores.b.root'", "store 'a'", "root /srv/fg"]),
        ({"a": {"type": "files", "root": "/srv/fg/"},
          "b": {"type": "files", "root": "/srv/x/../fg"}},
         ["'stores.b.root'", "store 'a'"]),
        ({"a": {"type": "s3", "bucket": "bkt-1", "prefix": "orders/"},
          "b": {"type": "s3", "bucket": "bkt-1"}},
         ["'stores.b.prefix'", "store 'a'", "prefix 'orders/'"]),
        ({"a": _LEGACY, "b": {**_LEGACY, "fencing": "lease"}},
         ["'stores.b.table'", "store 'a'", "table public.t"]),
    ],
)  # fmt: skip
def test_two_stores_over_the_same_data_are_refused(
    stores: dict[str, Any], words: list[str]
) -> None:
    """A file, object or row reachable through two stores would be fenced by two
    marks: a token stale in one passes the other."""
    with pytest.raises(ConfigError) as err:
        parse_config({"stores": stores})
    for word in words:
        assert word in str(err.value)


def test_stores_side_by_side_are_accepted() -> None:
    config = parse_config({"stores": {
        "a": {"type": "files", "root": "/srv/fg/a"},
        "b": {"type": "files", "root": "/srv/fg/b"},
        "c": {"type": "s3", "bucket": "bkt-1", "prefix": "a/"},
        "d": {"type": "s3", "bucket": "bkt-1", "prefix": "b/"},
        "e": {"type": "s3", "bucket": "bkt-2", "prefix": "a/"},
        "kv": {"type": "postgres", "dsn": "postgresql://h/d"},
        "kv2": {"type": "postgres", "dsn": "postgresql://h/d"},  # rows keyed by store
        "t1": _LEGACY,
        "t2": {**_LEGACY, "table": "u"},
    }})  # fmt: skip
    assert len(config.stores) == 9
