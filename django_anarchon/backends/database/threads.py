"""A few threads, each holding its own connection to one database: where the ORM runs.

The engine is asyncio and the ORM blocks, so every call goes to one of these threads
(never the event loop). The pool belongs to the backend, not to an event loop, so the
backend may be used from one loop after another (sync twins via ``async_to_sync``) and
from several threads at once. Each thread checks its connection before every batch of
work, as Django does around a request, so that a dropped connection, a server restart
or ``CONN_MAX_AGE`` never wedges a worker; a thread closes its connection when it ends.

Work is taken in order, except that ``urgent`` work (a lease's heartbeat, finish and
release) goes ahead of everything queued: a burst of claims must not keep a live runner's
heartbeat waiting until its lease lapses and a backup takes the run over.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from django.db import connections

__all__ = ["ConnectionThreads"]

T = TypeVar("T")

_Job = tuple["Future[Any]", Callable[[], Any]]
_URGENT, _NORMAL, _STOP = 0, 1, 2


class ConnectionThreads:
    """Up to ``size`` threads, started on demand, that run callables for one alias."""

    def __init__(self, using: str, size: int, name: str = "anarchon-db") -> None:
        if size < 1:
            raise ValueError(f"size must be at least 1, got {size!r}")
        self.using = using
        self.size = size
        self.name = name
        self._lock = threading.Lock()
        # (priority, order, work): urgent first, then first come first served; the
        # stop markers last, so that shutdown() lets queued work finish.
        self._queue: queue.PriorityQueue[tuple[int, int, _Job | None]] = queue.PriorityQueue()
        self._order = itertools.count()
        self._threads: list[threading.Thread] = []
        self._idle = 0

    def submit(self, fn: Callable[[], T], *, urgent: bool = False) -> Future[T]:
        """Run ``fn`` in one of the threads; ``urgent`` work goes ahead of queued work."""
        future: Future[T] = Future()
        with self._lock:
            if self._idle == 0 and len(self._threads) < self.size:
                thread = threading.Thread(
                    target=self._work, name=f"{self.name}-{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                self._idle += 1
                thread.start()
            self._idle -= 1
        self._queue.put((_URGENT if urgent else _NORMAL, next(self._order), (future, fn)))
        return future

    def shutdown(self) -> None:
        """Stop every thread once its work is done; each closes its own connection."""
        with self._lock:
            threads, self._threads = self._threads, []
            self._idle = 0
            for _ in threads:
                self._queue.put((_STOP, next(self._order), None))
        for thread in threads:
            thread.join()
        with self._lock:
            self._idle = 0

    def _work(self) -> None:
        connection = connections[self.using]
        try:
            while True:
                _, _, item = self._queue.get()
                if item is None:
                    return
                future, fn = item
                outcome: tuple[bool, Any] = (False, None)
                running = future.set_running_or_notify_cancel()
                if running:
                    try:
                        connection.close_if_unusable_or_obsolete()
                        outcome = (True, fn())
                    except BaseException as exc:
                        outcome = (False, exc)
                # Idle again before the caller hears back, so that its next call reuses
                # this thread instead of starting another.
                with self._lock:
                    self._idle += 1
                if running:
                    ok, value = outcome
                    if ok:
                        future.set_result(value)
                    else:
                        future.set_exception(value)
        finally:
            connection.close()
