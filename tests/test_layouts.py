"""Each wire layout, written twice (Lua and Python), checked against itself by names (issue 37 item 3).

* Every script's header names its KEYS; every builder in ``_store/calls*.py``
  puts keys in KEYS. Both are read as names here (the header's words, the
  ``QueueKeys`` attribute a built key is) and must agree, key by key: a key
  added to one side, or two keys swapped, fails.
* ARGV[1] is `now` and ARGV[2] the queue's prefix, in every script and builder.
* ``lua/include/keys.lua`` builds, from a prefix, the names ``QueueKeys``
  builds in Python: run on the embedded server's Lua, each must be the same.
* The per-job enqueue layout (``JOB_ARGS``, ``lua/include/job_args.lua``) and
  the claim reply (``CLAIM_FIELDS``, ``EXTRA_FIELDS``, ``lua/claim.lua``)
  name the same fields in the same order.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import fakeredis
import pytest

import venturi_redis as vr
from venturi_redis._store import calls, calls_flow, calls_obs, calls_ops, calls_schedule
from venturi_redis._store.keys import QueueKeys
from venturi_redis._store.prepare import Prepared
from venturi_redis._store.scripts import expand

LUA = Path(vr.__file__).resolve().parent.parent / "lua"
K = QueueKeys.for_queue("q")
J = "01J9ZQ4K8V3M0S5B2N7XWYQ1RT"

# A header's words for a key (in order: the first that matches names it) -> its name.
HEADER_NAMES = [
    (r"pending (zsets|sets), CRITICAL", "pending"),
    (r"^retrying zset", "retrying"),
    (r"pending zset", "pending"),
    (r"new job's hash", "job"),
    (r"new job's journal", "journal"),
    (r"^job hash|^the job's hash", "job"),
    (r"^journal stream", "journal"),
    (r"schedule's hash", "schedule"),
    (r"set of schedule ids", "schedules"),
    (r"due index", "schedules_due"),
    (r"schedules wake list", "schedules_wake"),
    (r"stop list", "wake_stop"),
    (r"wake list", "wake"),
    (r"queue meta hash", "meta"),
    (r"event stream", "events"),
    (r"dedup:held", "dedup_held"),
    (r"dedup index", "dedup"),
    (r"limits:state", "limits_state"),
    (r"limits:ready", "limits_ready"),
    (r"limits:parked", "limits_parked"),
    (r"limits hash", "limits"),
    (r"^order:held", "order_held"),
    (r"^order:queue", "order_queue"),
    (r"^order:paused", "order_paused"),
    (r"^order:seq", "order_seq"),
    (r"the finished zset", "finished"),
    (r"^the scratch key journal-compact", "journal_compact"),
    (r"^(running|suspended|completed|dead|cancelled|waiting) zset", None),  # the word itself
]
# An entry starts its comment line or follows two spaces (a KEYS[n] inside prose is no entry).
_ENTRY = re.compile(r"(?:^|(?<=\s\s))KEYS\[(\d+)(?:\.\.(\d+))?\]\s+(?:optional:\s+)?(.+?)(?=\s\s+KEYS\[|$)")


def header_keys(script: str) -> list[str]:
    """The names of a script's KEYS, in order, from its header comment."""
    out: dict[int, str] = {}
    for line in (LUA / f"{script}.lua").read_text().splitlines():
        if not line.startswith("--"):
            if out:
                break
            continue
        text = line[2:].strip()
        if not text.startswith("KEYS["):
            continue  # prose that mentions a key, or a description's second line
        for m in _ENTRY.finditer(text):
            first, last, words = int(m.group(1)), int(m.group(2) or m.group(1)), m.group(3)
            if "i" in m.group(0).split("]")[0]:  # enqueue's per-job keys: checked by their own test
                continue
            for pattern, name in HEADER_NAMES:
                found = re.search(pattern, words)
                if found:
                    for i in range(first, last + 1):
                        out[i] = name or found.group(1)
                    break
            else:
                raise AssertionError(f"{script}.lua: KEYS[{first}] '{words}' names no key this test knows")
    assert sorted(out) == list(range(1, len(out) + 1)), f"{script}.lua: KEYS numbered {sorted(out)}"
    return [out[i] for i in sorted(out)]


