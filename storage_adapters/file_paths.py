"""Where a files store keeps each key: key segments, hashed shard paths, parent folders.

``KeyPaths`` is the path half of ``storage_adapters.files.FileStore`` (see the layout
in that module's docstring): it maps keys and scopes to paths below the real root,
creates and removes the key's folders, and refuses symlinks out of the root and
files or folders in a key's way. Everything here runs in the store's I/O threads.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from typing import Final

from storage_adapters.errors import BadValue

__all__ = ["HIDDEN", "KeyPaths", "fsync_dir", "key_segments"]

HIDDEN: Final = ".fencegate@"
_NAME_MAX: Final = 255


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _inside(path: str, folder: str) -> bool:
    return os.path.commonpath([path, folder]) == folder


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def key_segments(key: str) -> list[str]:
    """Split a key into path segments, refusing anything that could leave the root."""
    if key.startswith("/"):
        raise BadValue(f"key {key!r} is an absolute path", key=key)
    parts = key.split("/")
    for part in parts:
        if part in ("", ".", ".."):
            raise BadValue(f"key {key!r} has an empty, '.' or '..' path segment", key=key)
        if "\x00" in part:
            raise BadValue(f"key {key!r} contains NUL", key=key)
        if len(part.encode()) > _NAME_MAX:
            raise BadValue(f"key {key!r} has a segment longer than {_NAME_MAX} bytes", key=key)
    if parts[0] == HIDDEN:  # unreachable through validate_key; kept as a second fence
        raise BadValue(f"key {key!r} names fencegate's hidden folder", key=key)
    return parts


class KeyPaths:
    """The paths of a files store below its real root (set by ``FileStore.start``)."""

    _root: str
    _hidden: str
    _tmp_dev: int

    def _shard_path(self, kind: str, text: str) -> str:
        digest = _sha(text)
        return os.path.join(self._hidden, kind, digest[:2], digest)

    def _lock_path(self, scope: str) -> str:
        return self._shard_path("locks", scope)

    def _meta_path(self, key: str) -> str:
        return self._shard_path("meta", key)

    def _tmp_folder(self, folder: str) -> str:
        # os.replace needs one filesystem; a key folder on another mount gets its temp
        # file beside it, under a name with '@' that no key can name.
        try:
            if os.stat(folder).st_dev != self._tmp_dev:
                return folder
        except FileNotFoundError:  # removed by a delete just now: the replace makes it again
            pass
        return os.path.join(self._hidden, "tmp")

    def _allowed(self, real: str) -> bool:
        return _inside(real, self._root) and not _inside(real, self._hidden)

    def _parents(self, key: str, parts: list[str]) -> str:
        """``_make_parents``, again when a delete removed a folder on the way meanwhile."""
        for attempt in range(3):
            try:
                return self._make_parents(key, parts)
            except FileNotFoundError:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _make_parents(self, key: str, parts: list[str]) -> str:
        """Create the key's parent folders; refuse files in the way and symlinks out."""
        current = self._root
        for depth, part in enumerate(parts[:-1], start=1):
            path = os.path.join(current, part)
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(path)
                    fsync_dir(current)
                st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                path = os.path.realpath(path)
                if not self._allowed(path):
                    raise BadValue(f"key {key!r} goes through a symlink out of the root", key=key)
                st = os.stat(path)
            if not stat.S_ISDIR(st.st_mode):
                prefix = "/".join(parts[:depth])
                raise BadValue(
                    f"key {key!r} conflicts with the existing key {prefix!r}"
                    " (a file, not a folder)",
                    key=key,
                )
            current = path
        return current

    def _check_target(self, key: str, final: str) -> None:
        try:
            st = os.lstat(final)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode) and self._removed_if_empty(final):
            return  # left by a delete before deletes removed empty folders
        if stat.S_ISDIR(st.st_mode):
            raise BadValue(
                f"key {key!r} conflicts with existing keys below it (it is a folder)", key=key
            )
        if not stat.S_ISREG(st.st_mode):
            raise BadValue(f"key {key!r} is a symlink or special file; not written", key=key)

    def _removed_if_empty(self, folder: str) -> bool:
        try:
            os.rmdir(folder)
        except OSError:  # not empty: keys below it
            return False
        fsync_dir(os.path.dirname(folder))
        return True

    def _existing_target(self, key: str, parts: list[str]) -> str | None:
        """The key's file for a delete, or None when it does not exist."""
        path = os.path.join(self._root, *parts)
        folder = os.path.realpath(os.path.dirname(path))
        if not self._allowed(folder):
            raise BadValue(f"key {key!r} goes through a symlink out of the root", key=key)
        final = os.path.join(folder, parts[-1])
        try:
            self._check_target(key, final)
            os.lstat(final)
        except (FileNotFoundError, NotADirectoryError):
            return None
        return final

    def _remove_empty_folders(self, parts: list[str]) -> None:
        """Remove the key's folders that the delete left empty, deepest first.

        Otherwise key ``a`` stays refused ("a folder") once ``a/b`` is deleted. Only
        real folders on the key's own path (no symlink on the way) are removed; a
        writer that meanwhile puts a file into one of them tries again (``_sync_put``).
        """
        for depth in range(len(parts) - 1, 0, -1):
            folder = os.path.join(self._root, *parts[:depth])
            if os.path.realpath(folder) != folder:
                return
            try:
                os.rmdir(folder)
                fsync_dir(os.path.dirname(folder))
            except OSError:  # not empty (another key, a writer's new file), or gone
                return
