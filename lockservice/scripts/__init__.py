"""Lua scripts of the lock protocol, each read once from its ``.lua`` file."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib.resources import files

__all__ = [
    "ACQUIRE",
    "ALL",
    "EXTEND",
    "FIND",
    "INSPECT",
    "MARK_SYNCED",
    "RAISE_FENCE",
    "RECOPIED",
    "RELEASE",
    "RESYNC",
    "STATE",
    "TAG",
    "UNDO",
    "Script",
]


@dataclass(frozen=True, slots=True)
class Script:
    """A script's source and the SHA1 that EVALSHA calls it by."""

    name: str
    source: bytes
    sha: bytes


def _read(name: str) -> bytes:
    return files(__name__).joinpath(f"{name}.lua").read_bytes()


def _load(name: str, *libraries: str) -> Script:
    """The script, behind the helper files it uses (Lua scripts cannot call each other)."""
    source = b"\n".join([*(_read(lib) for lib in libraries), _read(name)])
    return Script(name, source, hashlib.sha1(source).hexdigest().encode())


ACQUIRE = _load("acquire", "queue")
RELEASE = _load("release", "queue")
UNDO = _load("undo", "queue")
EXTEND = _load("extend")
RAISE_FENCE = _load("raise_fence")
INSPECT = _load("inspect")
FIND = _load("find", "queue")
RESYNC = _load("resync")
MARK_SYNCED = _load("mark_synced")
RECOPIED = _load("recopied")
STATE = _load("state", "queue")
TAG = _load("tag", "queue")

ALL = (
    ACQUIRE,
    RELEASE,
    UNDO,
    EXTEND,
    RAISE_FENCE,
    INSPECT,
    FIND,
    RESYNC,
    MARK_SYNCED,
    RECOPIED,
    STATE,
    TAG,
)
