"""A task's model changes while jobs enqueued by the old model wait (docs/semantics.md,
"Changing a task's model while its jobs wait").

Each test enqueues (or runs) with one class, then runs or reads with another of
the same KIND, as a deploy does: the jobs stored by the old code meet the new
model in the worker, the producer's dedup merge, a workflow's results, a typed
offload read and the dashboard. On real Redis.
"""

from __future__ import annotations

import enum
import logging
import types
from collections.abc import Sequence
from typing import Any, ClassVar

import httpx
import pytest
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, model_validator

import venturi_redis as vr
from tests.helpers import drain
from venturi_redis.dashboard import create_app

pytestmark = pytest.mark.anyio


# -- the common changes, one old model and one new per row ------------------------------


class Address(BaseModel):
    city: str


class AddressWithZip(BaseModel):
    city: str
    zip: str


class Plan(enum.StrEnum):
    FREE = "free"
    PRO = "pro"


class PlanWithoutFree(enum.StrEnum):
    PRO = "pro"


class OldOrder(vr.Task):
    """What the producers enqueued before the deploy."""

    KIND: ClassVar[str] = "mc.order"
    user: int
    plan: str = "free"
    address: Address = Address(city="Oslo")
    legacy: str = "x"


def _new(name: str, fields: dict[str, Any], config: ConfigDict | None = None) -> type[Any]:
    """A handler of KIND mc.order whose task has ``fields`` (name: (annotation, default))."""
    annotations: dict[str, Any] = {"KIND": ClassVar[str], **{k: v[0] for k, v in fields.items()}}
    namespace: dict[str, Any] = {"__annotations__": annotations, "KIND": "mc.order"}
    namespace.update({k: v[1] for k, v in fields.items() if v[1] is not ...})
    if config is not None:
        namespace["model_config"] = config
    task = type(f"{name}Task", (vr.Task,), namespace)

    async def handle(self: Any, ctx: vr.Context[vr.NoCarry], state: dict[str, Any]) -> vr.Outcome:
        state["seen"] = self.model_dump(mode="json")
        return vr.Outcome.completed()

    return types.new_class(
        name, (task, vr.Handler[dict[str, Any]]), exec_body=lambda ns: ns.update(handle=handle)
    )


# Each row: the new model, and what an old job (OldOrder(user=7)) then comes to:
# the payload its handler sees, or the dead note's words naming the field.
CHANGES: dict[str, tuple[type[Any], dict[str, Any] | str]] = {
    "field added with a default": (
        _new("AddedDefault", {"user": (int, ...), "region": (str, "eu")}),
        {"user": 7, "region": "eu"},
    ),
    "required field added": (
        _new("AddedRequired", {"user": (int, ...), "region": (str, ...)}),
        "region: Field required",
    ),
    "field removed (extra keys ignored, pydantic's default)": (
        _new("Removed", {"user": (int, ...)}),
        {"user": 7},
    ),
    "field removed, extra keys forbidden": (
        _new("RemovedForbid", {"user": (int, ...)}, ConfigDict(extra="forbid")),
        "legacy: Extra inputs are not permitted",
    ),
    "field renamed, the old name accepted": (
        _new("Renamed", {"user_id": (int, Field(validation_alias=AliasChoices("user_id", "user")))}),
        {"user_id": 7},
    ),
    "field renamed, the old name not accepted": (
        _new("RenamedBare", {"user_id": (int, ...)}),
        "user_id: Field required",
    ),
    "type widened int -> str (pydantic does not coerce)": (
        _new("Widened", {"user": (str, ...)}),
        "user: Input should be a valid string",
    ),
    "type widened int -> str, numbers coerced": (
        _new("WidenedCoerced", {"user": (str, ...)}, ConfigDict(coerce_numbers_to_str=True)),
        {"user": "7"},
    ),
    "str -> Enum": (
        _new("Enumed", {"user": (int, ...), "plan": (Plan, Plan.PRO)}),
        {"user": 7, "plan": "free"},
    ),
    "str -> Enum without the stored value": (
        _new("EnumNarrowed", {"user": (int, ...), "plan": (PlanWithoutFree, PlanWithoutFree.PRO)}),
        "plan: Input should be 'pro'",
    ),
    "nested model gains a required field": (
        _new("Nested", {"user": (int, ...), "address": (AddressWithZip, ...)}),
        "address.zip: Field required",
    ),
}


