"""Where configuration values come from, and reading them with types.

``Reader`` reads raw TOML values; every failure is one ``ConfigError`` line
naming the key, its (redacted) value, where it came from and what is wrong.
``apply_env`` maps ``FENCEGATE_*`` variables onto the raw document::

    FENCEGATE_LISTEN  FENCEGATE_METRICS_LISTEN  FENCEGATE_ALLOW_REMOTE
    FENCEGATE_MAX_BODY_BYTES  FENCEGATE_REQUEST_TIMEOUT_MS  FENCEGATE_SHUTDOWN_TIMEOUT_MS
    FENCEGATE_SHUTDOWN_GRACE_MS  FENCEGATE_LOG_LEVEL  FENCEGATE_LOG_FORMAT  FENCEGATE_STRICT_START
    FENCEGATE_WORKERS
    FENCEGATE_TLS_CERT  FENCEGATE_TLS_KEY
    FENCEGATE_LOCKS_<KEY>           e.g. FENCEGATE_LOCKS_REDIS=redis://a:6379,redis://b:6379,...
                                    FENCEGATE_LOCKS_GROUPS=redis://a1,redis://a2,redis://a3;redis://b1,...
    FENCEGATE_STORES_<NAME>_<KEY>   e.g. FENCEGATE_STORES_KV_DSN=postgresql://...

``<NAME>`` is the store name upper-cased with ``-`` as ``_`` (a store that
the file does not name is created lower-cased); lists are comma-separated.
``FENCEGATE_URL``, ``FENCEGATE_API_KEY`` and ``FENCEGATE_CONFIG`` are read by
the CLI, not here. Any other ``FENCEGATE_*`` variable is most likely a typo:
``apply_env`` returns a warning naming it and the closest known variable.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, NoReturn, cast
from urllib.parse import urlsplit, urlunsplit

from gateway.errors import ConfigError

__all__ = [
    "AUTH_KEY_KEYS",
    "CLIENT_ENV",
    "LOCKS_KEYS",
    "STORE_KEYS",
    "TOP_KEYS",
    "Reader",
    "apply_env",
    "known_env",
    "redact",
    "set_path",
]

TOP_KEYS: Final = {
    "listen", "metrics_listen", "allow_remote", "max_body_bytes", "request_timeout_ms",
    "shutdown_timeout_ms", "shutdown_grace_ms", "log_level", "log_format", "strict_start",
    "workers", "locks", "stores", "auth", "tls",
}  # fmt: skip
LOCKS_KEYS: Final = {
    "redis", "groups", "previous_groups", "node_timeout_ms", "min_ttl_ms", "max_ttl_ms",
    "max_wait_ms", "default_ttl_ms", "default_wait_ms", "issued_cache_size",
}  # fmt: skip
STORE_KEYS: Final = {
    "type", "dsn", "schema", "table", "key_column", "columns", "root", "fencing",
    "pool_min", "pool_max", "command_timeout_ms", "acquire_timeout_ms",
    "endpoint", "bucket", "region", "prefix", "access_key_id", "secret_access_key",
}  # fmt: skip
AUTH_KEY_KEYS: Final = {"name", "sha256", "locks", "stores", "verbs"}


_SECRET_PARAM = re.compile(r"(?i)(^|[&;])((?:ssl)?password=)[^&;]*")
"""A password in a URL's query (libpq and the MySQL drivers take ``?password=``)."""


def redact(text: str) -> str:
    """``text`` with the passwords of a URL in it replaced by ``***``: the one after the
    user name, and any ``password`` or ``sslpassword`` of its query."""
    try:
        parts = urlsplit(text)
    except ValueError:
        return "<unparsable url>"
    if parts.query:
        parts = parts._replace(query=_SECRET_PARAM.sub(r"\1\2***", parts.query))
    if parts.password is not None:
        user = parts.username or ""
        host = parts.netloc.rpartition("@")[2]
        parts = parts._replace(netloc=f"{user}:***@{host}")
    return urlunsplit(parts)


