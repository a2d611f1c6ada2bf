"""Script commands are packed as hiredis packs them, what a fan-out shares once."""

from __future__ import annotations

from typing import Any

import hiredis
import pytest

from lockservice import LockManager
from lockservice.resp import pack_args, pack_call, pack_script, pack_str
from tests._servers import RedisNode

SHA_A = b"a" * 40
SHA_B = b"b" * 40


def _hiredis(args: tuple[bytes | str | int, ...]) -> bytes:
    packed: bytes = hiredis.pack_command(args)  # type: ignore[arg-type]  # stub types a 1-tuple
    return packed


@pytest.mark.parametrize(
    ("keys", "args"),
    [
        (("lock:{n}", "fence:{n}"), ("0123abcd", 10000, "", 30000, "run", "proc")),
        (("lock:{é/ü}",), ("ünïcode", b"\x00\r\n\xff", -1, 0, 2**63 - 1)),
        ((), ()),
        (("k",), ()),
        ((), ("only", "args")),
    ],
)
def test_a_packed_script_is_what_hiredis_packs(
    keys: tuple[str, ...], args: tuple[bytes | str | int, ...]
) -> None:
    # the script or the command changes, and back
    for command, name in (
        (b"EVALSHA", SHA_A),
        (b"EVALSHA", SHA_B),
        (b"FCALL", SHA_B),
        (b"EVALSHA", SHA_A),
    ):
        expected = _hiredis((command, name, len(keys), *keys, *args))
        assert pack_script(command, name, keys, args) == expected
        assert pack_script(command, name, keys, args) == expected  # again: from the cached part
        equal = tuple(keys)  # equal keys in another tuple: packed on their own, the same
        assert pack_script(command, name, equal, args) == expected
        other = tuple(f"{k}x" for k in keys)
        assert pack_script(command, name, other, args) == _hiredis(
            (command, name, len(other), *other, *args)
        )


@pytest.mark.parametrize(
    ("keys", "parts"),
    [
        (("lock:{n}", "fence:{n}"), (("0123abcd", 10000, "", 30000), ("run",), ("proc",))),
        (("lock:{é/ü}",), (("ünïcode", b"\x00\r\n\xff"), (-1, 0, 2**63 - 1))),
        ((), ()),
        (("k",), ((),)),
        ((), (("only", "args"),)),
    ],
)
def test_a_script_of_packed_parts_is_what_hiredis_packs(
    keys: tuple[str, ...], parts: tuple[tuple[bytes | str | int, ...], ...]
) -> None:
    args = tuple(a for part in parts for a in part)
    packed = [pack_args(*part) for part in parts]
    for command, name in ((b"EVALSHA", SHA_A), (b"FCALL", SHA_B), (b"EVALSHA", SHA_A)):
        expected = _hiredis((command, name, len(keys), *keys, *args))
        assert pack_call(command, name, pack_args(*keys), *packed) == expected
        assert pack_call(command, name, pack_args(*keys), *packed) == expected  # cached start
        assert pack_args(*keys).values == keys


@pytest.mark.parametrize("value", ["", "0123456789abcdef" * 2, "ünïcode/é", "a\r\nb", "x" * 300])
def test_a_str_packs_as_hiredis_packs_it(value: str) -> None:
    assert pack_str(value) == pack_args(value)
    expected = _hiredis((b"FCALL", b"f", 0, value))
    assert pack_call(b"FCALL", b"f", pack_args(), pack_str(value)) == expected


async def test_a_fan_out_packs_what_its_nodes_share_once(
    redis3: list[RedisNode], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An acquire and a release of a handle each send one script to the three nodes:
    the lease id is packed once per fan-out, the name's keys, the ttl and the process
    once for their cycles, and the nodes' run ids once per connect."""
    mgr = await LockManager.connect([n.url for n in redis3])
    try:
        # Connected, scripts loaded, and the name's counters equal on every node: the nodes
        # of a new cluster may have different wall-clock token bases, so a name's first
        # grants can differ and take round 2 (R4: raise_fence, a third fan-out with the
        # key). That round raised the counter on every node, on each node's one command
        # connection ahead of what follows, so the acquire below agrees in round 1.
        await mgr.release(await mgr.acquire("pack/a", ttl=10.0))
        packed: list[Any] = []
        real = hiredis.pack_command

        def counting(args: Any) -> bytes:
            packed.extend(args)
            return real(args)  # type: ignore[no-any-return]

        monkeypatch.setattr(hiredis, "pack_command", counting)
        lease = await mgr.acquire("pack/a", ttl=10.0)
        await mgr.release(LockManager.handle(lease.name, lease.lease_id))
        monkeypatch.setattr(hiredis, "pack_command", real)
        # the lease id: pack_str, once per fan-out; the keys, the ttl and the process at
        # the name's first cycle; the run ids at connect: hiredis packs nothing here
        assert packed == []
        assert lease.token > 0
    finally:
        await mgr.close()
