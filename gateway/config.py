"""Configuration: one TOML file, then ``FENCEGATE_*`` environment variables, then CLI flags.

Keys (DESIGN.md "Configuration"; durations in integer milliseconds)::

    listen = "127.0.0.1:8080"        metrics_listen = "127.0.0.1:9108"   (optional, /metrics only)
    allow_remote = false             max_body_bytes = 8388608
    request_timeout_ms = 60000       shutdown_timeout_ms = 30000   shutdown_grace_ms = 5000
    log_level = "info"               log_format = "text" | "json"
    strict_start = false             (true: a store that cannot start stops the start)
    workers = 1                      (gateway processes on listen; 0: one per core)
    [locks]  redis = [urls] | groups = [[urls], {id = "a", redis = [urls]}, ...]
             previous_groups = [...] (only while changing groups)
             node_timeout_ms = 200  min_ttl_ms = 10  max_ttl_ms = 300000
             max_wait_ms = 30000  default_ttl_ms = 10000  default_wait_ms = 0
             issued_cache_size = 100000
    [stores.<name>]  type = "postgres" | "mysql" | "files" | "s3"
             fencing = "token" | "lease" | "none"
             postgres: dsn, schema = "public", pool_min = 1, pool_max = 10,
                       command_timeout_ms = 10000, acquire_timeout_ms = 5000,
                       table, key_column, columns (a legacy table; all three or none)
             mysql:    as postgres, but dsn = "mysql://user:pass@host:3306/db" and no
                       schema (the database is the DSN's)
             files:    root
             s3:       bucket, endpoint (none: AWS), region = "us-east-1", prefix = "",
                       access_key_id, secret_access_key (both or neither; neither: the
                       AWS environment variables), command_timeout_ms = 10000 (per request)
    [[auth.keys]]  name, sha256 (hex of the key), locks, stores (prefixes, none by
             default; "" allows all), verbs (lock, read, write; all by default)
    [tls]  cert, key

Every key can be overridden by a ``FENCEGATE_*`` environment variable (see
``gateway/_sources.py``: ``FENCEGATE_LOCKS_REDIS=redis://a,redis://b,redis://c``,
``FENCEGATE_LOCKS_GROUPS=redis://a1,redis://a2,redis://a3;redis://b1,...``,
``FENCEGATE_STORES_KV_DSN=...``), except auth keys, which come from the file only.
With no file and no ``FENCEGATE_STORES_*`` the gateway serves one files store,
``files``, under ``./fencegate-data``; with no ``[locks] redis`` it uses the
in-process lock backend (one gateway only).

One store's table, ``StoreConfig`` and its parsing, lives in ``gateway/store_config.py``.
"""

from __future__ import annotations

import copy
import dataclasses
import ipaddress
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, cast

from gateway._sources import (
    AUTH_KEY_KEYS,
    LOCKS_KEYS,
    TOP_KEYS,
    Reader,
    apply_env,
    redact,
    set_path,
)
from gateway.errors import ConfigError
from gateway.logs import LOG_FORMATS, LOG_LEVELS
from gateway.store_config import (  # StoreConfig: re-exported
    StoreConfig,
    check_overlaps,
    parse_store,
)
from lockservice.node import parse_node_url
from lockservice.placement import GroupSpec

__all__ = [
    "Address",
    "ApiKey",
    "Config",
    "ConfigError",
    "LocksConfig",
    "StoreConfig",
    "TlsConfig",
    "load_config",
    "parse_config",
    "redact",
]
VERBS: Final = frozenset({"lock", "read", "write"})
_HEX64: Final = re.compile(r"[0-9a-fA-F]{64}")
_MAX_WORKERS: Final = 256