class Reader:
    """Typed access to raw values; every failure names the key, its value and its origin."""

    def __init__(self, origins: Mapping[str, str]) -> None:
        self.origins = origins

    def fail(self, path: str, value: object, problem: str) -> NoReturn:
        origin = self.origins.get(path)
        where = f"config {path!r}" + (f" (from {origin})" if origin else "")
        if value is None:
            raise ConfigError(f"{where} is not set: {problem}")
        raise ConfigError(f"{where} has value {show(path, value)}: {problem}")

    def known(self, t: Mapping[str, Any], allowed: set[str], where: str) -> None:
        for key in t:
            if key not in allowed:
                path = f"{where}.{key}" if where else key
                known = ", ".join(sorted(allowed))
                raise ConfigError(f"config key {path!r} is unknown; known keys here: {known}")

    def table(self, t: Mapping[str, Any], key: str) -> Mapping[str, Any]:
        value = t.get(key, {})
        if not isinstance(value, Mapping):
            self.fail(key, value, "must be a table")
        return value

    def string(self, t: Mapping[str, Any], key: str, path: str) -> str | None:
        value = t.get(key)
        if value is not None and (not isinstance(value, str) or not value):
            self.fail(path, value, "must be a non-empty string")
        return value

    def strings(self, t: Mapping[str, Any], key: str, path: str) -> tuple[str, ...]:
        value = t.get(key, [])
        if isinstance(value, str) and path.rpartition(".")[2] in ("redis", "columns"):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.fail(path, value, "must be a list of strings")
        return tuple(value)

    def choice(
        self,
        t: Mapping[str, Any],
        key: str,
        path: str,
        allowed: tuple[str, ...],
        default: str | None,
    ) -> str:
        value = t.get(key, default)
        if value not in allowed:
            self.fail(path, value, f"must be one of {', '.join(map(repr, allowed))}")
        return cast(str, value)

    def integer(
        self, t: Mapping[str, Any], key: str, path: str, default: int, *, low: int = 1
    ) -> int:
        value = t.get(key, default)
        if isinstance(value, str) and path in self.origins and value.strip().isdigit():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(path, value, "must be a whole number")
        if value < low:
            self.fail(path, value, f"must be at least {low}")
        return value

    def ms(self, t: Mapping[str, Any], key: str, path: str, default: int, *, low: int = 1) -> float:
        return self.integer(t, key, path, default, low=low) / 1000

    def boolean(self, t: Mapping[str, Any], key: str, path: str, default: bool) -> bool:
        value = t.get(key, default)
        if isinstance(value, str) and path in self.origins:
            value = {
                "true": True,
                "1": True,
                "yes": True,
                "false": False,
                "0": False,
                "no": False,
            }.get(value.strip().lower(), value)
        if not isinstance(value, bool):
            env = path in self.origins
            self.fail(path, value, "must be true or false" + (" (or 1/0, yes/no)" if env else ""))
        return value

    def address(self, t: Mapping[str, Any], key: str) -> tuple[str, int] | None:
        value = t.get(key)
        if value is None:
            return None
        if not isinstance(value, str):
            self.fail(key, value, "must be 'host:port'")
        host, sep, port = value.rpartition(":")
        host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        if not sep or not host or not port.isdigit() or int(port) > 65535:
            self.fail(key, value, "must be 'host:port' (IPv6 as '[::1]:8080')")
        return host, int(port)

    def file(self, t: Mapping[str, Any], key: str, path: str) -> str:
        value = self.string(t, key, path)
        if value is None:
            self.fail(path, value, "[tls] needs both cert and key")
        if not Path(value).is_file():
            self.fail(path, value, "no such file")
        return value


def show(path: str, value: object) -> str:
    """``value`` for an error message, with URL passwords redacted and secrets hidden."""
    if path.endswith("secret_access_key"):
        return "<hidden>"
    if isinstance(value, str):
        return repr(redact(value))
    if path.endswith("dsn"):
        return "<hidden>"
    if isinstance(value, list | tuple | Mapping):  # as written in TOML, not as Python
        items = _redacted(value)
        try:
            return json.dumps(items)
        except (TypeError, ValueError):
            return repr(items)
    return repr(value)


