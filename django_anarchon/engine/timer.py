"""One timer per scheduler: a heap of due times served by a single asyncio task.

An idle job is one heap entry, never a task or a thread, so 10,000 idle jobs cost a few
megabytes and no wake-ups. Times are wall-clock epoch milliseconds (slots are), and the
task re-reads the clock after every wake-up, sleeping at most ``MAX_SLEEP_S`` so a
stepped wall clock is noticed.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import time
from collections.abc import Callable

from ..logtime import iso
from ..wallclock import now_ms

__all__ = ["Timer"]

logger = logging.getLogger("django_anarchon")

#: Longest single sleep, so a wall-clock step is noticed within this many seconds.
MAX_SLEEP_S = 30.0
#: A wait this short is slept on the timer's thread, not through the loop (``_run``).
SHORT_SLEEP_S = 0.002


class Timer:
    """Calls ``fire(key, due_ms)`` on the loop once ``due_ms`` has passed.

    One entry per key: scheduling a key again replaces its entry (the old heap item is
    left behind and ignored when popped). ``fire`` must be quick; it starts tasks.
    """

    def __init__(self, fire: Callable[[str, int], None], *, label: str = "timer") -> None:
        self._fire = fire
        self._label = label
        self._heap: list[tuple[int, int, str]] = []
        self._current: dict[str, tuple[int, int]] = {}
        self._seq = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    def __len__(self) -> int:
        return len(self._current)

    def due(self, key: str) -> int | None:
        entry = self._current.get(key)
        return None if entry is None else entry[0]

    def next_due(self) -> int | None:
        """The earliest due time (a replaced entry may make it early, never late)."""
        return self._heap[0][0] if self._heap else None

    def schedule(self, key: str, due_ms: int) -> None:
        """Set (or move) ``key``'s due time; safe from any thread."""
        if self._off_loop():
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self.schedule, key, due_ms)
            return
        seq = next(self._seq)
        self._current[key] = (due_ms, seq)
        heapq.heappush(self._heap, (due_ms, seq, key))
        if self._heap[0][1] == seq:  # the new earliest entry: the sleeper must re-plan
            self._poke()
        if len(self._heap) > 2 * len(self._current) + 64:
            self._compact()

    def cancel(self, key: str) -> None:
        if self._off_loop():
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self.cancel, key)
            return
        self._current.pop(key, None)

    def start(self) -> None:
        """Start the timer task on the running loop."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._stopping = False
        self._task = self._loop.create_task(self._run(), name=f"anarchon-{self._label}")

    async def stop(self) -> None:
        self._stopping = True
        self._poke()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._loop = None

    # -- internals ------------------------------------------------------------------

    def _off_loop(self) -> bool:
        loop = self._loop
        if loop is None or loop.is_closed():
            return False
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        return running is not loop

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _compact(self) -> None:
        self._heap = [(due, seq, key) for key, (due, seq) in self._current.items()]
        heapq.heapify(self._heap)

    def _pop_due(self, now: int) -> list[tuple[str, int]]:
        fired: list[tuple[str, int]] = []
        while self._heap and self._heap[0][0] <= now:
            due, seq, key = heapq.heappop(self._heap)
            if self._current.get(key) == (due, seq):
                del self._current[key]
                fired.append((key, due))
        return fired

    async def _run(self) -> None:
        assert self._wake is not None
        while not self._stopping:
            try:
                for key, due in self._pop_due(now_ms()):
                    try:
                        self._fire(key, due)
                    except Exception:
                        logger.exception("%s: firing %s (due %s) failed", self._label, key, iso(due))
                while self._heap and self._heap[0][0:2] != self._current.get(self._heap[0][2]):
                    heapq.heappop(self._heap)  # drop replaced or cancelled entries
                delay = MAX_SLEEP_S
                if self._heap:
                    # In nanoseconds: a whole-ms clock would wake up to 1 ms late.
                    left_ns = self._heap[0][0] * 1_000_000 - time.time_ns()
                    delay = min(max(left_ns / 1e9, 0), MAX_SLEEP_S)
                self._wake.clear()
                # The event loop's wait ends late: epoll counts whole milliseconds (rounded
                # up) and the kernel lets a wait of T run over by about T/1000 (its timer
                # slack), 1 to 2 ms for a slot a second away. So the loop's wait ends that
                # much early, and the last stretch is slept here, blocking the loop for at
                # most SHORT_SLEEP_S plus the slack.
                early = SHORT_SLEEP_S + delay / 500
                if 0 < delay <= early:
                    time.sleep(delay)  # noqa: ASYNC251 - deliberate: at most ~2 ms (above)
                elif delay > 0:
                    try:
                        async with asyncio.timeout(delay - early):
                            await self._wake.wait()
                    except TimeoutError:
                        pass
            except asyncio.CancelledError:
                raise
            except Exception:  # never let the one timer die
                logger.exception("%s: timer loop error; continuing", self._label)
                await asyncio.sleep(0.1)