def key_names() -> dict[str, str]:
    """Every key a builder below can put in KEYS -> its name."""
    names = {
        getattr(K, a): a
        for a in [
            "running",
            "suspended",
            "completed",
            "dead",
            "cancelled",
            "dedup",
            "dedup_held",
            "meta",
            "wake",
            "events",
            "waiting",
            "retrying",
            "limits",
            "limits_state",
            "limits_parked",
            "limits_ready",
            "schedules",
            "schedules_due",
            "schedules_wake",
            "order_held",
            "order_queue",
            "order_paused",
            "order_seq",
            "journal_compact",
        ]
    }
    names.update({K.pending(p): "pending" for p in vr.Priority})
    names.update({K.job(J): "job", K.journal(J): "journal", K.schedule("s"): "schedule"})
    names[K.wake_stop("w")] = "wake_stop"
    return names


PREPARED = Prepared(J, "k", vr.Priority.NORMAL, 0, b"p", b"", "", "", "", False)
SAMPLE: dict[str, Any] = {
    "job_id": J,
    "token": "t",
    "priority": vr.Priority.NORMAL,
    "new_priority": vr.Priority.NORMAL,
    "note": "",
    "carry": b"",
    "attachment": b"",
    "value": b"",
    "delay_ms": 0,
    "count": 1,
    "worker": "w",
    "token_base": "b",
    "default_lease_ms": 1000,
    "batch": 10,
    "max_failures": "",
    "ids": [J],
    "state": "completed",
    "keep_ms": None,
    "limit": 1,
    "schedule_id": "s",
    "key": "k",
    "pause": True,
}
# Builders whose parameters the samples above do not cover, with theirs.
OVERRIDES: dict[str, dict[str, Any]] = {
    # The general layout (a job with an optional field); the short one: the test below.
    "enqueue": {"jobs": [PREPARED._replace(lease_ms="5000")]},
    "enqueue_flow": {"jobs": [(PREPARED, "fail", [])]},
    "extend": {"leases": [(J, "t", 1000)]},
    "complete": {"completions": [calls.completion(J, "t", "", b"", b"", b"")]},
    "claim": {"stop_key": K.wake_stop("w")},
    "merge": {"holder": J, "old_priority": vr.Priority.NORMAL, "payload": b"", "by": J},
    "schedule_upsert": {
        "next_at": None,
        "anchor": None,
        "definition": dict.fromkeys(calls_schedule.DEFINITION_FIELDS, ""),
    },
}
BUILDERS: dict[str, Any] = {
    "enqueue": calls.enqueue,
    "merge": calls.merge,
    "claim": calls.claim,
    "extend": calls.extend,
    "reclaim": calls.reclaim,
    "complete": calls.complete,
    "pause": calls.pause,
    "suspend": calls.suspend,
    "retry": calls.retry,
    "dead": calls.dead,
    "release": calls.release,
    "cancel": calls.cancel,
    "enqueue_flow": calls_flow.enqueue_flow,
    "progress": calls_obs.progress,
    "resume": calls_ops.resume,
    "retry_dead": calls_ops.retry_dead,
    "cancel_pending": calls_ops.cancel_pending,
    "purge": calls_ops.purge,
    "limit": calls_ops.limit,
    "schedule_upsert": calls_schedule.schedule_upsert,
    "schedule_due": calls_schedule.schedule_due,
    "schedule_fire": calls_schedule.schedule_fire,
    "schedule_pause": calls_schedule.schedule_pause,
    "update": calls_ops.update,
    "order_pause": calls_ops.order_pause,
}


def built(name: str) -> calls.Call:
    fn = BUILDERS[name]
    kwargs: dict[str, Any] = {}
    for param in list(inspect.signature(fn).parameters.values())[2:]:
        if param.name in OVERRIDES.get(name, {}):
            kwargs[param.name] = OVERRIDES[name][param.name]
        elif param.name in SAMPLE:
            kwargs[param.name] = SAMPLE[param.name]
        elif param.default is inspect.Parameter.empty:
            kwargs[param.name] = "x"  # a value the builder passes through as it is
    args = [a for a in kwargs.values()] if name in OVERRIDES and "jobs" in OVERRIDES[name] else None
    if args is not None:
        return fn(K, "", *args)  # type: ignore[no-any-return]
    positional = [
        p for p in list(inspect.signature(fn).parameters.values())[2:] if p.kind is p.POSITIONAL_OR_KEYWORD
    ]
    pos = [kwargs.pop(p.name) for p in positional if p.name in kwargs]
    return fn(K, "", *pos, **kwargs)  # type: ignore[no-any-return]


