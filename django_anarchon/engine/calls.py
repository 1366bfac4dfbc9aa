"""Calling user code (handlers, data providers) so that nothing it does escapes.

A sync call runs in a pool thread behind a ``_Gate`` that the runner closes when it gives
the call up, so a call still queued then never starts; an async call runs in a task that
returns, never raises, what the code raised (asyncio would re-raise ``SystemExit`` and
``KeyboardInterrupt`` out of the event loop). Either way the result says whether the code
had seen its signal aborted, which decides ``interrupted`` over ``success``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import threading
import time
import traceback
from collections.abc import Awaitable, Callable
from concurrent.futures import Future as ThreadFuture
from dataclasses import dataclass
from typing import Any, TypeVar

from django.db import close_old_connections, connections

from ..logtime import iso
from .context import JobContext
from .signal import AbortSignal

logger = logging.getLogger("django_anarchon")

T = TypeVar("T")

#: Most characters of an error text kept in a record.
MAX_ERROR_CHARS = 4000


def _set(future: asyncio.Future[T], value: T) -> None:
    if not future.done():
        future.set_result(value)


# -- what a call of user code ended with ---------------------------------------------------


@dataclass(frozen=True)
class _Returned:
    value: Any
    aborted: bool  # the call had seen its signal aborted when it returned


@dataclass(frozen=True)
class _Raised:
    exc: BaseException
    aborted: bool  # the signal was already aborted when the call raised


@dataclass(frozen=True)
class _GaveUp:
    """The runner stopped waiting: ``why`` is ``"timeout"`` or the interrupt's reason."""

    why: str


class _NotStarted:
    """The call never started: its attempt ended, or its signal was aborted, first."""


_NOT_STARTED = _NotStarted()
_CANCELLED = _GaveUp("cancelled")

_Result = _Returned | _Raised | _GaveUp | _NotStarted


class _Gate:
    """Lets a pool thread start user code only while its attempt goes on.

    The thread enters right before the call; the runner closes the gate when it gives
    the call up. Both happen under one lock, so a call that had not entered when the
    gate closed never starts, and one that had is known to be running.
    """

    def __init__(
        self,
        signal: AbortSignal,
        loop: asyncio.AbstractEventLoop,
        started: asyncio.Future[float] | None,
    ) -> None:
        """``started`` is set to the call's start (``time.monotonic()``) when one is given:
        only a timeout needs it, and each notice costs the loop a wake-up from the thread."""
        self._lock = threading.Lock()
        self._signal = signal
        self._loop = loop
        self._started = started
        self._open = True
        self._entered = False

    def enter(self) -> bool:
        """In the pool thread: may the call start? (Not once given up, or aborted but by a stop.)"""
        with self._lock:
            if not self._open or not _may_start(self._signal):
                return False
            self._entered = True
        if self._started is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed: nothing waits
                self._loop.call_soon_threadsafe(_set, self._started, time.monotonic())
        return True

    def close(self) -> bool:
        """On the loop: no start from now on; return whether the call had started."""
        with self._lock:
            self._open = False
            return self._entered


def _may_start(signal: AbortSignal) -> bool:
    """Any abort but a stop's forbids a start; a stop's grace still lets won work start."""
    return not signal._is_aborted() or signal.reason == "stop"


def _returned(value: Any, ctx: JobContext) -> _Returned:
    return _Returned(value, ctx.signal._was_seen())


def _raised(exc: BaseException, ctx: JobContext) -> _Raised:
    return _Raised(exc, ctx.signal._is_aborted())


def _in_thread(gate: _Gate, fn: Callable[[JobContext], Any], ctx: JobContext) -> _Result:
    """Run sync user code in a pool thread with Django's per-request connection hygiene.

    As around a request: a connection past ``CONN_MAX_AGE``, or broken, is closed before
    and after the call, and any other stays with the thread for its next run (closing
    them all cost every run of a handler that touches the database a new connection).
    """
    if not gate.enter():
        return _NOT_STARTED
    try:
        close_old_connections()
        try:
            value = fn(ctx)
        except BaseException as exc:  # SystemExit too: it is this attempt's failure
            return _raised(exc, ctx)
        return _returned(value, ctx)
    finally:
        try:
            close_old_connections()
        except Exception:
            logger.exception("closing database connections after job %s failed", ctx.name)


def close_thread_connections() -> None:
    """Close the calling pool thread's connections, as the thread ends."""
    try:
        connections.close_all()
    except Exception:
        logger.exception("closing a pool thread's database connections failed")


async def _in_task(
    fn: Callable[[JobContext], Any], ctx: JobContext, started: asyncio.Future[float]
) -> _Result:
    """Run async user code as a task that cannot end the loop.

    The call itself happens in here (a wrong signature raises inside the task), and a
    ``SystemExit``/``KeyboardInterrupt`` is returned, not raised: asyncio re-raises
    those out of the event loop when a task raises them.
    """
    if not _may_start(ctx.signal):
        return _NOT_STARTED
    _set(started, time.monotonic())
    try:
        value = fn(ctx)
    except BaseException as exc:
        return _raised(exc, ctx)
    if inspect.isawaitable(value):
        return await _await_in_task(value, ctx)
    return _returned(value, ctx)


async def _await_in_task(awaitable: Awaitable[Any], ctx: JobContext) -> _Result:
    try:
        value = await awaitable
    except asyncio.CancelledError:
        raise
    except BaseException as exc:
        return _raised(exc, ctx)
    return _returned(value, ctx)


def _is_async(fn: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


def error_text(exc: BaseException) -> str:
    """Type and message first (what lists show), then the last frames of the traceback."""
    head = f"{type(exc).__name__}: {exc}"
    frames = "".join(traceback.format_exception(exc, limit=-5))
    text = f"{head}\n\n{frames}".rstrip()
    if len(text) > MAX_ERROR_CHARS:
        text = text[: MAX_ERROR_CHARS - 3] + "..."
    return text


def _late(job: str, slot: int, result: object) -> None:
    if isinstance(result, _NotStarted):
        return
    how = f"raised {result.exc!r}" if isinstance(result, _Raised) else "returned"
    logger.warning(
        "job %s slot %s: the handler %s after its attempt had ended; result ignored",
        job,
        iso(slot),
        how,
    )


def _log_late(job: str, slot: int) -> Callable[[Any], None]:
    """A done-callback for a handler given up on (an asyncio or a thread future)."""

    def done(future: asyncio.Future[Any] | ThreadFuture[Any]) -> None:
        if future.cancelled():
            return
        exc = future.exception()
        _late(job, slot, _Raised(exc, True) if exc is not None else future.result())

    return done


def _result(future: asyncio.Future[_Result]) -> _Result:
    """A finished call's result; an exception that escaped the wrappers is a failure too."""
    exc = future.exception()
    if exc is not None:
        return _Raised(exc, False)
    return future.result()
