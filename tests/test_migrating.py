"""docs/migrating.md, and what a user moving code from Celery, RQ, arq or Dramatiq writes first.

The page's venturi blocks run in tests/test_docs_runnable.py; here, that the
page is there to be found (linked from the README and the glossary, and
runnable where it claims to be), and that the first mistakes such a user
makes (a peer's enqueue option, a function or a class where a task goes, a
handler that returns its value or nothing) are met by an error that says
what to write instead.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, ClassVar

import pytest

import venturi_redis as vr
from tests.helpers import drain
from tests.tasks import Echo

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "migrating.md"


def test_the_page_is_linked_from_the_readme_and_the_glossary() -> None:
    assert "`docs/migrating.md`" in (ROOT / "README.md").read_text()
    assert "](migrating.md)" in (ROOT / "docs" / "glossary.md").read_text()


def test_every_section_of_the_page_that_shows_venturi_code_runs_it() -> None:
    """Each how-to section's venturi program is marked runnable (so the suite runs it)."""
    text = PAGE.read_text()
    sections = re.split(r"^## ", text, flags=re.M)[1:]
    runnable = {s.splitlines()[0] for s in sections if "<!-- runnable -->\n```python" in s}
    assert runnable == {
        "Defining a task, calling it, getting its result",
        "Retries with backoff",
        "Unique and deduplicated jobs",
        "Periodic tasks and rate limits",
        "Chains, groups and chords",
        "Synchronous code, the worker command and concurrency",
        "Testing",
    }
    for peer in ("Celery", "RQ", "arq", "Dramatiq"):
        assert text.count(f"# {peer}") >= 3, peer  # its snippets, side by side with ours


@pytest.mark.parametrize(
    ("option", "value", "hint"),
    [
        ("countdown", 60, "use delay="),  # Celery
        ("eta", None, "use at="),  # Celery
        ("queue", "emails", r"use client\.queue\(name\)\.enqueue"),  # Celery
        ("_defer_by", 60, "use delay="),  # arq
        ("_job_id", "feed-42", r"use the task's dedup_key\(\)"),  # arq
        ("job_timeout", 30, "use timeout="),  # RQ
        ("depends_on", "x", "use after="),  # RQ
        ("max_retries", 5, "use max_failures="),  # Celery, Dramatiq
    ],
)
@pytest.mark.parametrize("face", ["queue", "sharded", "sync"])
async def test_a_peers_enqueue_option_names_ours(
    client: vr.Client, url: str, queue_name: str, face: str, option: str, value: object, hint: str
) -> None:
    q: Any
    sc = None
    if face == "queue":
        q = client.queue(queue_name)
    elif face == "sharded":
        q = vr.ShardedQueue(client, queue_name, partitions=2)
    else:
        sc = vr.SyncClient(url)
        q = sc.queue(queue_name)
    said = rf"enqueue\(\) got an unexpected keyword argument '{option}': {hint}"
    try:
        if face == "sync":
            with pytest.raises(TypeError, match=said):
                q.enqueue(Echo(text="x"), **{option: value})
        else:
            with pytest.raises(TypeError, match=said):
                await q.enqueue(Echo(text="x"), **{option: value})
        assert not any((await client.queue(queue_name).counts()).values())
    finally:
        if sc is not None:
            sc.close()


async def test_enqueue_many_names_the_options_only_enqueue_takes(queue: vr.Queue) -> None:
    with pytest.raises(TypeError, match=r"'after': only enqueue\(\) takes it, one job at a time"):
        await queue.enqueue_many([Echo(text="x")], after=[])
    with pytest.raises(TypeError, match=r"'countdown': use delay="):
        await queue.enqueue_many([Echo(text="x")], countdown=5)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'dealy'$"):  # no guess at typos
        await queue.enqueue_many([Echo(text="x")], dealy=5)


class Returns(vr.Task):
    KIND: ClassVar[str] = "migrating.returns"
    value: int | None


class ReturnsJob(Returns, vr.Handler[None]):
    def handle(self, ctx: vr.Context[vr.NoCarry], state: None) -> Any:  # as a Celery task body would
        return self.value


@pytest.mark.parametrize(
    ("value", "said"),
    [
        (5, "got int: to store it as the job's result, `return vr.Outcome.completed(result=value)`"),
        (None, "got None (it ended without a return): end it with `return vr.Outcome.completed()`"),
    ],
)
async def test_a_handler_that_returns_its_value_is_told_how_to_return_it(
    queue: vr.Queue, value: int | None, said: str
) -> None:
    job_id = await queue.enqueue(Returns(value=value))  # the default backstop: 25 failed runs
    await drain(queue, ReturnsJob)
    info = await queue.get(job_id)
    # Dead at its first run: a retry would run the handler's side effects again.
    assert info is not None and info.state is vr.JobState.DEAD and info.run_count == 1
    assert info.dead_reason is vr.DeadReason.PERMANENT
    assert info.note == f"ReturnsJob.handle() must return a vr.Outcome, {said}"


class Fixed(vr.Task):
    KIND: ClassVar[str] = "migrating.returns"  # the same KIND, its handler fixed in a later deploy
    value: int | None


class FixedJob(Fixed, vr.Handler[None]):
    def handle(self, ctx: vr.Context[vr.NoCarry], state: None) -> vr.Outcome:
        return vr.Outcome.completed(result=self.value)


