"""Queue, ShardedQueue and SyncQueue offer the same operations, defined once (issue 25 item 5).

``QueueSurface`` (``venturi_redis/_producer/surface.py``) is the one
definition of the signatures; these tests compare every face with it, then
run the operations the sharded and blocking faces gained.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import pytest

import venturi_redis as vr
from tests.helpers import drain
from tests.tasks import Doomed, DoomedJob, Echo, EchoJob
from venturi_redis._producer.surface import QueueSurface

pytestmark = pytest.mark.anyio

OPERATIONS = sorted(
    name
    for name, member in vars(QueueSurface).items()
    if not name.startswith("_") and inspect.isfunction(member)
)
FACES: list[type[Any]] = [vr.Queue, vr.ShardedQueue, vr.SyncQueue]


@pytest.fixture(params=["redis", "memory"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_the_surface_names_every_shared_operation() -> None:
    assert (
        sorted(
            [
                "cancel",
                "cancel_jobs",
                "counts",
                "enqueue",
                "enqueue_many",
                "get",
                "history",
                "is_drained",
                "journal",
                "list_jobs",
                "pause",
                "pause_key",
                "purge",
                "resume",
                "resume_key",
                "resume_queue",
                "retry",
                "retry_dead",
                "stats",
                "update",
            ]
        )
        == OPERATIONS
    )


@pytest.mark.parametrize("face", FACES, ids=lambda f: f.__name__)
@pytest.mark.parametrize("operation", OPERATIONS)
def test_every_face_has_the_surface_signature(face: type[Any], operation: str) -> None:
    """Same parameters (names, kinds, defaults, annotations) and the same result type."""
    expected = inspect.signature(getattr(QueueSurface, operation))
    method = getattr(face, operation, None)
    assert method is not None, f"{face.__name__} lacks {operation}"
    actual = inspect.signature(method)
    assert list(actual.parameters.values()) == list(expected.parameters.values()), (
        f"{face.__name__}.{operation}{actual} differs from QueueSurface.{operation}{expected}"
    )
    assert actual.return_annotation == expected.return_annotation
    # The async faces return an awaitable of the result; the blocking one the result.
    assert inspect.iscoroutinefunction(method) is (face is not vr.SyncQueue)
    assert method.__doc__, f"{face.__name__}.{operation} has no docstring"


def test_the_enqueue_options_are_declared_once_and_read_by_prepare() -> None:
    """Every face takes ``**options`` of one TypedDict; ``prepare`` takes each option.

    A new enqueue option is one line in ``_store/prepare.py`` and none in the
    faces: this fails when an option is declared that ``prepare`` does not read.
    """
    from venturi_redis._store.prepare import prepare, prepare_many

    # `cap`, `encryption` and a call's bounds (`max_jobs`, `max_bytes`) are the client's,
    # not options of a call.
    taken = set(inspect.signature(prepare).parameters) - {"task", "cap", "encryption"}
    assert set(vr.EnqueueOptions.__optional_keys__) - {"after", "at"} == taken
    clients = {"tasks", "cap", "encryption", "max_jobs", "max_bytes"}
    many = set(inspect.signature(prepare_many).parameters) - clients
    assert set(vr.EnqueueManyOptions.__optional_keys__) == many
    assert vr.EnqueueManyOptions.__optional_keys__ < vr.EnqueueOptions.__optional_keys__


@pytest.mark.parametrize("face", ["queue", "sharded", "sync"])
async def test_an_unknown_enqueue_option_is_a_type_error_naming_it(
    client: vr.Client, url: str, queue_name: str, face: str
) -> None:
    q: Any
    if face == "queue":
        q = client.queue(queue_name)
    elif face == "sharded":
        q = vr.ShardedQueue(client, queue_name, partitions=2)
    else:
        sc = vr.SyncClient(url)
        q = sc.queue(queue_name)
    try:
        if face == "sync":
            with pytest.raises(TypeError, match=r"enqueue\(\) got an unexpected keyword argument 'dealy'"):
                q.enqueue(Echo(text="x"), dealy=1)
            with pytest.raises(
                TypeError, match=r"enqueue_many\(\) got an unexpected keyword argument 'carry'"
            ):
                q.enqueue_many([Echo(text="x")], carry=None)
        else:
            with pytest.raises(TypeError, match=r"enqueue\(\) got an unexpected keyword argument 'dealy'"):
                await q.enqueue(Echo(text="x"), dealy=1)
            with pytest.raises(
                TypeError, match=r"enqueue_many\(\) got an unexpected keyword argument 'carry'"
            ):
                await q.enqueue_many([Echo(text="x")], carry=None)
        assert not any((await client.queue(queue_name).counts()).values())
    finally:
        if face == "sync":
            sc.close()


async def test_a_misspelt_bulk_filter_is_a_type_error_naming_it(client: vr.Client, queue_name: str) -> None:
    """The bulk filters are one typed dict (``vr.BulkFilters``) passed on as ``**filters``:
    a name that is none of them is refused, as a keyword parameter would be."""
    q = client.queue(queue_name)
    with pytest.raises(TypeError, match="'knd'"):
        await q.retry_dead(knd="x")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="'older'"):
        await q.purge("dead", older=1)  # type: ignore[call-arg]
    assert set(vr.BulkFilters.__optional_keys__) == {
        "kind", "error_type", "since", "until", "note_contains", "limit", "on_progress"
    }  # fmt: skip


# -- what the sharded face gained ------------------------------------------------------


async def test_sharded_queue_lists_retries_and_purges_over_its_partitions(
    client: vr.Client, queue_name: str
) -> None:
    sharded = vr.ShardedQueue(client, queue_name, partitions=3)
    doomed = await sharded.enqueue_many([Doomed() for _ in range(6)])
    done = await sharded.enqueue_many([Echo(text=str(i)) for i in range(3)])
    await drain(sharded.partitions, DoomedJob, EchoJob)
    assert len({(await sharded.get(j)).queue for j in doomed}) == 3  # type: ignore[union-attr]

    dead = await sharded.list_jobs(state="dead")
    assert sorted(j.id for j in dead) == sorted(doomed)
    assert len(await sharded.list_jobs(state=vr.JobState.DEAD, limit=4)) == 4
    assert [j.id for j in await sharded.list_jobs(kind="echo")] != []
    with pytest.raises(vr.ConfigurationError, match="limit"):
        await sharded.list_jobs(limit=0)

    assert await sharded.retry(doomed[0]) is True
    assert await sharded.retry(doomed[0]) is False  # pending now
    assert await sharded.retry("01J0000000000000000000NONE") is False
    moved = await sharded.retry_dead(limit=2)
    assert len(moved) == 2 and doomed[0] not in moved
    rest = await sharded.retry_dead(kind="doomed")
    assert sorted([doomed[0], *moved, *rest]) == sorted(doomed)
    assert await sharded.retry_dead() == []
    assert (await sharded.counts())["pending"] == 6

    assert await sharded.purge("completed") == len(done)
    assert [await sharded.get(j) for j in done] == [None] * len(done)


# -- what the blocking face gained -------------------------------------------------------


@pytest.fixture
def sync_client(url: str) -> Iterator[vr.SyncClient]:
    with vr.SyncClient(url) as sc:
        yield sc


async def test_sync_queue_runs_the_operations(sync_client: vr.SyncClient, queue_name: str) -> None:
    sq = sync_client.queue(queue_name)
    assert sq.is_drained()
    jid = sq.enqueue(Doomed())
    assert not sq.is_drained()
    assert [j.id for j in sq.list_jobs(state="pending")] == [jid]
    sq.pause()
    assert sq.stats().paused
    sq.resume_queue()
    assert not sq.stats().paused

    # Let a worker of the async client kill the job, then handle it from here.
    async with vr.Client.from_url(sync_client.client.url) as client:
        await drain(client.queue(queue_name), DoomedJob)
    assert sq.stats().dead == 1
    assert sq.retry(jid) is True
    assert sq.retry(jid) is False
    async with vr.Client.from_url(sync_client.client.url) as client:
        await drain(client.queue(queue_name), DoomedJob)
    assert sq.retry_dead(kind="doomed") == [jid]
    async with vr.Client.from_url(sync_client.client.url) as client:
        await drain(client.queue(queue_name), DoomedJob)
    assert sq.purge("dead") == 1
    assert sq.get(jid) is None


def test_the_client_options_are_client_and_connection_options() -> None:
    """``vr.ClientOptions`` (``Client.from_url``'s ``**options``) names every option ``Client`` takes
    (its ``url`` is from_url's own argument) and the connection's two: a new ``Client`` option not
    declared there fails here, and so would a type checker's reading of users' calls."""
    client_options = set(inspect.signature(vr.Client).parameters) - {"redis", "url"}
    assert set(vr.ClientOptions.__optional_keys__) == client_options | {"cluster", "max_connections"}
    assert not vr.ClientOptions.__required_keys__
