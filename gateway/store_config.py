"""Configuration of one store, ``[stores.<name>]``: ``StoreConfig`` and its parsing.

``gateway/config.py`` reads the whole file and calls ``parse_store`` for each store;
the keys of each store type are listed in that module's docstring.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, cast
from urllib.parse import parse_qs, urlsplit

from gateway._sources import STORE_KEYS, Reader, redact
from gateway.errors import ConfigError

__all__ = ["Fencing", "StoreConfig", "parse_store"]
Fencing = Literal["token", "lease", "none"]
_STORE_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
_POSTGRES_ONLY: Final = (
    "dsn", "schema", "table", "key_column", "columns", "pool_min", "pool_max",
    "command_timeout_ms", "acquire_timeout_ms",
)  # fmt: skip
_S3_ONLY: Final = (
    "endpoint", "bucket", "region", "prefix", "access_key_id", "secret_access_key",
)  # fmt: skip
_S3_BUCKET: Final = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """``[stores.<name>]``."""

    name: str
    type: Literal["postgres", "mysql", "files", "s3"]
    fencing: Fencing = "token"
    dsn: str | None = field(default=None, repr=False)
    schema: str = "public"
    pool_min: int = 1
    pool_max: int = 10
    command_timeout: float = 10.0
    acquire_timeout: float = 5.0
    table: str | None = None
    key_column: str | None = None
    columns: tuple[str, ...] = ()
    root: str | None = None
    endpoint: str | None = None
    bucket: str | None = None
    region: str = "us-east-1"
    prefix: str = ""
    access_key_id: str | None = field(default=None, repr=False)
    secret_access_key: str | None = field(default=None, repr=False)

    def describe(self) -> str:
        """One line for the log, without secrets."""
        if self.type == "files":
            what = f"files under {self.root}"
        elif self.type == "s3":
            where = redact(self.endpoint) if self.endpoint else "AWS"
            what = f"s3 bucket {self.bucket} at {where} ({self.region}), prefix {self.prefix!r}"
        elif self.table:
            what = f"{self.type} table {self.table} ({self.key_column}; {', '.join(self.columns)})"
            what += f" at {redact(self.dsn or '')}"
        elif self.type == "mysql":
            what = f"mysql key-value at {redact(self.dsn or '')}"
        else:
            what = f"postgres key-value at {redact(self.dsn or '')} schema {self.schema}"
        return f"store {self.name!r}: {what}, fencing={self.fencing}"


def parse_store(r: Reader, name: str, t: Any) -> StoreConfig:
    where = f"stores.{name}"
    if not _STORE_NAME.fullmatch(name):
        r.fail(where, name, "a store name is 1-64 characters of A-Z a-z 0-9 _ -")
    if not isinstance(t, Mapping):
        r.fail(where, t, "must be a table")
    r.known(t, STORE_KEYS, where)
    if "type" not in t:
        came_from = sorted({o for p, o in r.origins.items() if p.startswith(f"{where}.")})
        source = f" (the store comes from {', '.join(came_from)})" if came_from else ""
        env = f"FENCEGATE_STORES_{name.upper().replace('-', '_')}_TYPE"
        raise ConfigError(
            f"config {where + '.type'!r} is not set{source}: a store needs type = "
            f"'postgres', 'mysql', 'files' or 's3' (in the file, or {env}=postgres)"
        )
    kind = r.choice(t, "type", f"{where}.type", ("postgres", "mysql", "files", "s3"), None)
    fencing = r.choice(t, "fencing", f"{where}.fencing", ("token", "lease", "none"), "token")
    if kind != "s3":
        for key in _S3_ONLY:
            if key in t:
                r.fail(f"{where}.{key}", t[key], "only for type = 's3'")
    if kind == "s3":
        return _parse_s3(r, name, t, cast(Fencing, fencing))
    if kind == "files":
        for key in _POSTGRES_ONLY:
            if key in t:
                r.fail(f"{where}.{key}", t[key], "only for type = 'postgres' or 'mysql'")
        root = r.string(t, "root", f"{where}.root")
        if root is None:
            r.fail(f"{where}.root", None, "a files store needs root = <directory>")
        return StoreConfig(name, "files", cast(Fencing, fencing), root=root)
    if "root" in t:
        r.fail(f"{where}.root", t["root"], "only for type = 'files'")
    dsn = r.string(t, "dsn", f"{where}.dsn")
    if kind == "mysql":
        if "schema" in t:
            r.fail(f"{where}.schema", t["schema"], "a mysql store uses the DSN's database")
        problem = _mysql_dsn_problem(dsn)
        if problem:
            r.fail(f"{where}.dsn", dsn, problem)
    else:
        problem = _postgres_dsn_problem(dsn)
        if problem:
            r.fail(f"{where}.dsn", dsn, problem)
    table = r.string(t, "table", f"{where}.table")
    key_column = r.string(t, "key_column", f"{where}.key_column")
    columns = r.strings(t, "columns", f"{where}.columns")
    if table is None and (key_column is not None or columns):
        bad = "key_column" if key_column is not None else "columns"
        r.fail(f"{where}.{bad}", t[bad], "only with table = <an existing table>")
    if table is not None:
        if key_column is None:
            r.fail(f"{where}.key_column", None, f"table {table!r} needs key_column")
        if not columns:
            r.fail(f"{where}.columns", [], "name the columns a client may write")
        if len(set(columns)) != len(columns) or key_column in columns:
            r.fail(f"{where}.columns", columns, "repeats a column or the key column")
    pool_min = r.integer(t, "pool_min", f"{where}.pool_min", 1, low=0)
    pool_max = r.integer(t, "pool_max", f"{where}.pool_max", 10, low=1)
    if pool_min > pool_max:
        r.fail(f"{where}.pool_min", pool_min, f"exceeds pool_max ({pool_max})")
    return StoreConfig(
        name,
        cast(Literal["postgres", "mysql"], kind),
        cast(Fencing, fencing),
        dsn=dsn,
        schema=r.string(t, "schema", f"{where}.schema") or "public",
        pool_min=pool_min,
        pool_max=pool_max,
        command_timeout=r.ms(t, "command_timeout_ms", f"{where}.command_timeout_ms", 10_000),
        acquire_timeout=r.ms(t, "acquire_timeout_ms", f"{where}.acquire_timeout_ms", 5_000),
        table=table,
        key_column=key_column,
        columns=columns,
    )


def check_overlaps(r: Reader, stores: Mapping[str, StoreConfig]) -> None:
    """Refuse two stores over the same data: a file, object or row reachable through
    both would have a mark in each scope, and a write through one would pass a stale
    token that the other refuses. Files roots nested or equal, s3 prefixes of one
    bucket nested or equal, one existing table twice (by its DSN as written)."""
    seen: list[tuple[str, StoreConfig]] = []
    for name, store in stores.items():
        for other_name, other in seen:
            clash = _overlap(store, other)
            if clash is not None:
                path, value, what = clash
                r.fail(
                    f"stores.{name}.{path}",
                    value,
                    f"{what} of store {other_name!r} ({_where(other)}): data under both "
                    "would be fenced by two marks; give each store its own",
                )
        seen.append((name, store))


def _where(store: StoreConfig) -> str:
    if store.type == "files":
        return f"root {store.root}"
    if store.type == "s3":
        return f"bucket {store.bucket}, prefix {store.prefix!r}"
    return f"table {store.schema}.{store.table}" if store.table else "its key-value table"


def _overlap(a: StoreConfig, b: StoreConfig) -> tuple[str, object, str] | None:
    """(key, value, what it overlaps) when ``a`` and ``b`` reach the same data."""
    if a.type != b.type:
        return None
    if a.type == "files" and a.root and b.root:
        ra, rb = Path(a.root).resolve(), Path(b.root).resolve()
        if ra == rb or rb in ra.parents or ra in rb.parents:
            return "root", a.root, "overlaps the root"
    elif a.type == "s3":
        same_bucket = (a.endpoint, a.bucket) == (b.endpoint, b.bucket)
        if same_bucket and (a.prefix.startswith(b.prefix) or b.prefix.startswith(a.prefix)):
            return "prefix", a.prefix, "overlaps the prefix"
    elif a.table and (a.dsn, a.schema, a.table) == (b.dsn, b.schema, b.table):
        return "table", a.table, "is the table"
    return None


def _parse_s3(r: Reader, name: str, t: Mapping[str, Any], fencing: Fencing) -> StoreConfig:
    where = f"stores.{name}"
    for key in (*_POSTGRES_ONLY, "root"):
        if key in t and key != "command_timeout_ms":
            r.fail(f"{where}.{key}", t[key], "not a key of type = 's3'")
    bucket = r.string(t, "bucket", f"{where}.bucket")
    if bucket is None or not _S3_BUCKET.fullmatch(bucket):
        r.fail(
            f"{where}.bucket",
            bucket,
            "an s3 store needs bucket = <an existing bucket> (3-63 of a-z 0-9 . -)",
        )
    endpoint = r.string(t, "endpoint", f"{where}.endpoint")
    if endpoint is not None:
        try:
            parts = urlsplit(endpoint)
            parts.port  # noqa: B018  # raises ValueError for a bad port
        except ValueError as exc:
            r.fail(
                f"{where}.endpoint", redact(endpoint), f"must be an http:// or https:// URL ({exc})"
            )
        if parts.scheme not in ("http", "https") or not parts.hostname:
            r.fail(f"{where}.endpoint", redact(endpoint), "must be an http:// or https:// URL")
    region = r.string(t, "region", f"{where}.region") or "us-east-1"
    prefix = r.string(t, "prefix", f"{where}.prefix") or ""
    if len(prefix.encode()) > 512 or "\x00" in prefix:
        r.fail(f"{where}.prefix", prefix, "must be at most 512 bytes, without NUL")
    key_id = r.string(t, "access_key_id", f"{where}.access_key_id")
    secret = r.string(t, "secret_access_key", f"{where}.secret_access_key")
    if (key_id is None) != (secret is None):
        missing = "secret_access_key" if secret is None else "access_key_id"
        r.fail(
            f"{where}.{missing}",
            None,
            "set access_key_id and secret_access_key together, or neither"
            " (then AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are used)",
        )
    return StoreConfig(
        name,
        "s3",
        fencing,
        command_timeout=r.ms(t, "command_timeout_ms", f"{where}.command_timeout_ms", 10_000),
        endpoint=endpoint,
        bucket=bucket,
        region=region,
        prefix=prefix,
        access_key_id=key_id,
        secret_access_key=secret,
    )


def _postgres_dsn_problem(dsn: str | None) -> str | None:
    """What is wrong with a postgres store's DSN (None when nothing is).

    asyncpg parses the DSN only when the store starts, and a malformed port there is a
    ``ValueError`` out of its parser, not a connection error: check what it would choke on.
    """
    needs = "a postgres store needs dsn = 'postgresql://...'"
    if dsn is None:
        return needs
    try:
        parts = urlsplit(dsn)
    except ValueError as exc:
        return f"{needs} ({exc})"
    if parts.scheme not in ("postgresql", "postgres"):
        return needs
    # libpq's host list: host[:port][,host[:port]...]; the ports of ?port= count too.
    ports = [_pg_port(spec) for spec in parts.netloc.rpartition("@")[2].split(",")]
    ports += [p for q in parse_qs(parts.query).get("port", []) for p in q.split(",")]
    for port in ports:
        if port and not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
            return f"{needs} (port {port!r} is not a number from 1 to 65535)"
    return None


def _pg_port(spec: str) -> str:
    """The port of one ``host[:port]`` of a DSN's host list ('' when none is given)."""
    if spec.startswith("["):  # [IPv6]:port
        return spec.partition("]")[2].removeprefix(":")
    return spec.partition(":")[2]


def _mysql_dsn_problem(dsn: str | None) -> str | None:
    """What is wrong with a mysql store's DSN (None when nothing is)."""
    needs = "a mysql store needs dsn = 'mysql://user:pass@host:3306/database'"
    if dsn is None:
        return needs
    try:
        parts = urlsplit(dsn)
        parts.port  # noqa: B018  # raises ValueError for a bad port
    except ValueError as exc:
        return f"{needs} ({exc})"
    if parts.scheme != "mysql" or not parts.hostname:
        return needs
    if not parts.path.strip("/") or "/" in parts.path.strip("/"):
        return f"{needs}: it names no database"
    if parts.query or parts.fragment:
        return "a mysql dsn takes no ?options or #fragment"
    return None
