"""Wake-ups: the hints of a store's push channel, for the waits that would otherwise poll.

A backend that has a push channel (``BaseBackend.wakeups()``: PostgreSQL ``LISTEN``,
Redis pub/sub, an in-process queue for the memory store) lets a backup take a released
run over, and a worker pick up a "Run now" request, as soon as the store says so rather
than at the next poll. A hint only ends a wait early: what follows is the same look at
the store (``active()``, a claim, the run requests' conditional ``UPDATE``) that the
poll would have made, so a lost, repeated or forged hint changes when an instance asks,
never what the store answers. The polls stay, at their intervals, as the fallback.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

from asgiref.sync import async_to_sync

from ..backends.base import Wakeup

__all__ = ["SEND_BOUND_S", "WakeHub", "WakeListener", "send_wakeup", "send_wakeup_sync"]

logger = logging.getLogger("django_anarchon")

#: Longest a sender waits for a hint to go out; past it the poll will find the change.
SEND_BOUND_S = 1.0
#: A hint this recent still counts for a wait that begins after it: it may have come
#: while the claim that made this instance wait was still on its way back.
RECENT_S = 2.0
#: Longest pause before the engine asks a backend again for its hints after they ended.
RESTART_MAX_S = 5.0

Key = tuple[str, str]


def released_key(job: str) -> Key:
    return ("released", job)


def requests_key(scheduler: str) -> Key:
    return ("run-request", scheduler)


class WakeHub:
    """Who waits for which hint; one per scheduler, used on the scheduler's loop only."""

    def __init__(self) -> None:
        self._waiters: dict[Key, set[asyncio.Event]] = {}
        self._recent: dict[Key, float] = {}
        #: Hints noted so far (tests and the benchmark wait on it).
        self.count = 0

    @contextlib.contextmanager
    def watching(self, *keys: Key) -> Iterator[asyncio.Event]:
        """An event set by each hint for one of ``keys`` while the block runs.

        Enter it before the look at the store that it may cut short, and ``clear()`` it
        just before each look: a hint that comes during the look then ends the next
        wait at once instead of being missed.
        """
        event = asyncio.Event()
        now = _now()
        if any(now - self._recent.get(key, -RECENT_S - 1) <= RECENT_S for key in keys):
            event.set()
        for key in keys:
            self._waiters.setdefault(key, set()).add(event)
        try:
            yield event
        finally:
            for key in keys:
                waiters = self._waiters.get(key)
                if waiters is not None:
                    waiters.discard(event)
                    if not waiters:
                        del self._waiters[key]

    def note(self, hint: Wakeup) -> None:
        """Wake the waiters of ``hint`` (all of them for ``resync``)."""
        self.count += 1
        now = _now()
        if hint.kind == "resync":
            for waiters in self._waiters.values():
                for event in waiters:
                    event.set()
            return
        key = released_key(hint.job) if hint.kind == "released" else requests_key(hint.scheduler)
        if len(self._recent) > 1000:  # forged hints for made-up jobs must not pile up
            self._recent = {k: t for k, t in self._recent.items() if now - t <= RECENT_S}
        self._recent[key] = now
        for event in self._waiters.get(key, ()):
            event.set()


def _now() -> float:
    return asyncio.get_running_loop().time()


class WakeListener:
    """The task that feeds a backend's hints into a hub, from ``start()`` to ``stop()``."""

    def __init__(self, backend: Any, hub: WakeHub, label: str) -> None:
        self._backend = backend
        self._hub = hub
        self._label = label
        self._task: asyncio.Task[None] | None = None

    @property
    def active(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> bool:
        """Start listening if the backend has a push channel; ``False`` if it has none."""
        wakeups = getattr(self._backend, "wakeups", None)
        try:
            hints = wakeups() if callable(wakeups) else None
        except Exception as exc:  # a backend's bug must not keep the scheduler from starting
            logger.warning("%s: no wake-ups (%r); polls go on", self._label, exc)
            return False
        if hints is None:
            return False
        self._task = asyncio.get_running_loop().create_task(
            self._listen(hints), name=f"anarchon wake-ups {self._label}"
        )
        return True

    async def _listen(self, hints: AsyncIterator[Wakeup]) -> None:
        delay = 0.1
        while True:
            try:
                async for hint in hints:
                    self._hub.note(hint)
                    delay = 0.1
                logger.warning("%s: the store's wake-ups ended; listening again", self._label)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a backend's bug must not end the scheduler
                logger.warning("%s: wake-ups failed (%r); polls go on", self._label, exc)
            finally:
                with contextlib.suppress(Exception):
                    await hints.aclose()  # type: ignore[attr-defined]
            await asyncio.sleep(delay)
            delay = min(delay * 2, RESTART_MAX_S)
            try:
                again = self._backend.wakeups()
            except Exception as exc:
                logger.warning("%s: no wake-ups (%r); polls go on", self._label, exc)
                return
            if again is None:
                return
            hints = again

    def cancel(self) -> asyncio.Task[None] | None:
        """Cancel the listening (it closes its connection); the task, to wait for its end."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
        return task


async def send_wakeup(backend: Any, hint: Wakeup) -> None:
    """Send a hint through ``backend``, within ``SEND_BOUND_S``; never raises."""
    wake = getattr(backend, "wake", None)
    if not callable(wake):
        return
    try:
        async with asyncio.timeout(SEND_BOUND_S):
            await wake(hint)
    except Exception as exc:  # only a hint: the poll finds the change anyway
        logger.info("could not send the %s hint for %s: %r", hint.kind, hint.job, exc)


def send_wakeup_sync(backend: Any, hint: Wakeup) -> None:
    """:func:`send_wakeup` from sync code (a web request); on a loop's thread, a task."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        async_to_sync(send_wakeup)(backend, hint)
        return
    task = loop.create_task(send_wakeup(backend, hint))
    _PENDING.add(task)
    task.add_done_callback(_PENDING.discard)


_PENDING: set[asyncio.Task[None]] = set()
