"""Encryption at rest (issue 41): nothing payload-like in plaintext in Redis, rotation,
readers without the key, a worker without the key, bad keys. On real Redis (the scripts
are untouched: they only ever see opaque bytes)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any, ClassVar

import anyio
import pytest
from pydantic import BaseModel

import venturi_redis as vr
from tests.helpers import drain, make_worker
from venturi_redis._model.sealing import HEADER_V1, key_id_of, sealed_key_id

pytestmark = pytest.mark.anyio

SECRET = "4111-1111-1111-1111"
KEY_A = bytes(range(32))
KEY_B = bytes(range(100, 132))


class Card(BaseModel):
    seen: int = 0
    note: str = ""


class Charge(vr.Task[Card]):
    KIND: ClassVar[str] = "enc.charge"
    card: str
    pad: str = ""


class ChargeJob(Charge, vr.Handler[Card]):
    async def handle(self, ctx: vr.Context[Card], state: Any) -> vr.Outcome:
        await ctx.report_progress({"card": self.card})
        ctx.set_attachment({"card": self.card})
        ctx.carry.seen += 1
        ctx.carry.note = self.card
        return vr.Outcome.completed(result={"charged": self.card})


class Pausing(vr.Task):
    KIND: ClassVar[str] = "enc.pausing"
    card: str


class PausingJob(Pausing, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        if ctx.resume_input is None:
            return vr.Outcome.suspend({"asked": self.card})
        return vr.Outcome.completed(result={"resumed": ctx.resume_input})


def _client(url: str, *keys: bytes) -> vr.Client:
    return vr.Client.from_url(url, encryption=vr.Encryption(keys=list(keys)) if keys else None)


async def _raw_dump(client: vr.Client, queue: vr.Queue, job_id: str) -> bytes:
    """Everything Redis holds about the job and its queue's streams, as one byte string."""
    r = client.redis
    parts: list[bytes] = []
    for field, value in (await r.hgetall(queue.keys.job(job_id))).items():
        parts += (field, value)
    for _, fields in await r.xrange(queue.keys.journal(job_id)):
        for field, value in fields.items():
            parts += (field, value)
    for _, fields in await r.xrange(queue.keys.events):
        for field, value in fields.items():
            parts += (field, value)
    return b"\n".join(parts)


async def test_raw_redis_holds_no_plaintext_and_the_keyed_client_reads_it(url: str, queue_name: str) -> None:
    async with _client(url, KEY_A) as client:
        queue = client.queue(queue_name)
        await queue.set_events(True)
        job_id = await queue.enqueue(Charge(card=SECRET, pad="x" * 1000), carry=Card(note=SECRET))
        raw = await client.redis.hgetall(queue.keys.job(job_id))
        assert SECRET.encode() not in b"".join(raw.values())
        assert raw[b"payload"].startswith(HEADER_V1) and raw[b"carry"].startswith(HEADER_V1)
        assert sealed_key_id(raw[b"payload"]) == key_id_of(KEY_A)
        assert raw[b"kind"] == b"enc.charge"  # metadata stays plain text
        await drain(queue, ChargeJob)
        dump = await _raw_dump(client, queue, job_id)
        assert SECRET.encode() not in dump
        raw = await client.redis.hgetall(queue.keys.job(job_id))
        for field in (b"payload", b"carry", b"result", b"progress"):
            assert raw[field].startswith(HEADER_V1), field
        # The keyed client reads it all back in the clear.
        info = await queue.get(job_id)
        assert info is not None and info.state == vr.JobState.COMPLETED
        assert info.payload == {"card": SECRET, "pad": "x" * 1000}
        assert info.carry == {"seen": 1, "note": SECRET}
        assert info.result == {"charged": SECRET} and info.progress == {"card": SECRET}
        assert [e.attachment for e in await queue.journal(job_id) if e.event == "completed"] == [
            {"card": SECRET}
        ]
        assert await _progress_values(queue) == [{"card": SECRET}]


async def _progress_values(queue: vr.Queue) -> list[Any]:
    """The value of the first ``progress`` event the queue's stream holds (read from the start)."""
    with anyio.fail_after(10):
        async for event in queue.events(since="0"):
            if event.event == "progress":
                return [event.value]
    return []


