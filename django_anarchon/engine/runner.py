"""Running one attempt of one run: context, data, handler, heartbeat, timeout, result.

Sync handlers run in the scheduler's bounded thread pool with Django's connection
hygiene around them; async handlers run as tasks on the scheduler's loop. On lease
stores the runner heartbeats while the handler runs, and a refused heartbeat (another
instance took the run over) aborts the handler. Whatever the handler does, the attempt
ends with a record: nothing it raises reaches the scheduler.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import traceback
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from django.db import close_old_connections, connections

from ..backends.base import (
    Backend,
    BaseBackend,
    FinalStatus,
    RunReason,
    RunRecord,
    StoredResult,
    ms_to_datetime,
)
from ..durations import format_duration
from ..exceptions import JobTimeoutError
from ..jobs import Job
from ..retry import retry_store_call
from .context import JobContext
from .events import Event, EventName
from .signal import AbortSignal
from .timer import now_ms

__all__ = ["UNSET", "Attempt", "Runner", "RunnerHost"]

logger = logging.getLogger("django_anarchon")

#: Marks "no run data given" (``None`` is a value a caller may not mean to pass).
UNSET: Any = object()

#: How long finish()/save_result() keep retrying a store that is down before giving up.
RECORD_RETRY_MS = 10 * 60 * 1000
#: Most characters of an error text kept in a record.
MAX_ERROR_CHARS = 4000


class RunnerHost(Protocol):
    """What the runner needs from its scheduler."""

    name: str
    instance_id: str
    backend: Backend | BaseBackend
    lease_ms: int
    heartbeat_ms: int
    data: Any

    def executor(self) -> Executor: ...

    async def emit(self, event: Event) -> None: ...


@dataclass(eq=False)
class Attempt:
    """One attempt in flight on this instance; the scheduler keeps them to stop them."""

    job: Job
    slot: int
    attempt: int
    reason: RunReason
    token: str | None
    manual: bool = False
    lease: bool = False
    run_data: Any = UNSET
    signal: AbortSignal = field(default_factory=AbortSignal)
    started_at: int = 0
    lost: bool = False
    _interrupted: asyncio.Future[str] | None = None
    _loop: asyncio.AbstractEventLoop | None = None

    def abort(self, reason: str) -> None:
        """Abort the handler's signal (it may still finish; the grace is the caller's)."""
        self.signal.abort(reason)

    def interrupt(self, reason: str) -> None:
        """Stop waiting for the handler: it ends ``interrupted`` now. Safe from any thread."""
        self.signal.abort(reason)
        loop, future = self._loop, self._interrupted
        if loop is None or future is None:
            return
        try:
            if asyncio.get_running_loop() is loop:
                _set(future, reason)
                return
        except RuntimeError:
            pass
        loop.call_soon_threadsafe(_set, future, reason)


def _set(future: asyncio.Future[str], value: str) -> None:
    if not future.done():
        future.set_result(value)


def _call_sync(fn: Callable[[JobContext], Any], ctx: JobContext) -> Any:
    """Run sync user code in a pool thread with Django's per-request connection hygiene."""
    close_old_connections()
    try:
        return fn(ctx)
    finally:
        try:
            close_old_connections()
            connections.close_all()
        except Exception:
            logger.exception("closing database connections after job %s failed", ctx.name)


def error_text(exc: BaseException) -> str:
    """Type and message first (what lists show), then the last frames of the traceback."""
    head = f"{type(exc).__name__}: {exc}"
    frames = "".join(traceback.format_exception(exc, limit=-5))
    text = f"{head}\n\n{frames}".rstrip()
    if len(text) > MAX_ERROR_CHARS:
        text = text[: MAX_ERROR_CHARS - 3] + "..."
    return text


def _log_late_return(job: str, slot: int) -> Callable[[asyncio.Future[Any]], None]:
    def done(future: asyncio.Future[Any]) -> None:
        if future.cancelled():
            return
        exc = future.exception()
        logger.warning(
            "job %s slot %s: the handler returned after its attempt had ended (%s); result ignored",
            job,
            slot,
            f"raised {exc!r}" if exc else "returned",
        )

    return done


