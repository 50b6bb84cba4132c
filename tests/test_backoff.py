"""The retry schedule, and its agreement with the Lua copy on both backends."""

from __future__ import annotations

from pathlib import Path

import pytest

import venturi_redis as vr
from venturi_redis._model.backoff import delay_ms, fib_multiplier
from venturi_redis._model.ids import new_job_id
from venturi_redis._store.scripts import expand

pytestmark = pytest.mark.anyio

LUA = Path(__file__).resolve().parent.parent / "lua"


def test_multipliers_follow_fib_minus_one() -> None:
    assert [fib_multiplier(n) for n in range(1, 10)] == [0, 0, 1, 2, 4, 7, 12, 20, 33]


def test_no_jitter_is_the_plain_curve() -> None:
    got = [
        vr.backoff_delay("01J0000000000000000000000A", n, base=1.0, cap=600.0, jitter=0.0)
        for n in range(1, 8)
    ]
    assert got == [0.0, 0.0, 1.0, 2.0, 4.0, 7.0, 12.0]


def test_cap_is_a_hard_ceiling_even_for_huge_attempts() -> None:
    assert vr.backoff_delay("x", 10_000, base=1.0, cap=600.0, jitter=0.0) == 600.0
    assert vr.backoff_delay("x", 10_000, base=1.0, cap=600.0, jitter=0.5) <= 600.0


@pytest.mark.parametrize("jitter", [0.1, 0.25, 1.0])
def test_jitter_lands_in_range_and_is_deterministic(jitter: float) -> None:
    ids = [new_job_id() for _ in range(500)]
    for n in (3, 5, 9):
        d = vr.backoff_delay(ids[0], n, base=1.0, cap=600.0, jitter=0.0)
        delays = [vr.backoff_delay(i, n, base=1.0, cap=600.0, jitter=jitter) for i in ids]
        assert all(d * (1 - jitter) - 0.001 <= x <= d for x in delays)
        assert delays == [vr.backoff_delay(i, n, base=1.0, cap=600.0, jitter=jitter) for i in ids]
        assert len(set(delays)) > 50  # actually spread, not one constant offset


def test_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="jitter"):
        vr.backoff_delay("x", 1, base=1, cap=1, jitter=1.5)
    with pytest.raises(ValueError, match="attempt"):
        delay_ms("x", 0, 1000, 1000, 0.1)
    with pytest.raises(ValueError, match="base"):
        vr.Backoff.fibonacci(base=-1)


def _agreement_script() -> str:
    body = """
-- @include backoff.lua
local out = {}
local base, cap, jitter = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
for i = 4, #ARGV, 2 do
  out[#out + 1] = backoff_delay_ms(ARGV[i], tonumber(ARGV[i + 1]), base, cap, jitter)
end
return out
"""
    return expand(body, lambda name: (LUA / "include" / name).read_text())


async def test_lua_and_python_agree_exactly(client: vr.Client) -> None:
    src = _agreement_script()
    cases = [(new_job_id(), attempt) for attempt in range(1, 21) for _ in range(150)]
    for base_ms, cap_ms, jitter in [(1000, 600_000, 0.25), (250, 3_600_000, 1.0), (7, 10_000, 0.5)]:
        args: list[object] = [base_ms, cap_ms, repr(jitter)]
        for job_id, attempt in cases:
            args += [job_id, attempt]
        got = await client.redis.eval(src, 0, *args)
        want = [delay_ms(j, a, base_ms, cap_ms, jitter) for j, a in cases]
        assert [int(x) for x in got] == want


def test_the_retry_schedule_table_in_the_docs_is_the_default_schedule() -> None:
    text = (Path(__file__).resolve().parent.parent / "docs" / "design.md").read_text()
    block = text.split("<!-- retry-schedule -->", 1)[1].strip().splitlines()
    header, _, plain, jittered = (row.strip().strip("|").split("|") for row in block[:4])
    retries = [int(c.strip().rstrip("+")) for c in header[1:]]
    assert retries == list(range(1, len(retries) + 1))
    worker = vr.Worker(vr.Client.from_url("memory://schedule").queue("q"), handle_signals=False)
    policy, worker_jitter = worker.backoff, worker.jitter  # the defaults the table must show
    for n, plain_cell, jitter_cell in zip(retries, plain[1:], jittered[1:], strict=True):
        d = policy.delay("01JOB", n)
        assert float(plain_cell) == d
        low, _, high = jitter_cell.strip().partition("\N{EN DASH}")
        assert (float(low), float(high or low)) == (d * (1 - worker_jitter), d)
        # every id lands inside the stated range
        for job_id in ("01A", "01B", "01C", "01D"):
            got = policy.delay(job_id, n, jitter=worker_jitter)
            assert d * (1 - worker_jitter) - 0.001 <= got <= d
    assert policy.delay("01JOB", retries[-1] + 10) == float(plain[-1])  # "15+": the cap
