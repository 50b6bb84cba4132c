"""What the client's bounded pool costs when nobody waits, in instructions (callgrind).

Usage (from the repository root; needs valgrind)::

    .venv/bin/python benchmarks/pool_cost.py                      # a connection taken, given back
    .venv/bin/python benchmarks/pool_cost.py --sync-enqueue ROOT ...  # SyncClient.enqueue, per checkout

The first form times, in this checkout, ``n`` rounds of taking a connection
from a pool and giving it back (what every pooled command and pipeline
does), on redis-py's plain pool and on the client's (``_transport/pool.py``),
asyncio and blocking: the difference of two runs (``small`` and ``large``
rounds) over the difference in rounds, so start-up cancels out. The second
runs ``SyncClient.enqueue`` (the direct path, on the bounded blocking pool)
the same way, for each checkout ROOT (an export of main made with ``git
archive``, and this one).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import redis  # noqa: E402

from tests.servers import RedisServer  # noqa: E402

ROUNDS = """
import asyncio, sys
sys.path.insert(0, {root!r})
import redis
from redis.asyncio.connection import ConnectionPool
from venturi_redis._transport.pool import BoundedPool, BoundedSyncPool
from venturi_redis._transport.redispy import pooled_connection, pooled_sync_connection

kind, n, url = {kind!r}, {n}, {url!r}
if kind.startswith("async"):
    async def main():
        pool = (BoundedPool if kind == "async bounded" else ConnectionPool).from_url(url, max_connections=20)
        for _ in range(n):
            conn = await pooled_connection(pool)
            await pool.release(conn)
        await pool.disconnect()
    asyncio.run(main())
else:
    cls = BoundedSyncPool if kind == "blocking bounded" else redis.ConnectionPool
    pool = cls.from_url(url, max_connections=20)
    for _ in range(n):
        conn = pooled_sync_connection(pool)
        pool.release(conn)
    pool.disconnect()
"""

ENQUEUES = """
import sys
sys.path.insert(0, {root!r})
from typing import ClassVar
import venturi_redis as vr

class T(vr.Task):
    KIND: ClassVar[str] = "t"
    i: int

with vr.SyncClient({url!r}) as sc:
    q = sc.queue("bench")
    for i in range({n}):
        q.enqueue(T(i=i))
"""


def instructions(program: str) -> int:
    with tempfile.TemporaryDirectory() as d:
        out, source = Path(d) / "callgrind.out", Path(d) / "program.py"
        source.write_text(program)
        subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, str(source)],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        m = re.search(r"^(?:summary|totals):\s*(\d+)", out.read_text(), re.M)
        assert m, "no totals in the callgrind output"
        return int(m.group(1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--sync-enqueue", nargs="+", metavar="ROOT", help="checkouts whose SyncClient enqueue to count"
    )
    ap.add_argument("--small", type=int, default=1000)
    ap.add_argument("--large", type=int, default=5000)
    a = ap.parse_args()
    spread = a.large - a.small
    with RedisServer() as server:
        if a.sync_enqueue:
            for root in a.sync_enqueue:
                counts = []
                for n in (a.small, a.large):
                    redis.Redis.from_url(server.url).flushall()
                    counts.append(instructions(ENQUEUES.format(root=root, url=server.url, n=n)))
                print(f"{root}: {(counts[1] - counts[0]) / spread:,.0f} instructions per SyncClient enqueue")
            return
        root = str(HERE.parent)
        for kind in ("async plain", "async bounded", "blocking plain", "blocking bounded"):
            lo, hi = (
                instructions(ROUNDS.format(root=root, kind=kind, n=n, url=server.url))
                for n in (a.small, a.large)
            )
            print(f"{kind}: {(hi - lo) / spread:,.0f} instructions per connection taken and given back")


if __name__ == "__main__":
    main()