@pytest.mark.parametrize("change", list(CHANGES))
async def test_each_common_change_runs_the_old_job_or_kills_it_at_once_naming_the_field(
    queue: vr.Queue, change: str
) -> None:
    new, expected = CHANGES[change]
    old = await queue.enqueue(OldOrder(user=7))
    state: dict[str, Any] = {}
    await drain(queue, new, state=state)
    info = await queue.get(old)
    assert info is not None
    if isinstance(expected, dict):
        assert info.state is vr.JobState.COMPLETED and state["seen"] == {**state["seen"], **expected}
        return
    # Dead on its first claim: never retried, the field and the reason in the note.
    assert (info.state, info.dead_reason, info.run_count) == (
        vr.JobState.DEAD,
        vr.DeadReason.INVALID_PAYLOAD,
        1,
    )
    assert info.note is not None and expected in info.note and "payload does not decode" in info.note
    assert "7" not in info.note  # the stored values are never quoted


# -- a fix deployed, then the dead jobs redriven --------------------------------------------


class Invoice(vr.Task):
    KIND: ClassVar[str] = "mc.invoice"
    customer: int


class InvoiceV2(vr.Task):
    """A required field added: the old jobs cannot run."""

    KIND: ClassVar[str] = "mc.invoice"
    customer: int
    currency: str


