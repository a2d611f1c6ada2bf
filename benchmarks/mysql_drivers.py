"""Compare async MySQL drivers on the mysql store's hot path, in one process.

    python -m benchmarks.mysql_drivers [--dsn mysql://root@127.0.0.1:3306/test] [--n 2000]

Each driver runs the same statements the mysql store runs for one fenced put
(raise the mark, lock it, lock the data row, write it, commit), N times from
one task, then N point reads and N/10 reads of 50 rows. The drivers take turns
round by round (five rounds: a shared, busy machine drifts), and the median
round is printed in operations per second. Only loopback servers.

aiomysql 0.3.2 cannot bind bytes with PyMySQL 1.2 (TypeError in its escape);
the ``bench`` extra pins PyMySQL below 1.2 for it.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

SETUP = [
    "DROP TABLE IF EXISTS bench_fence, bench_kv",
    "CREATE TABLE bench_fence (scope_sha BINARY(32) PRIMARY KEY, token BIGINT NOT NULL)",
    "CREATE TABLE bench_kv (k VARCHAR(64) PRIMARY KEY, v LONGBLOB NOT NULL)",
]


async def fenced_put(conn: Any, i: int) -> None:
    sha = hashlib.sha256(b"bench/%d" % (i % 50)).digest()
    async with conn.cursor() as cur:
        await cur.execute(
            "INSERT INTO bench_fence VALUES (%s, %s) ON DUPLICATE KEY UPDATE"
            " token = GREATEST(token, %s)",
            (sha, i, i),
        )
        await cur.execute("SELECT token FROM bench_fence WHERE scope_sha = %s FOR UPDATE", (sha,))
        await cur.fetchone()
        await cur.execute("SELECT 1 FROM bench_kv WHERE k = %s FOR UPDATE", (f"k{i % 50}",))
        if await cur.fetchone() is None:
            await cur.execute("INSERT INTO bench_kv VALUES (%s, %s)", (f"k{i % 50}", b"x" * 100))
        else:
            await cur.execute("UPDATE bench_kv SET v = %s WHERE k = %s", (b"y" * 100, f"k{i % 50}"))
    await conn.commit()


async def point_read(conn: Any, i: int) -> None:
    async with conn.cursor() as cur:
        await cur.execute("SELECT v FROM bench_kv WHERE k = %s", (f"k{i % 50}",))
        await cur.fetchone()
    await conn.commit()


async def scan(conn: Any, i: int) -> None:
    async with conn.cursor() as cur:
        await cur.execute("SELECT k, v FROM bench_kv LIMIT 50")
        await cur.fetchall()
    await conn.commit()


async def rate(conn: Any, op: Callable[[Any, int], Awaitable[None]], n: int) -> float:
    started = time.perf_counter()
    for i in range(n):
        await op(conn, i)
    return n / (time.perf_counter() - started)


async def run(drivers: dict[str, Callable[[], Awaitable[Any]]], n: int) -> None:
    conns = {name: await connect() for name, connect in drivers.items()}
    first = next(iter(conns.values()))
    async with first.cursor() as cur:
        for sql in SETUP:
            await cur.execute(sql)
    results: dict[str, dict[str, list[float]]] = {name: {} for name in conns}
    try:
        for _ in range(5):
            for name, conn in conns.items():
                for label, op, count in (
                    ("fenced puts", fenced_put, n),
                    ("point reads", point_read, n),
                    ("50-row reads", scan, n // 10),
                ):
                    results[name].setdefault(label, []).append(await rate(conn, op, count))
        async with first.cursor() as cur:
            await cur.execute("DROP TABLE IF EXISTS bench_fence, bench_kv")
    finally:
        for conn in conns.values():
            conn.close()
    for name, by_op in results.items():
        cells = "   ".join(f"{op} {statistics.median(r):7.0f}/s" for op, r in by_op.items())
        print(f"{name:9} {cells}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", default="mysql://root@127.0.0.1:3306/test")
    parser.add_argument("--n", type=int, default=2000)
    args = parser.parse_args()
    url = urlsplit(args.dsn)
    assert url.hostname in ("127.0.0.1", "localhost", "::1"), "loopback servers only"
    kw: dict[str, Any] = {
        "host": url.hostname, "port": url.port or 3306, "user": url.username or "root",
        "password": url.password or "", "db": url.path.lstrip("/"), "autocommit": False,
    }  # fmt: skip

    async def both() -> None:
        import aiomysql
        import asyncmy

        my_kw = {**kw, "database": kw["db"], "db": None}
        await run(
            {
                "asyncmy": lambda: asyncmy.connect(**my_kw),
                "aiomysql": lambda: aiomysql.connect(**kw),
            },
            args.n,
        )

    asyncio.run(both())


if __name__ == "__main__":
    main()
