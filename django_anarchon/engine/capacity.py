"""Back-pressure: an instance claims only what its handler pool can start now."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

__all__ = ["Capacity"]


class Capacity:
    """How many sync handlers this instance can start now: its pool's free threads.

    A unit is held by each sync attempt until its user code has returned, and by each
    sync claim waiting for its answer, so an instance whose pool is full claims later
    than idle ones, and they win the slot (back-pressure).
    """

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.used = 0
        self._freed = asyncio.Event()

    @property
    def free(self) -> int:
        return self.threads - self.used

    @property
    def backlog(self) -> int:
        """How many runs this instance would have waiting for a thread with one more."""
        return max(self.used + 1 - self.threads, 0)

    def take(self, n: int = 1) -> None:
        self.used += n

    def give(self, n: int = 1) -> None:
        self.used = max(self.used - n, 0)
        self._freed.set()

    @contextlib.contextmanager
    def holding(self, n: int = 1) -> Iterator[None]:
        self.take(n)
        try:
            yield
        finally:
            self.give(n)

    def nudge(self) -> None:
        """Wake ``freed()`` as a unit given back would."""
        self._freed.set()

    async def freed(self, timeout_s: float) -> None:
        """Wait for the next unit given back (or a nudge), at most ``timeout_s``."""
        self._freed.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(timeout_s, 0.0)):
                await self._freed.wait()

    async def admit(self, limit_s: float) -> None:
        """Wait until a thread is free, at most ``limit_s`` (the caller then claims anyway)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit_s
        while self.backlog and (left := deadline - loop.time()) > 0:
            await self.freed(left)
