"""The load of each key of a per-key limit (issue 29: "limits (running and waiting per key)").

``queue.limits()`` breaks a per-key limit's row down by limit key: the
busiest keys with their own running and waiting counts, read in a bounded
number of commands however many keys the queue holds, each key decoded
exactly from its length-prefixed field. Contract tests on redis, memory and
cluster; the dashboard and the CLI show the same breakdown.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import httpx
import pytest

import venturi_redis as vr
from tests.helpers import claim_raw
from tests.servers import RedisServer
from venturi_redis._producer import limits as limits_module
from venturi_redis._store import calls
from venturi_redis._store.keys import limit_field, limit_key_of
from venturi_redis.dashboard import create_app

pytestmark = pytest.mark.anyio

XSS = "<script>alert(1)</script>"
KIND = "tenant-mail"


class Mail(vr.Task):
    KIND: ClassVar[str] = KIND
    tenant: str | None = None
    n: int = 0

    def limit_key(self) -> str | None:
        return self.tenant


T0 = 1_700_000_000_000


class Clock:
    """A fixed clock moved by hand: the ready rotation orders keys by when they came."""

    def __init__(self) -> None:
        self.ms = T0

    def __call__(self) -> int:
        return self.ms


@pytest.fixture
async def queue(url: str, queue_name: str) -> AsyncIterator[vr.Queue]:
    async with vr.Client.from_url(url, clock=Clock()) as c:
        yield c.queue(queue_name)


def load(key: str | None, running: int, waiting: int) -> vr.LimitKeyLoad:
    return vr.LimitKeyLoad(key=key, running=running, waiting=waiting)


async def per_key_row(q: vr.Queue, keys: int = 50) -> vr.LimitInfo:
    return next(i for i in await q.limits(keys=keys) if i.kind == KIND and i.per_key)


async def tenants(q: vr.Queue, xss: bool = False) -> None:
    """A kind-wide cap of 3 and a per-key cap of 1; four keyed tenants and two
    jobs without a key. The claim runs one job of each of the first three
    tenants (the kind-wide cap is then full) and parks everything else."""
    clock = q.client.clock
    assert isinstance(clock, Clock)
    await q.set_limit(KIND, concurrency=3)
    await q.set_limit(KIND, concurrency=1, per_key=True)
    for tenant, jobs in (("acme", 4), (XSS if xss else "zed", 1), ("beta", 3), ("late", 2), (None, 2)):
        clock.ms += 1
        await q.enqueue_many([Mail(tenant=tenant, n=i) for i in range(jobs)])
    clock.ms += 1
    assert len(await claim_raw(q, 10)) == 2 + 3 * len(calls.CLAIM_FIELDS)  # acme, zed and beta: three claimed


EXPECTED = (
    load("acme", 1, 3),
    load("beta", 1, 2),
    load("late", 0, 2),
    load(None, 0, 2),
    load("zed", 1, 0),
)


async def test_a_per_key_row_holds_each_keys_running_and_waiting(queue: vr.Queue) -> None:
    await tenants(queue)
    rows = await queue.limits()
    assert [(r.per_key, r.running, r.waiting) for r in rows] == [(False, 3, 9), (True, 3, 9)]
    kind_wide, per_key = rows
    assert (kind_wide.keys, kind_wide.keys_total) == ((), 0)
    # Busiest first (running plus waiting, then running), the key without a key as None.
    assert per_key.keys == EXPECTED
    assert per_key.keys_total == 5
    assert sum(x.running for x in per_key.keys) == per_key.running
    assert sum(x.waiting for x in per_key.keys) == per_key.waiting
    # A bound below the number of busy keys: the busiest, and the total still told.
    top = await per_key_row(queue, keys=2)
    assert (top.keys, top.keys_total) == (EXPECTED[:2], 5)
    none = await per_key_row(queue, keys=0)
    assert (none.keys, none.keys_total, none.running, none.waiting) == ((), None, 3, 9)


async def test_keys_with_separators_and_the_empty_key_are_decoded_exactly(queue: vr.Queue) -> None:
    await queue.set_limit(KIND, concurrency=1, per_key=True)
    odd = ["", "a\tb", "3:x", "ü\t#1:0", "acme\t", "+", "!"]
    for i, key in enumerate(odd):
        await queue.enqueue_many([Mail(tenant=key, n=n) for n in range(i + 1)])
    await claim_raw(queue, 100)
    row = await per_key_row(queue)
    # Each key ran one job and parks the rest: as many waiting as its index.
    assert sorted(row.keys, key=lambda x: x.waiting) == [load(k, 1, i) for i, k in enumerate(odd)]
    assert row.keys_total == len(odd)


async def test_odd_fields_are_skipped_never_a_traceback(queue: vr.Queue) -> None:
    await tenants(queue)
    k, redis = queue.keys, queue.client.redis
    head = KIND.encode() + b"\t"
    await redis.hset(
        k.limits_state,
        mapping={
            head + b"#5:0": b"1",  # a rate ring's field
            head + b"5:ab": b"2",  # the length is wrong
            head + b"04:acme": b"2",  # a leading zero: no field limit_field writes
            head + b"x:y": b"1",
            head + b"2:\xff\xfe": b"1",  # not UTF-8
            head + b"4:acme\t#2:0": b"1",  # an entity's rate ring
            head + limit_field("ghost").encode(): b"many",  # a count that is no number
            b"\tseq": b"7",
        },
    )
    await redis.zadd(k.limits_ready, {head + b"garbage": 0, head + b"9:": 0, head + b"6:nobody": 0})
    row = await per_key_row(queue)
    assert (row.keys, row.keys_total) == (EXPECTED, 5)


async def test_more_keys_than_the_bound_gives_the_bound(queue: vr.Queue) -> None:
    await queue.set_limit(KIND, concurrency=1, per_key=True)
    await queue.enqueue_many([Mail(tenant=f"t{i:03}", n=n) for i in range(60) for n in range(1 + (i == 7))])
    row = await per_key_row(queue)  # nothing claimed: every job parked at enqueue
    assert len(row.keys) == 50 and row.keys_total == 60
    assert row.keys[0] == load("t007", 0, 2)  # the busiest first
    assert [x.key for x in row.keys[1:]] == [f"t{i:03}" for i in range(60) if i != 7][:49]
    assert len((await per_key_row(queue, keys=5)).keys) == 5


async def test_the_read_stops_at_its_bound_and_says_the_total_is_unknown(
    queue: vr.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    await queue.set_limit(KIND, concurrency=1, per_key=True)
    await queue.enqueue_many([Mail(tenant=f"t{i:03}") for i in range(40)])
    monkeypatch.setattr(limits_module, "_CANDIDATES_MAX", 10)
    row = await per_key_row(queue, keys=5)
    assert len(row.keys) == 5 and row.keys_total is None
    assert all(x.waiting == 1 and x.running == 0 for x in row.keys)
    assert row.waiting == 40  # the row's own counts are exact whatever the bound


async def test_many_running_and_waiting_keys_scanned_in_pages(
    queue: vr.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past 128 entries Redis pages its SCANs: the whole of both structures is read
    within the default bounds, and a read cut short says so."""
    await queue.set_limit(KIND, concurrency=1, per_key=True)
    await queue.enqueue_many([Mail(tenant=f"t{i:03}", n=n) for i in range(300) for n in range(2)])
    await claim_raw(queue, 150)
    row = await per_key_row(queue)
    assert (row.running, row.waiting, row.keys_total) == (150, 450, 300)
    assert len(row.keys) == 50 and all((x.running, x.waiting) == (1, 1) for x in row.keys)
    monkeypatch.setattr(limits_module, "_SCAN_COUNT", 10)
    monkeypatch.setattr(limits_module, "_SCAN_CALLS", 2)
    cut = await per_key_row(queue, keys=300)
    assert cut.keys_total is None and 0 < len(cut.keys) < 300
    assert (cut.running, cut.waiting) == (150, 450)


