"""The Lua loader: includes once, in order; cycles rejected; NOSCRIPT recovery."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import venturi_redis as vr
from venturi_redis._store import calls
from venturi_redis._store.scripts import ScriptSet, _code_names, expand

pytestmark = pytest.mark.anyio


def test_include_expands_once_in_order() -> None:
    files = {"a.lua": "-- @include b.lua\nA", "b.lua": "B", "c.lua": "C"}
    out = expand("-- @include a.lua\n-- @include c.lua\n-- @include b.lua\nMAIN", files.__getitem__)
    body = [line for line in out.splitlines() if not line.startswith("--")]
    assert body == ["B", "A", "C", "MAIN"]


def test_an_include_keeps_only_the_definitions_the_script_uses() -> None:
    helpers = "\n".join(
        [
            "-- helpers",
            "local LIMIT = 10",
            "-- a, which needs LIMIT",
            "local function a(x)",
            "  return x < LIMIT",
            "end",
            "local function b(x)",
            "  return a(x) -- c( in a comment keeps nothing",
            "end",
            "local function c()",
            "  return 'b(' .. \"a\"",
            "end",
            "local function d() return c() end",
        ]
    )
    script = "-- d() is not called here\n-- @include h.lua\nlocal s = 'd()'\nreturn b(1)"
    out = expand(script, {"h.lua": helpers}.__getitem__)
    kept = [line for line in out.splitlines() if line.startswith("local")]
    # b uses a, a uses LIMIT; c and d are named only in strings and comments.
    assert kept == ["local LIMIT = 10", "local function a(x)", "local function b(x)", "local s = 'd()'"]
    assert "-- a, which needs LIMIT" in out  # a definition keeps the comment above it
    assert "-- (not used here: c)" in out and "-- (not used here: d)" in out
    assert out.splitlines()[-1] == "return b(1)"


def test_every_helper_a_script_names_is_in_its_source() -> None:
    """Checked against the shipped scripts, with a plainer reading than the loader's own."""
    lua = Path(vr.__file__).resolve().parent.parent / "lua"
    helpers = {
        m.group(1)
        for inc in (lua / "include").glob("*.lua")
        for m in re.finditer(r"^local\s+(?:function\s+)?(\w+)", inc.read_text(), re.M)
    }
    s = ScriptSet()
    for name in s.names():
        text = re.sub(r"'[^']*'|\"[^\"]*\"", "''", (lua / f"{name}.lua").read_text())  # strings out
        own = "\n".join(line.split("--")[0] for line in text.splitlines())  # comments out
        src = s[name].source
        for helper in helpers:
            if re.search(rf"\b{helper}\b", own):
                assert re.search(rf"^local\s+(function\s+)?{helper}\b", src, re.M), (name, helper)
    assert "local function check_owner" not in s["complete"].source  # includes only what it uses
    assert "local function check_owner" in s["retry"].source


def test_a_line_names_only_what_is_outside_its_strings_and_comment() -> None:
    assert _code_names("x = 'it\\'s d()' .. \"a\\\"b(\" -- c()") == {"x"}  # escaped quotes stay inside
    assert _code_names("z = '--' .. w -- v") == {"z", "w"}  # `--` in a string is no comment
    assert _code_names('y = "unclosed d(') == {"y"}  # an unclosed string runs to the end of the line
    assert _code_names("n = 1e5 + t2") == {"n", "e5", "t2"}


def test_a_field_or_method_name_is_no_use_of_a_local() -> None:
    assert _code_names("E.refuse(x) .. y:len() .. z") == {"E", "x", "y", "z"}
    assert _code_names("a..b .. c . d") == {"a", "b", "c"}  # `..` concatenates; `. d` is a field
    assert _code_names("t = {refuse = refuse}") == {"t", "refuse"}


