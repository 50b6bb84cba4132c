"""Bad values through the public API are refused where they are given (issue 26 items 4, 6, 7).

Every refusal is a ``vr.ConfigurationError`` (or ``TaskDefinitionError`` for
a task class) raised before anything is sent: each test checks the queue is
still empty afterwards, on a real Redis and on the embedded server.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, ClassVar

import pytest
from pydantic import BaseModel, Secret, SecretBytes, SecretStr

import venturi_redis as vr
from tests.tasks import Echo
from venturi_redis._model.backoff import MAX_SECONDS

pytestmark = pytest.mark.anyio

# Durations the API must refuse: they wrapped (1e16 s ran at once, a 1e16 s
# lease expired at every claim), or are not durations at all.
BAD_DURATIONS: list[Any] = [
    1e16,
    float("nan"),
    float("inf"),
    -1,
    -0.5,
    timedelta(days=365 * 101),
    timedelta(seconds=-1),
    MAX_SECONDS + 1,
    10**400,
    True,
    "5",
]
# Values that are not what they pretend: a bool is not an int here.
BAD_PRIORITIES: list[Any] = [True, False, 7, -1, "urgent", 1.0]
BAD_MAX_FAILURES: list[Any] = [True, False, 0, -3, 2.0, "3"]


@pytest.fixture
def backend() -> str:
    """Once, on real Redis: every check here runs before anything is sent
    (tests/conftest.py CONTRACT_MODULES; the scripts' own checks are there)."""
    return "redis"


async def assert_empty(queue: vr.Queue) -> None:
    counts = await queue.counts()
    assert not any(counts.values()), counts


# -- durations ------------------------------------------------------------------


@pytest.mark.parametrize("bad", BAD_DURATIONS, ids=repr)
async def test_enqueue_refuses_a_bad_delay(queue: vr.Queue, bad: Any) -> None:
    with pytest.raises(vr.ConfigurationError, match="delay"):
        await queue.enqueue(Echo(text="x"), delay=bad)
    with pytest.raises(vr.ConfigurationError, match="delay"):
        await queue.enqueue_many([Echo(text="x"), Echo(text="y")], delay=bad)
    await assert_empty(queue)


@pytest.mark.parametrize("bad", [*BAD_DURATIONS, 0, 0.0001, timedelta(0)], ids=repr)
async def test_enqueue_refuses_a_bad_lease(queue: vr.Queue, bad: Any) -> None:
    with pytest.raises(vr.ConfigurationError, match="lease"):
        await queue.enqueue(Echo(text="x"), lease=bad)
    with pytest.raises(vr.ConfigurationError, match="lease"):
        await queue.enqueue_many([Echo(text="x")], lease=bad)
    await assert_empty(queue)


async def test_the_longest_delay_and_lease_are_stored_exactly(queue: vr.Queue) -> None:
    """At the bound, eligible_at is 100 years ahead: not wrapped to the past."""
    before = datetime.now(UTC)
    job_id = await queue.enqueue(Echo(text="x"), delay=timedelta(seconds=MAX_SECONDS), lease=MAX_SECONDS)
    info = await queue.get(job_id)
    assert info is not None and info.eligible_at is not None
    ahead = info.eligible_at - before
    assert timedelta(days=365 * 100 - 1) < ahead < timedelta(days=365 * 100 + 1)
    raw = await queue.client.redis.hget(queue.keys.job(job_id), "lease_ms")
    assert raw == str(MAX_SECONDS * 1000).encode()
    assert (await queue.counts())["pending"] == 1


async def test_delay_false_is_refused_but_zero_is_not(queue: vr.Queue) -> None:
    with pytest.raises(vr.ConfigurationError, match="delay"):
        await queue.enqueue(Echo(text="x"), delay=False)
    await assert_empty(queue)
    assert await queue.enqueue(Echo(text="x"), delay=0)


# -- priority and max_failures ---------------------------------------------------


@pytest.mark.parametrize("bad", BAD_PRIORITIES, ids=repr)
async def test_enqueue_refuses_a_bad_priority(queue: vr.Queue, bad: Any) -> None:
    with pytest.raises(vr.ConfigurationError, match="priority"):
        await queue.enqueue(Echo(text="x"), priority=bad)
    with pytest.raises(vr.ConfigurationError, match="priority"):
        await queue.enqueue_many([Echo(text="x")], priority=bad)
    await assert_empty(queue)


class SaysTrue(vr.Task):
    KIND: ClassVar[str] = "validation.says_true"

    def priority(self) -> vr.Priority:
        return True  # type: ignore[return-value]  # what a careless override returns


async def test_a_task_whose_priority_is_a_bool_is_refused(queue: vr.Queue) -> None:
    with pytest.raises(vr.ConfigurationError, match="priority True"):
        await queue.enqueue(SaysTrue())
    with pytest.raises(vr.ConfigurationError, match="priority True"):
        await queue.enqueue_many([Echo(text="x"), SaysTrue()])
    await assert_empty(queue)


@pytest.mark.parametrize("bad", BAD_MAX_FAILURES, ids=repr)
async def test_enqueue_refuses_a_bad_max_failures(queue: vr.Queue, bad: Any) -> None:
    """``max_failures=True`` was stored as "True" and disabled the backstop."""
    with pytest.raises(vr.ConfigurationError, match="max_failures"):
        await queue.enqueue(Echo(text="x"), max_failures=bad)
    with pytest.raises(vr.ConfigurationError, match="max_failures"):
        await queue.enqueue_many([Echo(text="x")], max_failures=bad)
    await assert_empty(queue)


async def test_good_values_still_pass(queue: vr.Queue) -> None:
    job_id = await queue.enqueue(
        Echo(text="x"), delay=timedelta(seconds=1), priority="HIGH", lease=2.5, max_failures=3
    )
    raw = await queue.client.redis.hmget(queue.keys.job(job_id), "priority", "lease_ms", "max_failures")
    assert raw == [b"high", b"2500", b"3"]
    assert await queue.enqueue(Echo(text="y"), priority=0, max_failures=None)


# -- the other faces: SyncQueue, ShardedQueue, @vr.offload --------------------------


@pytest.fixture
def sync_queue(url: str, queue_name: str) -> Iterator[vr.SyncQueue]:
    with vr.SyncClient(url) as sc:
        yield sc.queue(queue_name)


BAD_CALLS: list[tuple[str, dict[str, Any]]] = [
    ("delay", {"delay": 1e16}),
    ("delay", {"delay": float("nan")}),
    ("lease", {"lease": timedelta(days=365 * 1000)}),
    ("lease", {"lease": -1}),
    ("priority", {"priority": True}),
    ("max_failures", {"max_failures": True}),
]


@pytest.mark.parametrize(("what", "kwargs"), BAD_CALLS, ids=lambda v: repr(v))
def test_sync_queue_refuses_the_same(sync_queue: vr.SyncQueue, what: str, kwargs: dict[str, Any]) -> None:
    with pytest.raises(vr.ConfigurationError, match=what):
        sync_queue.enqueue(Echo(text="x"), **kwargs)
    with pytest.raises(vr.ConfigurationError, match=what):
        sync_queue.enqueue_many([Echo(text="x")], **kwargs)
    counts = sync_queue.counts()
    assert not any(counts.values()), counts


@pytest.mark.parametrize(("what", "kwargs"), BAD_CALLS, ids=lambda v: repr(v))
async def test_sharded_queue_refuses_the_same(
    client: vr.Client, queue_name: str, what: str, kwargs: dict[str, Any]
) -> None:
    sharded = vr.ShardedQueue(client, queue_name, partitions=3)
    with pytest.raises(vr.ConfigurationError, match=what):
        await sharded.enqueue(Echo(text="x"), **kwargs)
    with pytest.raises(vr.ConfigurationError, match=what):
        await sharded.enqueue_many([Echo(text=str(i)) for i in range(6)], **kwargs)
    assert await sharded.is_drained()
    assert not any((await sharded.counts()).values())


@pytest.mark.parametrize(
    ("what", "kwargs"),
    [
        ("retention", {"retention": 1e16}),
        ("priority", {"priority": True}),
    ],
    ids=lambda v: repr(v),
)
def test_offload_options_are_checked_at_decoration(what: str, kwargs: dict[str, Any]) -> None:
    with pytest.raises(vr.ConfigurationError, match=what):

        @vr.offload(**kwargs)
        async def f(x: int) -> int:  # pragma: no cover - never defined
            return x


# -- the model: Outcome, Backoff, secrets ----------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: vr.Outcome("bogus"),  # type: ignore[arg-type]
        lambda: vr.Outcome("pause", delay_ms=float("nan")),  # type: ignore[arg-type]
        lambda: vr.Outcome("pause", delay_ms=-1),
        lambda: vr.Outcome("pause", delay_ms=True),
        lambda: vr.Outcome("pause", delay_ms=10**16),
        lambda: vr.Outcome("completed", note=3),  # type: ignore[arg-type]
        lambda: vr.Outcome.pause_in(1e16),
        lambda: vr.Outcome.pause_in(float("inf")),
        lambda: vr.Outcome.pause_in_with(-1, "later"),
    ],
)
def test_outcome_refuses_what_no_run_can_conclude(make: Callable[[], vr.Outcome]) -> None:
    with pytest.raises(vr.ConfigurationError, match=r"Outcome|pause delay"):
        make()


