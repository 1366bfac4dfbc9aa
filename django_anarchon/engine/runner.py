"""Running one attempt of one run: context, data, handler, heartbeat, timeout, result.

Sync handlers (and sync data providers) run in the scheduler's bounded thread pool with
Django's connection hygiene around them; async ones run as tasks on the scheduler's loop.
Whatever user code does, the attempt ends with one record and nothing it raises reaches
the scheduler: every exception but cancellation is the attempt's failure, and a
``SystemExit`` or ``KeyboardInterrupt`` from a handler never leaves the event loop.

An attempt that has ended never starts its handler later. A call still queued for a pool
thread is cancelled when its attempt ends, and the thread checks right before it calls
user code, so a handler whose run timed out, was taken over, or outlived the stop's
grace while it waited for a thread never starts. (A stop's abort alone still lets a
queued handler start within the grace: its run was won, and with no attempt left no
backup could run it.) The ``timeout`` clock starts when the handler starts, not when it
was queued.

A handler that returns after it *saw* its signal aborted (``aborted`` read as true,
``wait()``/``sleep()`` woken by it, ``raise_if_aborted()`` raised) was cut short: the
attempt is ``interrupted``, and after a stop its lease is released so that a backup
takes the run over at once. One that never looked ran to its end: a success.

On lease stores the runner heartbeats from the attempt's start until ``finish()`` or
``release()`` has answered, so a finish that is retried through an outage keeps the lease
alive. One lock per attempt serialises those store calls, each shielded from
cancellation: a heartbeat still on its way can never land after the lease was released
or finished. A refused heartbeat (another instance took the run over) aborts the handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from concurrent.futures import Future as ThreadFuture
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeAlias, TypeVar

from ..backends.base import (
    Backend,
    BaseBackend,
    FinalStatus,
    RunEnd,
    RunReason,
    RunRecord,
    StoredResult,
    Wakeup,
    ms_to_datetime,
)
from ..durations import format_duration
from ..enqueue.run import TaskBeat
from ..exceptions import JobTimeoutError
from ..jobs import Job
from ..logtime import iso
from ..retry import retry_store_call
from ..spool import SpoolEntry
from ..wallclock import now_ms
from .calls import (
    _CANCELLED,
    _NOT_STARTED,
    _await_in_task,
    _Gate,
    _GaveUp,
    _in_task,
    _in_thread,
    _is_async,
    _log_late,
    _NotStarted,
    _Raised,
    _Result,
    _result,
    _Returned,
    _set,
    error_text,
)
from .context import JobContext
from .ends import EndBatcher
from .events import Event, EventName
from .signal import AbortSignal
from .wake import send_wakeup

if TYPE_CHECKING:
    from .owed import OwedRecords
    from .tracing import Tracing

__all__ = ["UNSET", "Attempt", "Runner", "RunnerHost"]

logger = logging.getLogger("django_anarchon")

T = TypeVar("T")

#: Marks "no run data given" (``None`` is a value a caller may not mean to pass).
UNSET: Any = object()

#: How an attempt's lease ended: its finish is ``owed`` (it never reached the store),
#: ``ended`` (finished, lost, or released), or ``recorded`` (finished with its record).
Settled: TypeAlias = Literal["owed", "ended", "recorded"]

#: How long finish()/save_result() keep retrying a store that is down before giving up.
RECORD_RETRY_MS = 10 * 60 * 1000
#: How long release() is retried: a hand-over only helps while it is prompt.
RELEASE_RETRY_MS = 5_000
#: How long a cancelled async handler gets to end before the runner stops waiting for it.
CANCEL_WAIT_S = 1.0


class RunnerHost(Protocol):
    """What the runner needs from its scheduler."""

    name: str
    instance_id: str
    backend: Backend | BaseBackend
    lease_ms: int
    heartbeat_ms: int
    data: Any
    owed: OwedRecords
    tracing: Tracing

    def executor(self) -> Executor: ...

    def wants(self, name: EventName) -> bool: ...

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
    #: Why a ``cancel_other`` claim of this instance fenced it (``None``: it did not).
    cancelled: str | None = None
    #: What the handler (or data provider) raised, or its timeout: for the attempt's trace.
    exception: BaseException | None = None
    #: ``time.monotonic()`` when the store last confirmed the lease, taken when that claim
    #: or heartbeat was sent (so never later than the store's own start of the lease).
    held_at: float | None = None
    _interrupted: asyncio.Future[str] | None = field(default=None, init=False, repr=False)
    _loop: asyncio.AbstractEventLoop | None = field(default=None, init=False, repr=False)
    #: Serialises this attempt's heartbeat, finish and release calls (one at a time).
    _store_lock: asyncio.Lock | None = field(default=None, init=False, repr=False)
    #: finish()/release() is under way: a refused heartbeat no longer means "lost".
    _ending: bool = field(default=False, init=False, repr=False)
    #: finish()/release() has answered: no heartbeat may reach the store any more.
    _settled: bool = field(default=False, init=False, repr=False)
    #: Called once user code has returned (or was given up): its thread is free again,
    #: whatever store calls the attempt still makes (``Scheduler.run_attempt``).
    on_user_code_done: Callable[[], None] | None = field(default=None, repr=False)

    def abort(self, reason: str) -> None:
        """Abort the handler's signal (it may still finish; the grace is the caller's).

        A handler that has not started yet never will.
        """
        self.signal.abort(reason)

    def cancel(self, reason: str) -> None:
        """A later slot's ``cancel_other`` claim fenced this attempt: it ends ``interrupted``.

        An attempt whose finish already answered ran to its end and is left alone.
        """
        if self._settled:
            return
        self.lost = True
        self.cancelled = reason
        self.interrupt("cancelled")

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
        with contextlib.suppress(RuntimeError):  # the loop has closed: nothing waits
            loop.call_soon_threadsafe(_set, future, reason)


class _Heartbeat:
    """An attempt's heartbeats: a timer until the first is due, then ``Runner._heartbeat``.

    Most runs end within one heartbeat interval; a timer costs them far less than a task
    that sleeps and is cancelled (a burst of 1,000 runs pays it 1,000 times on the loop).
    """

    def __init__(self, runner: Runner, attempt: Attempt, loop: asyncio.AbstractEventLoop) -> None:
        self._task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        held_at = attempt.held_at if attempt.held_at is not None else time.monotonic()
        due = loop.time() + max(held_at + runner.host.heartbeat_ms / 1000 - time.monotonic(), 0.0)

        def begin() -> None:
            self._timer = None
            self._task = loop.create_task(runner._heartbeat(attempt))

        self._timer = loop.call_at(due, begin)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._task is not None:
            self._task.cancel()


class _What:
    """Names a store call of an attempt in log lines, formatted only if one is written:
    every run's finish is given one, and nearly none is ever logged."""

    __slots__ = ("attempt", "call", "scheduler")

    def __init__(self, scheduler: str, call: str, attempt: Attempt) -> None:
        self.scheduler, self.call, self.attempt = scheduler, call, attempt

    def __str__(self) -> str:
        attempt = self.attempt
        return (
            f"scheduler {self.scheduler}: {self.call} of job {attempt.job.name} "
            f"slot {iso(attempt.slot)} attempt {attempt.attempt}"
        )


