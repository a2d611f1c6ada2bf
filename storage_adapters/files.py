"""Files below a root directory, one file per key, fenced with ``flock`` and mark files.

Layout (``@`` is outside the key alphabet, so no key can name the hidden folder)::

    root/<key>                            the body, byte for byte
    root/.fencegate@/tmp/                 temp files before os.replace; leftovers removed at start
    root/.fencegate@/locks/ab/<sha256>    one lock file per scope (flock), never replaced
    root/.fencegate@/marks/ab/<sha256>    high-water mark of the scope, decimal
    root/.fencegate@/meta/ab/<sha256>     JSON {"ino", "token", "content_type"} of the key

An exclusive operation (put, delete, fenced read) holds ``flock(LOCK_EX)`` on
the scope's lock file from the mark check to the end of the write, which
serialises it with every other process; inside a process an ``asyncio.Lock``
per scope queues tasks first, so that waiting does not tie up threads. Each
operation opens its own descriptor of the lock file: flock locks belong to the
open file description, so two threads (or two ``FileStore`` objects) of one
process exclude each other as two processes do. All file I/O runs in
``asyncio.to_thread``.

A put, in order: check the mark; check the path; write the body to a temp
file and fsync it; write the raised mark (temp, fsync, rename, fsync of its
folder) if the token is newer; ``os.replace`` the temp file onto the key and
fsync the key's folder; then write the key's metadata the same way. So the
mark is durable before the data it admits, and the data file is always a
whole old or a whole new body.

Crash between the data replace and the metadata write: the body is the new
one, the metadata still describes the old file. The metadata records the
inode of the file it describes, and a read that finds another inode reports
``token=None`` and ``application/octet-stream`` rather than the old token;
the next write of the key repairs it. Fencing is unaffected (the mark was
written first). The same holds if someone edits the file outside fencegate.

Symlinks below the root are followed only when their real path stays inside
the root and outside the hidden folder; a symlink at the key itself is never
written or deleted through. Note that a symlink inside the root makes two keys
name one file with two fence scopes: do not put such links in a root.

Keys to paths, the key's folders and the symlink checks are ``KeyPaths`` in
``storage_adapters/file_paths.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import json
import os
import secrets
import stat
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final, TypeVar

from storage_adapters.base import DEFAULT_CONTENT_TYPE, NO_HOOKS, FencedStore, Record, StoreHooks
from storage_adapters.errors import (
    BadValue,
    NotFound,
    StaleToken,
    StorageError,
    StorageUnavailable,
    StoreNotStarted,
)
from storage_adapters.file_paths import HIDDEN, KeyPaths, fsync_dir, key_segments

__all__ = ["HIDDEN", "FileStore"]

_MAX_DIGITS: Final = 19  # of a token (a bigint); a mark file holds nothing else
_SHARDS: Final = [f"{i:02x}" for i in range(256)]
T = TypeVar("T")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


class FileStore(FencedStore, KeyPaths):
    """A directory of files, one per key, fenced per scope across processes.

    Args:
        name: the store name.
        root: the directory (created if missing); symlinks in it are resolved once, at start.
        hooks: metrics hooks.
    """

    kind = "files"

    def __init__(self, name: str, root: str | os.PathLike[str], *, hooks: StoreHooks = NO_HOOKS):
        super().__init__(name, hooks=hooks)
        self.root = Path(root)
        self._root = ""  # the real path, set by start
        self._hidden = ""
        self._tmp_dev = -1
        self._started = False
        self._scope_locks: weakref.WeakValueDictionary[str, asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )

    def check_key(self, key: str) -> None:
        super().check_key(key)
        key_segments(key)

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        with _os_errors(self.name):
            await asyncio.to_thread(self._sync_start)
        self._started = True

    async def close(self) -> None:
        self._started = False

    async def ping(self) -> None:
        self._require_started()
        await self._run(self._sync_ping)

    def _sync_ping(self) -> None:
        tmp = os.path.join(self._hidden, "tmp")
        os.stat(tmp)
        if not os.access(tmp, os.W_OK):
            raise PermissionError(errno.EACCES, "not writable", tmp)

    def _sync_start(self) -> None:
        os.makedirs(self.root, exist_ok=True)
        self._root = os.path.realpath(self.root)
        self._hidden = os.path.join(self._root, HIDDEN)
        with contextlib.suppress(FileExistsError):
            os.mkdir(self._hidden, 0o700)
        if not stat.S_ISDIR(os.lstat(self._hidden).st_mode):
            raise StorageError(f"store {self.name!r}: {self._hidden!r} is not a folder")
        for sub in ("tmp", "locks", "marks", "meta"):
            base = os.path.join(self._hidden, sub)
            os.makedirs(base, exist_ok=True)
            if sub != "tmp":
                for shard in _SHARDS:
                    os.makedirs(os.path.join(base, shard), exist_ok=True)
        fsync_dir(self._root)
        tmp = os.path.join(self._hidden, "tmp")
        self._tmp_dev = os.stat(tmp).st_dev
        self._remove_leftovers(tmp)

    def _remove_leftovers(self, tmp: str) -> None:
        """Remove temp files that no live writer holds (a writer keeps its temp file flocked)."""
        for entry in os.scandir(tmp):
            if not entry.is_file(follow_symlinks=False):
                continue
            try:
                fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            try:  # unlink while holding the lock: see _create_temp
                with contextlib.suppress(FileNotFoundError):  # renamed meanwhile: not a leftover
                    os.unlink(entry.path)
            finally:
                os.close(fd)

    # -- the three operations ----------------------------------------------------------

    async def _put(
        self, scope: str, key: str, token: int | None, body: bytes, content_type: str
    ) -> int | None:
        parts = key_segments(key)
        await self._exclusive(scope, self._sync_put, scope, key, parts, token, body, content_type)
        return token

    async def _get(self, scope: str, key: str, token: int | None) -> Record:
        parts = key_segments(key)
        if token is None:
            return await self._run(self._sync_read_shared, scope, key, parts)
        return await self._exclusive(scope, self._sync_fenced_read, scope, key, parts, token)

    async def _delete(self, scope: str, key: str, token: int | None) -> None:
        parts = key_segments(key)
        await self._exclusive(scope, self._sync_delete, scope, key, parts, token)

    def _sync_put(
        self,
        scope: str,
        key: str,
        parts: list[str],
        token: int | None,
        body: bytes,
        content_type: str,
    ) -> None:
        mark = self._check_mark(scope, key, token)
        folder = self._parents(key, parts)
        final = os.path.join(folder, parts[-1])
        self._check_target(key, final)
        tmp_folder = self._tmp_folder(folder)
        fd, tmp = self._create_temp(tmp_folder)
        try:
            _write_all(fd, body)
            os.fsync(fd)
            ino = os.fstat(fd).st_ino
            if token is not None and token > mark:
                self._write_mark(scope, token)
            for attempt in range(3):
                try:
                    os.replace(tmp, final)
                    break
                except FileNotFoundError:
                    # The delete of another key removed the (then empty) folder: again.
                    if attempt == 2 or not os.path.exists(tmp):
                        raise
                    folder = self._parents(key, parts)
                    final = os.path.join(folder, parts[-1])
                    self._check_target(key, final)
            tmp = ""
        finally:
            os.close(fd)
            if tmp:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
        fsync_dir(folder)
        meta = {"ino": ino, "token": token, "content_type": content_type}
        self._replace_small(self._meta_path(key), json.dumps(meta).encode())

    def _sync_fenced_read(self, scope: str, key: str, parts: list[str], token: int) -> Record:
        if token > self._check_mark(scope, key, token):
            self._write_mark(scope, token)
        return self._read(key, parts)

    def _sync_read_shared(self, scope: str, key: str, parts: list[str]) -> Record:
        # A shared lock keeps a plain read from seeing a write between its data and its
        # metadata. No lock file means no write of this scope ever started; don't create one.
        try:
            fd = os.open(self._lock_path(scope), os.O_RDONLY)
        except FileNotFoundError:
            return self._read(key, parts)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            return self._read(key, parts)
        finally:
            os.close(fd)

    def _sync_delete(self, scope: str, key: str, parts: list[str], token: int | None) -> None:
        mark = self._check_mark(scope, key, token)
        target = self._existing_target(key, parts)
        if token is not None and token > mark:
            self._write_mark(scope, token)
        if target is not None:
            os.unlink(target)
            with contextlib.suppress(FileNotFoundError):  # emptied and removed by a delete
                fsync_dir(os.path.dirname(target))
            self._remove_empty_folders(parts)
        meta = self._meta_path(key)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(meta)
            fsync_dir(os.path.dirname(meta))

    # -- fencing -----------------------------------------------------------------------

    async def _exclusive(self, scope: str, fn: Callable[..., T], *args: object) -> T:
        """Run ``fn`` in a thread holding the scope's lock, in-process and across processes."""
        lock = self._scope_locks.get(scope)
        if lock is None:
            lock = self._scope_locks[scope] = asyncio.Lock()
        async with lock:
            return await self._run(self._sync_locked, scope, fn, *args)

    def _sync_locked(self, scope: str, fn: Callable[..., T], *args: object) -> T:
        fd = os.open(self._lock_path(scope), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            return fn(*args)
        finally:
            os.close(fd)  # releases the flock

    def _check_mark(self, scope: str, key: str, token: int | None) -> int:
        """Return the mark of ``scope``; raise ``StaleToken`` if ``token`` is older, and
        ``CorruptMetadata`` (naming ``key``) if the mark file is not a decimal token."""
        if token is None:
            return 0
        path = self._shard_path("marks", scope)
        try:
            with open(path, "rb") as f:
                text = f.read()
        except FileNotFoundError:
            return 0
        digits = text.strip()
        if not (digits.isdigit() and len(digits) <= _MAX_DIGITS):  # fail closed: never guess
            what = f"the high-water mark of lock {scope!r} holds {text[:40]!r}"
            raise self._corrupt(key, what, where=path)
        mark = int(digits)
        if token < mark:
            raise StaleToken(token, mark, scope=scope)
        return mark

    def _write_mark(self, scope: str, token: int) -> None:
        self._replace_small(self._shard_path("marks", scope), str(token).encode())

    def _read(self, key: str, parts: list[str]) -> Record:
        real = os.path.realpath(os.path.join(self._root, *parts))
        if not self._allowed(real):
            raise BadValue(f"key {key!r} resolves outside the root", key=key)
        try:
            fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            # A root that is gone (an unmounted volume) is an outage, not a missing key.
            self._sync_ping()
            raise NotFound(self.name, key) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise NotFound(self.name, key)
            body = _read_all(fd)
        finally:
            os.close(fd)
        meta = self._read_meta(key)
        if meta is None or meta.get("ino") != st.st_ino:
            return Record(body=body, token=None, content_type=DEFAULT_CONTENT_TYPE)
        token = meta.get("token")
        content_type = meta.get("content_type")
        return Record(
            body=body,
            token=token if isinstance(token, int) else None,
            content_type=content_type if isinstance(content_type, str) else DEFAULT_CONTENT_TYPE,
        )

    def _read_meta(self, key: str) -> dict[str, object] | None:
        try:
            with open(self._meta_path(key), "rb") as f:
                meta = json.load(f)
        except (FileNotFoundError, ValueError):
            return None
        return meta if isinstance(meta, dict) else None

    # -- durable small files and temp files --------------------------------------------

    def _replace_small(self, path: str, data: bytes) -> None:
        """Write ``path`` durably: temp file, fsync, rename, fsync of the folder."""
        fd, tmp = self._create_temp(os.path.join(self._hidden, "tmp"))
        try:
            _write_all(fd, data)
            os.fsync(fd)
            os.replace(tmp, path)
            tmp = ""
        finally:
            os.close(fd)
            if tmp:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
        fsync_dir(os.path.dirname(path))

    def _create_temp(self, folder: str) -> tuple[int, str]:
        """A new temp file, flocked until closed so that ``start`` elsewhere leaves it alone.

        ``start`` of another process may lock and unlink a temp file between our
        open and our flock; then the file has no name left (st_nlink == 0), so try again.
        """
        while True:
            # HIDDEN in the name: no key can name a temp file, wherever it is.
            path = os.path.join(folder, f"{HIDDEN}{os.getpid()}-{secrets.token_hex(8)}.tmp")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
            fcntl.flock(fd, fcntl.LOCK_EX)
            if os.fstat(fd).st_nlink > 0:
                return fd, path
            os.close(fd)

    # -- threads and errors ------------------------------------------------------------

    def _require_started(self) -> None:
        if not self._started:
            raise StoreNotStarted(self.name)

    async def _run(self, fn: Callable[..., T], *args: object) -> T:
        """Run blocking file I/O in a thread; OS errors become ``StorageError`` s."""
        self._require_started()
        with _os_errors(self.name):
            return await asyncio.to_thread(fn, *args)


@contextlib.contextmanager
def _os_errors(store: str) -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            raise BadValue(f"path too long for store {store!r}: {exc.strerror}") from exc
        raise StorageUnavailable(store, f"{type(exc).__name__}: {exc}") from exc
