"""Flow control across worker processes (issue 28): caps never exceeded, fairness, slots after SIGKILL.

Three worker processes (``tests/procs/flowworker.py``, 8 slots each) share one
queue on a real Redis. Handlers record their start and end (wall clock, one
machine); the rate is checked on the claim times the journal holds (Redis's
clock, the one the limit counts with). The figures are printed (``-s``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import venturi_redis as vr
from tests.procs.flowworker import Rated, Timed
from tests.servers import RedisServer

ROOT = Path(__file__).resolve().parent.parent


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    top = now = 0
    for _, step in events:  # an end sorts before a start at the same instant
        now += step
        top = max(top, now)
    return top


def max_in_window(times: list[float], window: float) -> int:
    times = sorted(times)
    top, lo = 0, 0
    for hi, t in enumerate(times):
        while t - times[lo] >= window:
            lo += 1
        top = max(top, hi - lo + 1)
    return top


@pytest.fixture
def fleet(
    redis_server: RedisServer, tmp_path: Path
) -> Iterator[tuple[vr.SyncQueue, list[subprocess.Popen[bytes]]]]:
    name = f"flow-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "REDIS_URL": redis_server.url, "VENTURI_QUEUE": name, "PYTHONUNBUFFERED": "1"}
    procs = []
    for i in range(3):
        with (tmp_path / f"w{i}.log").open("wb") as out:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "tests.procs.flowworker"],
                    cwd=ROOT,
                    env=env,
                    stdout=out,
                    stderr=out,
                )
            )
    try:
        deadline = time.monotonic() + 30
        while not all("ready" in (tmp_path / f"w{i}.log").read_text() for i in range(3)):
            assert time.monotonic() < deadline, [(tmp_path / f"w{i}.log").read_text() for i in range(3)]
            time.sleep(0.05)
        with vr.SyncClient(redis_server.url) as client:
            yield client.queue(name), procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


def wait_done(q: vr.SyncQueue, ids: list[str], timeout: float = 30) -> list[vr.JobInfo]:
    deadline = time.monotonic() + timeout
    while True:
        infos = [q.get(i) for i in ids]
        if all(i is not None and i.state == vr.JobState.COMPLETED for i in infos):
            return [i for i in infos if i is not None]
        assert time.monotonic() < deadline, [i.state if i else None for i in infos]
        time.sleep(0.05)


def runs(r: redis.Redis, name: str) -> list[list[object]]:
    return [json.loads(x) for x in r.lrange(f"flowlog:{name}", 0, -1) if json.loads(x)[0] == "run"]


def test_caps_fairness_rate_and_a_killed_worker(
    fleet: tuple[vr.SyncQueue, list[subprocess.Popen[bytes]]], redis_server: RedisServer
) -> None:
    q, procs = fleet
    r = redis.Redis.from_url(redis_server.url)
    q.set_limit("timed", concurrency=4)
    q.set_limit("timed", concurrency=2, per_key=True)
    q.set_limit("rated", rate=vr.Rate(10, 0.5))

    # Concurrency and fairness: a big key enqueued first, a small one after.
    big = q.enqueue_many([Timed(key="big", seconds=0.05) for _ in range(40)])
    small = q.enqueue_many([Timed(key="small", seconds=0.05) for _ in range(4)])
    others = q.enqueue_many([Timed(key=f"k{i % 3}", seconds=0.05) for i in range(12)])
    wait_done(q, big + small + others)
    done = runs(r, q.name)
    spans = [(float(s), float(e)) for _, _, _, s, e in done]  # type: ignore[misc]
    kind_max = max_overlap(spans)
    key_max = max(
        max_overlap([(float(s), float(e)) for _, k, _, s, e in done if k == key])
        for key in ("big", "small", "k0")
    )  # type: ignore[misc]
    ends = sorted((float(e), k) for _, k, _, _, e in done)  # type: ignore[misc]
    small_last = max(i for i, (_, k) in enumerate(ends) if k == "small")
    print(f"\nkind concurrency: max {kind_max} observed, cap 4; per key: max {key_max}, cap 2")
    print(f"the small key's last job finished {small_last + 1}th of {len(ends)}")
    assert kind_max <= 4 and key_max <= 2
    assert kind_max >= 2  # distinct keys did run in parallel
    assert small_last < len(ends) // 2

    # Rate: no 0.5 s window sees more than 10 starts (claims, on Redis's clock).
    rated = q.enqueue_many([Rated(seconds=0.01) for _ in range(30)])
    wait_done(q, rated)
    claims = [e.at.timestamp() for i in rated for e in q.journal(i) if e.event == "claimed"]
    in_window = max_in_window(claims, 0.5)
    print(f"rate: max {in_window} starts in any 0.5 s window, rate 10/0.5s; {len(claims)} starts")
    assert in_window <= 10 and len(claims) == 30

    # A worker SIGKILLed while it holds a kind slot: its lease is reclaimed and the slot comes back.
    (stuck,) = q.enqueue_many([Timed(key="kill", seconds=0.05, first_seconds=60)])
    deadline = time.monotonic() + 20
    starts: list[list[object]] = []
    while not starts:
        starts = [json.loads(x) for x in r.lrange(f"flowlog:{q.name}", 0, -1) if json.loads(x)[-1] == stuck]
        assert time.monotonic() < deadline
        time.sleep(0.05)
    victim = int(starts[0][2])  # type: ignore[call-overload]
    os.kill(victim, signal.SIGKILL)
    after = q.enqueue_many([Timed(key=f"a{i}", seconds=0.05) for i in range(8)])
    infos = wait_done(q, [stuck, *after])
    assert infos[0].failures == 1  # the killed run, counted by the reclaim

    assert [i.running for i in q.limits()] == [0, 0, 0]
    print(f"after SIGKILL of pid {victim}: the job reran, every slot is back")
    for p in procs:
        assert p.poll() is None or p.pid == victim
