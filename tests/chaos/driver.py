"""Drive the transition scripts directly, the way ``venturi_redis/_worker.py`` does.

For tests that need to place each transition at an exact instant: the client
is built with a controlled clock (``vr.Client(redis, clock=...)``), so every
script receives ``now`` from the test instead of Redis TIME.
"""

from __future__ import annotations

from typing import Any

import venturi_redis as vr
from venturi_redis._model.enums import Priority
from venturi_redis._worker.runner import _parse_claim


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

    async def _call(self, name: str, keys: list[str], args: list[Any]) -> Any:
        return await self.c.scripts.call(self.c.redis, name, keys, args)

    async def claim(self, count: int, worker: str, token: str, lease_ms: int) -> list[tuple[str, str]]:
        """Claim up to ``count`` jobs; returns (id, token) pairs."""
        k = self.k
        reply = await self._call(
            "claim",
            k.claim,
            [k.prefix, self.c.now_arg(), count, worker, token, lease_ms],
        )
        _, _, jobs = _parse_claim(self.q, reply)
        return [(j.id, j.token) for j in jobs]

    async def complete(self, job_id: str, token: str, note: str = "", carry: bytes = b"") -> list[Any]:
        k = self.k
        (one,) = await self._call(
            "complete",
            [k.running, k.completed],
            [k.prefix, self.c.now_arg(), 1, job_id, token, note, b"", carry, b""],
        )
        return [1] if one == 1 else [0, one]

    async def retry(
        self, job_id: str, token: str, note: str = "boom", base_ms: int = 10, cap_ms: int = 50
    ) -> list[Any]:
        k = self.k
        prio = await self.priority(job_id)
        return list(
            await self._call(
                "retry",
                [k.job(job_id), k.journal(job_id), k.running, k.pending(prio), k.dead, k.dedup],
                [
                    job_id,
                    token,
                    self.c.now_arg(),
                    note,
                    b"",
                    b"",
                    base_ms,
                    cap_ms,
                    "0.25",
                    self.max_failures,
                    k.wake,
                ],
            )
        )

    async def pause(self, job_id: str, token: str, delay_ms: int = 0) -> list[Any]:
        k = self.k
        prio = await self.priority(job_id)
        return list(
            await self._call(
                "pause",
                [k.job(job_id), k.journal(job_id), k.running, k.pending(prio), k.dedup],
                [job_id, token, self.c.now_arg(), delay_ms, "", b"", b"", k.wake],
            )
        )

    async def suspend(self, job_id: str, token: str) -> list[Any]:
        k = self.k
        return list(
            await self._call(
                "suspend",
                [k.job(job_id), k.journal(job_id), k.running, k.suspended],
                [job_id, token, self.c.now_arg(), "", b"", b"", b""],
            )
        )

    async def dead(self, job_id: str, token: str, reason: str = "permanent") -> list[Any]:
        k = self.k
        return list(
            await self._call(
                "dead",
                [k.job(job_id), k.journal(job_id), k.running, k.dead],
                [job_id, token, self.c.now_arg(), "gone", b"", b"", reason],
            )
        )

    async def release(self, job_id: str, token: str) -> list[Any]:
        k = self.k
        prio = await self.priority(job_id)
        return list(
            await self._call(
                "release",
                [k.job(job_id), k.journal(job_id), k.running, k.pending(prio), k.dedup],
                [job_id, token, self.c.now_arg(), b"", "", k.wake],
            )
        )

    async def extend(self, pairs: list[tuple[str, str]], lease_ms: int) -> list[str]:
        """Renew leases; returns the ids whose lease is no longer ours."""
        args: list[Any] = [self.k.prefix, self.c.now_arg()]
        for job_id, token in pairs:
            args += [job_id, token, lease_ms]
        return [_t(x) for x in await self._call("extend", [self.k.running], args)]

    async def reclaim(self, batch: int = 100) -> tuple[int, int, list[str]]:
        k = self.k
        reply = await self._call(
            "reclaim",
            [k.running, k.dead, k.dedup],
            [k.prefix, self.c.now_arg(), batch, self.max_failures, k.wake],
        )
        return int(reply[0]), int(reply[1]), [_t(x) for x in reply[2:]]

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
        raw = await self.c.redis.xrange(self.k.journal(job_id))
        return [{_t(a): _t(b) for a, b in fields.items() if a != b"attachment"} for _, fields in raw]