async def test_suspend_output_and_resume_input_are_sealed(url: str, queue_name: str) -> None:
    async with _client(url, KEY_A) as client:
        queue = client.queue(queue_name)
        job_id = await queue.enqueue(Pausing(card=SECRET))
        await drain(queue, PausingJob)
        raw = await client.redis.hgetall(queue.keys.job(job_id))
        assert raw[b"output"].startswith(HEADER_V1)
        assert (await queue.get(job_id)).output == {"asked": SECRET}  # type: ignore[union-attr]
        assert await queue.resume(job_id, {"pin": SECRET}) == 1
        raw = await client.redis.hgetall(queue.keys.job(job_id))
        assert SECRET.encode() not in b"".join(raw.values())
        await drain(queue, PausingJob)
        info = await queue.get(job_id)
        assert info is not None and info.result == {"resumed": {"pin": SECRET}}


async def _build(card: str) -> dict[str, str]:
    return {"card": card}


async def test_offload_snapshot_is_sealed(url: str, queue_name: str) -> None:
    async with _client(url, KEY_A) as client:
        queue = client.queue(queue_name)
        fn = vr.offload(queue=queue_name, kind="enc.build")(_build)
        handle = await fn.offload(client, SECRET)
        w: vr.Worker[Any] = vr.Worker(queue, handle_signals=False, poll_interval=0.2).register(fn)
        with anyio.fail_after(30):
            await w.run(until_idle=True)
        token = handle.key.split(":", 1)[1]
        snap = await client.redis.hgetall(queue.keys.offload(token))
        assert snap[b"status"] == b"completed" and snap[b"value"].startswith(HEADER_V1)
        assert SECRET.encode() not in b"".join(snap.values())
        res = await vr.read_result(client, handle)
        assert res is not None and res.value == {"card": SECRET}
        async with _client(url) as keyless:
            with pytest.raises(vr.EncryptionKeyMissing, match=key_id_of(KEY_A)):
                await vr.read_result(keyless, handle)  # a typed value cannot be shown as a marker


async def test_a_reader_without_the_key_sees_the_marker_and_never_raises(url: str, queue_name: str) -> None:
    async with _client(url, KEY_A) as client:
        queue = client.queue(queue_name)
        await queue.set_events(True)
        job_id = await queue.enqueue(Charge(card=SECRET), carry=Card(note=SECRET))
        await drain(queue, ChargeJob)
    marker = vr.Encrypted(key_id_of(KEY_A))
    assert str(marker) == f"<encrypted: key id {key_id_of(KEY_A)}>"
    for keys in ((), (KEY_B,)):  # no encryption at all, or only another key
        async with _client(url, *keys) as reader:
            q = reader.queue(queue_name)
            info = await q.get(job_id)
            assert info is not None and info.state == vr.JobState.COMPLETED and not info.corrupt
            assert info.payload == info.carry == info.result == info.progress == marker
            assert [j.payload for j in await q.list_jobs(state="completed")] == [marker]
            entries = await q.journal(job_id)
            assert [e.attachment for e in entries if e.event == "completed"] == [marker]
            assert await _progress_values(q) == [marker]


def test_venturi_job_show_without_the_key_prints_the_marker(redis_server: Any, queue_name: str) -> None:
    from typer.testing import CliRunner

    from venturi_redis.cli.commands import app

    async def enqueue() -> str:
        async with _client(redis_server.url, KEY_A) as client:
            return await client.queue(queue_name).enqueue(Charge(card=SECRET))

    job_id = anyio.run(enqueue)
    for extra in (["--json"], []):
        res = CliRunner().invoke(
            app, ["job", "show", job_id, "--redis", redis_server.url, "-q", queue_name, *extra]
        )
        assert res.exit_code == 0, res.output
        assert f"<encrypted: key id {key_id_of(KEY_A)}>" in res.output and SECRET not in res.output
        assert "masked" not in res.output  # the marker hides the value already