def test_a_helper_only_a_lib_needs_is_made_in_the_lib() -> None:
    """A unit needed only inside one lib (from its `-- @lib` line to the next
    `end` at column 0) is spliced there; one the top needs, or two libs need,
    stays at the top, with what it uses."""
    helpers = "\n".join(
        [
            "local K = 1",
            "local function base() return K end",
            "local function rare() return base() end",
            "local function rarer() return rare() end",
            "local function both() return 2 end",
            "local function hot() return 3 end",
            "local function unused() end",
        ]
    )
    script = "\n".join(
        [
            "-- @include h.lua",
            "local function a_lib()",
            "  -- @lib",
            "  return {rarer = rarer, both = both}",
            "end",
            "local function b_lib()",
            "  -- @lib",
            "  return both() + base()",
            "end",
            "return hot() + a_lib().rarer() + b_lib()",
        ]
    )
    lines = expand(script, {"h.lua": helpers}.__getitem__).splitlines()
    at = {line.split("(")[0].removeprefix("local function "): i for i, line in enumerate(lines)}
    a_lib, b_lib = at["a_lib"], at["b_lib"]
    # base is needed by b_lib's lines and by rare: a lib's helper, but used by two -> the top.
    assert at["base"] < a_lib and at["hot"] < a_lib and at["both"] < a_lib
    assert a_lib < at["rare"] < at["rarer"] < b_lib  # in a_lib, in their order
    assert "-- (in the lib below: rare)" in lines and "-- (not used here: unused)" in lines
    assert lines[-1] == "return hot() + a_lib().rarer() + b_lib()"


def _lib_end(lines: list[str], lib: int) -> int:
    """The line of the ``end`` closing the lib whose ``-- @lib`` line is ``lib``.

    The helpers spliced into it are at column 0, each closed by its own
    column-0 ``end``; the lib's own lines are indented.
    """
    in_helper = False
    for i in range(lib + 1, len(lines)):
        if re.match(r"local function \w+\(", lines[i]):
            in_helper = True
        elif lines[i] == "end":
            if not in_helper:
                return i
            in_helper = False
    raise AssertionError("the lib has no end")


def test_the_hot_scripts_make_their_rare_helpers_in_a_lib() -> None:
    """claim, complete and enqueue: the helpers of their rare paths are made
    only by their libs, not on every call (benchmarks/README.md, "Session 22")."""
    s = ScriptSet()
    for name, hot, rare in [
        ("claim", ["take", "events_open"], ["quarantine", "finish_cancelled", "journal", "history_flush"]),
        (
            "complete",
            ["journal_add", "trim_finished"],
            ["refuse", "graph_finished", "offload_settle", "feature_keys", "limits_lib", "dedup_held_key"],
        ),
        ("enqueue", ["write_job", "wake_workers"], ["emit_many", "offload_pending", "history_flush"]),
    ]:
        lines = s[name].source.splitlines()
        lib = next(i for i, line in enumerate(lines) if line.strip().startswith("-- @lib"))
        lib_end = _lib_end(lines, lib)
        where = {
            m.group(1): i for i, line in enumerate(lines) if (m := re.match(r"local function (\w+)\(", line))
        }
        assert all(lib < where[h] < lib_end for h in rare), name
        assert all(not lib <= where[h] <= lib_end for h in hot), name


def _top_helpers(source: str) -> list[str]:
    """The helpers a script's expanded source makes at its top, every call: its
    column-0 ``local function``s outside its libs."""
    lines = source.splitlines()
    top: list[str] = []
    i = 0
    while i < len(lines):
        if lines[i].strip().startswith("-- @lib"):
            i = _lib_end(lines, i) + 1
            continue
        if m := re.match(r"local function (\w+)\(", lines[i]):
            top.append(m.group(1))
        i += 1
    return top