class Runner:
    """Runs attempts for one scheduler."""

    def __init__(self, host: RunnerHost) -> None:
        self.host = host

    def _what(self, attempt: Attempt, call: str) -> str:
        return (
            f"scheduler {self.host.name}: {call} of job {attempt.job.name} slot {attempt.slot} "
            f"attempt {attempt.attempt}"
        )

    def record(
        self,
        attempt: Attempt,
        status: str,
        finished_at: int | None = None,
        error: str | None = None,
    ) -> RunRecord:
        return RunRecord(
            job=attempt.job.name,
            slot=attempt.slot,
            scheduled_at=ms_to_datetime(attempt.slot),
            instance_id=self.host.instance_id,
            manual=attempt.manual,
            attempt=attempt.attempt,
            reason=attempt.reason,
            status=status,
            started_at=ms_to_datetime(attempt.started_at),
            finished_at=None if finished_at is None else ms_to_datetime(finished_at),
            duration_ms=None if finished_at is None else max(finished_at - attempt.started_at, 0),
            error=error,
        )

    async def _emit(
        self,
        name: EventName,
        attempt: Attempt,
        record: RunRecord | None = None,
        error: str | None = None,
        reason: str | None = None,
    ) -> None:
        await self.host.emit(
            Event(
                name=name,
                scheduler=self.host.name,
                instance_id=self.host.instance_id,
                job=attempt.job.name,
                slot=attempt.slot,
                record=record,
                error=error,
                reason=reason,
            )
        )

    async def run(self, attempt: Attempt) -> RunRecord:
        """Run ``attempt`` to its end and record it; never raises (except cancellation)."""
        loop = asyncio.get_running_loop()
        attempt._loop = loop
        attempt._interrupted = loop.create_future()
        attempt.started_at = now_ms()
        await self._emit("start", attempt, self.record(attempt, "running"), reason=attempt.reason)
        heartbeat: asyncio.Task[None] | None = None
        if attempt.lease:
            heartbeat = loop.create_task(self._heartbeat(attempt))
        try:
            status, error = await self._execute(attempt)
        finally:
            if heartbeat is not None:
                heartbeat.cancel()
        finished_at = now_ms()
        stopped = (
            attempt._interrupted.done() and not attempt.lost and attempt.signal.reason == "stop"
        )
        if attempt.lease and not attempt.lost and attempt.token is not None:
            if stopped:
                await self._release(attempt)
            else:
                finished = await self._finish(attempt, status)
                if finished is False:
                    attempt.lost = True
        if attempt.lost:
            note = "lease lost: another instance took this run over"
            error = f"{error}\n\n{note}" if error else note
            status = "interrupted"
        record = self.record(attempt, status, finished_at, error)
        await self._save(attempt, record)
        event: EventName = {"success": "success", "failed": "failure"}.get(status, "interrupted")  # type: ignore[assignment]
        await self._emit(event, attempt, record, error=error, reason=attempt.signal.reason)
        if attempt.lost:
            await self._emit("lost", attempt, record, error=error, reason="takeover")
        return record

    # -- the handler ------------------------------------------------------------------

    async def _execute(self, attempt: Attempt) -> tuple[FinalStatus, str | None]:
        job = attempt.job
        ctx = JobContext(
            name=job.name,
            slot=attempt.slot,
            scheduled_at=ms_to_datetime(attempt.slot),
            instance_id=self.host.instance_id,
            manual=attempt.manual,
            data=None,
            signal=attempt.signal,
            attempt=attempt.attempt,
            reason=attempt.reason,
        )
        try:
            ctx = replace(ctx, data=await self._data(attempt, ctx))
        except Exception as exc:
            logger.warning(
                "job %s slot %s: the data provider raised %r", job.name, attempt.slot, exc
            )
            return "failed", "data provider failed: " + error_text(exc)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any]
        if job.is_async:
            future = loop.create_task(job.handler(ctx), name=f"anarchon-run-{job.name}")
        else:
            future = loop.run_in_executor(self.host.executor(), _call_sync, job.handler, ctx)
        assert attempt._interrupted is not None
        timeout = None if job.options.timeout_ms is None else job.options.timeout_ms / 1000
        started = now_ms()
        done, _ = await asyncio.wait(
            {future, attempt._interrupted}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
        if (
            future in done
            and not job.is_async
            and not future.cancelled()
            and future.exception() is None
            and inspect.isawaitable(future.result())
        ):
            # A sync callable that returned a coroutine (``lambda ctx: work(ctx)``): run it.
            future = asyncio.ensure_future(future.result())
            if timeout is not None:
                timeout = max(timeout - (now_ms() - started) / 1000, 0)
            done, _ = await asyncio.wait(
                {future, attempt._interrupted}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
        if future in done:
            return self._outcome(attempt, future)
        if attempt._interrupted.done():
            why = attempt._interrupted.result()
            await self._abandon(attempt, future)
            return "interrupted", f"run interrupted ({why})"
        attempt.signal.abort("timeout")
        await self._abandon(attempt, future)
        assert job.options.timeout_ms is not None
        limit = format_duration(job.options.timeout_ms)
        timeout_error = JobTimeoutError(f"job {job.name!r} ran longer than its timeout of {limit}")
        logger.warning(
            "job %s slot %s attempt %s: %s", job.name, attempt.slot, attempt.attempt, timeout_error
        )
        return "failed", f"{type(timeout_error).__name__}: {timeout_error}"

    def _outcome(
        self, attempt: Attempt, future: asyncio.Future[Any]
    ) -> tuple[FinalStatus, str | None]:
        if future.cancelled():
            return "interrupted", f"run cancelled ({attempt.signal.reason or 'cancelled'})"
        exc = future.exception()
        if exc is None:
            return "success", None
        if attempt.signal.aborted:
            return "interrupted", error_text(exc)
        logger.warning(
            "job %s slot %s attempt %s failed: %r",
            attempt.job.name,
            attempt.slot,
            attempt.attempt,
            exc,
        )
        return "failed", error_text(exc)

    async def _abandon(self, attempt: Attempt, future: asyncio.Future[Any]) -> None:
        """Give up on a handler: cancel an async one; a sync thread runs on, ignored."""
        if isinstance(future, asyncio.Task):
            future.cancel()
            await asyncio.wait({future}, timeout=1.0)
            if not future.done():
                future.add_done_callback(_log_late_return(attempt.job.name, attempt.slot))
            elif not future.cancelled():
                future.exception()  # retrieved: no "never retrieved" warning
        else:
            future.add_done_callback(_log_late_return(attempt.job.name, attempt.slot))

    async def _data(self, attempt: Attempt, ctx: JobContext) -> Any:
        value = attempt.run_data
        if value is UNSET or value is None:
            value = attempt.job.options.data
        if value is None:
            value = self.host.data
        if not callable(value):
            return value
        if inspect.iscoroutinefunction(value):
            return await value(ctx)
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(self.host.executor(), _call_sync, value, ctx)
        if inspect.isawaitable(result):
            result = await result
        return result

    # -- the store ------------------------------------------------------------------

    async def _heartbeat(self, attempt: Attempt) -> None:
        runs = self.host.backend.runs
        assert runs is not None and attempt.token is not None
        job, slot, token = attempt.job.name, attempt.slot, attempt.token
        lease_ms = self.host.lease_ms
        while True:
            await asyncio.sleep(self.host.heartbeat_ms / 1000)
            try:
                alive = await retry_store_call(
                    self._what(attempt, "heartbeat"),
                    lambda: runs.heartbeat(job, slot, token, lease_ms),
                    deadline_ms=now_ms() + lease_ms,
                )
            except Exception:
                continue  # logged; the store decides whether the lease is still ours
            if not alive:
                logger.warning(
                    "job %s slot %s attempt %s: heartbeat refused; the run was taken over",
                    job,
                    slot,
                    attempt.attempt,
                )
                attempt.lost = True
                attempt.interrupt("takeover")
                return

    async def _finish(self, attempt: Attempt, status: FinalStatus) -> bool | None:
        runs = self.host.backend.runs
        assert runs is not None and attempt.token is not None
        job, slot, token = attempt.job.name, attempt.slot, attempt.token
        try:
            return await retry_store_call(
                self._what(attempt, "finish"),
                lambda: runs.finish(job, slot, token, status),
                deadline_ms=now_ms() + RECORD_RETRY_MS,
            )
        except Exception as exc:
            await self._emit("error", attempt, error=error_text(exc), reason="finish")
            return None

    async def _release(self, attempt: Attempt) -> None:
        runs = self.host.backend.runs
        assert runs is not None and attempt.token is not None
        job, slot, token = attempt.job.name, attempt.slot, attempt.token
        try:
            await retry_store_call(
                self._what(attempt, "release"),
                lambda: runs.release(job, slot, token),
                deadline_ms=now_ms() + 5_000,
            )
        except Exception as exc:
            await self._emit("error", attempt, error=error_text(exc), reason="release")

    async def _save(self, attempt: Attempt, record: RunRecord) -> None:
        assert record.finished_at is not None and record.duration_ms is not None
        result = StoredResult(
            slot=attempt.slot,
            by=self.host.instance_id,
            attempt=attempt.attempt,
            status=record.status,  # type: ignore[arg-type]
            started_at=attempt.started_at,
            finished_at=attempt.started_at + record.duration_ms,
            duration_ms=record.duration_ms,
            error=record.error,
            manual=attempt.manual,
            reason=attempt.reason,
        )
        options = attempt.job.options
        backend = self.host.backend
        try:
            await retry_store_call(
                self._what(attempt, "save_result"),
                lambda: backend.save_result(
                    attempt.job.name, result, options.history_size, options.history_ttl_ms
                ),
                deadline_ms=now_ms() + RECORD_RETRY_MS,
            )
        except Exception as exc:
            await self._emit("error", attempt, record, error=error_text(exc), reason="save_result")
