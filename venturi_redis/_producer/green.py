"""``SyncClient`` under gevent's or eventlet's monkey patching (docs/integrations.md).

``gevent.monkey.patch_all()`` makes ``threading.Thread`` a greenlet, so the
``SyncClient``'s loop "thread" would run its asyncio loop in a greenlet of
the application's own OS thread. asyncio records its running loop per OS
thread, not per greenlet: every request greenlet would then see our private
loop as running, and Django's ORM (``SynchronousOnlyOperation``),
``asyncio.run``, asgiref's ``async_to_sync`` and a second ``SyncClient``
("Already running asyncio in this thread") all refuse to run.

So under gevent the loop gets a real OS thread, started with the thread
function gevent saved before patching, and a calling greenlet waits for its
call's ``concurrent.futures.Future`` on a watcher of its own hub that the
loop thread fires (``gevent_result``: the hub keeps serving the other
greenlets meanwhile); inside the loop thread, the patched ``selectors`` and
``socket`` run on a gevent hub of that thread's own.

eventlet's green locks cannot be released from another OS thread, so a
caller could not wait for a real loop thread without blocking the hub:
``SyncClient`` refuses to start under eventlet's patching and names the
alternatives.

Nothing here imports gevent or eventlet: only the modules an application
already imported (``sys.modules``) are looked at.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from .._model.errors import ConfigurationError

EVENTLET_REFUSED = (
    "vr.SyncClient does not run under eventlet's monkey patching: its event loop needs a real "
    "OS thread, and eventlet's green locks cannot wait for one without blocking the hub. "
    "Run the app under gevent (gunicorn -k gevent) or threads (gunicorn -k gthread), or "
    "use the async vr.Client from an asyncio app (docs/integrations.md, 'gevent and eventlet')"
)

T = TypeVar("T")


def patched_threading() -> str | None:
    """``"gevent"`` or ``"eventlet"`` when that library has patched ``threading``, else ``None``."""
    gevent_monkey: Any = sys.modules.get("gevent.monkey")
    if gevent_monkey is not None and gevent_monkey.is_module_patched("threading"):
        return "gevent"
    eventlet_patcher: Any = sys.modules.get("eventlet.patcher")
    if eventlet_patcher is not None and eventlet_patcher.is_monkey_patched("thread"):
        return "eventlet"
    return None


def start_loop_thread(target: Callable[[], None], name: str) -> Callable[[Future[T], float | None], T]:
    """Run ``target`` on a new daemon OS thread; returns how to wait for a ``Future`` of it.

    Without patching, a plain daemon ``threading.Thread``, and a blocking
    ``Future.result``. Under gevent, a thread started by the original
    ``_thread.start_new_thread`` (a ``threading.Thread`` would be a
    greenlet), and ``gevent_result``. Under eventlet: refused
    (``ConfigurationError``, module docstring).
    """
    patched = patched_threading()
    if patched is None:
        threading.Thread(target=target, name=name, daemon=True).start()
        return Future.result
    if patched == "eventlet":
        raise ConfigurationError(EVENTLET_REFUSED)
    gevent_monkey: Any = sys.modules["gevent.monkey"]
    gevent_monkey.get_original("_thread", "start_new_thread")(target, ())
    return gevent_result


def gevent_result(future: Future[T], timeout: float | None = None) -> T:
    """``future``'s result, the calling greenlet waiting without blocking its hub.

    A patched ``Future.result`` would park the greenlet on a gevent lock that
    only another OS thread releases; a hub with nothing else to watch then
    raises ``LoopExit`` ("This operation would block forever") instead of
    waiting. So the greenlet waits on an ``async_`` watcher of its own hub,
    the watcher that another thread may fire (``send``), as gevent's own
    thread pool does. If the greenlet is killed or timed out while it
    waits (``gevent.Timeout``), the call is cancelled where it can be. After
    ``timeout`` seconds, ``TimeoutError`` (as ``Future.result``).
    """
    if not future.done():
        hub_module: Any = sys.modules["gevent.hub"]  # imported by gevent.monkey itself
        hub = hub_module.get_hub()
        wake = hub.loop.async_()
        waiter = hub_module.Waiter(hub)
        wake.start(waiter.switch, None)
        timer = hub.loop.timer(timeout) if timeout is not None else None
        if timer is not None:
            timer.start(waiter.switch, None)
        try:
            future.add_done_callback(lambda _: wake.send())
            waiter.get()
        except BaseException:
            future.cancel()
            raise
        finally:
            wake.close()
            if timer is not None:
                timer.close()
    return future.result(0)


__all__ = ["EVENTLET_REFUSED", "gevent_result", "patched_threading", "start_loop_thread"]