def test_outcomes_built_as_documented_still_work() -> None:
    assert vr.Outcome.completed().kind == "completed"
    assert vr.Outcome.pause_in(timedelta(minutes=1)).delay_ms == 60_000
    assert vr.Outcome.suspend(note="waiting").note == "waiting"
    assert vr.Outcome("pause", delay_ms=5).delay_ms == 5


@pytest.mark.parametrize(
    "make",
    [
        lambda: vr.Backoff.fibonacci(base=1e16),
        lambda: vr.Backoff.fibonacci(cap=float("nan")),
        lambda: vr.Backoff(base=float("nan"), cap=1.0),
        lambda: vr.Backoff(base=1.0, cap=-1.0),
        lambda: vr.Backoff(base=True, cap=1.0),
        lambda: vr.backoff_delay("01J", 1, base=1.0, cap=10.0, jitter=float("nan")),
    ],
)
def test_backoff_refuses_bad_durations(make: Callable[[], object]) -> None:
    with pytest.raises(vr.ConfigurationError, match=r"base|cap|jitter"):
        make()


class Inner(BaseModel):
    token: SecretStr


@pytest.mark.parametrize(
    ("annotation", "field"),
    [
        (SecretStr, "x"),
        (SecretBytes, "x"),
        (SecretStr | None, "x"),
        (list[SecretStr], "x"),
        (Secret[int], "x"),
        (Inner, "x.token"),
        (dict[str, Inner], "x.token"),
    ],
    ids=repr,
)
def test_a_task_with_a_secret_field_is_refused_at_definition(annotation: Any, field: str) -> None:
    """A SecretStr was stored as "**********": the handler got the mask, the secret was lost."""
    with pytest.raises(vr.TaskDefinitionError, match=f"field '{field}' is a pydantic secret type"):
        type(
            "HasSecret",
            (vr.Task,),
            {"__annotations__": {"KIND": ClassVar[str], "x": annotation}, "KIND": "validation.secret"},
        )