async def test_rotation_old_values_read_new_ones_under_the_first_key(url: str, queue_name: str) -> None:
    async with _client(url, KEY_A) as old:
        first = await old.queue(queue_name).enqueue(Charge(card=SECRET), carry=Card(note="a"))
    async with _client(url, KEY_B, KEY_A) as rotated:
        queue = rotated.queue(queue_name)
        info = await queue.get(first)
        assert info is not None and info.payload == {"card": SECRET, "pad": ""}
        await drain(queue, ChargeJob)  # the worker with [B, A] runs a job sealed under A
        info = await queue.get(first)
        assert info is not None and info.state == vr.JobState.COMPLETED and info.result == {"charged": SECRET}
        raw = await rotated.redis.hgetall(queue.keys.job(first))
        assert sealed_key_id(raw[b"result"]) == key_id_of(KEY_B)  # what it writes is under B
        second = await queue.enqueue(Charge(card=SECRET))
        raw = await rotated.redis.hgetall(queue.keys.job(second))
        assert sealed_key_id(raw[b"payload"]) == key_id_of(KEY_B)
    async with _client(url, KEY_A) as stale:  # a client not given B yet: a marker, no error
        info = await stale.queue(queue_name).get(second)
        assert info is not None and info.payload == vr.Encrypted(key_id_of(KEY_B))


async def test_values_written_before_encryption_stay_readable(url: str, queue_name: str) -> None:
    async with _client(url) as plain:
        job_id = await plain.queue(queue_name).enqueue(Charge(card="old"))
    async with _client(url, KEY_A) as client:
        queue = client.queue(queue_name)
        assert (await queue.get(job_id)).payload == {"card": "old", "pad": ""}  # type: ignore[union-attr]
        await drain(queue, ChargeJob)
        info = await queue.get(job_id)
        assert info is not None and info.state == vr.JobState.COMPLETED and info.result == {"charged": "old"}


@pytest.mark.parametrize("worker_keys", [(), (KEY_B,)], ids=["no-encryption", "other-key"])
async def test_a_worker_without_the_key_fails_the_run_with_a_note(
    url: str, queue_name: str, worker_keys: tuple[bytes, ...]
) -> None:
    async with _client(url, KEY_A) as producer:
        job_id = await producer.queue(queue_name).enqueue(
            Charge(card=SECRET), carry=Card(note=SECRET), max_failures=10
        )
        async with _client(url, *worker_keys) as other:
            queue = other.queue(queue_name)
            worker = make_worker(queue, ChargeJob)
            async with anyio.create_task_group() as tg:
                tg.start_soon(worker.run)
                with anyio.fail_after(20):
                    while True:
                        info = await producer.queue(queue_name).get(job_id)
                        assert info is not None
                        if info.failures >= 1:
                            break
                        await anyio.sleep(0.02)
                worker.shutdown()
        # A failed run, retried (a pod missing the key during a rollout): not dead at once.
        assert info.state in (vr.JobState.PENDING, vr.JobState.RUNNING)  # retried (RUNNING: again)
        assert info.note is not None and f"key id {key_id_of(KEY_A)}" in info.note
        assert "payload cannot be read" in info.note and SECRET not in info.note
        failed = [e for e in await producer.queue(queue_name).journal(job_id) if e.event == "failed"]
        assert failed and failed[0].details.get("error_type") == "venturi_redis.EncryptionKeyMissing"
        # Nothing was overwritten with a plain value: the carry is as stored, and the
        # keyed worker still runs it.
        raw = await producer.redis.hgetall(producer.queue(queue_name).keys.job(job_id))
        assert sealed_key_id(raw[b"carry"]) == key_id_of(KEY_A)
        assert SECRET.encode() not in b"".join(raw.values())
        await drain(producer.queue(queue_name), ChargeJob)
        done = await producer.queue(queue_name).get(job_id)
        assert done is not None
        if done.state is vr.JobState.COMPLETED:
            assert done.result == {"charged": SECRET} and done.carry == {"seen": 1, "note": SECRET}


class Asks(vr.Task[Card]):
    KIND: ClassVar[str] = "enc.asks"