@pytest.mark.parametrize("keys", [-1, True, 2.5, "5", None])
async def test_a_bad_keys_bound_is_refused(client: vr.Client, queue_name: str, keys: Any) -> None:
    with pytest.raises(vr.ConfigurationError, match="keys"):
        await client.queue(queue_name).limits(keys=keys)


@pytest.mark.parametrize("key", ["", "acme", "a\tb", "3:x", "ü", "\t#5:0", "x" * 1024])
def test_limit_key_of_inverts_limit_field(key: str) -> None:
    assert limit_key_of(limit_field(key).encode()) == key


@pytest.mark.parametrize(
    "field", [b"#5:0", b"+", b"!", b"5:ab", b"04:acme", b":x", b"x:y", b"2:\xff\xfe", b"1:a\t#1:0"]
)
def test_limit_key_of_refuses_what_is_no_key(field: bytes) -> None:
    assert limit_key_of(b"") is None  # a job without a key
    with pytest.raises(ValueError, match="limit key"):
        limit_key_of(field)


def test_the_blocking_face_reads_the_same(redis_server: RedisServer, queue_name: str) -> None:
    with vr.SyncClient(redis_server.url) as sc:
        q = sc.queue(queue_name)
        q.set_limit(KIND, concurrency=1, per_key=True)
        q.enqueue(Mail(tenant="acme"))
        q.enqueue(Mail(tenant="acme", n=1))
        (row,) = q.limits()
        assert (row.keys, row.keys_total) == ((load("acme", 0, 2),), 1)
        assert q.limits(keys=0)[0].keys == ()