def test_a_carry_with_a_secret_field_is_refused_at_definition() -> None:
    class Carry(BaseModel):
        key: SecretStr = SecretStr("")

    with pytest.raises(vr.TaskDefinitionError, match="carry Carry: field 'key'"):

        class WithCarry(vr.Task[Carry]):  # pragma: no cover - never defined
            KIND: ClassVar[str] = "validation.secret_carry"


class PlainToken(vr.Task):
    """The documented way out: a plain str, stored as it is."""

    KIND: ClassVar[str] = "validation.plain_token"
    token: str


async def test_a_plain_str_token_round_trips(queue: vr.Queue) -> None:
    job_id = await queue.enqueue(PlainToken(token="s3cr3t"))
    info = await queue.get(job_id)
    assert info is not None and info.payload == {"token": "s3cr3t"}


# -- every number the API stores is bounded (issue 38, item 7) -----------------------------

BIG = [2**53 + 1, 10**20, 2**64, 1_000_000_001]


@pytest.mark.parametrize("bad", [*BIG, 0, -1, True, 2.0])
async def test_limits_refuse_counts_no_script_reads_back(queue: vr.Queue, bad: Any) -> None:
    """2**53+1 read back rounded; 10**20 and 2**64 silently meant no cap."""
    with pytest.raises(vr.ConfigurationError, match="concurrency must be a whole number from 1 to"):
        await queue.set_limit("echo", concurrency=bad)
    with pytest.raises(vr.ConfigurationError, match="Rate count must be a whole number from 1 to"):
        vr.Rate(bad, 1)
    assert await queue.limits() == []