class AsksJob(Asks, vr.Handler[Any]):
    async def handle(self, ctx: vr.Context[Card], state: Any) -> vr.Outcome:
        ctx.carry.note = SECRET
        return vr.Outcome.suspend()


@pytest.mark.parametrize("worker_keys", [(), (KEY_B,)], ids=["no-encryption", "other-key"])
async def test_a_worker_without_the_key_of_a_sealed_carry_fails_the_run_with_a_note(
    url: str, queue_name: str, worker_keys: tuple[bytes, ...]
) -> None:
    # Encryption turned on while the job waited: its payload stays plain, the carry
    # its keyed run left is sealed, and a pod not given the key meets it at the resume.
    async with _client(url) as plain:
        job_id = await plain.queue(queue_name).enqueue(Asks(), max_failures=10)
    async with _client(url, KEY_A) as keyed:
        await drain(keyed.queue(queue_name), AsksJob)
        raw = await keyed.redis.hgetall(keyed.queue(queue_name).keys.job(job_id))
        assert sealed_key_id(raw[b"carry"]) == key_id_of(KEY_A) and sealed_key_id(raw[b"payload"]) is None
        assert await keyed.queue(queue_name).resume(job_id) == 1
    async with _client(url, *worker_keys) as other:
        queue = other.queue(queue_name)
        worker = make_worker(queue, AsksJob)
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            with anyio.fail_after(20):
                while True:
                    info = await queue.get(job_id)
                    assert info is not None
                    if info.failures >= 1 or info.state is vr.JobState.DEAD:
                        break
                    await anyio.sleep(0.02)
            worker.shutdown()
        # Retried, as for the payload: not dead as a carry that does not decode would be.
        assert info.state in (vr.JobState.PENDING, vr.JobState.RUNNING)
        assert info.note is not None and "carry cannot be read" in info.note
        assert f"key id {key_id_of(KEY_A)}" in info.note
        failed = [e for e in await queue.journal(job_id) if e.event == "failed"]
        assert failed and failed[0].details.get("error_type") == "venturi_redis.EncryptionKeyMissing"
        carry = await other.redis.hget(queue.keys.job(job_id), "carry")
        assert sealed_key_id(carry) == key_id_of(KEY_A)  # kept as it was stored


class Tally(BaseModel):
    n: int = 0


class Count(vr.Task[Tally]):
    KIND: ClassVar[str] = "enc.count"
    key: str
    secret: str = SECRET

    def dedup_key(self) -> str | None:
        return self.key

    def merge(self, existing: vr.Pending[Count, Tally]) -> vr.Merge[Count, Tally]:
        assert existing.payload.secret == SECRET  # the merge reads the plain value
        return vr.Merge.with_(self, Tally(n=existing.carry.n + 1))


async def test_a_merge_opens_and_seals_under_watch(url: str, queue_name: str) -> None:
    async with _client(url, KEY_A) as client:
        queue = client.queue(queue_name)
        first = await queue.enqueue(Count(key="k"), carry=Tally(n=1))
        assert await queue.enqueue(Count(key="k")) == first
        raw = await client.redis.hgetall(queue.keys.job(first))
        assert raw[b"payload"].startswith(HEADER_V1) and raw[b"carry"].startswith(HEADER_V1)
        assert SECRET.encode() not in b"".join(raw.values())
        assert (await queue.get(first)).carry == {"n": 2}  # type: ignore[union-attr]


async def test_enqueue_many_and_sync_client_seal(url: str, queue_name: str) -> None:
    async with _client(url, KEY_A) as client:
        queue = client.queue(queue_name)
        ids = await queue.enqueue_many([Charge(card=SECRET), Charge(card=SECRET)])
        for job_id in ids:
            raw = await client.redis.hgetall(queue.keys.job(job_id))
            assert sealed_key_id(raw[b"payload"]) == key_id_of(KEY_A)
    with vr.SyncClient(url, encryption=vr.Encryption(keys=[KEY_A])) as sc:
        job_id = sc.queue(queue_name).enqueue(Charge(card=SECRET))
        info = sc.queue(queue_name).get(job_id)
        assert info is not None and info.payload == {"card": SECRET, "pad": ""}
    async with _client(url) as keyless:
        raw = await keyless.redis.hgetall(keyless.queue(queue_name).keys.job(job_id))
        assert raw[b"payload"].startswith(HEADER_V1)


