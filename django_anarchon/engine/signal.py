"""The abort signal a handler receives as ``ctx.signal``.

One object serves both kinds of handler: a sync handler sleeps with ``wait()`` in its
pool thread, an async one with ``await sleep()`` on the loop, and both wake the moment
the engine aborts the run (stop, timeout, takeover). Aborting may happen on any thread.

The signal also remembers whether the handler *saw* the abort (read ``aborted`` as
true, woke from ``wait()``/``sleep()`` on it, or raised from ``raise_if_aborted()``):
a handler that returns after seeing it was cut short, and its attempt is recorded
``interrupted``; one that never looked ran to its own end, and its return is a success.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

from ..exceptions import AbortedError

__all__ = ["AbortSignal"]


class AbortSignal:
    """Aborted at most once, with a reason (``"stop"``, ``"timeout"``, ``"takeover"``)."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._reason: str | None = None
        self._seen = False
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = set()

    @property
    def aborted(self) -> bool:
        return self._saw(self._event.is_set())

    def _saw(self, aborted: bool) -> bool:
        if aborted:
            self._seen = True
        return aborted

    def _is_aborted(self) -> bool:
        """``aborted`` for the engine: its reading is not the handler seeing the abort."""
        return self._event.is_set()

    def _was_seen(self) -> bool:
        """Did the handler see the abort? Then a return from it means it was cut short."""
        return self._seen

    @property
    def reason(self) -> str | None:
        return self._reason

    def abort(self, reason: str) -> bool:
        """Abort with ``reason``; return ``False`` if it was already aborted (first reason wins)."""
        with self._lock:
            if self._event.is_set():
                return False
            self._reason = reason
            self._event.set()
            waiters, self._waiters = self._waiters, set()
        for loop, future in waiters:
            with contextlib.suppress(RuntimeError):  # a closed loop has nobody waiting
                loop.call_soon_threadsafe(_wake, future)
        return True

    def wait(self, timeout: float | None = None) -> bool:
        """Sleep up to ``timeout`` seconds (blocking), waking early on abort; return ``aborted``."""
        return self._saw(self._event.wait(timeout))

    async def sleep(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109
        """The async twin of :meth:`wait`: never blocks the event loop."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        entry = (loop, future)
        with self._lock:
            if self._event.is_set():
                return self._saw(True)
            self._waiters.add(entry)
        try:
            await asyncio.wait([future], timeout=timeout)
        finally:
            with self._lock:
                self._waiters.discard(entry)
        return self._saw(self._event.is_set())

    def raise_if_aborted(self) -> None:
        """Raise :class:`~django_anarchon.exceptions.AbortedError` once aborted."""
        if self._event.is_set():
            self._seen = True
            raise AbortedError(self._reason)

    def __repr__(self) -> str:
        state = f"aborted ({self._reason})" if self._event.is_set() else "active"
        return f"<AbortSignal {state}>"


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
