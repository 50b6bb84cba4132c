"""Redis memory per no-op job, pending and retained after it completed (docs/redis-layout.md).

Usage (from the repository root)::

    .venv/bin/python benchmarks/job_memory.py [--n 10000] [--no-compact]

Against a redis-server of its own (``--save '' --appendonly no``): ``INFO
memory`` used_memory before and after ``n`` no-op jobs are enqueued
(``enqueue_many`` of W6's task, payload ``{"i": i, "t": 0.0}``), then after a
``vr.Worker`` (concurrency 10, library defaults: the event stream on at its
default cap, the default retention, which keeps 10,000 completed jobs) has
run them all. Beside the deltas, ``MEMORY USAGE ... SAMPLES 0`` of one job's
keys in each phase and of the event stream, and what deleting every
completed job's journal, then every hash, frees (``MEMORY USAGE`` over-counts
a small stream: this is what it holds).

Then the size of an event stream entry (``MEMORY USAGE`` over ``XLEN``) on a
queue of its own, capped high enough to keep every entry: 2,000 single
enqueues (an entry of one job each), then 20 claims of 100 jobs (an entry of
100 jobs each; ``QueueStore.claim``, what a worker's claim sends).

``--no-compact`` runs the same against a copy of ``lua/`` whose journal
compaction is off (``compact_journal`` and ``journal_start`` take the path
they take where the server does not give scripts its version): what the
compaction saves.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE / "peers"))

import venturi_bench as VB  # noqa: E402

import venturi_redis as vr  # noqa: E402
from tests.servers import RedisServer  # noqa: E402
from venturi_redis._store import scripts as _scripts  # noqa: E402
from venturi_redis._store.keys import QueueKeys  # noqa: E402

QUEUE = "bench"


class Quiet(VB.Noop, vr.Handler[None]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: None) -> vr.Outcome:
        return vr.Outcome.completed()


def without_compaction(tmp: Path) -> Path:
    """A copy of ``lua/`` whose journal.lua never compacts (the fakeredis path)."""
    lua = tmp / "lua"
    shutil.copytree(HERE.parent / "lua", lua)
    journal = lua / "include" / "journal.lua"
    text = journal.read_text()
    flag = "local JOURNAL_COMPACTS = redis.sha1hex ~= nil"
    assert text.count(flag) == 1, "journal.lua changed: update this patch"
    journal.write_text(text.replace(flag, "local JOURNAL_COMPACTS = false"))
    return lua


def used(r: redis.Redis) -> int:
    return int(r.info("memory")["used_memory"])


def usage(r: redis.Redis, key: str) -> int:
    return int(r.memory_usage(key, samples=0) or 0)


async def fill(url: str, n: int) -> None:
    async with vr.Client.from_url(url) as client:
        q = client.queue(QUEUE)
        for s in range(0, n, 1000):
            await q.enqueue_many([VB.Noop(i=i) for i in range(s, min(s + 1000, n))])


async def drain(url: str, n: int) -> None:
    async with vr.Client.from_url(url) as client:
        q = client.queue(QUEUE)
        worker = vr.Worker(q, concurrency=10)
        worker.register(Quiet)
        await worker.run(until_idle=True)
        done = (await q.counts())["completed"]
        if done != n:
            raise SystemExit(f"completed {done} of {n} jobs")


async def entry_sizes(url: str) -> tuple[float, float]:
    """Bytes per event stream entry: of one job (single enqueues), of 100 jobs (claims)."""
    r = redis.Redis.from_url(url)
    async with vr.Client.from_url(url) as client:
        q = client.queue("bench-events")
        await q.set_events(True, maxlen=1_000_000)
        events = q.keys.prefix + "events"
        r.delete(events)
        for i in range(2000):
            await q.enqueue(VB.Noop(i=i))
        one = usage(r, events) / r.xlen(events)
        r.delete(events)
        for i in range(20):
            await q.store.claim(count=100, worker="bench:1:x", token_base=f"t{i}", default_lease_ms=60_000)
        many = usage(r, events) / r.xlen(events)
    r.close()
    return one, many


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=10_000)
    p.add_argument(
        "--no-compact", action="store_true", help="journal compaction off (a patched copy of lua/)"
    )
    a = p.parse_args()
    n = a.n
    k = QueueKeys.for_queue(QUEUE)
    with tempfile.TemporaryDirectory() as tmp:
        if a.no_compact:
            _scripts._default = _scripts.ScriptSet(without_compaction(Path(tmp)))
        with RedisServer() as server:
            r = redis.Redis.from_url(server.url)
            version = r.info("server")["redis_version"]
            r.flushall()
            time.sleep(0.2)  # let the flush's lazy frees settle
            base = used(r)
            asyncio.run(fill(server.url, n))
            pending = used(r) - base
            jid = r.zrange(k.pending(vr.Priority.NORMAL), 0, 0)[0].decode()
            zset = k.pending(vr.Priority.NORMAL)
            keys_pending: dict[str, Any] = {
                "hash": usage(r, k.job(jid)),
                "journal": usage(r, k.journal(jid)),
                "pending-set share": usage(r, zset) / max(1, r.zcard(zset)),
            }
            events = k.prefix + "events"
            enqueued = (r.xlen(events), usage(r, events))
            asyncio.run(drain(server.url, n))
            time.sleep(0.5)
            finished = used(r) - base
            xlen = r.xlen(events)
            keys_done: dict[str, Any] = {
                "hash": usage(r, k.job(jid)),
                "journal": usage(r, k.journal(jid)),
                "journal entries": r.xlen(k.journal(jid)),
                "completed-set share": usage(r, k.completed) / max(1, r.zcard(k.completed)),
            }
            stream = usage(r, events)
            # What each part holds in used_memory (MEMORY USAGE over-counts a
            # stream's fixed part): the journals, then the hashes, deleted.
            ids = [i.decode() for i in r.zrange(k.completed, 0, -1)]
            parts: dict[str, float] = {}
            for name, key_of in (("journals", k.journal), ("hashes", k.job)):
                before = used(r)
                for s in range(0, len(ids), 1000):
                    r.delete(*(key_of(i) for i in ids[s : s + 1000]))
                parts[name] = (before - used(r)) / n
            r.close()
            entry_one, entry_many = asyncio.run(entry_sizes(server.url))
    compact = "off (--no-compact)" if a.no_compact else "on"
    print(f"{n:,} no-op jobs, Redis {version}, journal compaction {compact}; INFO memory used_memory delta:")
    print(f"  pending:            {pending / n:,.0f} B per job")
    print(f"  completed, retained: {finished / n:,.0f} B per job")
    one = ", ".join(f"{name} {v:,.0f} B" for name, v in keys_pending.items())
    print(f"one pending job, MEMORY USAGE ... SAMPLES 0: {one}")
    done = ", ".join(
        f"{name} {v:,.0f}" + ("" if name == "journal entries" else " B") for name, v in keys_done.items()
    )
    print(f"the same job completed: {done}")
    freed = ", ".join(f"the {name} {v:,.0f} B" for name, v in parts.items())
    print(f"used_memory freed per job by deleting, in turn: {freed}")
    print(f"event stream after the enqueues: {enqueued[0]:,} entries, {enqueued[1]:,} B")
    print(
        f"event stream after the run: {xlen:,} entries, {stream:,} B ({stream / n:,.0f} B per job of the run)"
    )
    per_job = entry_many / 100
    print(
        f"an event stream entry: of one job {entry_one:,.0f} B; "
        f"of 100 jobs {entry_many:,.0f} B ({per_job:,.0f} B a job)"
    )


if __name__ == "__main__":
    main()