def _redacted(value: object) -> object:
    """``value`` with every URL password in it (lists of lists too) replaced by ``***``."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, list | tuple):
        return [_redacted(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _redacted(v) for k, v in value.items()}
    return value


def set_path(raw: dict[str, Any], path: list[str], value: object) -> None:
    node = raw
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"config key {'.'.join(path)!r} cannot be set: {part!r} is a value")
        node = child
    node[path[-1]] = value


_ENV_TOP: Final = {
    "LISTEN": "listen",
    "METRICS_LISTEN": "metrics_listen",
    "ALLOW_REMOTE": "allow_remote",
    "MAX_BODY_BYTES": "max_body_bytes",
    "REQUEST_TIMEOUT_MS": "request_timeout_ms",
    "SHUTDOWN_TIMEOUT_MS": "shutdown_timeout_ms",
    "SHUTDOWN_GRACE_MS": "shutdown_grace_ms",
    "LOG_LEVEL": "log_level",
    "LOG_FORMAT": "log_format",
    "STRICT_START": "strict_start",
    "WORKERS": "workers",
}
CLIENT_ENV: Final = ("FENCEGATE_URL", "FENCEGATE_API_KEY", "FENCEGATE_CONFIG")
"""Read by the CLI, not server settings."""


def known_env(stores: list[str]) -> list[str]:
    """Every ``FENCEGATE_*`` variable this gateway reads, for "did you mean" hints."""
    names = [f"FENCEGATE_{k}" for k in _ENV_TOP]
    names += [f"FENCEGATE_LOCKS_{k.upper()}" for k in LOCKS_KEYS]
    names += ["FENCEGATE_TLS_CERT", "FENCEGATE_TLS_KEY", *CLIENT_ENV]
    for store in stores or ["<NAME>"]:
        prefix = f"FENCEGATE_STORES_{store.upper().replace('-', '_')}_"
        names += [prefix + k.upper() for k in STORE_KEYS]
    return names


def _unknown(var: str, stores: list[str]) -> str:
    close = difflib.get_close_matches(var, known_env(stores), n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}?" if close else ""
    return f"environment variable {var} is not a fencegate setting and is ignored{hint}"


def apply_env(raw: dict[str, Any], env: Mapping[str, str], origins: dict[str, str]) -> list[str]:
    """Set the values of ``FENCEGATE_*`` variables in ``raw``; return warnings (unknown names).

    Raises:
        ConfigError: a ``FENCEGATE_LOCKS_*``, ``_TLS_*``, ``_AUTH_*`` or ``_STORES_*``
            variable that names no key.
    """
    stores = raw.get("stores")
    existing = list(stores) if isinstance(stores, dict) else []
    warnings: list[str] = []
    for var in sorted(env):
        if not var.startswith("FENCEGATE_"):
            continue
        rest = var[len("FENCEGATE_") :]
        value: object = env[var]
        if rest in _ENV_TOP:
            path = [_ENV_TOP[rest]]
        elif rest.startswith("LOCKS_") and rest[6:].lower() in LOCKS_KEYS:
            path = ["locks", rest[6:].lower()]
        elif rest in ("TLS_CERT", "TLS_KEY"):
            path = ["tls", rest[4:].lower()]
        elif rest.startswith("STORES_"):
            path = _store_env_path(var, rest[7:], existing)
        elif rest.startswith(("LOCKS_", "TLS_", "AUTH_")):
            raise ConfigError(_unknown(var, existing).replace(" and is ignored", ""))
        elif var in CLIENT_ENV:
            continue
        else:
            warnings.append(_unknown(var, existing))
            continue
        if path[-1] in ("redis", "columns"):
            value = [v.strip() for v in env[var].split(",") if v.strip()]
        elif path[-1] in ("groups", "previous_groups"):  # groups apart by ';', nodes by ','
            value = [[v.strip() for v in g.split(",") if v.strip()] for g in env[var].split(";")]
            value = [g for g in value if g]
        set_path(raw, path, value)
        origins[".".join(path)] = var
    return warnings


def _store_env_path(var: str, rest: str, existing: list[str]) -> list[str]:
    for key in sorted(STORE_KEYS, key=len, reverse=True):
        suffix = "_" + key.upper()
        if rest.endswith(suffix) and len(rest) > len(suffix):
            wanted = rest[: -len(suffix)]
            name = next(
                (n for n in existing if n.upper().replace("-", "_") == wanted), wanted.lower()
            )
            return ["stores", name, key]
    raise ConfigError(
        f"environment variable {var} is not a fencegate setting: "
        f"use FENCEGATE_STORES_<NAME>_<KEY> with KEY one of {', '.join(sorted(STORE_KEYS))}"
    )
