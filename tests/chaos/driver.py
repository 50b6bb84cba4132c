"""Drive the transition scripts directly, the way ``venturi_redis/_worker.py`` does.

For tests that need to place each transition at an exact instant: the client
is built with a controlled clock (``vr.Client(redis, clock=...)``), so every
script receives ``now`` from the test instead of Redis TIME.
"""

from __future__ import annotations

from typing import Any

import venturi_redis as vr
from venturi_redis._model.enums import Priority
from venturi_redis._model.records import JOURNAL_FIELDS, journal_from
from venturi_redis._store import calls
from venturi_redis._worker.job import jobs_of


class Clock:
    """A settable millisecond clock for ``vr.Client(clock=...)``."""

    def __init__(self, ms: int = 1_700_000_000_000) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms

    def advance(self, ms: int) -> int:
        self.ms += ms
        return self.ms


def _t(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class Driver:
    """One queue's transitions, called by name, with the keys the worker passes."""

    def __init__(self, queue: vr.Queue, *, max_failures: str = "none") -> None:
        self.q = queue
        self.k = queue.keys
        self.c = queue.client
        self.max_failures = max_failures

    async def _call(self, call: calls.Call) -> Any:
        return await self.c.sender.call(call)

    def _now(self) -> str:
        return self.c._now_arg()

    async def claim(self, count: int, worker: str, token: str, lease_ms: int) -> list[tuple[str, str]]:
        """Claim up to ``count`` jobs; returns (id, token) pairs."""
        reply = await self._call(
            calls.claim(
                self.k, self._now(), count=count, worker=worker, token_base=token, default_lease_ms=lease_ms
            )
        )
        jobs = jobs_of(self.q, calls.claim_reply(reply, token))
        return [(j.id, j.token) for j in jobs]

    async def complete(self, job_id: str, token: str, note: str = "", carry: bytes = b"") -> list[Any]:
        completion = calls.completion(job_id, token, note, b"", carry, b"")
        (one,) = calls.completed(await self._call(calls.complete(self.k, self._now(), [completion])))
        return [1] if one.applied else [0, one.detail]

    async def retry(
        self, job_id: str, token: str, note: str = "boom", base_ms: int = 10, cap_ms: int = 50
    ) -> list[Any]:
        prio = await self.priority(job_id)
        call = calls.retry(
            self.k,
            self._now(),
            job_id=job_id,
            token=token,
            priority=prio,
            note=note,
            attachment=b"",
            carry=b"",
            base_ms=base_ms,
            cap_ms=cap_ms,
            jitter=0.25,
            max_failures=self.max_failures,
        )
        return list(await self._call(call))

    async def pause(self, job_id: str, token: str, delay_ms: int = 0) -> list[Any]:
        prio = await self.priority(job_id)
        call = calls.pause(
            self.k,
            self._now(),
            job_id=job_id,
            token=token,
            priority=prio,
            delay_ms=delay_ms,
            note="",
            attachment=b"",
            carry=b"",
        )
        return list(await self._call(call))

    async def suspend(self, job_id: str, token: str) -> list[Any]:
        call = calls.suspend(
            self.k, self._now(), job_id=job_id, token=token, note="", attachment=b"", carry=b"", output=b""
        )
        return list(await self._call(call))

    async def dead(self, job_id: str, token: str, reason: str = "permanent") -> list[Any]:
        call = calls.dead(
            self.k,
            self._now(),
            job_id=job_id,
            token=token,
            note="gone",
            attachment=b"",
            carry=b"",
            reason=reason,
        )
        return list(await self._call(call))

    async def release(self, job_id: str, token: str) -> list[Any]:
        prio = await self.priority(job_id)
        call = calls.release(
            self.k, self._now(), job_id=job_id, token=token, priority=prio, carry=b"", note=""
        )
        return list(await self._call(call))

    async def extend(self, pairs: list[tuple[str, str]], lease_ms: int) -> calls.Extended:
        """Renew leases: the ids whose lease is no longer ours, and those held whose cancel was asked."""
        call = calls.extend(self.k, self._now(), [(job_id, token, lease_ms) for job_id, token in pairs])
        return calls.extended(await self._call(call))

    async def reclaim(self, batch: int = 100) -> tuple[int, int, list[str]]:
        call = calls.reclaim(self.k, self._now(), batch=batch, max_failures=self.max_failures)
        got = calls.reclaimed(await self._call(call))
        return got.requeued, got.dead, got.ids

    async def priority(self, job_id: str) -> Priority:
        raw = await self.c.redis.hget(self.k.job(job_id), "priority")
        return Priority.parse(_t(raw) if raw else "normal")

    async def where(self, job_id: str) -> list[str]:
        """Every index that holds ``job_id`` (should be exactly one, or none for a missing job)."""
        k = self.k
        keys = {
            **{f"pending:{p.label}": k.pending(p) for p in Priority},
            "running": k.running,
            "suspended": k.suspended,
            "completed": k.completed,
            "dead": k.dead,
            "cancelled": k.cancelled,
        }
        pipe = self.c.redis.pipeline(transaction=False)
        for key in keys.values():
            pipe.zscore(key, job_id)
        scores = await pipe.execute()
        return [name for name, s in zip(keys, scores, strict=True) if s is not None]

    async def events(self, job_id: str) -> list[dict[str, str]]:
        """The job's journal as a reader shows it (what the hash says put back: records.py)."""
        pipe = self.c.redis.pipeline(transaction=True)
        pipe.xrange(self.k.journal(job_id))
        pipe.hmget(self.k.job(job_id), *JOURNAL_FIELDS)
        stream, implied = await pipe.execute()
        raw = journal_from(stream, implied)
        return [{_t(a): _t(b) for a, b in fields.items() if a != b"attachment"} for _, fields in raw]
