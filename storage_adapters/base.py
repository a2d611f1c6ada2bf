"""The adapter interface: one ``FencedStore`` subclass per kind of storage.

Fencing, as every adapter implements it for a fence ``scope`` (the lock name,
by default ``{store}/{key}``)::

    accept iff token >= high_water[scope]; then high_water[scope] = token; then write

atomically with respect to every other writer of that scope, through any
process. A rejected write applies nothing and raises ``StaleToken``. A read
that carries a token (a *fenced read*) is refused the same way and otherwise
raises the mark before it reads, so that a holder that read, paused and lost
its lease cannot write back over what the next holder read::

    holder 1 (token 7): get(token=7) -> v0 ............ pause ........ put(7, v0+1) -> StaleToken
    holder 2 (token 8):                  get(token=8) -> v0 (mark = 8)   put(8, v0+1) -> ok

``token=None`` switches fencing off for one call: the same path without the
check and without touching the mark (the benchmark baseline).

A new backend is one module: subclass ``FencedStore``, set ``kind``, and
implement ``start``, ``close``, ``ping``, ``_put``, ``_get`` and ``_delete``;
``put``, ``get`` and ``delete`` here validate the arguments and report to the
hooks.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, ClassVar, Final, Protocol, Self, TypeVar

from storage_adapters.errors import BadValue, CorruptMetadata, StaleToken, StorageUnavailable

__all__ = [
    "DEFAULT_CONTENT_TYPE",
    "MAX_TOKEN",
    "NO_HOOKS",
    "FencedStore",
    "NoHooks",
    "Record",
    "StoreHooks",
    "compact_json",
    "validate_key",
    "validate_legacy_columns",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_CONTENT_TYPE: Final = "application/octet-stream"
MAX_TOKEN: Final = 2**63 - 1  # PostgreSQL bigint
_MAX_SCOPE: Final = 1024
_CORRUPT_MEMORY: Final = 1024  # corrupt keys logged already, per store (then logged anew)
_KEY_RE: Final = re.compile(r"[A-Za-z0-9._~:/-]{1,512}")
_CONTENT_TYPE_RE: Final = re.compile(r"[\x20-\x7e]{1,255}")
# A JSON string (kept), or whitespace outside strings (dropped).
_JSON_SPACE: Final = re.compile(r'("(?:[^"\\]+|\\.)*")|\s+')


def compact_json(text: str) -> str:
    """JSON text the server rendered, without the whitespace between tokens.

    A legacy-table row reads back as the API's other answers do (``{"id":"r1"}``),
    whichever server rendered it (MariaDB's ``JSON_OBJECT`` puts spaces after
    ``:`` and ``,``; PostgreSQL does so inside json/jsonb columns). Numbers are
    kept as the server wrote them: nothing is parsed.
    """
    return _JSON_SPACE.sub(lambda m: m.group(1) or "", text)


def validate_key(key: str) -> str:
    """Return ``key`` if it is 1-512 characters of ``A-Z a-z 0-9 . _ ~ : / -``.

    Raises:
        BadValue: the key is empty, too long or has another character.
    """
    if not isinstance(key, str) or _KEY_RE.fullmatch(key) is None:
        raise BadValue(
            f"key {key!r} is not 1-512 characters of A-Z a-z 0-9 . _ ~ : / -", key=str(key)
        )
    return key


def validate_legacy_columns(
    store: str, table: str, key_column: str, columns: Sequence[str]
) -> tuple[str, ...]:
    """Return ``columns`` as a tuple once table, key column and columns are valid names.

    Raises:
        ValueError: a name is empty, not a string or has a NUL; the key column is
            listed among the columns; or a column repeats.
    """
    listed = list(columns)
    for label, value in [("table", table), ("key_column", key_column)] + [
        ("columns", c) for c in listed
    ]:
        if not isinstance(value, str) or not value or "\x00" in value:
            raise ValueError(f"store {store!r}: {label} has value {value!r}; not a name")
    if key_column in listed:
        raise ValueError(
            f"store {store!r}: columns has value {listed!r}; the key column"
            f" {key_column!r} comes from the URL and cannot be listed"
        )
    if len(set(listed)) != len(listed):
        raise ValueError(f"store {store!r}: columns has value {listed!r}; a name repeats")
    return tuple(listed)


def _validate_token(token: int | None) -> None:
    if token is None:
        return
    # bool is an int; a True token is a bug in the caller, not token 1.
    if not isinstance(token, int) or isinstance(token, bool) or not 1 <= token <= MAX_TOKEN:
        raise BadValue(f"token {token!r} is not a positive 64-bit integer")


def _validate_scope(scope: str) -> None:
    if not isinstance(scope, str) or not 1 <= len(scope) <= _MAX_SCOPE or "\x00" in scope:
        raise BadValue(f"fence scope {scope!r} is not 1-{_MAX_SCOPE} characters without NUL")


@dataclass(frozen=True, slots=True)
class Record:
    """What a read returns: the body, and the token of the last accepted write of the key."""

    body: bytes
    token: int | None
    content_type: str


class StoreHooks(Protocol):
    """Where a store reports what happens (``gateway/metrics.py`` implements it).

    Every method must be cheap and must not raise.
    """

    def write_done(self, store: str, seconds: float, ok: bool) -> None:
        """A put or delete ended: ok, or failed (rejected, bad value, unavailable)."""

    def rejected(self, store: str, reason: str) -> None:
        """A write or fenced read was refused by fencing; reason is ``stale_token``."""


class NoHooks:
    """The default: report nothing."""

    def write_done(self, store: str, seconds: float, ok: bool) -> None:
        pass

    def rejected(self, store: str, reason: str) -> None:
        pass


NO_HOOKS: Final[StoreHooks] = NoHooks()


class FencedStore(ABC):
    """A storage that applies a write only if its fencing token is not stale."""

    kind: ClassVar[str]
    """``postgres``, ``postgres_legacy``, ``mysql``, ``mysql_legacy``, ``files`` or ``s3``."""
    per_key_scope: ClassVar[bool] = False
    """True: the fence scope is always the key's own lock; ``X-Fencing-Lock`` is refused."""

    def __init__(self, name: str, *, hooks: StoreHooks = NO_HOOKS) -> None:
        self.name = name
        self.hooks = hooks
        self._corrupt_logged: set[tuple[str, str]] = set()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @abstractmethod
    async def start(self) -> None:
        """Connect, create fencegate's own tables or folders if missing, clean leftovers.

        Idempotent, and safe when several processes start at once.
        """

    @abstractmethod
    async def close(self) -> None:
        """Release connections; calls after this raise ``StorageUnavailable``."""

    @abstractmethod
    async def ping(self) -> None:
        """Return if the storage answers (for ``/readyz``).

        Raises:
            StorageUnavailable: it does not.
        """

    def check_key(self, key: str) -> None:
        """Raise ``BadValue`` for a key this store can never hold (before any fencing)."""
        validate_key(key)

    async def put(
        self,
        scope: str,
        key: str,
        token: int | None,
        body: bytes,
        *,
        content_type: str = DEFAULT_CONTENT_TYPE,
    ) -> int | None:
        """Write ``body`` at ``key`` if ``token`` is not older than the mark of ``scope``.

        Args:
            scope: the fence scope (the lock name).
            key: the store key, see ``validate_key``.
            token: the fencing token, or None to write without fencing.
            body: the bytes to keep.
            content_type: kept with the body and returned by ``get``.

        Returns:
            The token.

        Raises:
            StaleToken: a newer token was seen for ``scope``; nothing was written.
            BadValue: the key, token or body cannot be stored.
            StorageUnavailable: the storage failed; the write may or may not have happened.
        """
        self._check(scope, key, token)
        if not isinstance(content_type, str) or not _CONTENT_TYPE_RE.fullmatch(content_type):
            raise BadValue(f"content type {content_type!r} is not 1-255 printable ASCII characters")
        return await self._timed_write(self._put, scope, key, token, bytes(body), content_type)

    async def get(self, scope: str, key: str, token: int | None) -> Record:
        """Read ``key``; with a token, a fenced read that first raises the mark of ``scope``.

        Raises:
            StaleToken: (fenced read) a newer token was seen for ``scope``.
            NotFound: the key does not exist (checked after the fence).
            BadValue: the key or token is malformed.
            StorageUnavailable: the storage failed.
        """
        self._check(scope, key, token)
        retry = True
        while True:
            try:
                return await self._get(scope, key, token)
            except StaleToken:
                self._notify_rejected()
                raise
            except StorageUnavailable as exc:
                if not (retry and self._retry_once(exc)):
                    raise
                retry = False

    async def delete(self, scope: str, key: str, token: int | None) -> None:
        """Delete ``key``, fenced like ``put``; a missing key is not an error.

        The fence check and the mark update happen even when the key is missing.

        Raises:
            StaleToken: a newer token was seen for ``scope``; nothing was deleted.
            BadValue: the key or token is malformed.
            StorageUnavailable: the storage failed.
        """
        self._check(scope, key, token)
        await self._timed_write(self._delete, scope, key, token)

    async def _timed_write(self, write: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``await write(*args)``, timed for the hooks and retried once where
        ``_retry_once`` says the call never reached the storage (each attempt
        reported on its own); a stale token is counted."""
        retry = True
        while True:
            started = time.perf_counter()  # the loop's clock is ms-coarse under uvloop
            ok = False
            try:
                result = await write(*args)
                ok = True
                return result
            except StaleToken:
                self._notify_rejected()
                raise
            except StorageUnavailable as exc:
                if not (retry and self._retry_once(exc)):
                    raise
                retry = False
            finally:
                self._write_ended(started, ok)

    @abstractmethod
    async def _put(
        self, scope: str, key: str, token: int | None, body: bytes, content_type: str
    ) -> int | None:
        """Check and write atomically; arguments are already validated."""

    @abstractmethod
    async def _get(self, scope: str, key: str, token: int | None) -> Record:
        """Fenced (token) or plain (None) read; arguments are already validated."""

    @abstractmethod
    async def _delete(self, scope: str, key: str, token: int | None) -> None:
        """Check and delete atomically; arguments are already validated."""

    def _retry_once(self, exc: StorageUnavailable) -> bool:
        """True: the call failed before it reached the storage, and is made once more
        (each attempt reported to the hooks on its own). None is, unless overridden."""
        return False

    def _corrupt(self, key: str, what: str, where: str = "") -> CorruptMetadata:
        """The error for fencing metadata of ``key`` that fencegate did not write,
        logged at WARNING once per key and problem (not once per request). ``where``
        (a server path) goes to the log only, never to the client."""
        err = CorruptMetadata(self.name, key, what)
        seen = (key, what)
        if seen not in self._corrupt_logged:
            if len(self._corrupt_logged) >= _CORRUPT_MEMORY:
                self._corrupt_logged.clear()
            self._corrupt_logged.add(seen)
            log.warning("%s%s", err, f" (in {where})" if where else "")
        return err

    def _check(self, scope: str, key: str, token: int | None) -> None:
        _validate_scope(scope)
        self.check_key(key)
        _validate_token(token)

    def _write_ended(self, started: float, ok: bool) -> None:
        """Report a put or delete that ended (not one that was cancelled)."""
        if not _cancelled():
            self._notify_write(time.perf_counter() - started, ok)

    def _notify_write(self, seconds: float, ok: bool) -> None:
        try:
            self.hooks.write_done(self.name, seconds, ok)
        except Exception:  # a metrics bug must not turn a done write into an error
            log.exception("store hook write_done failed")

    def _notify_rejected(self) -> None:
        try:
            self.hooks.rejected(self.name, "stale_token")
        except Exception:  # see _notify_write
            log.exception("store hook rejected failed")


def _cancelled() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
