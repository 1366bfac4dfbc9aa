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
from collections.abc import Awaitable, Callable
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
    asgiref) and possibly from several threads, so it keeps one client per loop; a client
    whose loop is gone is dropped (its loop cannot run its shutdown any more).
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
        self._items: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, T] = (
            weakref.WeakKeyDictionary()
        )
        self._opening: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
            weakref.WeakKeyDictionary()
        )

    async def get(self) -> T:
        """The client of the running loop; opens one if there is none or it is broken."""
        loop = asyncio.get_running_loop()
        with self._lock:
            item = self._items.get(loop)
            if item is not None and self._usable(item):
                return item
            opening = self._opening.get(loop)
            if opening is None:
                opening = self._opening[loop] = asyncio.Lock()
        async with opening:
            with self._lock:
                item = self._items.get(loop)
            if item is not None and self._usable(item):
                return item
            if item is not None:
                await self.discard(item)
            fresh = await self._open()
            with self._lock:
                self._items[loop] = fresh
            return fresh

    async def discard(self, item: T) -> None:
        """Forget ``item`` (a broken client) and close it quietly."""
        with self._lock:
            for loop, held in list(self._items.items()):
                if held is item:
                    del self._items[loop]
        with contextlib.suppress(Exception):  # a broken client may fail to close; it is gone
            await self._close(item)

    async def close_all(self) -> None:
        """Close the client of this loop; ask live loops to close theirs; drop the rest."""
        current = asyncio.get_running_loop()
        with self._lock:
            items = list(self._items.items())
            self._items.clear()
        for loop, item in items:
            if loop is current:
                with contextlib.suppress(Exception):  # closing is best effort
                    await self._close(item)
            elif loop.is_running() and not loop.is_closed():
                asyncio.run_coroutine_threadsafe(self._quiet_close(item), loop)

    async def _quiet_close(self, item: T) -> None:
        with contextlib.suppress(Exception):  # closing is best effort
            await self._close(item)