async def test_jobs_a_handler_returned_no_outcome_for_come_back_by_their_error_type(queue: vr.Queue) -> None:
    returned = await queue.enqueue(Returns(value=None))
    raised = await queue.enqueue(Returns(value=-1), max_failures=1)

    class SomeRaise(ReturnsJob):  # the same KIND: returns None, or raises for -1
        def handle(self, ctx: vr.Context[vr.NoCarry], state: None) -> Any:
            if self.value == -1:
                raise KeyError(self.value)
            return None

    await drain(queue, SomeRaise)
    assert await queue.retry_dead(error_type="TypeError") == [returned]  # the fix is deployed
    await drain(queue, FixedJob)
    back, still = await queue.get(returned), await queue.get(raised)
    assert back is not None and back.state is vr.JobState.COMPLETED and back.run_count == 2
    assert still is not None and still.state is vr.JobState.DEAD


def send_welcome(user_id: int) -> None:  # an RQ or Celery task, as written there
    del user_id


@vr.offload(queue="migrating", kind="migrating.build")
async def build(n: int) -> int:
    return n


@pytest.mark.parametrize(
    ("value", "said"),
    [
        (Echo, r"got the class Echo: build one, Echo\(field=\.\.\.\)$"),
        (send_welcome, r"got the function send_welcome: a job is a vr\.Task subclass .* @vr\.offload"),
        (build, r"got the @vr\.offload function build: enqueue it with build\.offload\(client, \.\.\.\)$"),
        ("send_welcome", r"got str$"),
    ],
    ids=["class", "function", "offload", "str"],
)
@pytest.mark.parametrize("face", ["queue", "many", "sharded", "sync", "schedule"])
async def test_enqueueing_what_is_no_task_says_what_to_pass(
    client: vr.Client, url: str, queue_name: str, face: str, value: Any, said: str
) -> None:
    call = "schedule()" if face == "schedule" else "enqueue"
    match = rf"{re.escape(call)} expects a vr\.Task instance, {said}"
    sc = None
    try:
        if face == "sync":
            sc = vr.SyncClient(url)
            with pytest.raises(vr.TaskDefinitionError, match=match):
                sc.queue(queue_name).enqueue(value)
        elif face == "many":
            with pytest.raises(vr.TaskDefinitionError, match=match):
                await client.queue(queue_name).enqueue_many([Echo(text="x"), value])
        elif face == "sharded":
            with pytest.raises(vr.TaskDefinitionError, match=match):
                await vr.ShardedQueue(client, queue_name, partitions=2).enqueue(value)
        elif face == "schedule":
            with pytest.raises(vr.TaskDefinitionError, match=match):
                await client.queue(queue_name).schedule("s", value, every=60)
        else:
            with pytest.raises(vr.TaskDefinitionError, match=match):
                await client.queue(queue_name).enqueue(value)
        assert not any((await client.queue(queue_name).counts()).values())
    finally:
        if sc is not None:
            sc.close()


async def test_registering_the_task_instead_of_its_handler_says_which_class_to_write(queue: vr.Queue) -> None:
    with pytest.raises(
        vr.TaskDefinitionError,
        match=r"got <class '.*Echo'>: register its handler, class EchoJob\(Echo, vr\.Handler\[\.\.\.\]\)",
    ):
        vr.Worker(queue).register(Echo)


class OldBody(vr.Task):
    KIND: ClassVar[str] = "migrating.old_body"
    user_id: int


class NoParams(OldBody, vr.Handler[None]):
    def handle(self) -> vr.Outcome:  # type: ignore[override]
        return vr.Outcome.completed()


class CeleryParams(OldBody, vr.Handler[None]):
    def handle(self, user_id: int) -> vr.Outcome:  # type: ignore[override]
        return vr.Outcome.completed()


class AsyncNoState(OldBody, vr.Handler[None]):
    async def handle(self, ctx: vr.Context[vr.NoCarry]) -> vr.Outcome:  # type: ignore[override]
        return vr.Outcome.completed()


class Defaults(OldBody, vr.Handler[None]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: None = None) -> vr.Outcome:
        return vr.Outcome.completed()


class Star(OldBody, vr.Handler[None]):
    def handle(self, *args: Any) -> vr.Outcome:  # type: ignore[override]
        return vr.Outcome.completed()


@pytest.mark.parametrize(
    ("handler", "sig"),
    [
        (NoParams, "(self)"),
        (CeleryParams, "(self, user_id)"),
        (AsyncNoState, "(self, ctx)"),
    ],
)
async def test_a_handle_that_cannot_take_ctx_and_state_is_refused_at_registration(
    queue: vr.Queue, handler: type[Any], sig: str
) -> None:
    with pytest.raises(
        vr.TaskDefinitionError,
        match=rf"{handler.__qualname__}\.handle{re.escape(sig)} cannot be called as handle\(ctx, state\)",
    ):
        vr.Worker(queue).register(handler)


@pytest.mark.parametrize("handler", [Defaults, Star])
async def test_a_handle_that_can_take_ctx_and_state_runs(queue: vr.Queue, handler: type[Any]) -> None:
    job_id = await queue.enqueue(OldBody(user_id=1))
    await drain(queue, handler)
    info = await queue.get(job_id)
    assert info is not None and info.state is vr.JobState.COMPLETED
