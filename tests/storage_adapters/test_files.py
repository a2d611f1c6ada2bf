"""FileStore on real files: paths stay in the root, bodies kept exactly, flock across processes."""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import json
import os
import random
import shutil
import sys
import threading
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

import storage_adapters
from gateway.app import create_app
from gateway.config import parse_config
from storage_adapters import BadValue, FileStore, NotFound, StaleToken, StorageUnavailable
from storage_adapters.file_paths import key_segments
from storage_adapters.files import HIDDEN
from tests._gateway import Client, ServeClient
from tests.storage_adapters.test_fencing import Attempt, check_fenced_history, watch_values


def listdir(path: Path) -> list[str]:
    return sorted(os.listdir(path))


def hidden_path(root: Path, kind: str, text: str) -> Path:
    """Where the documented layout keeps the lock, mark or metadata file of a scope or key."""
    digest = hashlib.sha256(text.encode()).hexdigest()
    return root / HIDDEN / kind / digest[:2] / digest


@pytest.mark.parametrize(
    "key",
    [
        "../x",
        "a/../../x",
        "..",
        ".",
        "a/./b",
        "/etc/passwd",
        "a//b",
        "a/",
        "a\x00b",
        HIDDEN,
        f"{HIDDEN}/marks/00",
        "x" * 256,
        "a b",
        "",
    ],
)
async def test_keys_that_could_leave_the_root_are_refused(
    files: FileStore, tmp_path: Path, key: str
) -> None:
    with pytest.raises(BadValue):
        await files.put("s", key, 1, b"x")
    with pytest.raises(BadValue):
        await files.get("s", key, None)
    with pytest.raises(BadValue):
        await files.delete("s", key, 1)
    assert listdir(tmp_path) == ["root"]


def test_key_segments_refuses_what_validate_key_would_let_through() -> None:
    for key in ["/abs", "a//b", "a/..", "./a", "a\x00b", HIDDEN, "é" * 128]:
        with pytest.raises(BadValue):
            key_segments(key)
    assert key_segments("a/b.c/~d") == ["a", "b.c", "~d"]


async def test_body_is_kept_byte_for_byte_at_the_key_path(files: FileStore, tmp_path: Path) -> None:
    body = bytes(range(256)) * 4096 + b"\r\n\x00"
    await files.put("s", "dir/sub/blob.bin", 1, body, content_type="application/x-thing")
    assert (tmp_path / "root" / "dir" / "sub" / "blob.bin").read_bytes() == body
    record = await files.get("s", "dir/sub/blob.bin", None)
    assert (record.body, record.token, record.content_type) == (body, 1, "application/x-thing")
    await files.put("s", "empty", 1, b"")
    assert (tmp_path / "root" / "empty").read_bytes() == b""


async def test_symlinked_folder_out_of_the_root_is_refused(
    files: FileStore, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"secret")
    (tmp_path / "root" / "out").symlink_to(outside)
    with pytest.raises(BadValue, match="symlink"):
        await files.put("s", "out/new", 1, b"x")
    with pytest.raises(BadValue, match="outside the root"):
        await files.get("s", "out/secret", None)
    with pytest.raises(BadValue, match="symlink"):
        await files.delete("s", "out/secret", 2)
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]
    assert (outside / "secret").read_bytes() == b"secret"


async def test_symlinked_file_out_of_the_root_is_refused(files: FileStore, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"secret")
    (tmp_path / "root" / "leak").symlink_to(secret)
    with pytest.raises(BadValue):
        await files.get("s", "leak", None)
    with pytest.raises(BadValue):
        await files.put("s", "leak", 1, b"overwritten")
    with pytest.raises(BadValue):
        await files.delete("s", "leak", 1)
    assert secret.read_bytes() == b"secret"
    assert (tmp_path / "root" / "leak").is_symlink()


async def test_the_hidden_folder_cannot_be_reached(files: FileStore, tmp_path: Path) -> None:
    root = tmp_path / "root"
    await files.put("s", "k", 5, b"v")
    (root / "alias").symlink_to(root / HIDDEN)
    mark = hidden_path(root, "marks", "s").relative_to(root / HIDDEN)
    with pytest.raises(BadValue):
        await files.get("s", f"alias/{mark}", None)
    with pytest.raises(BadValue):
        await files.put("s", f"alias/{mark}", 9, b"1")
    assert hidden_path(root, "marks", "s").read_bytes() == b"5"
    # ".fencegate" without '@' is an ordinary key
    await files.put("t", ".fencegate", 1, b"ordinary")
    assert (root / ".fencegate").read_bytes() == b"ordinary"


async def test_symlink_inside_the_root_is_followed(files: FileStore, tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "real").mkdir()
    (root / "alias").symlink_to(root / "real")
    await files.put("s", "alias/x", 1, b"through")
    assert (root / "real" / "x").read_bytes() == b"through"
    assert (await files.get("s", "alias/x", None)).body == b"through"