class InvoiceV2Job(InvoiceV2, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        return vr.Outcome.completed(result=self.currency)


class InvoiceV3(vr.Task):
    """The fix: the field gets the value every old job meant."""

    KIND: ClassVar[str] = "mc.invoice"
    customer: int
    currency: str = "EUR"


class InvoiceV3Job(InvoiceV3, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        return vr.Outcome.completed(result=self.currency)


async def test_old_jobs_killed_by_a_new_model_run_once_a_fix_is_deployed_and_they_are_redriven(
    queue: vr.Queue,
) -> None:
    old = await queue.enqueue_many([Invoice(customer=i) for i in range(3)])
    await drain(queue, InvoiceV2Job)
    assert [(await queue.get(i)).dead_reason for i in old] == [vr.DeadReason.INVALID_PAYLOAD] * 3  # type: ignore[union-attr]
    # `venturi dead retry -q Q --kind mc.invoice --note-contains "does not validate" --all`
    moved = await queue.retry_dead(kind="mc.invoice", note_contains="does not validate")
    assert sorted(moved) == sorted(old)
    await drain(queue, InvoiceV3Job)
    for job_id in old:
        info = await queue.get(job_id)
        assert info is not None and (info.state, info.result) == (vr.JobState.COMPLETED, "EUR")


# -- a schedule stores its payload --------------------------------------------------------


class Report(vr.Task):
    KIND: ClassVar[str] = "mc.report"
    name: str


class ReportV2(vr.Task):
    KIND: ClassVar[str] = "mc.report"
    name: str
    fmt: str


class ReportV2Job(ReportV2, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        return vr.Outcome.completed(result=self.fmt)


async def test_a_schedule_keeps_the_old_payload_until_it_is_declared_again(queue: vr.Queue) -> None:
    await queue.schedule("nightly", Report(name="n"), cron="0 3 * * *")
    first = await queue.trigger_schedule("nightly")
    await drain(queue, ReportV2Job)
    info = await queue.get(first or "")
    assert info is not None and (info.dead_reason, info.schedule_id) == (
        vr.DeadReason.INVALID_PAYLOAD,
        "nightly",
    )
    assert info.note is not None and "fmt: Field required" in info.note
    # Declared again with the new model (as vr.Worker(schedules=[...]) does at each start):
    # its timing and next fire time are kept, its payload replaced.
    before = await queue.get_schedule("nightly")
    after = await queue.schedule("nightly", ReportV2(name="n", fmt="pdf"), cron="0 3 * * *")
    assert before is not None and after.next_at == before.next_at
    second = await queue.trigger_schedule("nightly")
    await drain(queue, ReportV2Job)
    assert (await queue.get(second or "")).result == "pdf"  # type: ignore[union-attr]


# -- a migration of old payloads that raises -----------------------------------------------


class Sync(vr.Task):
    KIND: ClassVar[str] = "mc.sync"
    user: int


class SyncV2(vr.Task):
    """Upgrades the old payloads: ``user`` became ``account``, with a bug (a KeyError on
    an old payload without ``user_id``, which the author expected them all to have)."""

    KIND: ClassVar[str] = "mc.sync"
    account: int
    token: str = Field(default="", json_schema_extra={"sensitive": True})

    @model_validator(mode="before")
    @classmethod
    def upgrade(cls, data: Any) -> Any:
        if isinstance(data, dict) and "account" not in data:
            data = {**data, "account": data.pop("user_id")}
        return data


class SyncV2Job(SyncV2, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        return vr.Outcome.completed()


class SyncV2Batch(SyncV2, vr.BatchHandler[Any]):
    @classmethod
    async def handle_batch(
        cls, items: Sequence[vr.BatchItem[SyncV2]], state: dict[str, Any]
    ) -> Sequence[vr.Outcome | BaseException] | None:
        state.setdefault("accounts", []).extend(item.task.account for item in items)
        return None


async def test_a_validator_that_raises_on_an_old_payload_kills_the_job_at_once(queue: vr.Queue) -> None:
    old = await queue.enqueue(Sync(user=7))
    new = await queue.enqueue(SyncV2(account=8))
    await drain(queue, SyncV2Job, timeout=20)  # before: the run was left running, and this hung
    info = await queue.get(old)
    assert info is not None
    assert (info.state, info.dead_reason, info.run_count) == (
        vr.JobState.DEAD,
        vr.DeadReason.INVALID_PAYLOAD,
        1,
    )
    assert info.note == (
        "payload does not decode: stored value does not validate as SyncV2: "
        "its validation raised KeyError: 'user_id'"
    )
    dead = (await queue.journal(old))[-1]
    assert (dead.event, dead.details["reason"], dead.details["error_type"]) == (
        "dead",
        "invalid_payload",
        "KeyError",
    )
    assert 'data.pop("user_id")' in dead.details["traceback"]  # the validator's own line
    assert (await queue.get(new)).state is vr.JobState.COMPLETED  # type: ignore[union-attr]


async def test_a_batch_with_an_old_job_whose_validator_raises_runs_the_others(queue: vr.Queue) -> None:
    new = await queue.enqueue_many([SyncV2(account=i) for i in range(3)])
    old = await queue.enqueue(Sync(user=7))
    state: dict[str, Any] = {}
    await drain(queue, SyncV2Batch, state=state, timeout=20)  # before: the batch was left running
    assert sorted(state["accounts"]) == [0, 1, 2]
    for job_id in new:
        assert (await queue.get(job_id)).state is vr.JobState.COMPLETED  # type: ignore[union-attr]
    info = await queue.get(old)
    assert (
        info is not None
        and info.dead_reason is vr.DeadReason.INVALID_PAYLOAD
        and "KeyError" in (info.note or "")
    )


class Secretive(vr.Task):
    KIND: ClassVar[str] = "mc.secretive"
    user_id: str
    token: str


class SecretiveV2(vr.Task):
    KIND: ClassVar[str] = "mc.secretive"
    user_id: str
    token: str = Field(json_schema_extra={"sensitive": True})

    @model_validator(mode="before")
    @classmethod
    def upgrade(cls, data: Any) -> Any:
        raise RuntimeError(f"cannot upgrade {data}")  # quotes the whole stored payload


class SecretiveV2Job(SecretiveV2, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        return vr.Outcome.completed()


async def test_a_raising_validators_message_is_stored_with_the_sensitive_values_masked(
    queue: vr.Queue,
) -> None:
    old = await queue.enqueue(Secretive(user_id="u-1", token="tok-very-secret"))
    await drain(queue, SecretiveV2Job)
    info = await queue.get(old)
    assert info is not None and info.dead_reason is vr.DeadReason.INVALID_PAYLOAD
    dead = (await queue.journal(old))[-1]
    for text in (info.note or "", dead.note or "", dead.details["traceback"]):
        assert "tok-very-secret" not in text and "***" in text and "RuntimeError" in text


# -- the carry of a continuation ---------------------------------------------------------------


class Progress(BaseModel):
    pages: int = 0


class ProgressV2(BaseModel):
    """``pages`` renamed; a bug in the upgrade raises on the old carries."""

    page_count: int = 0

    @model_validator(mode="before")
    @classmethod
    def upgrade(cls, data: Any) -> Any:
        return {"page_count": data["page_total"]}  # KeyError: the old carry has "pages"


class Crawl(vr.Task[Progress]):
    KIND: ClassVar[str] = "mc.crawl"


class CrawlJob(Crawl, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[Progress], state: Any) -> vr.Outcome:
        ctx.carry.pages += 2
        return vr.Outcome.suspend()


class CrawlV2(vr.Task[ProgressV2]):
    KIND: ClassVar[str] = "mc.crawl"


class CrawlV2Job(CrawlV2, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[ProgressV2], state: Any) -> vr.Outcome:
        return vr.Outcome.completed()


async def test_a_carry_whose_validator_raises_kills_the_job_at_once(queue: vr.Queue) -> None:
    job_id = await queue.enqueue(Crawl())
    await drain(queue, CrawlJob)
    assert await queue.resume(job_id, None) == 1
    await drain(queue, CrawlV2Job, timeout=20)
    info = await queue.get(job_id)
    assert info is not None and (info.state, info.dead_reason) == (
        vr.JobState.DEAD,
        vr.DeadReason.INVALID_PAYLOAD,
    )
    assert (
        info.note is not None and info.note.startswith("carry does not decode: ") and "KeyError" in info.note
    )
    assert info.carry == {"pages": 2}  # kept, for the fixed model and an operator's retry


# -- a resume value of an older type -------------------------------------------------------------


class Decision(BaseModel):
    ok: bool


class DecisionV2(BaseModel):
    ok: bool
    by: str


class Approve(vr.Task):
    KIND: ClassVar[str] = "mc.approve"
    RESUME: ClassVar[Any] = Decision


class ApproveJob(Approve, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        return vr.Outcome.suspend() if ctx.resume_input is None else vr.Outcome.completed()


class ApproveV2(vr.Task):
    KIND: ClassVar[str] = "mc.approve"
    RESUME: ClassVar[Any] = DecisionV2


class ApproveV2Job(ApproveV2, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        return vr.Outcome.suspend() if ctx.resume_input is None else vr.Outcome.completed()


async def test_a_resume_value_of_an_older_type_is_dead_naming_the_type(queue: vr.Queue) -> None:
    job_id = await queue.enqueue(Approve())
    await drain(queue, ApproveJob)
    assert await queue.resume(job_id, Decision(ok=True)) == 1  # an old UI still sends the old shape
    await drain(queue, ApproveV2Job)
    info = await queue.get(job_id)
    assert info is not None and info.dead_reason is vr.DeadReason.INVALID_PAYLOAD
    assert (
        info.note
        == "resume input does not validate: stored value does not validate as DecisionV2: by: Field required"
    )


# -- dedup: an enqueue by the new model meets a pending job of the old ------------------------------


class Refresh(vr.Task):
    KIND: ClassVar[str] = "mc.refresh"
    feed: int

    def dedup_key(self) -> str | None:
        return str(self.feed)


class RefreshV2(vr.Task):
    """``feed`` became a str, and a required ``source`` was added: the old job does not validate."""

    KIND: ClassVar[str] = "mc.refresh"
    feed: str
    source: str

    def dedup_key(self) -> str | None:
        return self.feed


class RefreshV2Job(RefreshV2, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        return vr.Outcome.completed(result=self.source)


class Count(vr.Task):
    KIND: ClassVar[str] = "mc.count"
    key: str
    n: int

    def dedup_key(self) -> str | None:
        return self.key

    def merge(self, existing: vr.Pending[Any, Any]) -> vr.Merge[Any, Any]:
        return vr.Merge.with_(Count(key=self.key, n=existing.payload.n + self.n), vr.NoCarry())


class CountV2(vr.Task):
    """``n`` renamed ``amount`` without accepting the old name: merge() cannot be shown the old job."""

    KIND: ClassVar[str] = "mc.count"
    key: str
    amount: int

    def dedup_key(self) -> str | None:
        return self.key

    def merge(self, existing: vr.Pending[Any, Any]) -> vr.Merge[Any, Any]:
        return vr.Merge.with_(
            CountV2(key=self.key, amount=existing.payload.amount + self.amount), vr.NoCarry()
        )


async def test_the_default_merge_replaces_a_pending_job_the_new_model_cannot_read(queue: vr.Queue) -> None:
    old = await queue.enqueue(Refresh(feed=5), delay=3600)  # waits (a retry's backoff would too)
    merged = await queue.enqueue(RefreshV2(feed="5", source="rss"))  # before: PayloadError
    assert merged == old
    assert (await queue.get(old)).payload == {"feed": "5", "source": "rss"}  # type: ignore[union-attr]
    assert [e.details.get("decision") for e in await queue.journal(old) if e.event == "merged"] == ["replace"]


async def test_a_custom_merge_that_cannot_read_the_pending_job_enqueues_beside_it(
    queue: vr.Queue, caplog: pytest.LogCaptureFixture
) -> None:
    old = await queue.enqueue(Count(key="k", n=2))
    with caplog.at_level(logging.WARNING, logger="venturi_redis.dedup"):
        new = await queue.enqueue(CountV2(key="k", amount=3))  # before: PayloadError
    assert new != old
    assert (await queue.get(old)).payload == {"key": "k", "n": 2}  # type: ignore[union-attr]  # kept as it was
    [record] = [r for r in caplog.records if r.name == "venturi_redis.dedup"]
    text = record.getMessage()
    assert old in text and new in text and "amount: Field required" in text and "Merge.independent" in text
    # The next enqueue merges into the new job, which holds the key now.
    assert await queue.enqueue(CountV2(key="k", amount=4)) == new
    assert (await queue.get(new)).payload == {"key": "k", "amount": 7}  # type: ignore[union-attr]


# -- workflows and offload: results stored by an older result type ------------------------------------


class Total(BaseModel):
    cents: int


class TotalV2(BaseModel):
    cents: int
    currency: str


async def _total_v1(n: int) -> Total:
    return Total(cents=n)


async def _total_v2(n: int) -> TotalV2:
    return TotalV2(cents=n, currency="EUR")


class Sum(vr.Task):
    KIND: ClassVar[str] = "mc.sum"


class SumJob(Sum, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        await ctx.dependency_results()
        return vr.Outcome.completed()


async def test_a_dependency_result_of_an_older_type_kills_the_waiting_job_at_once(
    client: vr.Client, queue: vr.Queue
) -> None:
    v1 = vr.offload(queue=queue.name, kind="mc.total")(_total_v1)
    v2 = vr.offload(queue=queue.name, kind="mc.total")(_total_v2)
    handle = await v1.offload(client, 5)
    await drain(queue, v1)  # the dependency completes under the old code
    parent = await queue.enqueue(Sum(), after=[handle.job_id])  # ready at once: its result is copied
    await drain(queue, v2, SumJob, max_failures=5)
    info = await queue.get(parent)
    assert info is not None
    # Before: failed and retried to its backstop (dead, max_failures, after 5 runs).
    assert (info.dead_reason, info.run_count) == (vr.DeadReason.INVALID_PAYLOAD, 1)
    assert info.note == (
        f"the result of dependency {handle.job_id} (mc.total) cannot be read: "
        "stored value does not validate as TotalV2: currency: Field required"
    )
    # Redriven once the result type accepts the old results, it runs.
    assert await queue.retry(parent)
    v3 = vr.offload(queue=queue.name, kind="mc.total")(_total_v1)
    await drain(queue, v3, SumJob)
    assert (await queue.get(parent)).state is vr.JobState.COMPLETED  # type: ignore[union-attr]


async def test_a_typed_offload_read_of_an_older_result_names_the_job(
    client: vr.Client, queue: vr.Queue
) -> None:
    v1 = vr.offload(queue=queue.name, kind="mc.total2")(_total_v1)
    v2 = vr.offload(queue=queue.name, kind="mc.total2")(_total_v2)
    handle = await v1.offload(client, 5)
    await drain(queue, v1)
    typed = v2.handle(handle.key)  # the web server, deployed with the new return type
    for read in (vr.read_result(client, typed), vr.resolve(client, typed, timeout=5)):
        with pytest.raises(vr.PayloadError) as caught:
            await read
        assert str(caught.value) == (
            f"offload result of job {handle.job_id} cannot be read: stored value does not validate as "
            "TotalV2: currency: Field required; an untyped read (vr.read_result(client, handle.key)) "
            "returns the stored document"
        )
    untyped = await vr.read_result(client, handle.key)
    assert untyped is not None and untyped.value == {"cents": 5}


# -- the dashboard --------------------------------------------------------------------------------------


class Login(vr.Task):
    KIND: ClassVar[str] = "mc.login"
    user: str
    token: str = Field(json_schema_extra={"sensitive": True})


class LoginV2(vr.Task):
    """``token`` renamed ``api_token``: the old jobs' ``token`` is a key the model no longer has."""

    KIND: ClassVar[str] = "mc.login"
    user: str
    api_token: str = Field(default="", json_schema_extra={"sensitive": True})


async def test_the_dashboard_masks_payload_keys_the_new_model_no_longer_declares(
    client: vr.Client, queue: vr.Queue
) -> None:
    old = await queue.enqueue(Login(user="ann", token="tok-very-secret"))
    new = await queue.enqueue(LoginV2(user="bob", api_token="tok-other-secret"))
    app = create_app(client, show_payloads=True, tasks=[LoginV2])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://dash") as h:
        docs = [
            (await h.get(f"/api/queues/{queue.name}/jobs/{i}")).json()["job"]["payload"] for i in (old, new)
        ]
        page = await h.get(f"/queues/{queue.name}/jobs/{old}")
    # Before: the old job's token was shown, its field no longer marked by any model.
    assert docs == [{"user": "ann", "token": "***"}, {"user": "bob", "api_token": "***"}]
    assert "tok-very-secret" not in page.text