#: A slot's datetime, shared by the runs of that slot (a burst's runs have one slot).
_slot_datetime = functools.lru_cache(maxsize=256)(ms_to_datetime)


def _unlock(lock: asyncio.Lock, task: asyncio.Future[Any]) -> None:
    lock.release()
    if not task.cancelled():
        task.exception()  # retrieved: whoever awaited it saw it, or was cancelled


class Runner:
    """Runs attempts for one scheduler."""

    def __init__(self, host: RunnerHost) -> None:
        self.host = host
        self._ends: EndBatcher | None = None

    def _batcher(self) -> EndBatcher | None:
        """Where the store writes a finish and its record in one call (``engine/ends.py``)."""
        runs: Any = self.host.backend.runs
        if not callable(getattr(runs, "finish_many", None)):
            return None
        if self._ends is None or self._ends.runs is not runs:
            self._ends = EndBatcher(runs)
        return self._ends

    def close(self) -> asyncio.Task[None] | None:
        """At a stop: cancel the batch of ends still on its way (``EndBatcher.close``)."""
        return None if self._ends is None else self._ends.close()

    def _what(self, attempt: Attempt, call: str) -> _What:
        return _What(self.host.name, call, attempt)

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
            scheduled_at=_slot_datetime(attempt.slot),
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
        if not self.host.wants(name):
            return
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
        """Run ``attempt`` to its end and record it; never raises (except cancellation).

        Under the attempt's trace (``engine/tracing.py``): its span is current meanwhile.
        """
        with self.host.tracing.attempt(attempt) as trace:
            record = await self._run(attempt)
            trace.end(record, attempt.exception)
            return record

    async def _run(self, attempt: Attempt) -> RunRecord:
        loop = asyncio.get_running_loop()
        attempt._loop = loop
        attempt._interrupted = loop.create_future()
        attempt._store_lock = asyncio.Lock()
        attempt.started_at = now_ms()
        await self._emit("start", attempt, self.record(attempt, "running"), reason=attempt.reason)
        heartbeat: _Heartbeat | None = None
        unconfirmed = await self._unconfirmed(attempt)
        if unconfirmed is None and attempt.lease and attempt.token is not None:
            heartbeat = _Heartbeat(self, attempt, loop)
        try:
            try:
                try:
                    if unconfirmed is None:
                        status, error = await self._execute(attempt)
                    else:
                        status, error = "interrupted", unconfirmed
                finally:
                    if attempt.on_user_code_done is not None:
                        attempt.on_user_code_done()
            except Exception as exc:  # the runner's own bug: still one record, never a crash
                logger.exception("%s failed", self._what(attempt, "the run"))
                status, error = "failed", error_text(exc)
            finished_at = now_ms()
            owed = self.host.owed
            entry = self._entry(attempt, status, finished_at, error,
                                finish=heartbeat is not None and not attempt.lost)
            owed.owe(attempt, entry)
            settled: Settled = "ended"
            if heartbeat is not None and not attempt.lost:
                # Heartbeats go on until finish()/release() has answered.
                settled = await self._settle(attempt, status, entry)
            finish_owed = settled == "owed"
        finally:
            if heartbeat is not None:
                heartbeat.cancel()
        # overlap "cancel_other": whoever fenced this attempt (the canceller, or a backup
        # that took the run over) recorded it in the same store call; this runner does not
        # write over that record (docs/decisions.md).
        fenced = attempt.lost and attempt.job.options.overlap == "cancel_other"
        if attempt.lost:
            note = attempt.cancelled or (
                "lease lost: a later slot cancelled this run, or another instance took it over"
                if fenced
                else "lease lost: another instance took this run over"
            )
            error = f"{error}\n\n{note}" if error else note
            status = "interrupted"
        record = self.record(attempt, status, finished_at, error)
        if settled == "recorded":  # the finish and the record, in one store call
            owed.paid(attempt)
        elif not finish_owed and not owed.settled(attempt):
            if fenced:
                owed.paid(attempt)
            elif attempt.lost:  # the history record says so now: lost, interrupted
                entry = self._entry(attempt, status, finished_at, error, finish=False)
                owed.owe(attempt, entry)
            else:
                owed.paid(attempt, finish=True)
        if not owed.settled(attempt):  # else a stop's bound spooled it all meanwhile
            if await self._save(attempt, entry.result, record) and not finish_owed:
                owed.paid(attempt)
            else:
                owed.give_up(attempt)
        event: EventName = {"success": "success", "failed": "failure"}.get(status, "interrupted")  # type: ignore[assignment]
        await self._emit(event, attempt, record, error=error, reason=attempt.signal.reason)
        if attempt.lost:
            why = "cancelled" if attempt.cancelled else "takeover"
            await self._emit("lost", attempt, record, error=error, reason=why)
        return record

    async def _settle(self, attempt: Attempt, status: FinalStatus, entry: SpoolEntry) -> Settled:
        """End the lease: release it after a stop (a backup takes over at once), else finish.

        With no attempt left nobody could take a released run over, so it is finished
        ``interrupted`` instead of waiting for the store's sweep. ``owed`` if a finish
        never reached the store (it is owed, and spooled); ``recorded`` if the finish
        wrote ``entry``'s history record too (``runs.finish_many``). A release that did
        not reach the store is not owed: the lease lapses by itself.
        """
        attempt._ending = True
        if (
            status == "interrupted"
            and attempt.signal.reason == "stop"
            and attempt.attempt < attempt.job.options.max_attempts
        ):
            await self._release(attempt)
            return "ended"
        ends = self._batcher()
        finished = await self._finish(attempt, status, None if ends is None else (ends, entry))
        if finished is None:
            return "owed"
        if not finished:
            attempt.lost = True
            return "ended"
        return "ended" if ends is None else "recorded"

    def _entry(
        self, attempt: Attempt, status: FinalStatus, finished_at: int, error: str | None,
        *, finish: bool,
    ) -> SpoolEntry:
        """What ``attempt`` owes the store: its history record, and the finish of its lease."""
        options = attempt.job.options
        return SpoolEntry(
            job=attempt.job.name,
            result=StoredResult(
                slot=attempt.slot,
                by=self.host.instance_id,
                attempt=attempt.attempt,
                status=status,
                started_at=attempt.started_at,
                finished_at=max(finished_at, attempt.started_at),
                duration_ms=max(finished_at - attempt.started_at, 0),
                error=error,
                manual=attempt.manual,
                reason=attempt.reason,
            ),
            history_size=options.history_size,
            history_ttl_ms=options.history_ttl_ms,
            token=attempt.token if finish else None,
            finish=status if finish else None,
        )

    # -- the handler ------------------------------------------------------------------

    def _provider(self, attempt: Attempt) -> Any:
        value = attempt.run_data
        if value is UNSET or value is None:
            value = attempt.job.options.data
        if value is None:
            value = self.host.data
        return value

    async def _execute(self, attempt: Attempt) -> tuple[FinalStatus, str | None]:
        job = attempt.job
        ctx = JobContext(
            name=job.name,
            slot=attempt.slot,
            scheduled_at=_slot_datetime(attempt.slot),
            instance_id=self.host.instance_id,
            manual=attempt.manual,
            data=None,
            signal=attempt.signal,
            attempt=attempt.attempt,
            reason=attempt.reason,
        )
        provider = self._provider(attempt)
        if callable(provider):
            data = await self._call(attempt, provider, ctx, is_async=_is_async(provider))
            if not isinstance(data, _Returned) or data.aborted:
                return self._status(attempt, data, provider=True)
            ctx = replace(ctx, data=data.value)
        else:
            ctx = replace(ctx, data=provider)
        timeout_s = None if job.options.timeout_ms is None else job.options.timeout_ms / 1000
        handler = job.handler
        if isinstance(handler, TaskBeat):
            # A job that enqueues a task: the beat needs the store and this attempt's lease
            # token to commit the enqueue with the run's finish (enqueue/run.py).
            # Once it has finished the run itself, a refused heartbeat means "finished", not
            # "lost" (as while the runner's own finish() is under way).
            handler = handler.bind(
                self.host.backend,
                attempt.token if attempt.lease else None,
                functools.partial(setattr, attempt, "_ending", True),
            )
        result = await self._call(attempt, handler, ctx, is_async=job.is_async, timeout_s=timeout_s)
        return self._status(attempt, result)

    def _status(
        self, attempt: Attempt, result: _Result, provider: bool = False
    ) -> tuple[FinalStatus, str | None]:
        job = attempt.job
        why = attempt.signal.reason or "aborted"
        if isinstance(result, _NotStarted):
            return "interrupted", f"run interrupted ({why}) before its handler started"
        if isinstance(result, _GaveUp):
            if result is _CANCELLED:
                return "interrupted", f"run cancelled ({why})"
            if result.why != "timeout":
                return "interrupted", f"run interrupted ({result.why})"
            assert job.options.timeout_ms is not None
            limit = format_duration(job.options.timeout_ms)
            timeout_error = JobTimeoutError(
                f"job {job.name!r} ran longer than its timeout of {limit}"
            )
            attempt.exception = timeout_error
            logger.warning(
                "job %s slot %s attempt %s: %s",
                job.name,
                iso(attempt.slot),
                attempt.attempt,
                timeout_error,
            )
            return "failed", f"{type(timeout_error).__name__}: {timeout_error}"
        prefix = "data provider failed: " if provider else ""
        if isinstance(result, _Raised):
            attempt.exception = result.exc
            if result.aborted:
                return "interrupted", prefix + error_text(result.exc)
            logger.warning(
                "job %s slot %s attempt %s: the %s raised %r",
                job.name,
                iso(attempt.slot),
                attempt.attempt,
                "data provider" if provider else "handler",
                result.exc,
            )
            return "failed", prefix + error_text(result.exc)
        if result.aborted:
            what = "data provider" if provider else "handler"
            return (
                "interrupted",
                f"run interrupted ({why}): the {what} returned after its signal was aborted",
            )
        return "success", None

    async def _call(
        self,
        attempt: Attempt,
        fn: Callable[[JobContext], Any],
        ctx: JobContext,
        *,
        is_async: bool,
        timeout_s: float | None = None,
    ) -> _Result:
        """Call user code; wait for it, for an interrupt, or ``timeout_s`` after it started.

        Waiting for a pool thread does not count against the timeout. A call given up
        before it started never starts.
        """
        loop = asyncio.get_running_loop()
        interrupted = attempt._interrupted
        assert interrupted is not None
        started: asyncio.Future[float] = loop.create_future()
        gate: _Gate | None = None
        thread_future: ThreadFuture[_Result] | None = None
        future: asyncio.Future[_Result]
        if is_async:
            future = loop.create_task(_in_task(fn, ctx, started), name=f"anarchon-run-{ctx.name}")
        else:
            gate = _Gate(attempt.signal, loop, None if timeout_s is None else started)
            thread_future = self.host.executor().submit(
                self.host.tracing.thread(_in_thread), gate, fn, ctx
            )
            future = asyncio.wrap_future(thread_future, loop=loop)
        deadline: float | None = None
        while True:
            if deadline is None and timeout_s is not None and started.done():
                deadline = started.result() + timeout_s
            waiting: set[asyncio.Future[Any]] = {future, interrupted}
            if timeout_s is not None and not started.done():
                waiting.add(started)
            wait_s = None if deadline is None else max(deadline - time.monotonic(), 0)
            try:
                done, _ = await asyncio.wait(
                    waiting, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED
                )
            except asyncio.CancelledError:
                # The run itself is cancelled: what has not started must never start.
                if gate is not None:
                    gate.close()
                if thread_future is not None:
                    thread_future.cancel()
                future.cancel()
                raise
            if future in done:
                result = _CANCELLED if future.cancelled() else _result(future)
                if (
                    gate is not None
                    and isinstance(result, _Returned)
                    and inspect.isawaitable(result.value)
                ):
                    # A sync callable that returned an awaitable (``lambda ctx: work(ctx)``):
                    # await it on the loop, under the same timeout. It has started (the
                    # thread tells that only for a timeout).
                    _set(started, time.monotonic())
                    gate, thread_future = None, None
                    future = loop.create_task(
                        _await_in_task(result.value, ctx), name=f"anarchon-run-{ctx.name}"
                    )
                    continue
                return result
            if interrupted.done():
                why = interrupted.result()
                return await self._give_up(attempt, future, gate, thread_future, started, why)
            if not done:  # past the deadline
                attempt.signal.abort("timeout")
                return await self._give_up(attempt, future, gate, thread_future, started, "timeout")
            # else it has just started: from now on its timeout runs

    async def _give_up(
        self,
        attempt: Attempt,
        future: asyncio.Future[_Result],
        gate: _Gate | None,
        thread_future: ThreadFuture[_Result] | None,
        started: asyncio.Future[float],
        why: str,
    ) -> _Result:
        """Stop waiting for a call: cancel it if it has not started, else let it run, ignored."""
        job, slot = attempt.job.name, attempt.slot
        if gate is not None and thread_future is not None:
            entered = gate.close()
            thread_future.cancel()  # still queued: it never runs
            future.cancel()
            if not entered:
                return _NOT_STARTED
            thread_future.add_done_callback(_log_late(job, slot))
            return _GaveUp(why)
        future.cancel()
        if not started.done():
            return _NOT_STARTED  # cancelled before its first step: the body never runs
        await asyncio.wait({future}, timeout=CANCEL_WAIT_S)
        if not future.done():
            future.add_done_callback(_log_late(job, slot))
        elif not future.cancelled():
            future.exception()  # retrieved: no "never retrieved" warning
        return _GaveUp(why)

    # -- the store ------------------------------------------------------------------

    async def _locked(self, attempt: Attempt, call: Callable[[], Awaitable[T]]) -> T:
        """One store call of ``attempt`` under its lock, shielded from cancellation.

        Cancelling the caller leaves the call to land with the lock still held (a call
        already in a database thread runs on anyway), so no other call of this attempt
        can overtake it.
        """
        lock = attempt._store_lock
        assert lock is not None
        await lock.acquire()
        try:
            task = asyncio.ensure_future(call())
        except BaseException:
            lock.release()
            raise
        task.add_done_callback(functools.partial(_unlock, lock))
        return await asyncio.shield(task)

    async def _beat(self, attempt: Attempt) -> bool | None:
        """One heartbeat under the attempt's lock, retried until the lease would lapse.

        ``None`` once finish()/release() has answered (no heartbeat may land after it);
        a confirmed lease moves ``held_at`` to the time this heartbeat was sent.
        """
        runs = self.host.backend.runs
        assert runs is not None and attempt.token is not None
        job, slot, token = attempt.job.name, attempt.slot, attempt.token
        lease_ms = self.host.lease_ms

        async def beat() -> bool | None:
            if attempt._settled:  # finish()/release() answered while this one waited
                return None
            sent = time.monotonic()
            alive = await self.host.tracing.store(
                "heartbeat", runs.heartbeat(job, slot, token, lease_ms), job=job, slot=slot
            )
            if alive:
                attempt.held_at = sent
            return alive

        return await retry_store_call(
            self._what(attempt, "heartbeat"),
            lambda: self._locked(attempt, beat),
            deadline_ms=now_ms() + lease_ms,
        )

    async def _unconfirmed(self, attempt: Attempt) -> str | None:
        """Why user code must not start (``None``: it may): the lease is not confirmed.

        A lease confirmed more than a heartbeat interval ago is renewed first; if the
        store refuses (a backup took the run over) or cannot answer, the attempt ends
        ``interrupted`` unstarted, as one whose lease was lost.
        """
        if not attempt.lease or attempt.token is None or attempt.held_at is None:
            return None
        age_s = time.monotonic() - attempt.held_at
        if age_s <= self.host.heartbeat_ms / 1000:
            return None
        try:
            alive = await self._beat(attempt)
        except Exception:
            alive = False  # logged: unconfirmed, so it must not start
        if alive:
            return None
        why = (
            f"not started: its claim was answered {age_s:.1f} s before the start, and the "
            "store did not confirm the lease then"
        )
        logger.warning("%s: %s", self._what(attempt, "the run"), why)
        attempt.lost = True
        return why

    async def _heartbeat(self, attempt: Attempt) -> None:
        """Renew the lease one heartbeat interval after each confirmation, until settled."""
        while not attempt._settled:
            held_at = attempt.held_at if attempt.held_at is not None else time.monotonic()
            wait_s = held_at + self.host.heartbeat_ms / 1000 - time.monotonic()
            await asyncio.sleep(max(wait_s, 0.0))
            try:
                alive = await self._beat(attempt)
            except Exception:
                await asyncio.sleep(self.host.heartbeat_ms / 1000)
                continue  # logged; the store decides whether the lease is still ours
            if alive is None:
                return
            if not alive:
                if attempt._ending:
                    # finish()/release() is under way (perhaps its reply was lost and the
                    # run is finished already): its own answer says whether it was ours.
                    return
                logger.warning(
                    "job %s slot %s attempt %s: heartbeat refused; the run was taken over",
                    attempt.job.name,
                    iso(attempt.slot),
                    attempt.attempt,
                )
                attempt.lost = True
                attempt.interrupt("takeover")
                return

    async def _finish(
        self,
        attempt: Attempt,
        status: FinalStatus,
        recording: tuple[EndBatcher, SpoolEntry] | None = None,
    ) -> bool | None:
        """``finish()``, or with ``recording`` the finish and the entry's record together."""
        runs = self.host.backend.runs
        assert runs is not None and attempt.token is not None
        job, slot, token = attempt.job.name, attempt.slot, attempt.token

        def call() -> Awaitable[bool]:
            if recording is None:
                return runs.finish(job, slot, token, status)
            ends, entry = recording
            return ends.finish(RunEnd(
                job, token, status, entry.result, entry.history_size, entry.history_ttl_ms
            ))

        async def finish() -> bool:
            # Repeat-safe: a retry after a lost reply finds the run finished by this very
            # token with this status, and the store answers True again.
            finished = await self.host.tracing.store(
                "finish", call(), job=job, slot=slot, with_record=recording is not None
            )
            attempt._settled = True
            return finished

        try:
            return await retry_store_call(
                self._what(attempt, "finish"),
                lambda: self._locked(attempt, finish),
                deadline_ms=now_ms() + RECORD_RETRY_MS,
                give_up=self.host.owed.past_cut,
            )
        except Exception as exc:
            await self._emit("error", attempt, error=error_text(exc), reason="finish")
            return None

    async def _release(self, attempt: Attempt) -> None:
        runs = self.host.backend.runs
        assert runs is not None and attempt.token is not None
        job, slot, token = attempt.job.name, attempt.slot, attempt.token

        async def release() -> bool:
            released = await self.host.tracing.store(
                "release", runs.release(job, slot, token), job=job, slot=slot
            )
            attempt._settled = True
            return released

        try:
            released = await retry_store_call(
                self._what(attempt, "release"),
                lambda: self._locked(attempt, release),
                deadline_ms=now_ms() + RELEASE_RETRY_MS,
                give_up=self.host.owed.past_cut,
            )
        except Exception as exc:
            await self._emit("error", attempt, error=error_text(exc), reason="release")
            return
        if released:  # the backups watching the run look now, not a heartbeat later
            await send_wakeup(self.host.backend, Wakeup("released", job=job))

    async def _save(self, attempt: Attempt, result: StoredResult, record: RunRecord) -> bool:
        """Write the history record; ``False`` if the store did not take it in time."""
        options = attempt.job.options
        backend = self.host.backend
        try:
            await retry_store_call(
                self._what(attempt, "save_result"),
                lambda: self.host.tracing.store(
                    "save_result",
                    backend.save_result(
                        attempt.job.name, result, options.history_size, options.history_ttl_ms
                    ),
                    job=attempt.job.name,
                    slot=attempt.slot,
                ),
                deadline_ms=now_ms() + RECORD_RETRY_MS,
                give_up=self.host.owed.past_cut,
            )
        except Exception as exc:
            await self._emit("error", attempt, record, error=error_text(exc), reason="save_result")
            return False
        return True
