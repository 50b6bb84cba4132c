"""The queue page's live feed: the queue's event stream as server-sent events.

``GET /queues/{queue}/events`` answers ``text/event-stream``: one ``venturi``
event per ``queue.events()`` entry (its ``id`` is the stream id, so a browser's
``EventSource`` that reconnects sends it back as ``Last-Event-ID`` and resumes
after it, missing nothing the capped stream still holds), a comment line every
``HEARTBEAT`` seconds while the queue is quiet, and an end after ``LIFETIME``
seconds (the browser reconnects by itself). When the queue's events are off
the answer is ``204``, which tells ``EventSource`` not to reconnect.

The response is its own ASGI callable, not a generator handed to Starlette:
the follower runs in a task group beside a watcher of ``http.disconnect``, so
a closed tab cancels the follower's blocking ``XREAD`` at once (redis-py drops
that connection rather than return it mid-read), and the follower is closed
(``aclosing``) on every way out. ``OPEN`` counts the feeds being served.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any, cast

import anyio
import anyio.abc
from starlette.responses import Response

from .._model.events import QueueEvent
from ._data import jsonable

if TYPE_CHECKING:
    from .._producer.client import Queue
    from ._security import Receive, Scope, Send

HEARTBEAT = 15.0
LIFETIME = 300.0
# How long the browser waits before it reconnects after a feed ends.
RETRY_MS = 3000
# A stream entry's id, or one job's event of an entry that tells many ("<id>/<k>").
_EVENT_ID_RE = re.compile(r"\d{1,20}-\d{1,20}(/\d{1,6})?")
OPEN = 0
_SCOPES: set[anyio.CancelScope] = set()


def close_all() -> None:
    """End every feed being served (each sends its end and returns): a server
    that stops calls it first, or it would wait for every open tab."""
    for scope in list(_SCOPES):
        scope.cancel()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def resume_point(last_event_id: str | None) -> str:
    """Where a (re)connecting feed starts: after the id the browser saw last, else now."""
    if last_event_id and _EVENT_ID_RE.fullmatch(last_event_id.strip()):
        return last_event_id.strip()
    return "$"


def event_dict(event: QueueEvent) -> dict[str, Any]:
    """An event as JSON-ready data (what the feed sends, and what the page shows as text)."""
    doc: dict[str, Any] = jsonable(
        {
            "id": event.id,
            "event": event.event,
            "job_id": event.job_id,
            "kind": event.kind,
            "at": event.at,
            "run": event.run,
            "note": event.note,
            "value": event.value,
            "details": dict(event.details),
        }
    )
    return doc


def frame(event: QueueEvent) -> bytes:
    """One server-sent event. ``json.dumps`` escapes newlines, so ``data`` is one line."""
    data = json.dumps(event_dict(event), ensure_ascii=True, separators=(",", ":"))
    return f"id: {event.id}\nevent: venturi\ndata: {data}\n\n".encode()


class EventFeed(Response):
    """The response described in the module docstring."""

    def __init__(
        self, queue: Queue, since: str, *, heartbeat: float = HEARTBEAT, lifetime: float = LIFETIME
    ) -> None:
        super().__init__()
        # No content-length: the body is a stream; no proxy buffering (nginx).
        self.raw_headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-store"),
            (b"x-accel-buffering", b"no"),
        ]
        self.queue = queue
        self.since = since
        self.heartbeat = heartbeat
        self.lifetime = lifetime

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        global OPEN
        OPEN += 1
        try:
            if self.since == "$":
                # "$" made concrete before the first byte: whatever happens after
                # the browser sees the answer begin is in the feed.
                newest = await self.queue.client.redis.xrevrange(self.queue.keys.events, count=1)
                self.since = _text(newest[0][0]) if newest else "0-0"
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            hello = f"retry: {RETRY_MS}\n\n".encode()
            await send({"type": "http.response.body", "body": hello, "more_body": True})
            async with anyio.create_task_group() as tg:
                _SCOPES.add(tg.cancel_scope)
                try:
                    tg.start_soon(self._watch_disconnect, receive, tg.cancel_scope)
                    with anyio.move_on_after(self.lifetime if self.lifetime > 0 else math.inf):
                        await self._relay(send)
                    tg.cancel_scope.cancel()
                finally:
                    _SCOPES.discard(tg.cancel_scope)
            with contextlib.suppress(OSError):  # the client may be gone already
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            OPEN -= 1

    @staticmethod
    async def _watch_disconnect(receive: Receive, scope: anyio.CancelScope) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        scope.cancel()

    async def _relay(self, send: Send) -> None:
        """Events as they come, a heartbeat comment while there are none."""
        sender, inbox = anyio.create_memory_object_stream[QueueEvent](100)
        async with anyio.create_task_group() as tg, inbox:
            tg.start_soon(self._follow, sender)
            while True:
                with anyio.move_on_after(self.heartbeat) as quiet:
                    event = await inbox.receive()
                if quiet.cancelled_caught:
                    await send({"type": "http.response.body", "body": b": quiet\n\n", "more_body": True})
                    continue
                await send({"type": "http.response.body", "body": frame(event), "more_body": True})

    async def _follow(self, sender: anyio.abc.ObjectSendStream[QueueEvent]) -> None:
        events = cast("AsyncGenerator[QueueEvent, None]", self.queue.events(since=self.since))
        async with sender, contextlib.aclosing(events):
            async for event in events:
                await sender.send(event)
