"""A TCP forwarder on 127.0.0.1 that the chaos suite can cut: a network partition between
one agent and the server, with no root, no iptables and nothing outside this process.

Each agent talks to its own `Proxy` port; the proxy forwards to the server's port. `cut()`
resets every open connection and answers every new one with a reset until `restore()`, so
the agent sees what a broken network shows it: requests that fail at once. All proxies run
on one asyncio loop in a daemon thread; `cut`/`restore` are called from other threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
CHUNK = 65536
HOST = "127.0.0.1"


def reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset (SO_LINGER 0), as a dropped connection looks to its peer."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class Proxy:
    """One listening port forwarding to `upstream_port`; build it with `ProxyLoop.add`."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.cut_now = False
        self.connections = 0  # accepted and forwarded, for the summary
        self.refused = 0  # reset while cut
        self._open: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._handlers = 0  # connections being accepted or forwarded now
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    async def listen(self) -> None:
        self._server = await asyncio.start_server(self._accept, HOST, 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def cut(self) -> None:
        self.cut_now = True
        for client, upstream in list(self._open):
            reset(client)
            reset(upstream)
        self._open.clear()

    async def restore(self) -> None:
        self.cut_now = False

    async def close(self) -> None:
        """Stop listening, reset every connection and let each handler finish (a handler
        still pending when the loop stops would be destroyed mid-flight)."""
        if self._server is not None:
            self._server.close()
        await self.cut()
        for _ in range(200):
            if not self._handlers:
                break
            await asyncio.sleep(0.01)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                      ) -> None:
        self._handlers += 1
        try:
            await self._forward(reader, writer)
        finally:
            self._handlers -= 1

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                       ) -> None:
        if self.cut_now:
            self.refused += 1
            reset(writer)
            return
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(
                HOST, self.upstream_port)
        except OSError:  # the server is down: the agent sees a refusal, as it would
            reset(writer)
            return
        if self.cut_now:  # cut while connecting
            reset(writer)
            reset(upstream_writer)
            return
        self.connections += 1
        pair = (writer, upstream_writer)
        self._open.add(pair)
        pumps = [asyncio.ensure_future(self._pump(reader, upstream_writer)),
                 asyncio.ensure_future(self._pump(upstream_reader, writer))]
        try:
            # Either side closing ends the connection (HTTP needs no half-close here).
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            self._open.discard(pair)
            for side in pair:
                side.close()  # flushes what the other side sent last

    @staticmethod
    async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(CHUNK):
                writer.write(data)
                await writer.drain()


class ProxyLoop:
    """The event loop thread that runs every proxy of one test; `close()` stops it."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="chaos-proxy",
                                        daemon=True)
        self._thread.start()
        self.proxies: list[Proxy] = []

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=10)

    def add(self, upstream_port: int) -> Proxy:
        proxy = Proxy(upstream_port)
        self._run(proxy.listen())
        self.proxies.append(proxy)
        return proxy

    def cut(self, proxy: Proxy) -> None:
        self._run(proxy.cut())

    def restore(self, proxy: Proxy) -> None:
        self._run(proxy.restore())

    def close(self) -> None:
        for proxy in self.proxies:
            with contextlib.suppress(Exception):
                self._run(proxy.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()