def test_every_script_has_a_builder_here() -> None:
    assert sorted(BUILDERS) == sorted(p.stem for p in LUA.glob("*.lua"))


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_a_scripts_keys_are_the_ones_its_header_names(name: str) -> None:
    call = built(name)
    assert call.name == name
    names = key_names()
    got = [names.get(k, f"? {k}") for k in call.keys]
    want = header_keys(name)
    if name == "purge":
        want = ["completed" if w == "finished" else w for w in want]
    if name == "enqueue":
        got = got[: len(want)]  # then each job's hash and pending set: the test below
    assert got == want


@pytest.mark.parametrize("name", sorted(set(BUILDERS) - {"enqueue"}))
def test_every_script_but_enqueue_declares_the_slot_guard(name: str) -> None:
    """The scratch key, absent between calls, is declared last (before claim's optional
    stop list): while a Cluster moves the queue's slot, Redis refuses the call before
    it runs (tests/test_cluster_reshard.py)."""
    keys = built(name).keys  # claim's sample rides behind an idle BLPOP: its stop list follows
    if name == "claim":
        assert keys[-2:] == [K.journal_compact, K.wake_stop("w")]
    else:
        assert keys[-1] == K.journal_compact
    if name == "claim":
        plain = calls.claim(K, "", count=1, worker="w", token_base="b", default_lease_ms=1)
        assert plain.keys[-1] == K.journal_compact


def test_enqueue_declares_no_slot_guard() -> None:
    """A single enqueue pays for no extra key: the new job's hash it declares is
    missing on a slot's source until the move ends, which refuses it the same way."""
    assert K.journal_compact not in built("enqueue").keys


def test_enqueue_puts_each_jobs_hash_then_its_pending_set() -> None:
    other = Prepared("01J9ZQ4K8V3M0S5B2N7XWYQ1RU", "k", vr.Priority.HIGH, 0, b"p", b"", "", "", "", False)
    call = calls.enqueue(K, "", [PREPARED, other])
    assert call.keys[3:] == [
        K.job(J),
        K.pending(vr.Priority.NORMAL),
        K.job(other.id),
        K.pending(vr.Priority.HIGH),
    ]


def test_a_plain_single_enqueue_sends_the_short_layout() -> None:
    call = calls.enqueue(K, "", [PREPARED])
    assert call.keys == [K.dedup, K.wake, K.meta, K.job(J), K.pending(vr.Priority.NORMAL)]
    assert call.args == ["", *calls.job_args(PREPARED)[: len(calls.JOB_ARGS) - 1]]
    assert K.meta == K.prefix + "meta"  # enqueue.lua takes the prefix from the meta key
    header = (LUA / "enqueue.lua").read_text()
    assert re.search(r"ARGV\[2\.\.7\]\s+the job's six fixed values", header)
    assert "string.sub(KEYS[3], 1, -5)" in header  # -5: drops "meta"
    # Anything else sends the general layout: now, then the prefix.
    general: list[tuple[list[Prepared], dict[str, Any]]] = [
        ([PREPARED._replace(lease_ms="5000")], {}),
        ([PREPARED._replace(carry=b"c")], {}),
        ([PREPARED], {"dedup_mode": "force"}),
        ([PREPARED], {"offload": [("tok", 1000)]}),
        ([PREPARED, PREPARED._replace(id="01J9ZQ4K8V3M0S5B2N7XWYQ1RU")], {}),
    ]
    for jobs, options in general:
        assert calls.enqueue(K, "", jobs, **options).args[:3] == ["", K.prefix, len(jobs)], (jobs, options)


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_argv_starts_with_now_and_the_prefix(name: str) -> None:
    call = built(name)
    assert call.args[:2] == ["", K.prefix]
    header = (LUA / f"{name}.lua").read_text()
    assert re.search(r"ARGV\[1\]\s+now", header), f"{name}.lua: ARGV[1] is not documented as now"
    assert re.search(r"ARGV\[2\]\s+(the )?key prefix", header), f"{name}.lua: ARGV[2] is not the key prefix"


