"""Security promises that a mutation campaign found no test defending (docs/dashboard.md,
"Security"; docs/guarantees.md, "Sensitive fields stay out of what operators read").

Each test here failed with its mutant applied: a dropped CSRF check, a secret let
through, a guard loosened.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import pydantic
import pytest
from pydantic import Field

import venturi_redis as vr
from tests.helpers import drain

pytestmark = pytest.mark.anyio

CARD = "4242424242424242"


class PinCarry(pydantic.BaseModel):
    pin: str = Field("", json_schema_extra={"sensitive": True})


class Charge(vr.Task):
    KIND: ClassVar[str] = "sec-charge"
    card: str = Field(json_schema_extra={"sensitive": True})


class ChargeJob(Charge, vr.Handler[PinCarry]):
    async def handle(self, ctx: vr.Context[PinCarry], state: Any) -> vr.Outcome:
        ctx.carry = PinCarry(pin="9876-secret")
        raise ValueError(f"card {self.card} declined (pin {ctx.carry.pin})")


async def test_a_failed_runs_log_line_masks_the_secrets_even_at_debug(
    queue: vr.Queue, caplog: pytest.LogCaptureFixture
) -> None:
    """At DEBUG the failed-run WARNING carries the run's traceback: scrubbed as the note is."""
    caplog.set_level(logging.DEBUG, logger="venturi_redis.worker")
    job_id = await queue.enqueue(Charge(card=CARD), max_failures=1)
    await drain(queue, ChargeJob)
    assert (await queue.get(job_id)).note == "card *** declined (pin ***)"  # type: ignore[union-attr]
    (line,) = [r for r in caplog.records if "failed:" in r.getMessage() and job_id in r.getMessage()]
    text = logging.Formatter().format(line)
    assert "card *** declined (pin ***)" in text and "Traceback" in text
    assert CARD not in text and "9876-secret" not in text