@pytest.mark.parametrize(
    "keys",
    [
        [],
        [b"short"],
        [KEY_A + b"x"],
        ["a" * 32],
        [KEY_A, KEY_A],
        [KEY_A, KEY_B, bytearray(KEY_A)],
        KEY_A,
        None,
    ],
    ids=["empty", "short", "long", "str", "duplicate", "duplicate-bytearray", "bare-bytes", "none"],
)
def test_bad_keys_are_configuration_errors(keys: Any) -> None:
    with pytest.raises(vr.ConfigurationError):
        vr.Encryption(keys=keys)


async def test_a_bad_encryption_argument_writes_nothing(url: str) -> None:
    with pytest.raises(vr.ConfigurationError, match=r"vr\.Encryption"):
        vr.Client.from_url(url, encryption=[KEY_A])  # type: ignore[arg-type]


def test_encryption_repr_shows_key_ids_never_keys() -> None:
    enc = vr.Encryption(keys=[KEY_B, KEY_A])
    assert enc.key_ids == (key_id_of(KEY_B), key_id_of(KEY_A))
    assert KEY_A.hex() not in repr(enc) and key_id_of(KEY_B) in repr(enc)
    assert len(vr.Encryption.new_key()) == 32


def test_a_damaged_value_is_a_payload_error_not_a_wrong_value() -> None:
    enc = vr.Encryption(keys=[KEY_A])
    sealed = enc.seal(b"\x81\xa1a\x01")
    assert enc.open(sealed) == b"\x81\xa1a\x01"
    damaged = sealed[:-1] + bytes([sealed[-1] ^ 1])
    with pytest.raises(vr.PayloadError, match="does not decrypt"):
        enc.open(damaged)
    relabelled = HEADER_V1 + bytes.fromhex(key_id_of(KEY_B)) + sealed[6:]
    with pytest.raises(vr.PayloadError, match="does not decrypt"):
        vr.Encryption(keys=[KEY_A, KEY_B]).open(relabelled)


def test_importing_the_package_does_not_load_the_cipher() -> None:
    # redis-py itself imports the top ``cryptography`` package when installed (to tell
    # whether it is available); venturi loads none of its modules until an Encryption is made.
    code = (
        "import sys, venturi_redis as vr; vr.Client.from_url('memory://'); "
        "loaded = [m for m in sys.modules if m.startswith('cryptography.hazmat')]; "
        "assert not loaded, loaded; vr.Encryption(keys=[bytes(32)]); "
        "assert 'cryptography.hazmat.primitives.ciphers.aead' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_without_cryptography_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cryptography.hazmat.primitives.ciphers.aead", None)
    with pytest.raises(vr.ConfigurationError, match=r"venturi-redis\[crypto\]"):
        vr.Encryption(keys=[KEY_A])


async def test_a_schedule_stores_its_payload_sealed_and_its_fires_are_sealed(
    url: str, queue_name: str
) -> None:
    from tests.test_schedules import T0, Clock
    from venturi_redis._producer.firing import fire_due

    clock = Clock(T0)
    async with vr.Client.from_url(url, clock=clock, encryption=vr.Encryption(keys=[KEY_A])) as client:
        queue = client.queue(queue_name)
        await queue.schedule("tick", Charge(card=SECRET), every=10)
        clock.ms = T0 + 10_000
        round_ = await fire_due(queue)
        [(_, fired)] = round_.fired
        sched = await client.redis.hgetall(queue.keys.schedule("tick"))
        assert sched[b"payload"].startswith(HEADER_V1) and SECRET.encode() not in b"".join(sched.values())
        raw = await client.redis.hgetall(queue.keys.job(fired.id))
        assert sealed_key_id(raw[b"payload"]) == key_id_of(KEY_A)
        info = await queue.get(fired.id)
        assert info is not None and info.payload == {"card": SECRET, "pad": ""}


class Part(vr.Task):
    KIND: ClassVar[str] = "enc.part"
    card: str