def test_the_ending_scripts_make_their_rare_helpers_in_a_lib() -> None:
    """retry, pause, release, suspend and dead: a refusal (lease.lua refuse,
    through check_owner's lib), a run's slot, a throttled key, an offload,
    dependents, an order key, the history and the backstop's death are made
    only by the script's lib, and the helpers a common path inlines are not
    made at all (benchmarks/README.md, "Session 24")."""
    s = ScriptSet()
    everywhere = ["check_owner", "journal", "materialize"]
    for name, hot, rare, gone, most in [
        (
            "retry",
            ["leave_running", "backoff_delay_ms", "reindex", "retrying_key", "with_error", "wake_workers"],
            [
                "refuse",
                "limits_lib",
                "history_count",
                "history_flush",
                "unhold",
                "offload_settle",
                "graph_finished",
                "order_lib",
                "feature_keys",
            ],
            ["die", "back_to_pending", "clear_lease"],
            26,
        ),
        (
            "pause",
            ["leave_running", "reindex", "wake_workers"],
            ["refuse", "limits_lib"],
            ["back_to_pending", "clear_lease"],
            21,
        ),
        (
            "release",
            ["reindex", "wake_workers"],
            ["refuse", "limits_lib"],
            ["back_to_pending", "clear_lease", "leave_running"],
            20,
        ),
        (
            "suspend",
            ["leave_running"],
            ["refuse", "limits_lib", "wake_workers", "unhold", "dedup_held_key"],
            ["set_blob", "clear_lease"],
            19,
        ),
        (
            "dead",
            ["leave_running", "with_error"],
            [
                "refuse",
                "limits_lib",
                "wake_workers",
                "unhold",
                "offload_settle",
                "graph_finished",
                "order_lib",
                "history_count",
                "history_flush",
                "feature_keys",
            ],
            ["clear_lease"],
            20,
        ),
    ]:
        src = s[name].source
        top = _top_helpers(src)
        made = set(re.findall(r"^local function (\w+)\(", src, re.M))
        assert set(everywhere + hot) <= set(top), (name, sorted(set(everywhere + hot) - set(top)))
        assert not set(rare) & set(top), (name, sorted(set(rare) & set(top)))
        assert set(rare) <= made, (name, sorted(set(rare) - made))  # in the lib
        assert not set(gone) & made, (name, sorted(set(gone) & made))
        assert top[-1] == "lib" and len(top) <= most, (name, len(top), top)


def test_lines_passed_together_name_what_each_would_alone() -> None:
    lines = ['y = "unclosed d(', "z = 'a\\", "-- c()", "w = v -- u", "x = 'ok' .. t"]
    assert (
        _code_names("\n".join(lines))
        == set().union(*map(_code_names, lines))
        == {"y", "z", "w", "v", "x", "t"}
    )


def test_include_cycle_is_rejected() -> None:
    files = {"a.lua": "-- @include b.lua", "b.lua": "-- @include a.lua"}
    with pytest.raises(ValueError, match="cycle"):
        expand("-- @include a.lua", files.__getitem__)


def test_missing_include_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "include").mkdir()
    (tmp_path / "x.lua").write_text("-- @include nope.lua\nreturn 1")
    s = ScriptSet(tmp_path)  # a script is expanded when first asked for (the start-up's three only)
    with pytest.raises(FileNotFoundError, match=r"nope\.lua"):
        s["x"]


def test_every_script_has_a_header_naming_keys_and_returns() -> None:
    s = ScriptSet()
    assert {"enqueue", "claim", "complete", "pause", "retry", "dead", "extend", "reclaim", "release"} <= set(
        s.names()
    )
    for name in s.names():
        src = s[name].source
        assert "Returns" in src, name
        assert "KEYS[" in src, name
        assert "ARGV[" in src, name


async def test_noscript_is_recovered(client: vr.Client, queue: vr.Queue) -> None:
    await client.redis.script_flush()
    job_id = await queue.enqueue_many([])  # nothing to do, nothing sent
    assert job_id == []
    # enqueue after a flush: EVALSHA fails with NOSCRIPT, is loaded and retried.
    from tests.tasks import Echo

    jid = await queue.enqueue(Echo(text="hi"))
    assert (await queue.get(jid)) is not None
    await client.redis.script_flush()
    res = await client.sender.pipeline([calls.extend(queue.keys, "", [])] * 3)
    assert [calls.extended(r) for r in res] == [calls.Extended([], [])] * 3


