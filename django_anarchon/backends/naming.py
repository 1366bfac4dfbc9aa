"""Job names as broker names: readable, routing-safe, and never colliding.

A job name may hold dots, spaces, wildcards (``*``, ``>``, ``#``) or any Unicode letter.
Brokers give some of those a meaning (a NATS subject splits on dots and matches ``*`` and
``>``; a RabbitMQ topic binding matches ``*`` and ``#``; a JetStream stream name refuses
dots, spaces and wildcards). So a job becomes a *key*: a short readable part made of
``[A-Za-z0-9_-]`` only, plus a hash of the exact name. Two names that sanitize alike
("a.b" and "a b") still differ by their hash, and a key is one subject token.

Also here: ``LoopBound``, a client connection bound to the event loop it was opened on.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
import threading
import unicodedata
import weakref
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Generic, TypeVar

__all__ = ["LoopBound", "job_key"]

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
_READABLE_CHARS = 40
_HASH_CHARS = 16  # 64 bits of sha256: a collision among job names is not a practical risk


def job_key(name: str) -> str:
    """``"billing.reconcile"`` -> ``"billing_reconcile-3f0c9a...``; safe as a subject token.

    The readable part folds accents to ASCII where it can ("é" -> "e") and turns every other
    run of unsafe characters into ``_``; the hash is over the exact UTF-8 name.
    """
    folded = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode("ascii")
    readable = _UNSAFE.sub("_", folded).strip("_")[:_READABLE_CHARS] or "job"
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:_HASH_CHARS]
    return f"{readable}-{digest}"


T = TypeVar("T")


class LoopBound(Generic[T]):
    """One client per running event loop, opened lazily and re-opened when it breaks.

    Broker clients (nats-py, aio-pika) belong to the loop that opened them. A backend is
    called from several loops in turn (the sync twins run each call on a fresh loop via
    asgiref) and possibly from several threads, so it keeps one client per loop.

    A client is closed by its own loop as that loop shuts down: each client is watched by
    an async generator, which ``asyncio.run`` and asgiref close (``shutdown_asyncgens``)
    before closing the loop. No socket is left behind by a loop that ended.
    """

    def __init__(
        self,
        open_: Callable[[], Awaitable[T]],
        close: Callable[[T], Awaitable[None]],
        usable: Callable[[T], bool],
    ) -> None:
        self._open = open_
        self._close = close
        self._usable = usable
        self._lock = threading.Lock()
        self._items: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, tuple[T, AsyncGenerator[None, None]]
        ] = weakref.WeakKeyDictionary()
        self._opening: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
            weakref.WeakKeyDictionary()
        )

    def _current(self, loop: asyncio.AbstractEventLoop) -> T | None:
        with self._lock:
            entry = self._items.get(loop)
        return entry[0] if entry is not None else None

    async def get(self) -> T:
        """The client of the running loop; opens one if there is none or it is broken."""
        loop = asyncio.get_running_loop()
        item = self._current(loop)
        if item is not None and self._usable(item):
            return item
        with self._lock:
            opening = self._opening.get(loop)
            if opening is None:
                opening = self._opening[loop] = asyncio.Lock()
        async with opening:
            item = self._current(loop)
            if item is not None and self._usable(item):
                return item
            if item is not None:
                await self.discard(item)
            fresh = await self._open()
            watcher = self._watch(fresh)
            await watcher.__anext__()
            with self._lock:
                self._items[loop] = (fresh, watcher)
            return fresh

    async def _watch(self, item: T) -> AsyncGenerator[None, None]:
        """Suspended until its loop shuts down (or the client is dropped), then closes it."""
        try:
            yield
        finally:
            with self._lock:
                for loop, (held, _) in list(self._items.items()):
                    if held is item:
                        del self._items[loop]
            with contextlib.suppress(Exception):  # closing is best effort
                await self._close(item)

    async def discard(self, item: T) -> None:
        """Forget ``item`` (a broken client) and close it quietly."""
        with self._lock:
            watchers = [w for held, w in self._items.values() if held is item]
        for watcher in watchers:
            await watcher.aclose()
        if not watchers:
            with contextlib.suppress(Exception):
                await self._close(item)

    async def close_all(self) -> None:
        """Close the client of this loop; ask live loops to close theirs."""
        current = asyncio.get_running_loop()
        with self._lock:
            entries = list(self._items.items())
        for loop, (_, watcher) in entries:
            if loop is current:
                await watcher.aclose()
            elif loop.is_running() and not loop.is_closed():
                asyncio.run_coroutine_threadsafe(_aclose(watcher), loop)


async def _aclose(watcher: AsyncGenerator[None, None]) -> None:
    await watcher.aclose()