# -- the dashboard and the CLI ---------------------------------------------------------


@pytest.fixture
async def dash_client(redis_server: RedisServer) -> AsyncIterator[vr.Client]:
    client = vr.Client.from_url(redis_server.url, namespace=f"d{uuid.uuid4().hex[:10]}", clock=Clock())
    try:
        yield client
    finally:
        await client.aclose()


async def test_the_queue_page_and_its_json_show_each_key_escaped(dash_client: vr.Client) -> None:
    q = dash_client.queue("mail")
    await tenants(q, xss=True)
    transport = httpx.ASGITransport(app=create_app(dash_client))
    async with httpx.AsyncClient(transport=transport, base_url="http://dash") as h:
        page = await h.get("/queues/mail")
        api = (await h.get("/api/queues/mail/limits")).json()
    assert page.status_code == 200
    per_key = next(r for r in api["limits"] if r["per_key"])
    assert per_key["keys"] == [
        {"key": "acme", "running": 1, "waiting": 3},
        {"key": "beta", "running": 1, "waiting": 2},
        {"key": "late", "running": 0, "waiting": 2},
        {"key": None, "running": 0, "waiting": 2},
        {"key": XSS, "running": 1, "waiting": 0},
    ]
    assert per_key["keys_total"] == 5
    assert next(r for r in api["limits"] if not r["per_key"])["keys"] == []
    nested = re.search(f'data-limit-keys="{KIND}">(.*?)</span>', page.text, re.DOTALL)
    assert nested, "no key breakdown under the per-key row"
    rows = re.findall(
        r'<tr><td class="id">(.*?)</td><td class="num">(\d+)</td><td class="num">(\d+)</td></tr>', nested[1]
    )
    assert rows == [
        ("acme", "1", "3"),
        ("beta", "1", "2"),
        ("late", "0", "2"),
        ('<em class="nokey">(no key)</em>', "0", "2"),
        ("&lt;script&gt;alert(1)&lt;/script&gt;", "1", "0"),
    ]
    assert XSS not in page.text and "5 busy keys" in nested[1]
    # The kind-wide row has no breakdown.
    assert page.text.count("data-limit-keys=") == 1


def test_cli_limits_lists_the_busiest_keys(redis_server: RedisServer, queue_name: str) -> None:
    from typer.testing import CliRunner

    from venturi_redis.cli.commands import app

    url = redis_server.url
    with vr.SyncClient(url) as sc:
        q = sc.queue(queue_name)
        q.set_limit(KIND, concurrency=1, per_key=True)
        q.enqueue_many([Mail(tenant="acme", n=i) for i in range(3)])
        q.enqueue_many([Mail(tenant="zed\x1b[31m", n=i) for i in range(2)])
        q.enqueue(Mail(tenant="solo"))

    def venturi(*args: str) -> Any:
        res = CliRunner().invoke(app, ["limits", *args, "--redis", url, "-q", queue_name])
        assert res.exit_code == 0, res.output
        return res.output

    (row,) = json.loads(venturi("--json"))
    assert row["keys"] == [
        {"key": "acme", "running": 0, "waiting": 3},
        {"key": "zed\x1b[31m", "running": 0, "waiting": 2},
        {"key": "solo", "running": 0, "waiting": 1},
    ]
    assert row["keys_total"] == 3
    table = venturi("--keys", "2")
    assert "key acme" in table and "key zed\\x1b[31m" in table and "solo" not in table
    assert "1 more busy key" in table
    assert "key acme" not in venturi("--keys", "0")
    assert json.loads(venturi("--json", "--keys", "0"))[0]["keys"] == []