class PartJob(Part, vr.Handler[Any]):
    seen: ClassVar[list[dict[str, Any]]] = []

    async def handle(self, ctx: vr.Context[vr.NoCarry], state: Any) -> vr.Outcome:
        deps = await ctx.dependency_results()
        if deps:
            PartJob.seen.append(deps)
        return vr.Outcome.completed(result={"part": self.card})


async def test_dependency_results_are_copied_sealed_and_opened_by_the_parent(
    url: str, queue_name: str
) -> None:
    PartJob.seen = []
    async with _client(url, KEY_A) as client:
        queue = client.queue(queue_name)
        flow = await queue.enqueue_flow(Part(card="parent"), [Part(card=SECRET)])
        await drain(queue, PartJob)
        copied = await client.redis.hgetall(queue.keys.depresults(flow.parent_id))
        assert copied and SECRET.encode() not in b"".join(copied.values())
        assert PartJob.seen == [{flow.children_ids[0]: {"part": SECRET}}]


async def test_the_dashboard_without_the_key_shows_the_marker(url: str, queue_name: str) -> None:
    import httpx

    from venturi_redis.dashboard import create_app

    async with _client(url, KEY_A) as client:
        job_id = await client.queue(queue_name).enqueue(Charge(card=SECRET))
    marker = f"<encrypted: key id {key_id_of(KEY_A)}>"
    async with _client(url) as keyless:
        for show in (False, True):
            app = create_app(keyless, show_payloads=show)
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://dash") as h:
                page = await h.get(f"/queues/{queue_name}/jobs/{job_id}")
                assert page.status_code == 200 and "&lt;encrypted: key id" in page.text
                assert SECRET not in page.text
                doc = (await h.get(f"/api/queues/{queue_name}/jobs/{job_id}")).json()
                assert doc["job"]["payload"] == marker


async def test_the_payload_cap_applies_to_the_plain_value(url: str, queue_name: str) -> None:
    from venturi_redis._model.codec import pack_model

    task = Charge(card=SECRET)
    size = len(pack_model(task))
    enc = vr.Encryption(keys=[KEY_A])
    async with vr.Client.from_url(url, encryption=enc, max_payload_bytes=size) as client:
        queue = client.queue(queue_name)
        job_id = await queue.enqueue(task)  # stored 34 bytes longer, accepted
        raw = await client.redis.hgetall(queue.keys.job(job_id))
        assert len(raw[b"payload"]) == size + 34
        with pytest.raises(vr.PayloadTooLarge):
            await queue.enqueue(Charge(card=SECRET + "x"))


async def test_update_seals_the_new_payload(url: str, queue_name: str) -> None:
    async with _client(url, KEY_A) as client:
        queue = client.queue(queue_name)
        job_id = await queue.enqueue(Charge(card="old"))
        assert await queue.update(job_id, task=Charge(card=SECRET)) is True
        raw = await client.redis.hgetall(queue.keys.job(job_id))
        assert sealed_key_id(raw[b"payload"]) == key_id_of(KEY_A)
        assert SECRET.encode() not in b"".join(raw.values())
        assert (await queue.get(job_id)).payload == {"card": SECRET, "pad": ""}  # type: ignore[union-attr]


class Keyed(vr.Task):
    KIND: ClassVar[str] = "enc.keyed"
    card: str
    key: str = "k"

    def dedup_key(self) -> str | None:
        return "" if self.key == "bad" else self.key  # "": a dedup key refused


