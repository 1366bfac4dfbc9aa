"""Attempts' ends, batched: each lease's finish and its history record in one store call.

On a lease store that offers ``runs.finish_many()``, an attempt that ends costs one call
where it cost two (``finish()``, then ``save_result()``), and the store writes both in
one atomic step. Attempts that end while a call is on its way (a burst of 1,000 jobs due
at once) wait for it and go together in the next one: an end that finds the store idle
goes at once, and none waits longer than one call for its turn.

Each end's caller keeps its own retries and its own lock against heartbeats (the
runner's ``_locked``): a batch that fails fails each of its ends, and each is sent again
by its caller, with the same token (``finish_many`` is repeat-safe, as ``finish`` is).
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from ..backends.base import RunEnd

__all__ = ["END_CHUNK", "EndBatcher", "FinishesMany"]

#: Most ends in one ``finish_many`` call (bounds one transaction, one pipeline).
END_CHUNK = 200


class FinishesMany(Protocol):
    async def finish_many(self, ends: list[RunEnd]) -> list[bool]: ...


class EndsNotSent(RuntimeError):
    """The scheduler stopped (or restarted on another loop) before these ends were sent."""


class EndBatcher:
    """The ends of one scheduler's attempts, sent together where they meet, on its loop."""

    def __init__(self, runs: FinishesMany) -> None:
        self.runs = runs
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: list[tuple[RunEnd, asyncio.Future[bool]]] = []
        self._sender: asyncio.Task[None] | None = None

    async def finish(self, end: RunEnd) -> bool:
        """Finish ``end``'s lease and, if that acts, write its history record."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a new start: whatever the old loop held is gone
            self._loop, self._queue, self._sender = loop, [], None
        future: asyncio.Future[bool] = loop.create_future()
        self._queue.append((end, future))
        if self._sender is None or self._sender.done():
            self._sender = loop.create_task(self._send(), name="anarchon finish_many")
        return await future

    def close(self) -> asyncio.Task[None] | None:
        """At a stop, once its attempts' tasks are cancelled: cancel the call on its way.

        Returns the task to wait for, if one was still going.
        """
        sender, self._sender = self._sender, None
        if sender is None or sender.done():
            return None
        sender.cancel()
        return sender

    async def _send(self) -> None:
        batch: list[tuple[RunEnd, asyncio.Future[bool]]] = []
        try:
            while self._queue:
                batch, self._queue = self._queue[:END_CHUNK], self._queue[END_CHUNK:]
                batch = [(end, future) for end, future in batch if not future.done()]
                if not batch:
                    continue
                try:
                    answers = await self.runs.finish_many([end for end, _ in batch])
                    if len(answers) != len(batch):
                        raise RuntimeError(
                            f"finish_many answered {len(answers)} times for {len(batch)} ends"
                        )
                except Exception as exc:  # each caller retries its own end
                    _fail(batch, exc)
                    continue
                for (_, future), answer in zip(batch, answers, strict=True):
                    if not future.done():
                        future.set_result(bool(answer))
                batch = []
        except asyncio.CancelledError:
            # Never hand a caller a CancelledError it would take for its own cancellation.
            queued, self._queue = self._queue, []
            _fail([*batch, *queued], EndsNotSent("the scheduler stopped before the store answered"))
            raise


def _fail(batch: list[tuple[RunEnd, asyncio.Future[bool]]], exc: BaseException) -> None:
    for _, future in batch:
        if not future.done():
            future.set_exception(exc)