HIGH_FIRST = (vr.Priority.CRITICAL, vr.Priority.HIGH, vr.Priority.NORMAL, vr.Priority.LOW)
KEYS_LUA = """
-- @include keys.lua
local p, id = ARGV[1], ARGV[2]
local job, journal = job_keys(p, id)
local deps, dependents, depresults = graph_keys(p, id)
local f = feature_keys(p)
local g = graph_queue_keys(p)
return {job, journal, events_key(p), journal_scratch_key(p), offload_key(p, 'tok'), deps, dependents,
  depresults, graph_orphans_key(p), f.events, f.wake, f.limits, f.limits_state, f.limits_parked,
  f.limits_ready, f.limits_rings, retrying_key(p), f.expiring, expiring_key(p), g.waiting, g.dead,
  g.wake, g.pending.critical, g.pending.high,
  g.pending.normal, g.pending.low, dedup_held_key(p), dedup_index_key(p), f.order_held, f.order_queue,
  f.order_paused, f.order_seq, f.order_ended, history_keys(p, '1765000020', '1764997200')}
"""


def test_keys_lua_names_every_key_as_keys_py_does() -> None:
    source = expand(KEYS_LUA, lambda inc: (LUA / "include" / inc).read_text())
    r = fakeredis.FakeStrictRedis()
    got = [x.decode() for x in r.eval(source, 0, K.prefix, J)]
    want = [
        K.job(J), K.journal(J), K.events, K.journal_compact, K.offload("tok"), K.deps(J), K.dependents(J),
        K.depresults(J), K.graph_orphans, K.events, K.wake, K.limits, K.limits_state, K.limits_parked,
        K.limits_ready, K.limits_rings, K.retrying, K.expiring, K.expiring, K.waiting, K.dead, K.wake,
        *(K.pending(p) for p in HIGH_FIRST), K.dedup_held, K.dedup, K.order_held, K.order_queue,
        K.order_paused, K.order_seq, K.order_ended, K.history_minute(1765000020), K.history_hour(1764997200),
    ]  # fmt: skip
    assert got == want
    # Every name-building helper of keys.lua is in the script above.
    helpers = set(
        re.findall(r"^local function (\w+)\(prefix", (LUA / "include" / "keys.lua").read_text(), re.M)
    )
    assert helpers <= set(re.findall(r"(\w+)\(p\b", KEYS_LUA)), helpers


def test_the_per_job_enqueue_layout_is_the_same_on_both_sides() -> None:
    lua = (LUA / "include" / "job_args.lua").read_text()
    m = re.search(r"local function job_at\(a\)\s*return (.+?)\s*end", lua, re.S)
    assert m is not None
    slots = re.findall(r"ARGV\[a(?: \+ (\d+))?\]", m.group(1))
    assert [int(s or 0) for s in slots] == list(range(len(calls.JOB_ARGS)))
    assert re.search(r"local JOB_ARGS = (\d+)", lua).group(1) == str(len(calls.JOB_ARGS))  # type: ignore[union-attr]
    documented = re.search(r"--\s*(id, kind, priority[^\n]*)", lua)
    assert documented is not None
    fields = [re.sub(r"\s*\(.*\)", "", w).strip(" .,").split(" ")[0] for w in documented.group(1).split(",")]
    assert fields[: len(calls.JOB_ARGS)] == list(calls.JOB_ARGS)
    assert calls.job_args(PREPARED)[: len(calls.JOB_ARGS)] == [J, "k", "normal", 0, "", b"p", 0]


def test_the_claim_reply_names_its_fields_as_claim_lua_writes_them() -> None:
    lua = (LUA / "claim.lua").read_text()
    written = re.findall(r"out\[o \+ (\d+)\] = (\w+)", lua)
    # claim.lua's locals -> the CLAIM_FIELDS name each is.
    local = {"run": "run_count", "created": "created_at", "eligible": "eligible_at"}
    assert [int(i) for i, _ in written] == list(range(1, len(calls.CLAIM_FIELDS) + 1))
    assert [local.get(v, v) for _, v in written] == list(calls.CLAIM_FIELDS)
    extras = re.search(r"extras = \{(.+?)\}", lua, re.S)
    assert extras is not None
    names = [re.match(r"\s*(\w+)", part).group(1) for part in extras.group(1).split(",")]  # type: ignore[union-attr]
    local_extra = {"maxf": "max_failures", "resume": "resume_input"}
    assert [local_extra.get(n, n) for n in names] == list(calls.EXTRA_FIELDS)
