"""What Redis Functions would save: enqueue, claim and complete by ``FCALL`` against ``EVALSHA``.

usage: PATH=/tmp/debug-redis:$PATH python benchmarks/functions_cost.py [--n 2000] [--batches 1,100]
                                                                         [--rounds 2]

A measurement for the owner's decision (benchmarks/README.md, "What is left",
item 7), not a design: the package sends scripts (``EVALSHA``), and nothing
here changes that. Each script's expanded source (``_store/scripts.py``) is
wrapped as it is into one function library, loaded with ``FUNCTION LOAD``;
the figure is Redis's instructions per job under callgrind (as
``redis_cost.py`` counts them), the same calls sent both ways, alternated
``--rounds`` times: ``--n`` single enqueues, then a drain of ``--n`` jobs in
claims of each ``--batches`` size (the worker's shape: one round trip of
complete + the next claim).

How the scripts are wrapped, and what a real design would have to settle:

- Redis 7.0 runs a library's load with the ``redis`` API alone (no
  ``string``, ``math``...), and a helper such as ``local format =
  string.format`` fails there: each script's helpers are made by a setup
  function at its first call, kept for every later one. That is the saving:
  an ``EVAL`` makes every helper closure of the script on every call.
- ``KEYS`` and ``ARGV`` are the function's arguments; the helpers read them
  as upvalues of the library, set at each call.
- A script's top-level state (``local events_stream = nil`` and the like) is
  now kept between calls: the wrapper resets each such local at each call.
  ``graph_queue_damage`` (complete.lua, workflows only) is out of the reset's
  reach here and never set by these plain jobs; a design would need each
  script's per-call state made explicit, and a test that no call sees
  another's.
- Deployment, which is why this is the owner's call: a library persists in
  RDB and AOF and replicates; an ACL user needs ``FUNCTION`` and ``FCALL``;
  Redis Cluster needs it loaded on every primary; Redis 6.2 has no
  functions, and fakeredis (``memory://``) neither.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import tempfile
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import redis_cost as rc  # noqa: E402
from venturi_only import Raw  # noqa: E402

from venturi_redis._model.ids import new_job_id  # noqa: E402
from venturi_redis._store import calls  # noqa: E402
from venturi_redis._store.scripts import scripts  # noqa: E402

# Where each script's own body starts: what comes before it is its helpers.
BODY = "local now = now_ms(ARGV[1])"
# A per-call local these plain jobs never set, out of the wrapper's reach (above).
NOT_RESET = {"graph_queue_damage"}


def wrapped(name: str) -> str:
    """``name``'s script as a library function ``v_<name>``: helpers made once, state reset per call."""
    source = scripts()[name].source
    cut = source.index(BODY)
    helpers, body = source[:cut], source[cut:]
    state = [x for x in re.findall(r"^local (\w+) = nil", helpers, re.M) if x not in NOT_RESET]
    reset = f"{', '.join(state)} = {', '.join('nil' for _ in state)}\n" if state else ""
    return (
        f"local body_{name} = nil\nlocal function setup_{name}()\n{helpers}\n"
        f"return function()\n{reset}{body}\nend\nend\n"
        f"redis.register_function('v_{name}', function(keys, args) KEYS, ARGV = keys, args; "
        f"body_{name} = body_{name} or setup_{name}(); return body_{name}() end)\n"
    )


def library() -> str:
    return "#!lua name=venturi_proto\nlocal KEYS, ARGV\n" + "".join(
        wrapped(n) for n in ("enqueue", "claim", "complete")
    )


class Functions(Raw):
    """``benchmarks/venturi_only.py``'s bare driver, sending ``FCALL`` instead of ``EVALSHA``."""

    def _claim(self, count: int) -> list[Any]:
        call = calls.claim(self.k, "", count=count, worker="w8", token_base="tok", default_lease_ms=30000)
        return ["FCALL", "v_claim", len(call.keys), *call.keys, *call.args]

    async def claim(self, count: int) -> list[tuple[str, str]]:
        return self.parse_claim(await self.r.execute_command(*self._claim(count)))

    def claim_call(self, pipe: Any, count: int) -> Any:
        return pipe.execute_command(*self._claim(count))

    def complete_call(self, pipe: Any, jobs: list[tuple[str, str]]) -> Any:
        done = [calls.completion(j, t, "", b"", b"", b"") for j, t in jobs]
        call = calls.complete(self.k, "", done, max_kept="")
        return pipe.execute_command("FCALL", "v_complete", len(call.keys), *call.keys, *call.args)

    async def enqueue(self, ids: list[str]) -> None:
        keys, args = self.enqueue_args(ids)
        await self.r.execute_command("FCALL", "v_enqueue", len(keys), *keys, *args)


async def measure(n: int, batches: list[int], rounds: int) -> dict[str, list[int]]:
    out = Path(tempfile.mkdtemp()) / "cg"
    figures: dict[str, list[int]] = {}
    with rc.callgrind_server(out) as (port, pid):
        url = f"redis://127.0.0.1:{port}"
        scripted, functions = Raw(url), Functions(url)
        dumps = 0

        async def phase(label: str, work: Awaitable[Any]) -> Any:
            nonlocal dumps
            await rc.callgrind_control(pid, "-z")
            done = await work
            await rc.callgrind_control(pid, "-d")
            dumps += 1
            figures.setdefault(label, []).append(rc._total(Path(f"{out}.{dumps}")) // n)
            return done

        async def singles(raw: Raw) -> None:
            for job_id in [new_job_id() for _ in range(n)]:
                await raw.enqueue([job_id])

        try:
            await rc.server_up(scripted.r)
            await scripted.load()
            await scripted.r.execute_command("FUNCTION", "LOAD", "REPLACE", library())
            for _ in range(rounds):
                for how, raw in (("EVALSHA", scripted), ("FCALL", functions)):
                    await phase(f"single enqueue, {how}", singles(raw))
                    await raw.r.flushall()
                for batch in batches:
                    for how, raw in (("EVALSHA", scripted), ("FCALL", functions)):
                        for start in range(0, n, 500):  # the same jobs, by EVALSHA: only the drain is counted
                            await scripted.enqueue([new_job_id() for _ in range(min(500, n - start))])
                        done = await phase(f"claim + complete, batch {batch}, {how}", raw.drain(batch))
                        if done != n:
                            raise RuntimeError(f"drained {done} of {n} jobs")
        finally:
            await scripted.aclose()
            await functions.aclose()
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2000, help="jobs per phase (default 2000)")
    ap.add_argument("--batches", default="1,100", help="claim sizes of the drains (default 1,100)")
    ap.add_argument("--rounds", type=int, default=2, help="EVALSHA / FCALL alternations (default 2)")
    args = ap.parse_args()
    figures = asyncio.run(measure(args.n, [int(b) for b in args.batches.split(",")], args.rounds))
    print(f"Redis instructions per job (callgrind), {args.n} jobs a phase, each round in turn:")
    for label, values in figures.items():
        print(f"  {label}: {', '.join(f'{v:,}' for v in values)}")


if __name__ == "__main__":
    main()