async def test_the_largest_limit_reads_back_exactly(queue: vr.Queue) -> None:
    from venturi_redis._model.limits import MAX_COUNT

    await queue.set_limit("echo", concurrency=MAX_COUNT, rate=vr.Rate(MAX_COUNT, 100 * 365 * 86400))
    [limit] = await queue.limits()
    assert limit.concurrency == MAX_COUNT and limit.rate == vr.Rate(MAX_COUNT, 100 * 365 * 86400)


@pytest.mark.parametrize("bad", [*BIG, 0, -1, True, 2.0])
async def test_set_events_refuses_a_cap_xadd_cannot_take(queue: vr.Queue, bad: Any) -> None:
    with pytest.raises(vr.ConfigurationError, match="events maxlen must be a whole number from 1 to"):
        await queue.set_events(True, maxlen=bad)
    assert await queue.client.redis.hget(queue.keys.meta, "events") is None
    await queue.set_events(False, maxlen=bad)  # the cap of a switch-off is not read


@pytest.mark.parametrize("bad", [0, 10_001, 10**20, True, 2.5])
def test_retention_refuses_a_batch_no_script_call_should_take(bad: Any) -> None:
    with pytest.raises(
        vr.ConfigurationError, match="retention batch must be a whole number from 1 to 10,000"
    ):
        vr.Retention(batch=bad)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tz": "localtime"}, "each host's own"),
        ({"tz": "Factory"}, "not one IANA zone"),
        ({"tz": "right/UTC"}, "not one IANA zone"),
        ({"start_at": datetime(1, 1, 1, tzinfo=UTC)}, "start_at must be from 1970-01-01 to 9999-12-31 UTC"),
        ({"end_at": datetime(1969, 12, 31, tzinfo=UTC)}, "end_at must be from 1970-01-01"),
        (
            {"start_at": datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-14)))},
            "start_at must be from 1970-01-01 to 9999-12-31 UTC",
        ),
        ({"every": 10**20}, "every"),
    ],
)
async def test_schedules_refuse_a_zone_or_instant_no_host_agrees_on(
    queue: vr.Queue, kwargs: dict[str, Any], message: str
) -> None:
    kwargs = {"every": 5, **kwargs}
    with pytest.raises(vr.ConfigurationError, match=message):
        await queue.schedule("s", Echo(text="x"), **kwargs)
    with pytest.raises(vr.ConfigurationError, match=message):
        vr.Schedule("s", Echo(text="x"), **kwargs)
    assert await queue.schedules() == []


async def test_a_cron_that_would_step_past_year_9999_has_ended(queue: vr.Queue) -> None:
    late = datetime(9999, 12, 31, 23, tzinfo=UTC)
    with pytest.raises(vr.ConfigurationError, match="never fires"):
        await queue.schedule("s", Echo(text="x"), cron="0 0 * * *", start_at=late)
    info = await queue.schedule(
        "s", Echo(text="x"), cron="0 0 29 2 *", end_at=datetime(9999, 12, 31, tzinfo=UTC)
    )
    assert info.next_at is not None