@dataclass(frozen=True, slots=True)
class Address:
    """A TCP listen address."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False  # a host name: it may resolve to anything


@dataclass(frozen=True, slots=True)
class LocksConfig:
    """``[locks]``: the Redis nodes (none: in-process backend) and limits, in seconds."""

    redis: tuple[str, ...] = ()
    groups: tuple[GroupSpec, ...] = ()  # instead of redis: names spread over these
    previous_groups: tuple[GroupSpec, ...] = ()  # during a change of groups only
    node_timeout: float = 0.2
    min_ttl: float = 0.01
    max_ttl: float = 300.0
    max_wait: float = 30.0
    default_ttl: float = 10.0
    default_wait: float = 0.0
    issued_cache_size: int = 100_000


@dataclass(frozen=True, slots=True)
class ApiKey:
    """One ``[[auth.keys]]``: the SHA-256 of a bearer key and what it may do."""

    name: str
    sha256: bytes = field(repr=False)
    locks: tuple[str, ...] = ()
    stores: tuple[str, ...] = ()
    verbs: frozenset[str] = VERBS


@dataclass(frozen=True, slots=True)
class TlsConfig:
    cert: str
    key: str


@dataclass(frozen=True, slots=True)
class Config:
    """The whole configuration; build with ``load_config`` or ``parse_config``."""

    listen: Address = Address("127.0.0.1", 8080)
    locks: LocksConfig = LocksConfig()
    stores: Mapping[str, StoreConfig] = field(default_factory=dict)
    auth_keys: tuple[ApiKey, ...] = ()
    max_body_bytes: int = 8 * 1024 * 1024
    request_timeout: float = 60.0
    shutdown_timeout: float = 30.0
    metrics_listen: Address | None = None
    allow_remote: bool = False
    tls: TlsConfig | None = None
    shutdown_grace: float = 5.0
    log_level: str = "info"
    log_format: Literal["text", "json"] = "text"
    strict_start: bool = False
    workers: int = 1
    """Gateway processes sharing ``listen`` (``fencegate serve --workers``); 0: one per core."""
    warnings: tuple[str, ...] = ()
    """Not errors, but likely mistakes (a misspelled ``FENCEGATE_*`` variable)."""

    @property
    def worker_count(self) -> int:
        """``workers``, with 0 as the number of cores this process may run on."""
        if self.workers:
            return self.workers
        try:
            return len(os.sched_getaffinity(0))
        except AttributeError:  # pragma: no cover - not on Linux
            return os.cpu_count() or 1


DEFAULT_STORES: Final = {"files": {"type": "files", "root": "./fencegate-data"}}


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, object] | None = None,
) -> Config:
    """Read ``path`` (None: no file), apply ``env`` (``FENCEGATE_*``), then ``overrides``.

    Args:
        overrides: dotted keys (``"listen"``, ``"locks.redis"``) from command-line flags.
    Raises:
        ConfigError: one line naming the key, the value and what is wrong.
    """
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as f:
                raw = tomllib.load(f)
        except OSError as exc:
            raise ConfigError(f"config file {str(path)!r} cannot be read: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {str(path)!r} is not valid TOML: {exc}") from None
        except RecursionError:
            raise ConfigError(
                f"config file {str(path)!r} is not valid TOML: arrays or tables nested too deeply"
            ) from None
    env = {} if env is None else env
    if path is None and not any(k.startswith("FENCEGATE_STORES_") for k in env):
        raw["stores"] = copy.deepcopy(DEFAULT_STORES)
    origins: dict[str, str] = {}
    warnings = apply_env(raw, env, origins)
    for dotted, value in (overrides or {}).items():
        set_path(raw, dotted.split("."), value)
        origins[dotted] = "command line"
    config = parse_config(raw, origins=origins)
    return dataclasses.replace(config, warnings=tuple(warnings)) if warnings else config


def parse_config(raw: Mapping[str, Any], *, origins: Mapping[str, str] | None = None) -> Config:
    """Validate a TOML document (already parsed) into a ``Config``."""
    r = Reader(origins or {})
    r.known(raw, TOP_KEYS, "")
    locks = _parse_locks(r, r.table(raw, "locks"))
    stores: dict[str, StoreConfig] = {}
    for name, table in r.table(raw, "stores").items():
        stores[name] = parse_store(r, name, table)
    check_overlaps(r, stores)
    keys = _parse_auth(r, r.table(raw, "auth"))
    listen = _address(r, raw, "listen") or Address("127.0.0.1", 8080)
    tls_raw = r.table(raw, "tls")
    r.known(tls_raw, {"cert", "key"}, "tls")
    tls = None
    if tls_raw:
        tls = TlsConfig(r.file(tls_raw, "cert", "tls.cert"), r.file(tls_raw, "key", "tls.key"))
    allow_remote = r.boolean(raw, "allow_remote", "allow_remote", False)
    if not listen.loopback and not keys and not allow_remote:
        r.fail(
            "listen",
            str(listen),
            "a non-loopback address with no [[auth.keys]] lets anyone who can reach it "
            "take locks and write; add [[auth.keys]] or set allow_remote = true",
        )
    metrics_listen = _address(r, raw, "metrics_listen")
    request_timeout = r.ms(raw, "request_timeout_ms", "request_timeout_ms", 60_000)
    if request_timeout <= locks.max_wait:
        r.fail(
            "request_timeout_ms",
            int(request_timeout * 1000),
            f"must exceed locks.max_wait_ms ({int(locks.max_wait * 1000)}) "
            "or a waiting acquire is cut off",
        )
    shutdown_timeout = r.ms(raw, "shutdown_timeout_ms", "shutdown_timeout_ms", 30_000, low=0)
    shutdown_grace = r.ms(raw, "shutdown_grace_ms", "shutdown_grace_ms", 5_000, low=0)
    if "shutdown_grace_ms" not in raw:
        shutdown_grace = min(shutdown_grace, shutdown_timeout / 2)
    elif shutdown_grace > shutdown_timeout:
        r.fail(
            "shutdown_grace_ms",
            int(shutdown_grace * 1000),
            f"exceeds shutdown_timeout_ms ({int(shutdown_timeout * 1000)}), the whole shutdown",
        )
    return Config(
        listen=listen,
        locks=locks,
        stores=stores,
        auth_keys=keys,
        max_body_bytes=r.integer(raw, "max_body_bytes", "max_body_bytes", 8 << 20, low=1),
        request_timeout=request_timeout,
        shutdown_timeout=shutdown_timeout,
        metrics_listen=metrics_listen,
        allow_remote=allow_remote,
        tls=tls,
        shutdown_grace=shutdown_grace,
        log_level=r.choice(raw, "log_level", "log_level", LOG_LEVELS, "info"),
        log_format=cast(
            Literal["text", "json"], r.choice(raw, "log_format", "log_format", LOG_FORMATS, "text")
        ),
        strict_start=r.boolean(raw, "strict_start", "strict_start", False),
        workers=_workers(r, raw, locks, (listen, metrics_listen)),
    )


def _workers(
    r: Reader, raw: Mapping[str, Any], locks: LocksConfig, listens: tuple[Address | None, ...]
) -> int:
    """``workers``: 1 by default, 0 for one per core; more than one needs Redis (one list
    or groups) and a port."""
    workers = r.integer(raw, "workers", "workers", 1, low=0)
    if workers > _MAX_WORKERS:
        r.fail("workers", workers, f"must be at most {_MAX_WORKERS}")
    if workers != 1 and not (locks.redis or locks.groups):
        r.fail(
            "workers",
            workers,
            "more than one worker needs [locks] redis or groups: without them the "
            "in-process lock backend is used, which lives in one process, so workers "
            "would grant the same lock at once",
        )
    if workers != 1 and any(a is not None and a.port == 0 for a in listens):
        r.fail(
            "workers",
            workers,
            "workers share one port: listen and metrics_listen need a fixed port, not 0",
        )
    return workers


def _address(r: Reader, raw: Mapping[str, Any], key: str) -> Address | None:
    parsed = r.address(raw, key)
    return None if parsed is None else Address(*parsed)


def _parse_locks(r: Reader, t: Mapping[str, Any]) -> LocksConfig:
    r.known(t, LOCKS_KEYS, "locks")
    urls = r.strings(t, "redis", "locks.redis")
    if len(urls) not in (0, 1, 3, 5):
        r.fail("locks.redis", urls, f"{len(urls)} nodes given; use 1, 3 or 5 independent nodes")
    for url in urls:
        try:
            parse_node_url(url)
        except ValueError as exc:
            r.fail("locks.redis", urls, str(exc))
    if len({parse_node_url(u).label for u in urls}) != len(urls):
        r.fail("locks.redis", urls, "the same node is listed twice")
    groups = _parse_groups(r, t, "groups")
    previous = _parse_groups(r, t, "previous_groups")
    if urls and groups:
        r.fail("locks.groups", t["groups"], "set locks.redis or locks.groups, not both")
    if previous:
        if not (urls or groups):
            r.fail("locks.previous_groups", t["previous_groups"], "needs locks.groups (or redis)")
        now = groups or (GroupSpec.of(urls),)
        if {g.id for g in now} == {g.id for g in previous}:
            r.fail("locks.previous_groups", t["previous_groups"], "equals the groups; remove it")
        _one_group_per_node(r, (*now, *previous), "locks.previous_groups", t["previous_groups"])
    locks = LocksConfig(
        redis=urls,
        groups=groups,
        previous_groups=previous,
        node_timeout=r.ms(t, "node_timeout_ms", "locks.node_timeout_ms", 200),
        min_ttl=r.ms(t, "min_ttl_ms", "locks.min_ttl_ms", 10),
        max_ttl=r.ms(t, "max_ttl_ms", "locks.max_ttl_ms", 300_000),
        max_wait=r.ms(t, "max_wait_ms", "locks.max_wait_ms", 30_000, low=0),
        default_ttl=r.ms(t, "default_ttl_ms", "locks.default_ttl_ms", 10_000),
        default_wait=r.ms(t, "default_wait_ms", "locks.default_wait_ms", 0, low=0),
        issued_cache_size=r.integer(t, "issued_cache_size", "locks.issued_cache_size", 100_000),
    )
    if locks.max_ttl < locks.min_ttl:
        r.fail("locks.max_ttl_ms", int(locks.max_ttl * 1000), "is below locks.min_ttl_ms")
    if not locks.min_ttl <= locks.default_ttl <= locks.max_ttl:
        r.fail("locks.default_ttl_ms", int(locks.default_ttl * 1000), "is outside min..max ttl")
    if locks.default_wait > locks.max_wait:
        r.fail("locks.default_wait_ms", int(locks.default_wait * 1000), "exceeds max_wait_ms")
    return locks


def _parse_groups(r: Reader, t: Mapping[str, Any], key: str) -> tuple[GroupSpec, ...]:
    """``[[urls], {id = "a", redis = [urls]}, ...]``: each a Redlock of 1, 3 or 5 nodes."""
    path = f"locks.{key}"
    raw = t.get(key, [])
    if not isinstance(raw, list):
        r.fail(path, raw, "must be a list of groups: [[urls], [urls], ...]")
    if key == "groups" and key in t and not raw:  # the in-process backend otherwise
        r.fail(path, raw, "is empty: list at least one group, or leave the key out")
    specs: list[GroupSpec] = []
    for i, item in enumerate(raw):
        where = f"{path}[{i}]"
        group_id = None
        if isinstance(item, Mapping):
            r.known(item, {"id", "redis"}, where)
            group_id = r.string(item, "id", f"{where}.id")
            urls = r.strings(item, "redis", f"{where}.redis")
        else:
            urls = r.strings({"redis": item}, "redis", where)
        if len(urls) not in (1, 3, 5):
            r.fail(where, list(urls), f"{len(urls)} nodes given; use 1, 3 or 5 independent nodes")
        try:
            specs.append(GroupSpec.of(urls, group_id))
        except ValueError as exc:
            r.fail(where, item, str(exc))
    ids = [g.id for g in specs]
    if len(set(ids)) != len(ids):
        r.fail(path, raw, "two groups have the same id")
    _one_group_per_node(r, specs, path, raw)
    return tuple(specs)


def _one_group_per_node(r: Reader, specs: Sequence[GroupSpec], path: str, raw: object) -> None:
    """A node is in one group only (a group listed in groups and previous_groups is one)."""
    seen: dict[str, str] = {}
    for spec in {g.id: g for g in specs}.values():
        labels = [parse_node_url(u).label for u in spec.urls]
        if len(set(labels)) != len(labels):
            r.fail(path, raw, f"group {spec.id!r} lists the same node twice")
        for label in labels:
            if seen.setdefault(label, spec.id) != spec.id:
                r.fail(path, raw, f"node {label} is in two groups ({seen[label]}, {spec.id})")


def _parse_auth(r: Reader, t: Mapping[str, Any]) -> tuple[ApiKey, ...]:
    r.known(t, {"keys"}, "auth")
    entries = t.get("keys", [])
    if not isinstance(entries, list):
        r.fail("auth.keys", entries, "must be an array of tables: [[auth.keys]]")
    keys: list[ApiKey] = []
    for i, entry in enumerate(entries):
        where = f"auth.keys[{i}]"
        if not isinstance(entry, Mapping):
            r.fail(where, entry, "must be a table")
        r.known(entry, AUTH_KEY_KEYS, where)
        name = r.string(entry, "name", f"{where}.name")
        if not name:
            r.fail(f"{where}.name", name, "every key needs a name (for logs and metrics)")
        digest = r.string(entry, "sha256", f"{where}.sha256")
        if digest is None or not _HEX64.fullmatch(digest):
            r.fail(f"{where}.sha256", digest, "must be the 64 hex digits of the key's SHA-256")
        verbs = r.strings(entry, "verbs", f"{where}.verbs") if "verbs" in entry else tuple(VERBS)
        if not set(verbs) <= VERBS:
            r.fail(f"{where}.verbs", verbs, f"verbs are {', '.join(sorted(VERBS))}")
        key = ApiKey(
            name,
            bytes.fromhex(digest),
            locks=r.strings(entry, "locks", f"{where}.locks"),
            stores=r.strings(entry, "stores", f"{where}.stores"),
            verbs=frozenset(verbs),
        )
        if any(k.sha256 == key.sha256 for k in keys):
            r.fail(f"{where}.sha256", digest, "the same key is configured twice")
        if any(k.name == key.name for k in keys):
            r.fail(f"{where}.name", name, "the same name is used twice")
        keys.append(key)
    return tuple(keys)