async def test_scripts_evicted_from_the_eval_cache_are_sent_again() -> None:
    """Redis 7.4+ and Valkey 8 keep at most 500 scripts loaded by EVAL and evict the
    least recently used (INFO stats evicted_scripts); ours are loaded by EVAL (the
    fallback after NOSCRIPT, a transaction's calls), so an application that EVALs
    scripts of its own evicts them at any moment. Every path meets the NOSCRIPT and
    sends the source again: the enqueue lane, a transaction, the blocking client's
    direct enqueue, the worker's claims (behind its BLPOP too) and its pipelined
    endings. A server without eviction (before 7.4) runs the same steps, nothing
    evicted."""
    import anyio
    import redis.asyncio as aioredis

    from tests.helpers import make_worker
    from tests.servers import RedisServer
    from tests.tasks import Echo, EchoJob

    with RedisServer() as server:
        other = aioredis.Redis.from_url(server.url)
        crowded = 0

        async def crowd() -> None:
            """600 EVALs of new scripts: more than the 500 an evicting server keeps."""
            nonlocal crowded
            pipe = other.pipeline(transaction=False)
            for i in range(crowded, crowded + 600):
                pipe.eval(f"return {i}", 0)
            await pipe.execute()
            crowded += 600

        async with vr.Client.from_url(server.url) as client:
            q = client.queue("evicted")
            evicts = "evicted_scripts" in await other.info("stats")
            ids = [await q.enqueue(Echo(text="warm"))]  # enqueue.lua loaded by EVAL (NOSCRIPT first)
            await crowd()
            if evicts:  # the next call is a NOSCRIPT
                assert await other.script_exists(client.sender._scripts["enqueue"].sha) == [False]
            ids.append(await q.enqueue(Echo(text="lane")))
            await crowd()
            ids += await q.enqueue_many([Echo(text=f"many-{i}") for i in range(30)])
            await crowd()

            def direct() -> str:
                with vr.SyncClient(server.url) as sc:
                    return sc.queue("evicted").enqueue(Echo(text="direct"))

            ids.append(await anyio.to_thread.run_sync(direct))
            await crowd()
            worker = make_worker(q, EchoJob, concurrency=4, poll_interval=0.05)
            async with anyio.create_task_group() as tg:
                tg.start_soon(worker.run)
                with anyio.fail_after(30):
                    for i in range(30):  # while the worker claims, completes and waits
                        ids.append(await q.enqueue(Echo(text=f"late-{i}")))
                        await crowd()
                        await anyio.sleep(0.01)
                    while (await q.counts())["completed"] < len(ids):
                        await crowd()
                        await anyio.sleep(0.02)
                worker.shutdown()
            for job_id in ids:
                info = await q.get(job_id)
                assert info is not None and info.state == vr.JobState.COMPLETED, info
            if evicts:
                assert int((await other.info("stats"))["evicted_scripts"]) > 0
        await other.aclose()


def test_a_command_error_inside_a_script_is_the_same_exception_on_redis_6_2() -> None:
    """Redis 7.0 and later reply an error a command raised inside a script with
    the command's own code first (redis-py raises its class); 6.2 wraps it in
    "Error running script (...)", a plain ResponseError. At maxmemory a 6.2
    server runs the enqueue script and refuses its first write: `enqueue` then
    raised that, where docs/guarantees.md promises OutOfMemoryError (found by
    tests/chaos/test_hostile_input.py's test_redis_at_maxmemory on 6.2.16)."""
    from redis.exceptions import OutOfMemoryError, ReadOnlyError, ResponseError

    sha = "3463e0501b4cf8a0a0071fe6d4b0a8ea0aa8d024"
    oom = "OOM command not allowed when used memory > 'maxmemory'."
    wrapped = f"Error running script (call to f_{sha}): @user_script:296: @user_script: 296: -{oom}"
    for reply in (wrapped, f"Command # 2 (EVALSHA {sha} 3 a b c) of pipeline caused error: {wrapped}"):
        got = calls.script_error(ResponseError(reply))
        assert type(got) is OutOfMemoryError
        # As 7.0+ replies it (redis-py strips the code): the command's message, then where.
        assert (
            str(got)
            == f"command not allowed when used memory > 'maxmemory'. script: {sha}, on @user_script:296."
        )
    readonly = wrapped.replace(f"-{oom}", "-READONLY You can't write against a read only replica.")
    assert type(calls.script_error(ResponseError(readonly))) is ReadOnlyError
    # Any other error is left as it is, a coded one mapped as before.
    other = ResponseError(wrapped.replace("-OOM", "-WRONGTYPE"))
    assert calls.script_error(other) is other
    assert isinstance(calls.script_error(ResponseError("VR_BADARG delay is NaN")), vr.ConfigurationError)
