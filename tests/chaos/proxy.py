"""A tiny TCP proxy in front of Redis that a test can make go silent.

``blackhole()`` makes every connection open at that moment swallow whatever
is sent, in both directions, forever, without closing: the half-open TCP
connection a NAT or firewall leaves behind, or a server that stops
answering. New connections are forwarded normally. ``pause()`` / ``resume()``
hold every connection, new ones included, until resumed.
"""

from __future__ import annotations

import asyncio
import contextlib


class Proxy:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self._server: asyncio.Server | None = None
        self._generation = 0  # connections of generations <= _dead_upto are blackholed
        self._dead_upto = -1
        self._running = asyncio.Event()
        self._running.set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self) -> Proxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def blackhole(self) -> None:
        """Every connection open now goes silent for good; later ones work."""
        self._dead_upto = self._generation
        self._generation += 1

    def pause(self) -> None:
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        gen = self._generation
        await self._running.wait()
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self._writers += [writer, up_writer]
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.ensure_future(self._pump(gen, src, dst))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(self, gen: int, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.CancelledError):
            while True:
                await self._running.wait()
                data = await src.read(65536)
                if not data:
                    break
                await self._running.wait()
                if gen <= self._dead_upto:
                    continue  # swallowed: the peer waits for a reply that never comes
                dst.write(data)
                await dst.drain()
        dst.close()

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for w in self._writers:
            w.close()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
