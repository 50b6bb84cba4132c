"""The scripts' conventions, read from the sources (CONTRIBUTING.md, "Lua").

* ARGV[1] is ``now`` and ARGV[2] the queue's key prefix, in every script.
* Keys are never spliced from data: outside ``lua/include/keys.lua`` no
  script concatenates a key name (``prefix .. 'job:'``, ``.. 'pending:'``,
  ``.. 'cancelled'``...), so a key a script touches is either in KEYS or
  comes from keys.lua's helpers, which take the prefix and an id, or, for
  the pending sets, pick one of KEYS by the priority field.
* Every KEYS index a script reads is in its header, and the calls that
  ``calls.py`` builds pass exactly as many keys as the header lists, every
  one in the queue's hash tag (so the same scripts run on Redis Cluster).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import venturi_redis as vr
from venturi_redis._store import calls, calls_flow, calls_obs, calls_ops, calls_schedule
from venturi_redis._store.keys import QueueKeys
from venturi_redis._store.prepare import Prepared
from venturi_redis._store.scripts import ScriptSet

LUA = Path(vr.__file__).resolve().parent.parent / "lua"
SCRIPTS = sorted(p.stem for p in LUA.glob("*.lua"))
# The names keys.py gives a queue's keys; none may follow a `..` outside keys.lua.
KEY_SUFFIXES = (
    "job:|journal:|pending:|offload:|deps:|dependents:|depresults:|"
    "running|suspended|completed|dead|cancelled|dedup|meta|wake|waiting"
)


def _code(text: str) -> str:
    """``text`` without its ``--`` comments (strings kept)."""
    return "\n".join(re.sub(r"--.*$", "", line) for line in text.splitlines())


def _header(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if line.startswith("--"))


def test_every_script_takes_now_then_the_prefix() -> None:
    for name in SCRIPTS:
        header = _header((LUA / f"{name}.lua").read_text())
        assert re.search(r"ARGV\[1\]\s+now in ms", header), name
        assert re.search(r"ARGV\[2\]\s+key prefix of the queue", header), name


def test_no_key_name_is_spliced_outside_keys_lua() -> None:
    spliced = re.compile(rf"\.\.\s*'({KEY_SUFFIXES})'|\bprefix\s*\.\.|ARGV\[2\]\s*\.\.")
    files = [*LUA.glob("*.lua"), *(LUA / "include").glob("*.lua")]
    for path in files:
        if path.name == "keys.lua" and path.parent.name == "include":
            continue
        found = spliced.search(_code(path.read_text()))
        assert found is None, f"{path.name} builds a key name: {found.group(0) if found else ''}"


QUEUE_WIDE = (
    r"prefix \.\. '(waiting|dead|wake|graph:orphans|journal-compact|retrying|expiring|dedup|dedup:held"
    r"|pending:(critical|high|normal|low)|events|limits|limits:(state|parked|ready|rings)"
    r"|order:(held|queue|paused|seq|ended))'\}?\s*"
)


def test_keys_lua_derives_names_from_the_prefix_and_an_id_only() -> None:
    """The helpers' key expressions concatenate the prefix, a literal and their id or token."""
    code = _code((LUA / "include" / "keys.lua").read_text())
    for expr in re.findall(r"prefix\s*\.\.[^\n,]*", code):
        # A job's keys from an id or token; or (graph_queue_keys, workflows; feature_keys,
        # events and flow control, on the paths that use them only) one of
        # the fixed queue-wide names a finishing job's dependents move between; or
        # the metrics history's hash of a minute or hour, from the script's clock.
        assert (
            re.fullmatch(
                r"prefix \.\. '(job:|journal:|offload:|deps:|dependents:|depresults:)' \.\. (id|token)\s*",
                expr,
            )
            or re.fullmatch(QUEUE_WIDE, expr)
            or re.fullmatch(r"prefix \.\. 'history:(m|h):' \.\. (minute_s|hour_s)\s*", expr)
        ), expr


def test_the_pending_set_is_picked_from_keys_never_named() -> None:
    code = _code((LUA / "include" / "keys.lua").read_text())
    assert "return KEYS[first + level]" in code
    for name in SCRIPTS:
        assert "'pending:" not in (LUA / f"{name}.lua").read_text(), name