async def test_a_bulk_enqueue_seals_each_payload_under_its_own_nonce_of_one_draw(
    url: str, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    secrets = [f"{SECRET}-{i:03d}" for i in range(150)]
    draws: list[bytes] = []
    real = os.urandom

    def urandom(n: int) -> bytes:
        draws.append(real(n))
        return draws[-1]

    enc = vr.Encryption(keys=[KEY_B, KEY_A])  # seals under KEY_B, the first key
    async with vr.Client.from_url(url, encryption=enc) as client:
        queue = client.queue(queue_name)
        monkeypatch.setattr(os, "urandom", urandom)
        ids = await queue.enqueue_many([Charge(card=s, pad="x" * 1000) for s in secrets])
        monkeypatch.undo()
        payloads: list[bytes] = []
        for job_id in ids:
            raw = await client.redis.hgetall(queue.keys.job(job_id))
            assert SECRET.encode() not in b"".join(raw.values())
            payloads.append(raw[b"payload"])
        assert {sealed_key_id(p) for p in payloads} == {key_id_of(KEY_B)}
        nonces = [p[6:18] for p in payloads]
        assert len(set(nonces)) == len(ids) == 150
        # The nonces are one draw of this call, 12 bytes a job, cut in the tasks' order.
        (draw,) = [d for d in draws if len(d) == 12 * 150]
        assert nonces == [draw[i : i + 12] for i in range(0, len(draw), 12)]
        plain = vr.Encryption(keys=[KEY_B])  # the payload opens under that key alone
        from venturi_redis._model.codec import unpack

        assert [unpack(plain.open(p))["card"] for p in payloads] == secrets
        assert [(await queue.get(i)).payload["card"] for i in ids] == secrets  # type: ignore[union-attr]
        flow = await queue.enqueue_flow(Part(card=SECRET), [Part(card=f"{SECRET}-{i}") for i in range(5)])
        flow_nonces = []
        for job_id in (*flow.children_ids, flow.parent_id):
            raw = await client.redis.hgetall(queue.keys.job(job_id))
            assert SECRET.encode() not in b"".join(raw.values())
            flow_nonces.append(raw[b"payload"][6:18])
        assert len(set(flow_nonces + nonces)) == 156


async def test_a_bulk_enqueue_over_the_cap_raises_first_and_writes_nothing(url: str, queue_name: str) -> None:
    from venturi_redis._model.codec import pack_model

    bad_key = Keyed(card=SECRET, key="bad")
    cap = len(pack_model(bad_key))  # every task but too_large within the cap
    enc = vr.Encryption(keys=[KEY_A])
    async with vr.Client.from_url(url, encryption=enc, max_payload_bytes=cap) as client:
        queue = client.queue(queue_name)
        ok = [Keyed(card=SECRET, key=f"k{i}") for i in range(10)]
        too_large = Keyed(card=SECRET + "xx", key="big")
        for tasks, error in (
            ([*ok[:5], too_large, *ok[5:]], vr.PayloadTooLarge),
            ([too_large, *ok], vr.PayloadTooLarge),
            ([*ok[:3], too_large, *ok[3:6], bad_key], vr.PayloadTooLarge),  # the tasks' order
            ([*ok[:3], bad_key, *ok[3:6], too_large], vr.ConfigurationError),
        ):
            with pytest.raises(error) as caught:
                await queue.enqueue_many(tasks)
            assert isinstance(caught.value, vr.PayloadTooLarge) == (error is vr.PayloadTooLarge)
            assert [k async for k in client.redis.scan_iter(match=f"{queue.keys.prefix}*")] == []
        assert len(await queue.enqueue_many(ok)) == 10


async def test_a_sealed_value_that_no_longer_opens_under_its_key_is_shown_as_corrupt(
    url: str, queue_name: str
) -> None:
    # A reader holding the key meets a value whose seal does not open (its bytes
    # changed in Redis): the value is shown as stored, as any undecodable one is,
    # and the read goes on; it never raises.
    async with _client(url, KEY_A) as client:
        queue = client.queue(queue_name)
        job_id = await queue.enqueue(Charge(card=SECRET), carry=Card(note=SECRET))
        await drain(queue, ChargeJob)
        key = queue.keys.job(job_id)
        sealed = await client.redis.hget(key, "result")
        assert sealed is not None and sealed_key_id(sealed) == key_id_of(KEY_A)
        tampered = sealed[:-1] + bytes([sealed[-1] ^ 1])  # one bit of its tag
        await client.redis.hset(key, "result", tampered)
        info = await queue.get(job_id)
        assert info is not None and info.state == vr.JobState.COMPLETED
        assert info.result is None and set(info.corrupt) == {"result"}  # named, never raised
        assert info.carry == Card(seen=1, note=SECRET).model_dump()  # the rest still opens
