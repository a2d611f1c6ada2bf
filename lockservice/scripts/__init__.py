"""Lua scripts of the lock protocol, each read once from its ``.lua`` file.

Each script is sent two ways, from the same files: as EVALSHA of its source (the
helper files it uses in front), and, on Redis 7 and later, as FCALL of a function
of one library (``LIBRARY``) that holds every script, with the helpers once at its
top. Names carry a hash of the library's text (``VERSION``): two gateways of
different versions sharing a node each load and call their own code.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib.resources import files
from typing import Final

__all__ = [
    "ACQUIRE",
    "ALL",
    "EXTEND",
    "FIND",
    "INSPECT",
    "LIBRARY",
    "LIBRARY_NAME",
    "MARK_SYNCED",
    "RAISE_FENCE",
    "RECOPIED",
    "RELEASE",
    "RESYNC",
    "STATE",
    "TAG",
    "UNDO",
    "VERSION",
    "Script",
]


@dataclass(frozen=True, slots=True)
class Script:
    """A script's source, the SHA1 that EVALSHA calls it by and its FCALL name."""

    name: str
    source: bytes
    sha: bytes
    function: bytes


def _read(name: str) -> bytes:
    return files(__name__).joinpath(f"{name}.lua").read_bytes()


# name: (helper files it uses, the flags of its function). Without flags a function
# is refused at its start when the node is over maxmemory (with noeviction); a script
# sent by EVAL is refused only at its first write that may grow memory (SET, INCR,
# ZADD, HSET), unless it wrote already. So a script whose writes today cannot be
# refused under OOM (they only delete or expire: DEL, ZREM, HDEL, PEXPIRE, or a
# hand-over after such a delete) gets `allow-oom`: release, undo, extend, find and
# recopied never become impossible on a full node (extend of a group member, whose
# ZADD updates an existing member, now also works there; recopied's new base, R21,
# rewrites the marker in place with a value of the same size). The scripts that grant or
# raise counters (acquire, tag, raise_fence, resync, mark_synced) keep no flags:
# refused whole at the start, never half-run. `no-writes` only for the truly
# read-only ones (inspect, state: no write in them or the helpers they call); find
# may drop expired group members (queue.lua: holder).
_SPECS: Final[dict[str, tuple[tuple[str, ...], tuple[str, ...]]]] = {
    "acquire": (("queue",), ()),
    "release": (("queue",), ("allow-oom",)),
    "undo": (("queue",), ("allow-oom",)),
    "extend": ((), ("allow-oom",)),
    "raise_fence": ((), ()),
    "inspect": ((), ("no-writes",)),
    "find": (("queue",), ("allow-oom",)),
    "resync": ((), ()),
    "mark_synced": ((), ()),
    "recopied": ((), ("allow-oom",)),
    "state": (("queue",), ("no-writes",)),
    "tag": (("queue",), ()),
}


def _library(version: str) -> bytes:
    """The function library of every script: the helper files once, then each script
    as the body of a function whose ``KEYS`` and ``ARGV`` are its arguments."""
    helpers = sorted({lib for libs, _ in _SPECS.values() for lib in libs})
    parts = [f"#!lua name=fencegate_{version}".encode(), *(_read(lib) for lib in helpers)]
    for name, (_, flags) in _SPECS.items():
        listed = ", ".join(f"'{flag}'" for flag in flags)
        parts.append(
            f"redis.register_function{{function_name = '{name}_{version}', "
            f"flags = {{{listed}}}, callback = function(KEYS, ARGV)".encode()
        )
        parts.extend((_read(name), b"end}"))
    return b"\n".join(parts) + b"\n"


VERSION: Final = hashlib.sha1(_library("")).hexdigest()[:12]
LIBRARY_NAME: Final = f"fencegate_{VERSION}"
LIBRARY: Final = _library(VERSION)


def _load(name: str) -> Script:
    """The script, behind the helper files it uses (Lua scripts cannot call each other)."""
    libraries, _ = _SPECS[name]
    source = b"\n".join([*(_read(lib) for lib in libraries), _read(name)])
    sha = hashlib.sha1(source).hexdigest().encode()
    return Script(name, source, sha, f"{name}_{VERSION}".encode())


ACQUIRE = _load("acquire")
RELEASE = _load("release")
UNDO = _load("undo")
EXTEND = _load("extend")
RAISE_FENCE = _load("raise_fence")
INSPECT = _load("inspect")
FIND = _load("find")
RESYNC = _load("resync")
MARK_SYNCED = _load("mark_synced")
RECOPIED = _load("recopied")
STATE = _load("state")
TAG = _load("tag")

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