def _documented_keys(header: str) -> int:
    """The highest KEYS index a header names (``KEYS[7..10]`` counts as 10)."""
    top = 0
    for a, b in re.findall(r"KEYS\[(\d+)(?:\.\.(\d+))?\]", header):
        top = max(top, int(b or a))
    return top


def _used_keys(code: str) -> int:
    used = [int(i) for i in re.findall(r"KEYS\[(\d+)\]", code)]
    return max(used, default=0)


@pytest.mark.parametrize("name", [n for n in SCRIPTS if n not in ("enqueue",)])
def test_the_header_lists_every_key_the_script_reads(name: str) -> None:
    text = (LUA / f"{name}.lua").read_text()
    documented = _documented_keys(_header(text))
    assert _used_keys(_code(text)) <= documented
    # keys.lua's pending_key(first, ...) reads KEYS[first..first+3].
    for first in re.findall(r"pending_key\((\d+),", _code(text)):
        assert int(first) + 3 <= documented, name


K = QueueKeys.for_queue("rules")
JOB = Prepared("01JOB", "k", vr.Priority.NORMAL, 0, b"p", b"", "", "", "", False)


def _sample_calls() -> dict[str, calls.Call]:
    """One call of every script, as calls.py builds it."""
    now = ""
    return {
        "enqueue": calls.enqueue(K, now, [JOB]),
        "claim": calls.claim(K, now, count=1, worker="w", token_base="t", default_lease_ms=1000),
        "complete": calls.complete(K, now, [calls.completion("01JOB", "t", "", b"", b"", b"")]),
        "pause": calls.pause(
            K,
            now,
            job_id="01JOB",
            token="t",
            priority=vr.Priority.NORMAL,
            delay_ms=0,
            note="",
            attachment=b"",
            carry=b"",
        ),
        "suspend": calls.suspend(
            K, now, job_id="01JOB", token="t", note="", attachment=b"", carry=b"", output=b""
        ),
        "retry": calls.retry(
            K,
            now,
            job_id="01JOB",
            token="t",
            priority=vr.Priority.NORMAL,
            note="",
            attachment=b"",
            carry=b"",
            base_ms=1,
            cap_ms=2,
            jitter=0.1,
            max_failures="none",
        ),
        "dead": calls.dead(
            K, now, job_id="01JOB", token="t", note="", attachment=b"", carry=b"", reason="permanent"
        ),
        "release": calls.release(
            K, now, job_id="01JOB", token="t", priority=vr.Priority.NORMAL, carry=b"", note=""
        ),
        "cancel": calls.cancel(K, now, job_id="01JOB", note="n"),
        "resume": calls_ops.resume(K, now, job_id="01JOB", value=b"v"),
        "update": calls_ops.update(
            K, now, job_id="01JOB", kind="k", payload=b"p", dedup="", priority="high", delay_ms="0"
        ),
        "extend": calls.extend(K, now, [("01JOB", "t", 1000)]),
        "reclaim": calls.reclaim(K, now, batch=1, max_failures="none"),
        "purge": calls_ops.purge(K, now, state="dead", keep_ms=0, batch=1),
        "merge": calls.merge(
            K,
            now,
            holder="01JOB",
            old_priority=vr.Priority.NORMAL,
            new_priority=vr.Priority.HIGH,
            decision="keep",
            payload=b"",
            carry_action="keep",
            carry=b"",
            by="01NEW",
        ),
        "retry_dead": calls_ops.retry_dead(K, now, ids=["01JOB"], note="n"),
        "cancel_pending": calls_ops.cancel_pending(K, now, ids=["01JOB"], note="n"),
        "progress": calls_obs.progress(K, now, job_id="01JOB", token="t", value=b"v"),
        "enqueue_flow": calls_flow.enqueue_flow(K, now, [calls_flow.FlowJob(JOB, "fail", ("01DEP",))]),
        **_schedule_calls(now),
        "limit": calls_ops.limit(K, now, action="set", kind="k", per_key=False, concurrency=1),
        "order_pause": calls_ops.order_pause(K, now, key="k", pause=True),
    }