async def test_key_conflicting_with_a_folder_or_file(files: FileStore) -> None:
    await files.put("s", "a/b", 1, b"x")
    with pytest.raises(BadValue, match="'a' conflicts with existing keys below it"):
        await files.put("s", "a", 1, b"x")
    with pytest.raises(BadValue, match="'a/b/c' conflicts with the existing key 'a/b'"):
        await files.put("s", "a/b/c", 1, b"x")
    with pytest.raises(NotFound):
        await files.get("s", "a", None)
    with pytest.raises(NotFound):
        await files.get("s", "a/b/c", None)
    await files.delete("s", "a/b/c", 1)  # cannot exist: nothing to delete


async def test_deleting_the_last_key_below_a_folder_frees_its_name(
    files: FileStore, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    (root / "kept").mkdir()  # made by someone else, not by a delete: left alone
    await files.put("s1", "a/b/c", 1, b"x")
    await files.put("s2", "a/d", 1, b"y")
    await files.delete("s1", "a/b/c", 1)
    assert listdir(root / "a") == ["d"]  # a/b held only a/b/c
    await files.delete("s2", "a/d", 1)
    assert not (root / "a").exists()
    await files.put("s3", "a", 1, b"now a key")  # was "conflicts with existing keys below it"
    assert (await files.get("s3", "a", None)).body == b"now a key"
    assert (root / "kept").is_dir()
    # An empty folder at a key's path (a delete of an older version left it) gives way.
    await files.put("s4", "kept", 1, b"a key now")
    assert (root / "kept").read_bytes() == b"a key now"


async def test_writers_below_a_folder_that_deletes_empty_keep_writing(
    files: FileStore, tmp_path: Path
) -> None:
    # A delete may remove the folder another writer is about to replace its file into.
    async def cycle(key: str) -> None:
        for _ in range(40):
            await files.put(key, key, 1, b"v")
            await files.delete(key, key, 1)

    await asyncio.gather(*(cycle(f"f/{i}") for i in range(4)))
    assert not (tmp_path / "root" / "f").exists()


async def test_leftover_temp_files_are_removed_at_start(tmp_path: Path) -> None:
    root = tmp_path / "root"
    async with FileStore("files", root) as store:
        await store.put("s", "k", 1, b"v")
    tmp = root / HIDDEN / "tmp"
    (tmp / "123-dead.tmp").write_bytes(b"half a write")
    live = tmp / "456-live.tmp"
    live.write_bytes(b"in progress")
    fd = os.open(live, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a writer in another process, still at work
    try:
        async with FileStore("files", root) as store:
            assert sorted(p.name for p in tmp.iterdir()) == ["456-live.tmp"]
            assert (await store.get("s", "k", None)).body == b"v"
    finally:
        os.close(fd)
    async with FileStore("files", root):
        assert list(tmp.iterdir()) == []


async def test_marks_survive_a_restart(tmp_path: Path) -> None:
    async with FileStore("files", tmp_path / "root") as store:
        await store.put("s", "k", 7, b"v")
    async with FileStore("files", tmp_path / "root") as store:
        with pytest.raises(StaleToken) as caught:
            await store.put("s", "k", 6, b"late")
        assert caught.value.high_water == 7


async def test_data_changed_without_its_metadata_reports_no_token(
    files: FileStore, tmp_path: Path
) -> None:
    """A crash between the data replace and the metadata write (or an edit by hand)."""
    root = tmp_path / "root"
    await files.put("s", "k", 5, b"old", content_type="text/plain")
    replacement = root / "replacement"
    replacement.write_bytes(b"new")
    os.replace(replacement, root / "k")
    record = await files.get("s", "k", None)
    assert (record.body, record.token, record.content_type) == (
        b"new",
        None,
        "application/octet-stream",
    )
    await files.put("s", "k", 6, b"newer")  # the next write repairs it
    assert (await files.get("s", "k", None)).token == 6


async def test_writes_do_not_block_the_event_loop(files: FileStore, tmp_path: Path) -> None:
    """The put waits for a lock another process holds; the loop keeps running meanwhile."""
    loop = asyncio.get_running_loop()
    lock = hidden_path(tmp_path / "root", "locks", "slow")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    # Safety net: if the put blocked the loop, this thread still releases the lock after 1 s
    # and the gap assertion below fails instead of the test hanging.
    safety = threading.Timer(1.0, fcntl.flock, (fd, fcntl.LOCK_UN))
    safety.start()
    try:
        put = asyncio.create_task(files.put("slow", "slow", 1, b"x" * 1_000_000))
        gaps = []
        last = loop.time()
        for _ in range(20):
            await asyncio.sleep(0.01)
            now = loop.time()
            gaps.append(now - last)
            last = now
        assert not put.done()
        assert max(gaps) < 0.5
        fcntl.flock(fd, fcntl.LOCK_UN)
        assert await put == 1
    finally:
        safety.cancel()
        os.close(fd)


async def test_ping_fails_when_the_root_is_gone(files: FileStore, tmp_path: Path) -> None:
    await files.ping()
    shutil.rmtree(tmp_path / "root")
    with pytest.raises(StorageUnavailable):
        await files.ping()
    with pytest.raises(StorageUnavailable):
        await files.put("s", "k", 1, b"x")


CHILD = """
import asyncio, json, sys, time
from storage_adapters import FileStore, StaleToken

async def lane(store, tokens):
    out = []
    for token in tokens:
        start = time.monotonic()
        try:
            await store.put("race", "race", token, str(token).encode())
            accepted = True
        except StaleToken:
            accepted = False
        out.append([token, start, time.monotonic(), accepted])
    return out

async def main():
    tokens = json.loads(sys.argv[2])
    async with FileStore("files", sys.argv[1]) as store:
        print("ready", flush=True)
        sys.stdin.readline()
        lanes = await asyncio.gather(*(lane(store, tokens[i::3]) for i in range(3)))
    print(json.dumps([a for one in lanes for a in one]), flush=True)

asyncio.run(main())
"""


async def test_two_processes_with_interleaved_tokens_keep_token_order(tmp_path: Path) -> None:
    root = tmp_path / "root"
    rng = random.Random(11)
    tokens = sorted(range(1, 241), key=lambda t: t + rng.uniform(-25, 25))
    env = dict(os.environ, PYTHONPATH=str(Path(storage_adapters.__file__).parent.parent))
    async with FileStore("files", root) as watcher:
        children = [
            await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                CHILD,
                str(root),
                json.dumps(tokens[i::2]),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                env=env,
            )
            for i in range(2)
        ]
        try:
            for child in children:
                assert child.stdout is not None
                assert await asyncio.wait_for(child.stdout.readline(), 20) == b"ready\n"
            for child in children:
                assert child.stdin is not None
                child.stdin.write(b"go\n")
                await child.stdin.drain()
            stop = asyncio.Event()
            watch = asyncio.create_task(watch_values(watcher, stop, lambda r: int(r.body)))
            outputs = await asyncio.wait_for(
                asyncio.gather(*(child.communicate() for child in children)), 60
            )
            stop.set()
            seen = await watch
        finally:
            for child in children:
                if child.returncode is None:
                    child.kill()
                    await child.wait()
        final = int((await watcher.get("race", "race", None)).body)
    assert [child.returncode for child in children] == [0, 0]
    attempts = [Attempt(*a) for out, _ in outputs for a in json.loads(out)]
    assert len(attempts) == len(tokens)
    check_fenced_history(attempts, seen, final)


# -- a mark file written around fencegate ------------------------------------------------


async def test_a_corrupt_mark_file_answers_503_storage_corrupt_and_changes_nothing(
    tmp_path: Path, gateway_client: ServeClient, caplog: pytest.LogCaptureFixture
) -> None:
    """A mark that is not a decimal token is never guessed: every fenced request of the
    scope answers 503 storage_corrupt naming the key (no traceback, one WARNING),
    nothing is written, and the scope works again once the mark is repaired."""
    config = parse_config({"stores": {"files": {"type": "files", "root": str(tmp_path / "r")}}})
    client: Client = await gateway_client(create_app(config, registry=CollectorRegistry()))
    url = "/v1/stores/files/docs/a"

    async def take() -> str:
        grant = await (await client.post("/v1/locks/files/docs/a", json={"ttl_ms": 5000})).json()
        released = await client.delete(
            "/v1/locks/files/docs/a", headers={"X-Lease-Id": grant["lease_id"]}
        )
        assert released.status == 204
        return str(grant["token"])

    first = await take()
    assert (await client.put(url, data=b"one", headers={"X-Fencing-Token": first})).status == 200
    mark = hidden_path(tmp_path / "r", "marks", "files/docs/a")
    for garbage in (b"garbage", b"-5", b"", b"12 34"):
        mark.write_bytes(garbage)
        caplog.clear()
        token = await take()
        for method, data in (("PUT", b"two"), ("DELETE", None), ("GET", None)):
            response = await client.request(
                method, url, data=data, headers={"X-Fencing-Token": token}
            )
            assert response.status == 503, (garbage, method, await response.text())
            body = await response.json()
            assert body["error"] == "storage_corrupt"
            assert (body["store"], body["key"]) == ("files", "docs/a")
            assert "'docs/a'" in body["message"]
            assert "high-water mark of lock 'files/docs/a'" in body["message"]
            assert "Traceback" not in body["message"]
            assert str(tmp_path) not in body["message"]  # no server path to a client
        assert (tmp_path / "r" / "docs" / "a").read_bytes() == b"one"  # nothing applied
        assert mark.read_bytes() == garbage  # and the mark is not rewritten
        warnings = [r for r in caplog.records if "storage_corrupt" in r.getMessage()
                    or "corrupt" in r.getMessage()]  # fmt: skip
        assert len(warnings) == 1, [r.getMessage() for r in warnings]  # once, not per request
        assert warnings[0].levelname == "WARNING"
        assert str(mark) in warnings[0].getMessage()  # the operator's log names the file
        assert warnings[0].exc_info is None
    plain = await client.get(url)  # a plain read does not look at the mark
    assert plain.status == 200
    assert await plain.read() == b"one"
    mark.write_bytes(first.encode())  # repaired by hand
    token = await take()
    assert (await client.put(url, data=b"two", headers={"X-Fencing-Token": token})).status == 200
    assert (tmp_path / "r" / "docs" / "a").read_bytes() == b"two"
