"""The execution context a handler receives with each run."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic

import anyio
import anyio.lowlevel
from pydantic import BaseModel
from typing_extensions import TypeVar, TypeVarTuple, Unpack

from .._model.codec import pack
from .._model.errors import PayloadTooLarge
from .._model.outcome import UNSET
from .._model.records import JournalEntry
from .._model.sizes import PROGRESS_BYTES, over_cap
from .._model.task import NoCarry
from .dependencies import read_dependency_results
from .progress import Progress

CarryT = TypeVar("CarryT", bound=BaseModel, default=NoCarry)
T = TypeVar("T")
Ts = TypeVarTuple("Ts")


class Context(Generic[CarryT]):
    """What a run knows about its job, and where it records evidence.

    Attributes:
        job_id: The job's ULID.
        queue: The name of the queue the job came from.
        kind: The task's KIND.
        run_count: How many times the job has run, this run included.
        failures: Failed runs so far (not counting this one).
        history: The job's journal before this run, oldest first; a task reads
            its past failures here to decide its own fate.
        carry: The typed carry; mutate it freely, it is saved on pause, retry,
            suspend, release and completion.
        resume_input: The value given to ``queue.resume`` if this run follows a
            suspension, else ``None``.
    """

    __slots__ = (
        "_attachment",
        "_cancel_reason",
        "_cancelled",
        "_job",
        "_loop",
        "_progress",
        "_registry",
        "carry",
        "failures",
        "history",
        "job_id",
        "kind",
        "queue",
        "resume_input",
        "run_count",
    )

    def __init__(
        self,
        job_id: str,
        queue: str,
        kind: str,
        run_count: int,
        failures: int,
        history: Sequence[JournalEntry],
        carry: CarryT,
        resume_input: Any = None,
    ) -> None:
        self.job_id = job_id
        self.queue = queue
        self.kind = kind
        self.run_count = run_count
        self.failures = failures
        self.history = history
        self.carry: CarryT = carry
        self.resume_input = resume_input
        self._attachment: Any = UNSET
        # Made on the first wait: most runs are never cancelled nor waited on.
        self._cancelled: anyio.Event | None = None
        self._cancel_reason: str | None = None
        # The claimed job (set by the worker) and its progress writer, made by
        # the first report: most runs never report.
        self._job: Any = None
        self._progress: Progress | None = None
        # The worker's handlers by KIND (set by the worker): dependency results are typed by them.
        self._registry: dict[str, type[Any]] | None = None
        # The worker's event loop, set when a sync handler's thread runs (for from_thread).
        self._loop: asyncio.AbstractEventLoop | None = None

    async def dependency_results(self) -> dict[str, Any]:
        """The result of each job this one waited on (``after=``, ``enqueue_flow``), by job id.

        Typed where the dependency's task declares its result type (an
        ``@vr.offload`` function's return annotation), else the stored
        document (dicts, lists, numbers...), ``None`` for a job that returned
        none. A dependency that went dead or was cancelled, waited past by an
        ``"ignore"`` task, is missing. Empty for a job that waited on nothing.
        Read from the job's own copy, so retention of the dependencies cannot
        remove it (docs/workflows.md).
        """
        job = self._job
        if job is None:  # not a run started by a worker, or the handler has returned
            return {}
        return await read_dependency_results(job.queue, self.job_id, self._registry or {})

    def set_attachment(self, value: Any) -> None:
        """Record structured evidence for this run's journal entry; last write wins.

        Any pydantic-serializable value (dicts, lists, models, datetimes…). It is
        kept for every outcome, a raised error included. Raises PayloadError at
        once if the value cannot be encoded, and PayloadTooLarge if it is over
        the client's ``max_payload_bytes`` (1 MiB by default; every run's
        journal entry keeps its own), so the mistake shows where it is made.
        """
        raw = pack(value)
        job = self._job
        if job is not None and len(raw) > job.queue.client.max_payload_bytes:
            cap = job.queue.client.max_payload_bytes
            raise over_cap("the attachment", len(raw), cap, "max_payload_bytes")
        self._attachment = value

    async def report_progress(self, value: Any) -> None:
        """Report the run's progress: any msgpack-able value (a number, a dict...).

        Written at once to the job (``JobInfo.progress``) and published on the
        queue's event stream (a ``progress`` event), for this run only: a run
        whose lease is gone is refused. Reports closer than 0.2 s apart are
        held back and the newest is written when the interval has passed, or
        before the run's transition: the last value always lands. A report
        that cannot be written is logged, never raised (only a value that
        cannot be encoded raises, ``PayloadError``, at once, and one over
        64 KiB encoded, ``PayloadTooLarge``: a progress value is also an
        event of the queue's stream; put bulk in the attachment or result).
        """
        raw = pack(value)
        if len(raw) > PROGRESS_BYTES:
            raise PayloadTooLarge(
                f"the progress value is {len(raw):,} bytes encoded, over the cap of {PROGRESS_BYTES:,} "
                "(every report is also an event of the queue's stream): report a summary (a count, "
                "a fraction) and keep the detail in the attachment or the result"
            )
        progress = self._progress
        if progress is None:
            if self._job is None:
                raise RuntimeError("report_progress() needs a run started by a worker")
            progress = self._progress = Progress(self._job)
        await progress.report(raw)

    def from_thread(self, fn: Callable[[Unpack[Ts]], Awaitable[T]], /, *args: *Ts) -> T:
        """From a sync handler (a ``def handle``, in its thread): ``await fn(*args)`` on the worker's loop.

        Blocks the handler's thread until it is done and returns its result
        (or raises its error), as ``anyio.from_thread.run`` does. For the
        context's own coroutines (``ctx.from_thread(ctx.report_progress, 0.5)``,
        ``ctx.from_thread(ctx.dependency_results)``, ``ctx.from_thread(ctx.cancelled)``)
        and for async clients in the worker's state. The plain attributes and
        methods (``carry``, ``set_attachment``, ``is_cancelled``...) need no hop.

        Raises:
            RuntimeError: Not called from a sync handler's thread (in an
                ``async def handle``, await ``fn(*args)`` instead), or the
                worker's loop has closed.
        """
        loop = self._loop
        if loop is None:
            raise RuntimeError("ctx.from_thread() is for a sync handler (def handle) in its worker thread")
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            raise RuntimeError("ctx.from_thread() called on the worker's loop: in async def handle, await it")

        async def call() -> T:
            return await fn(*args)

        return asyncio.run_coroutine_threadsafe(call(), loop).result()

    @property
    def attachment(self) -> Any:
        """The attachment set so far (``None`` if none)."""
        return None if self._attachment is UNSET else self._attachment

    def is_cancelled(self) -> bool:
        """Whether the run has been asked to stop: shutdown, a lost lease, or an operator's cancel."""
        return self._cancel_reason is not None

    @property
    def cancel_reason(self) -> str | None:
        """Why the run was asked to stop, once it has been."""
        return self._cancel_reason

    async def cancelled(self) -> None:
        """Wait until the run is asked to stop; for use beside a long await."""
        if self._cancel_reason is not None:
            await anyio.lowlevel.checkpoint()
            return
        if self._cancelled is None:
            self._cancelled = anyio.Event()
        await self._cancelled.wait()

    def _cancel(self, reason: str) -> None:
        if self._cancel_reason is None:
            self._cancel_reason = reason
            if self._cancelled is not None:
                self._cancelled.set()