def _schedule_calls(now: str) -> dict[str, calls.Call]:
    """The schedule scripts' calls, built by their sibling owner, calls_schedule.py."""
    definition: dict[str, calls.ScriptArg] = dict.fromkeys(calls_schedule.DEFINITION_FIELDS, "")
    return {
        "schedule_upsert": calls_schedule.schedule_upsert(
            K, now, schedule_id="s", fingerprint="f", next_at=1, anchor=None, definition=definition
        ),
        "schedule_due": calls_schedule.schedule_due(K, now, limit=10),
        "schedule_fire": calls_schedule.schedule_fire(
            K, now, schedule_id="s", job_id="01JOB", version="1", fire_at=1, next_at=2
        ),
        "schedule_pause": calls_schedule.schedule_pause(K, now, schedule_id="s", pause=True),
    }


def test_calls_py_builds_a_call_for_every_script() -> None:
    assert sorted(_sample_calls()) == sorted(ScriptSet().names())


@pytest.mark.parametrize("name", [n for n in SCRIPTS if n not in ("enqueue",)])
def test_each_call_passes_the_keys_its_header_lists_in_one_hash_tag(name: str) -> None:
    call = _sample_calls()[name]
    assert call.name == name
    header = _header((LUA / f"{name}.lua").read_text())
    optional = len(re.findall(r"KEYS\[\d+\]\s+optional", header))
    assert len(call.keys) == _documented_keys(header) - optional
    assert all("{rules}" in key for key in call.keys), call.keys
    assert call.args[:2] == ["", K.prefix]


def test_the_enqueue_call_lays_out_its_keys_as_documented() -> None:
    call = _sample_calls()["enqueue"]
    assert call.keys == [K.dedup, K.wake, K.meta, K.job("01JOB"), K.pending(vr.Priority.NORMAL)]
    assert call.args[:2] == ["", "01JOB"]  # the short layout: a plain single job
    general = calls.enqueue(K, "", [JOB._replace(lease_ms="5000")])
    assert general.keys == call.keys
    assert general.args[:2] == ["", K.prefix]


def test_the_lua_job_states_are_jobstates() -> None:
    # include/states.lua's JOB_STATES tells a state written by hand from a real one.
    text = (LUA / "include" / "states.lua").read_text()
    states = set(re.findall(r"(\w+) = true", text))
    assert states == {s.value for s in vr.JobState}


ENDINGS_WRITING_NOW = ("retry", "pause", "release", "suspend", "dead", "cancel", "merge", "resume")


@pytest.mark.parametrize("name", ENDINGS_WRITING_NOW)
def test_an_ending_writes_the_clock_as_a_string_made_once(name: str) -> None:
    # Redis's Lua formats a number passed to redis.call with "%.17g" at every
    # use (~2,900 instructions); clock.lua's `str` makes the string once.
    text = (LUA / f"{name}.lua").read_text()
    assert "local now_s = str(now)" in text
    bare_now = re.compile(r"(?<![\w.])now(?![\w(])")
    for line in text.splitlines():
        code = line.split("--", 1)[0]
        writes = "redis.call(" in code or code.lstrip().startswith("journal(")
        if writes or re.search(r"'(updated_at|finished_at|eligible_at|cancel_requested)'", code):
            assert not bare_now.search(code), f"{name}.lua writes the bare clock: {line.strip()}"


def test_no_script_asks_the_server_its_version() -> None:
    # redis.REDIS_VERSION and redis.REDIS_VERSION_NUM exist since Redis 7.0:
    # on 6.2, the oldest release a worker accepts, both are nil, and a script
    # that took nil for "not a real Redis" (fakeredis) would quietly do less
    # there (it did: journals were left uncompacted, ~4.7 KB each instead of
    # ~0.7 KB). What a script needs to know of the server it reads from what
    # every release has (journal.lua's JOURNAL_COMPACTS: redis.sha1hex).
    files = [*LUA.glob("*.lua"), *(LUA / "include").glob("*.lua")]
    for path in files:
        found = re.search(r"\bREDIS_VERSION(_NUM)?\b", _code(path.read_text()))
        assert found is None, f"{path.name} reads redis.{found.group(0) if found else ''} (nil on Redis 6.2)"
