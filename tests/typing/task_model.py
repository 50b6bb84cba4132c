"""Declaring tasks as docs/design.md, docs/dedup.md and docs/semantics.md show.

Each negative line ends with the mypy code and the pyright rule that must
report it: an ignore that is no longer needed is an error under both checkers
(warn_unused_ignores, reportUnnecessaryTypeIgnoreComment), so a type that
loosens to Any fails the check.
"""

from datetime import timedelta
from typing import Any, ClassVar, Literal, Self, assert_type

from pydantic import BaseModel, Field

import venturi_redis as vr


class Seen(BaseModel):
    merges: int = 0


class Refresh(vr.Task[Seen]):
    KIND: ClassVar[str] = "refresh"
    feed_id: str
    urls: list[str]

    def dedup_key(self) -> str | None:
        return self.feed_id

    def merge(self, existing: vr.Pending["Refresh", Seen]) -> vr.Merge["Refresh", Seen]:
        assert_type(existing.payload, Refresh)
        assert_type(existing.carry, Seen)
        assert_type(existing.run_count, int)
        union = sorted(set(existing.payload.urls) | set(self.urls))
        merged = vr.Merge.with_(
            Refresh(feed_id=self.feed_id, urls=union), Seen(merges=existing.carry.merges + 1)
        )
        assert_type(merged, vr.Merge[Refresh, Seen])
        return merged


class Keep(vr.Task):
    """Every other merge decision, and Self in a merge's signature."""

    KIND: ClassVar[str] = "keep"
    key: str

    def dedup_key(self) -> str | None:
        return self.key

    def merge(self, existing: vr.Pending[Self, vr.NoCarry]) -> vr.Merge[Self, vr.NoCarry]:
        if existing.payload.key == "replace":
            return vr.Merge.replace()
        if existing.payload.key == "independent":
            return vr.Merge.independent()
        return vr.Merge.keep()


class Digest(vr.Task):
    KIND: ClassVar[str] = "digest"
    user: str

    def dedup_key(self) -> str | None:
        return self.user

    @classmethod
    def dedup_window(cls) -> timedelta:
        return timedelta(hours=1)

    @classmethod
    def debounce(cls) -> float:
        return 0.3


class Everything(vr.Task):
    """Every hook a task may override, with the types docs/design.md gives them."""

    KIND: ClassVar[str] = "everything"
    RESUME: ClassVar[type[Seen]] = Seen
    to: str
    token: str = Field(json_schema_extra={"sensitive": True})

    def priority(self) -> vr.Priority:
        return vr.Priority.HIGH

    def backoff(self) -> vr.Backoff | None:
        return vr.Backoff.fibonacci(base=5, cap=timedelta(minutes=1))

    def on_dependency_failure(self) -> Literal["fail", "ignore"]:
        return "ignore"

    def limit_key(self) -> str | None:
        return self.to.rsplit("@", 1)[1]

    def order_key(self) -> str | None:
        return self.to

    def timeout(self) -> float | None:
        return 30.0

    def expires(self) -> float | timedelta | None:
        return timedelta(minutes=10)


def reading_a_task() -> None:
    task = Everything(to="a@b.example", token="x")
    assert_type(task.priority(), vr.Priority)
    assert_type(Everything.kind(), str)
    assert_type(task.backoff(), vr.Backoff | None)
    assert_type(Refresh.carry_type(), type[BaseModel])
    assert_type(vr.Backoff.fibonacci(), vr.Backoff)
    assert_type(vr.Backoff.fibonacci().delay("job", 3), float)
    assert_type(vr.backoff_delay("job", 3, base=1.0, cap=600.0, jitter=0.25), float)
    assert_type(vr.TaskError.permanent("why"), vr.TaskError)


# -- what a checker must refuse ------------------------------------------------


class WrongPriority(vr.Task):
    KIND: ClassVar[str] = "wrong-priority"

    def priority(self) -> str:  # type: ignore[override]  # pyright: ignore[reportIncompatibleMethodOverride]
        return "high"


class WrongMerge(vr.Task[Seen]):
    KIND: ClassVar[str] = "wrong-merge"

    def merge(self, existing: vr.Pending["WrongMerge", Seen]) -> vr.Merge["WrongMerge", Seen]:
        # The carry must be the task's declared carry model.
        return vr.Merge.with_(self, vr.NoCarry())  # type: ignore[arg-type]  # pyright: ignore[reportReturnType]


def refused(task: Refresh, anything: Any) -> None:
    Refresh(feed_id="f")  # type: ignore[call-arg]  # pyright: ignore[reportCallIssue]
    Refresh(feed_id=1, urls=[])  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]

    vr.Backoff.fibonacci(base="5")  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]
