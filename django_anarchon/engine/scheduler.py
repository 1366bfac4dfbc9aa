"""The scheduler: its lifecycle, one timer, and the claim-run-record cycle of each slot.

Its jobs are defined and checked in ``registration.py``, the operator's ledger, pauses
and backfills are ``operations.py`` (both mixins of ``Scheduler``).

Everything runs on one asyncio loop (the one ``start()`` is awaited on). The timer wakes
for the next due slot; each due slot gets a short-lived task that claims it and, on a
win, runs it through the :class:`~.runner.Runner`. Nothing a handler, a callback or a
store does may end the scheduler: every task catches, logs, emits ``error``, and goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import secrets
import socket
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any, TypeVar

from asgiref.sync import async_to_sync

from ..backends.base import (
    Backend,
    BaseBackend,
    ClaimInput,
    RunRecord,
)
from ..backends.refusals import is_refusal
from ..durations import format_duration, parse_duration
from ..exceptions import ConfigurationError
from ..jobs import (
    COMMON_OPTIONS,
    DEFAULTS,
    MAX_THREADS,
    Job,
    JobOptions,
    check_instance_id,
    check_timezone,
    validate_options,
)
from ..logtime import iso
from ..retry import retry_store_call
from ..wallclock import now_ms
from .answers import new_token
from .calls import close_thread_connections, error_text
from .claims import ClaimFlows
from .clock import REFRESH_S, StoreClock, clock_reader
from .events import Callback, Event, EventName, EventRegistry
from .ledger import LedgerKeeper
from .operations import OperatorMixin
from .owed import STOP_BOUND_MS, STOP_NOW_BOUND_MS, OwedRecords
from .pool import DaemonThreadPool
from .registration import JobState, RegistrationMixin
from .runner import UNSET, Attempt, Runner
from .timer import Timer
from .tracing import NO_TRACING, Tracing
from .wake import WakeHub, WakeListener

__all__ = ["Scheduler"]

logger = logging.getLogger("django_anarchon")

T = TypeVar("T")

#: Longest pause between two tries of a store that does not answer at start.
START_RETRY_MAX_S = 5.0
#: Most jobs prepared in one ``prepare_jobs`` call at start.
PREPARE_CHUNK = 500
#: After a stop's bound, how long the tasks still going get to end once cancelled.
CANCEL_BOUND_S = 1.0
#: How long a read of the store's clock may take at start (or at a refresh).
CLOCK_READ_S = 5.0


def _runs(attempts: Iterable[Attempt]) -> str:
    """``job@slot`` of each attempt, for the stop's log lines."""
    return ", ".join(f"{a.job.name}@{iso(a.slot)}" for a in attempts)


def _outage(exc: BaseException) -> bool:
    return not is_refusal(exc)


def default_instance_id() -> str:
    """``host-pid-xxxx``: unique per process, readable in history, within the 255 of the stores."""
    return f"{socket.gethostname()[:200]}-{os.getpid()}-{secrets.token_hex(2)}"


class Scheduler(RegistrationMixin, OperatorMixin):
    """Runs its jobs on every instance, each slot exactly once across instances.

    ``backend`` is shared by every instance; ``lease``/``heartbeat`` matter on lease
    stores (``backend.runs``). ``job_defaults`` are job options under every job's own.
    """

    def __init__(
        self,
        backend: Backend | BaseBackend,
        name: str = "default",
        instance_id: str | None = None,
        lease: object = "30s",
        heartbeat: object = None,
        job_defaults: Mapping[str, Any] | None = None,
        data: Any = None,
        threads: int = 10,
        default_timezone: str = "UTC",
        spool: str | os.PathLike[str] | None = None,
    ) -> None:
        self.name = name
        self.backend = backend
        self.instance_id = instance_id if instance_id is not None else default_instance_id()
        try:
            check_instance_id(self.instance_id)
        except ConfigurationError as exc:
            self._config_error(exc.reason, "instance_id", instance_id)
        self.lease_ms = self._duration(lease, "lease")
        if self.lease_ms <= 0:
            self._config_error("must be longer than zero", "lease", lease)
        self.heartbeat_ms = (
            max(self.lease_ms // 3, 1)
            if heartbeat is None
            else self._duration(heartbeat, "heartbeat")
        )
        if not 0 < self.heartbeat_ms < self.lease_ms:
            self._config_error(
                f"must be longer than zero and shorter than the lease ({self.lease_ms} ms)",
                "heartbeat",
                heartbeat,
            )
        if (isinstance(threads, bool) or not isinstance(threads, int)
                or not 1 <= threads <= MAX_THREADS):
            self._config_error(f"expected a whole number from 1 to {MAX_THREADS:,}", "threads",
                               threads)
        self.threads = threads
        try:
            self.default_timezone = check_timezone(f"<scheduler {name}>", default_timezone)
        except ConfigurationError as exc:
            self._config_error(str(exc), "default_timezone", default_timezone)
        self.job_defaults = self._defaults(job_defaults)
        self.data = data
        self._jobs: dict[str, JobState] = {}
        self._events = EventRegistry()
        self._runner = Runner(self)
        self._pool: DaemonThreadPool | None = None
        self._timer: Timer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._running = False
        self._stopping = False
        self._stop_event: asyncio.Event | None = None
        self._stopped: asyncio.Future[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._attempts: set[Attempt] = set()
        self._initialized = False
        self._claims = ClaimFlows(self)
        #: Records owed to the store, and the spool they go to when it cannot take them.
        self.owed = OwedRecords(self, spool)
        #: Set by stop_now(): the grace's wait ends at once.
        self._hurry = asyncio.Event()
        #: The hints of the store's push channel (``backend.wakeups()``), while running.
        self.wakes = WakeHub()
        #: The store's clock as seen from here: timers are armed by it (engine/clock.py).
        self.clock = StoreClock(f"scheduler {self.name}")
        self._listener: WakeListener | None = None
        #: The hooks that trace attempts and store calls (``contrib.otel.instrument()``).
        self.tracing: Tracing = NO_TRACING
        #: The ledger's looks for missed slots, and the slots owed to it (engine/ledger.py).
        self.ledgers = LedgerKeeper(self)

    # -- configuration helpers ------------------------------------------------------

    def _config_error(self, message: str, option: str, value: object, what: str = "option") -> None:
        error = ConfigurationError(
            f"scheduler {self.name!r}: {what} {option!r} = {value!r}: {message}"
        )
        error.option, error.value = option, value
        raise error

    def _duration(self, value: object, option: str) -> int:
        try:
            return parse_duration(value, option=option)
        except ConfigurationError as exc:
            self._config_error(
                str(exc).removeprefix(f"option {option!r} = {value!r}: "), option, value
            )
            raise  # unreachable; for type checkers

    def _defaults(self, job_defaults: Mapping[str, Any] | None) -> JobOptions:
        if not job_defaults:
            return DEFAULTS
        if not isinstance(job_defaults, Mapping):
            self._config_error("expected a dict of job options", "job_defaults", job_defaults)
        for option, value in job_defaults.items():
            if option not in COMMON_OPTIONS:
                self._config_error(
                    "unknown option in job_defaults; known options: "
                    + ", ".join(sorted(COMMON_OPTIONS)),
                    option,
                    value,
                    "job_defaults option",
                )
        marker = f"<job_defaults of scheduler {self.name}>"
        try:
            return validate_options(marker, "every", job_defaults)[0]
        except ConfigurationError as exc:
            # Say "job_defaults of scheduler X" where a job's error would name the job.
            prefix = f"job {marker!r}, option {exc.option!r} = {exc.value!r}: "
            message = str(exc).removeprefix(prefix)
            self._config_error(message, str(exc.option), exc.value, "job_defaults option")
            raise  # unreachable; for type checkers

    @property
    def claim_flows(self) -> ClaimFlows:
        return self._claims

    # -- events -----------------------------------------------------------------------

    def on(self, event: str, callback: Callback) -> None:
        """Call ``callback(event)`` (sync or async) on each ``event``."""
        self._events.on(event, callback)

    def off(self, event: str, callback: Callback) -> None:
        self._events.off(event, callback)

    def wants(self, name: EventName) -> bool:
        """Whether an event of ``name`` reaches anyone (else it need not be built)."""
        return self._events.wanted(name)

    async def emit(self, event: Event) -> None:
        try:
            await self._events.emit(event, Scheduler, self)
        except Exception:  # pragma: no cover - emit already guards each callback
            logger.exception("scheduler %s: emitting %s failed", self.name, event.name)

    async def emit_event(
        self,
        name: EventName,
        job: Job | None = None,
        slot: int | None = None,
        error: str | None = None,
        reason: str | None = None,
    ) -> None:
        if not self._events.wanted(name):
            return
        await self.emit(
            Event(
                name=name,
                scheduler=self.name,
                instance_id=self.instance_id,
                job=None if job is None else job.name,
                slot=slot,
                error=error,
                reason=reason,
            )
        )

    # -- lifecycle --------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._running

    def next_due(self) -> int | None:
        """When the timer next fires (ms since the epoch, this worker's clock), if armed."""
        return None if self._timer is None else self._timer.next_due()

    def executor(self) -> DaemonThreadPool:
        if self._pool is None:
            self._pool = DaemonThreadPool(
                self.threads,
                thread_name_prefix=f"anarchon-{self.name}",
                on_exit=close_thread_connections,
            )
        return self._pool

    async def _ensure_init(self) -> None:
        if not self._initialized:
            await self.backend.init()
            self._initialized = True

    async def start(self) -> None:
        """Initialise the backend and the jobs, catch up missed runs, start the timer.

        A store that does not answer is retried with backoff until it does, or until
        :meth:`request_stop` (a signal) or cancellation ends the wait: then the scheduler
        does not start.
        """
        if self._running:
            return
        self._loop = asyncio.get_running_loop()
        self._stopping = False
        self._stop_event = asyncio.Event()
        self._hurry.clear()
        self._stopped = None
        if not await self._connect():
            logger.info("scheduler %s: stop requested before the store answered", self.name)
            self._loop = None
            return
        self._claims.reset()
        self.owed.open()
        self._timer = Timer(self._fire, label=f"scheduler {self.name}")
        self._running = True
        self._listener = WakeListener(self.backend, self.wakes, f"scheduler {self.name}")
        self._listener.start()
        self.spawn(self.owed.replay(), "spool replay")
        if clock_reader(self.backend) is not None:
            await self._read_clock()
            self.spawn(self._follow_clock(), "store clock")
        now = self.clock.now()
        for state in list(self._jobs.values()):
            self._arm(state, now, initial=True)
            self._claims.catch_up(state.job, now, state.next_slot)
        self._timer.start()
        if self.ledgers.store is not None:
            self.spawn(self.ledgers.keep(), "ledger")
        logger.info(
            "scheduler %s started: instance %s, backend %s, %s job(s)",
            self.name,
            self.instance_id,
            self.backend.name,
            len(self._jobs),
        )

    async def _read_clock(self) -> None:
        """Measure the store's clock offset (bounded: a store that hangs leaves it as is)."""
        try:
            async with asyncio.timeout(CLOCK_READ_S):
                await self.clock.measure(self.backend, next(iter(self._jobs), "-"))
        except TimeoutError:
            logger.warning("scheduler %s: the store's clock did not answer within %ss",
                           self.name, CLOCK_READ_S)

    async def _follow_clock(self) -> None:
        while not await self.wait_stopping(REFRESH_S):
            await self._read_clock()

    async def _connect(self) -> bool:
        """``init()`` and every ``prepare_job()``, retried until done; ``False`` if stopped first.

        A stop (signal, :meth:`stop`, :meth:`request_stop`) ends the wait at once, even in
        the middle of a backoff pause or a connection attempt.
        """
        event = self._stop_event
        assert event is not None
        connect = asyncio.ensure_future(self._init_and_prepare())
        stopped = asyncio.ensure_future(event.wait())
        try:
            await asyncio.wait({connect, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (connect, stopped):
                task.cancel()
            await asyncio.wait({connect, stopped})
        if event.is_set() or connect.cancelled():
            return False
        connect.result()  # an error that is not an outage (retry_store_call re-raised it)
        return True

    async def _init_and_prepare(self) -> None:
        """Outages are waited out; a refusal (wrong password, no such database) is raised."""
        await retry_store_call(
            f"scheduler {self.name}: init of the {self.backend.name} backend",
            self.backend.init,
            max_delay_s=START_RETRY_MAX_S,
            retryable=_outage,
        )
        self._initialized = True
        jobs = [(s.job.name, s.job.options.history_size) for s in list(self._jobs.values())]
        many = getattr(self.backend, "prepare_jobs", None)
        for start in range(0, len(jobs), PREPARE_CHUNK):
            chunk = jobs[start : start + PREPARE_CHUNK]
            names = chunk[0][0] if len(chunk) == 1 else f"{len(chunk)} jobs"

            async def prepare(chunk: list[tuple[str, int]] = chunk) -> None:
                if callable(many):  # batched (10,000 jobs: seconds, not minutes)
                    await many(chunk)
                    return
                for name, history_size in chunk:
                    await self.backend.prepare_job(name, history_size)

            await retry_store_call(
                f"scheduler {self.name}: prepare {names}", prepare,
                max_delay_s=START_RETRY_MAX_S, retryable=_outage,
            )

    async def stop(self, grace: object = "30s") -> None:
        """Stop claiming; give running handlers ``grace`` to end, then hand their runs over.

        Ends within ``grace`` plus ``STOP_BOUND_MS`` (plus ``CANCEL_BOUND_S``), whatever
        the store and the handlers do: records the store has not taken by then are spooled.
        """
        grace_ms = self._duration(grace, "grace")
        if not self._running:
            if self._stop_event is not None:
                self._stop_event.set()  # a start() still waiting for the store gives up
            return
        if self._stopped is not None:
            await asyncio.shield(self._stopped)
            return
        loop = asyncio.get_running_loop()
        self._stopped = loop.create_future()
        try:
            await self._shutdown(grace_ms)
        finally:
            self._running = False
            self._loop = None
            if not self._stopped.done():
                self._stopped.set_result(None)
            logger.info("scheduler %s stopped", self.name)

    async def _shutdown(self, grace_ms: int) -> None:
        self._stopping = True
        # Runs already going are aborted; a claim won from now on (sent before the stop,
        # with no attempt to spare) runs within the grace like one that had started.
        started = list(self._attempts)
        assert self._stop_event is not None
        self._stop_event.set()
        # Nothing waits for a hint from now on; its task ends with the others, below.
        listener, self._listener = self._listener, None
        listening = listener.cancel() if listener is not None else None
        if self._timer is not None:
            await self._timer.stop()
        for attempt in started:
            attempt.abort("stop")
        if started:
            logger.info(
                "scheduler %s: waiting up to %s for %s run(s) to end: %s",
                self.name,
                format_duration(grace_ms),
                len(started),
                _runs(started),
            )
        await self._wait_tasks(grace_ms / 1000, started)
        left = list(self._attempts)
        if left:
            logger.warning(
                "scheduler %s: %s run(s) still running after the grace, recorded interrupted "
                "and their leases released: %s",
                self.name,
                len(left),
                _runs(left),
            )
        # From now on the records of these attempts (and of those that ended in the
        # grace and are still writing) get STOP_BOUND_MS; what the store has not taken
        # by then goes to the spool, and the tasks still writing it are cancelled.
        self._cut_records(STOP_BOUND_MS)
        for attempt in left:
            attempt.interrupt("stop")
        loop = asyncio.get_running_loop()
        while (pending := self._pending()) and (left_s := self._cut_at() - loop.time()) > 0:
            # In slices: a stop_now() meanwhile brings the cut closer.
            await asyncio.wait(pending, timeout=min(left_s, 0.1))
        if self.ledgers.owed and (left_s := self._cut_at() - loop.time()) > 0:
            # What the ledger is owed, within the same bound (else the next instance's
            # look at start finds those slots).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left_s):
                    await self.ledgers.pay_owed()
        spooled = self.owed.spool_all()
        if spooled:
            logger.warning(
                "scheduler %s: the store did not take the records of %s attempt(s) within %s "
                "of the grace: spooled", self.name, spooled, format_duration(STOP_BOUND_MS),
            )
        for task in pending:
            task.cancel()
        if (sending := self._runner.close()) is not None:  # their batch of ends, if any
            pending.add(sending)
        if listening is not None:
            pending.add(listening)
        if pending:
            await asyncio.wait(pending, timeout=CANCEL_BOUND_S)
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    async def _wait_tasks(self, timeout_s: float, started: list[Attempt]) -> None:
        """Wait for the tasks going at the stop, then for runs that began during the grace.

        A claim in flight when the stop began spawns its run as a new task, which one
        ``asyncio.wait`` over the first tasks would not see; that run is due its grace too.
        """
        deadline = asyncio.get_running_loop().time() + timeout_s
        first = self._pending()
        while (first := {t for t in first if not t.done()}) and await self._wait_some(
            first, deadline
        ):
            pass
        while any(attempt not in started for attempt in self._attempts):
            pending = self._pending()
            if not pending or not await self._wait_some(pending, deadline):
                return

    def _pending(self) -> set[asyncio.Task[Any]]:
        return {task for task in self._tasks if not task.done()}

    async def _wait_some(self, tasks: set[asyncio.Task[Any]], deadline: float) -> bool:
        """Wait until one of ``tasks`` ends; ``False`` once ``deadline`` (loop time) or a
        :meth:`stop_now` has come."""
        loop = asyncio.get_running_loop()
        remaining = deadline - loop.time()
        if remaining <= 0 or self._hurry.is_set():
            return False
        hurry = loop.create_task(self._hurry.wait())
        try:
            await asyncio.wait({*tasks, hurry}, timeout=remaining,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            hurry.cancel()
        return not self._hurry.is_set()

    def _cut_records(self, bound_ms: int) -> None:
        """Records still owed get ``bound_ms`` more (or less, if already cut sooner)."""
        cut = now_ms() + bound_ms
        owed = self.owed
        owed.cut_at_ms = cut if owed.cut_at_ms is None else min(owed.cut_at_ms, cut)

    def _cut_at(self) -> float:
        """The records' cut as loop time."""
        assert self.owed.cut_at_ms is not None
        return asyncio.get_running_loop().time() + (self.owed.cut_at_ms - now_ms()) / 1000

    async def serve(self, grace: object = "30s") -> None:
        """Start, run until :meth:`stop`/:meth:`request_stop` or cancellation, then stop."""
        await self.start()
        assert self._stop_event is not None
        try:
            await self._stop_event.wait()
        finally:
            await self.stop(grace)

    def stop_now(self) -> None:
        """End every running handler's wait at once (a second SIGTERM); safe from any thread.

        Stops claiming and records each running attempt ``interrupted`` with its lease
        released, without waiting for a grace; a ``stop()`` in progress then ends promptly:
        records the store has not taken within ``STOP_NOW_BOUND_MS`` are spooled.
        """
        loop = self._loop
        if loop is None or not self._running:
            return
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if not on_loop:
            loop.call_soon_threadsafe(self.stop_now)
            return
        self._stopping = True
        if self._stop_event is not None:
            self._stop_event.set()
        for attempt in list(self._attempts):
            attempt.interrupt("stop")
        self._cut_records(STOP_NOW_BOUND_MS)
        self._hurry.set()

    def request_stop(self) -> None:
        """Make :meth:`serve` return (it then stops with its grace); safe from any thread."""
        loop, event = self._loop, self._stop_event
        if loop is None or event is None:
            return
        loop.call_soon_threadsafe(event.set)

    # -- the timer and due slots ------------------------------------------------------

    def _initial_slot(self, job: Job, now: int) -> int | None:
        """The slot still runnable now (due within max_late), else the next one."""
        latest = job.schedule.latest_at_or_before(now)
        if latest is not None and now <= latest + job.options.max_late_ms:
            return latest
        return job.schedule.next_after(now)

    def _arm_new(self, state: JobState) -> None:
        if self._running and self._jobs.get(state.job.name) is state:
            self.spawn(self._prepare_and_arm(state), f"prepare {state.job.name}")

    async def _prepare_and_arm(self, state: JobState) -> None:
        job = state.job
        await retry_store_call(
            f"scheduler {self.name}: prepare_job {job.name}",
            lambda: self.backend.prepare_job(job.name, job.options.history_size),
            deadline_ms=now_ms() + 60_000,
            give_up=lambda: self._stopping,
        )
        if self._running and self._jobs.get(job.name) is state:
            self._arm(state, self.clock.now(), initial=True)

    def _arm(self, state: JobState, now: int, *, initial: bool) -> None:
        job = state.job
        if initial:
            slot = None if job.is_expired(now) else self._initial_slot(job, now)
        else:
            assert state.next_slot is not None
            slot = job.schedule.next_after(state.next_slot)
            if slot is not None and slot + job.options.max_late_ms < now:
                # The loop was held up for longer than max_late: those slots are gone.
                skipped_from = slot
                slot = job.schedule.next_after(now - job.options.max_late_ms - 1)
                logger.warning(
                    "scheduler %s: job %s fell behind; slots from %s to before %s are too "
                    "late", self.name, job.name, iso(skipped_from), iso(slot),
                )
                # Never claimed here: the ledger marks them missed unless another instance
                # ran them (engine/ledger.py).
                self.ledgers.owe_from(job, skipped_from, slot)
        state.next_slot = slot
        if self._timer is None:
            return
        if slot is None:
            self._timer.cancel(job.name)
            return
        jitter = int(random.random() * job.options.jitter_ms) if job.options.jitter_ms else 0
        self._timer.schedule(job.name, self.clock.local(slot + jitter))

    def _fire(self, name: str, due: int) -> None:
        state = self._jobs.get(name)
        if state is None or state.next_slot is None or self._stopping:
            return
        slot = state.next_slot
        try:
            self._arm(state, self.clock.now(), initial=False)
        except Exception as exc:  # a schedule that cannot say its next slot: keep the rest going
            logger.exception(
                "scheduler %s: job %s: computing the next slot failed", self.name, name
            )
            state.next_slot = None
            self.spawn(
                self.emit_event("error", state.job, slot, error=error_text(exc), reason="schedule"),
                f"error {name}",
            )
        self._claims.due(state.job, slot)

    def spawn(self, coro: Coroutine[Any, Any, None], label: str) -> None:
        assert self._loop is not None
        task = self._loop.create_task(self._guard(coro, label), name=f"anarchon {label}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _guard(self, coro: Coroutine[Any, Any, None], label: str) -> None:
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.exception("scheduler %s: %s failed; the scheduler goes on", self.name, label)
            await self.emit_event("error", error=error_text(exc), reason=label)

    # -- what the claim flows need (engine/claims.py, answers.py) ---------------------

    @property
    def stopping(self) -> bool:
        return self._stopping

    async def wait_stopping(self, seconds: float, woken: asyncio.Event | None = None) -> bool:
        """Sleep up to ``seconds``, waking when a stop is requested (or ``woken`` is set,
        see ``engine/wake.py``); ``True`` if a stop was."""
        event = self._stop_event
        assert event is not None
        if woken is None:
            try:
                async with asyncio.timeout(seconds):
                    await event.wait()
            except TimeoutError:
                pass
            return event.is_set()
        if woken.is_set() or event.is_set():
            return event.is_set()
        waits = {asyncio.ensure_future(event.wait()), asyncio.ensure_future(woken.wait())}
        try:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        return event.is_set()

    def runs_here(self, job: str, slot: int) -> bool:
        return any(a.job.name == job and a.slot == slot for a in list(self._attempts))

    def cancel_here(self, job: str, slot: int, reason: str) -> None:
        """A ``cancel_other`` claim fenced the run of (job, slot): abort its attempts here."""
        for attempt in list(self._attempts):
            if attempt.job.name == job and attempt.slot == slot and attempt.lease:
                attempt.cancel(reason)

    async def run_attempt(self, attempt: Attempt) -> RunRecord:
        """Run an attempt here; a sync one holds a unit of the pool's capacity until its
        user code has returned (its finish and history writes need no thread)."""
        self._attempts.add(attempt)
        claims, name = self._claims, attempt.job.name
        capacity = claims.capacity
        units = [0 if attempt.job.is_async else 1]

        def given_back() -> None:
            if units:
                capacity.give(units.pop())
                claims.user_code_done(name, ending=attempt.lease)

        claims.user_code_started(name)
        capacity.take(units[0])
        attempt.on_user_code_done = given_back
        try:
            return await self._runner.run(attempt)
        finally:
            given_back()
            self._attempts.discard(attempt)
            if attempt.lease:
                self._claims.run_ended(attempt.job.name)

    # -- manual runs and history --------------------------------------------------------

    async def arun_now(self, name: str, data: Any = None) -> RunRecord:
        """Run ``name`` now on this instance (manual, never deduplicated) and return its record."""
        return await self._run_now(name, data)

    async def _run_now(
        self,
        name: str,
        data: Any = None,
        recorded: Callable[[int], Coroutine[Any, Any, None]] | None = None,
    ) -> RunRecord:
        """``arun_now``; ``recorded(slot)`` is awaited once the run is in the store."""
        job = self._state(name).job
        await self._ensure_init()
        o = job.options
        claim = ClaimInput(
            job=job.name,
            slot=now_ms(),
            token=new_token(),
            instance_id=self.instance_id,
            history_size=o.history_size,
            history_ttl_ms=o.history_ttl_ms,
        )
        slot = await retry_store_call(
            f"scheduler {self.name}: record_manual_run of job {job.name}",
            lambda: self.tracing.store(
                "record_manual_run", self.backend.record_manual_run(claim), job=job.name,
                slot=claim.slot, token=claim.token,
            ),
            deadline_ms=now_ms() + 30_000,
        )
        attempt = Attempt(
            job=job,
            slot=slot if isinstance(slot, int) and not isinstance(slot, bool) else claim.slot,
            attempt=1,
            reason="manual",
            token=claim.token,
            manual=True,
            lease=False,
            run_data=UNSET if data is None else data,
        )
        if recorded is not None:
            await recorded(attempt.slot)
        if self._stopping:
            attempt.abort("stop")
        return await self.run_attempt(attempt)

    def run_now(self, name: str, data: Any = None) -> RunRecord:
        """Sync twin of :meth:`arun_now`."""
        return self._sync("run_now", self.arun_now, name, data)

    async def ahistory(self, name: str, limit: int = 20) -> list[RunRecord]:
        """The latest attempts of ``name`` on every instance, newest first."""
        self._state(name)
        await self._ensure_init()
        return await self.backend.history(name, limit)

    def history(self, name: str, limit: int = 20) -> list[RunRecord]:
        return self._sync("history", self.ahistory, name, limit)

    async def alast_run(self, name: str) -> RunRecord | None:
        records = await self.ahistory(name, 1)
        return records[0] if records else None

    def last_run(self, name: str) -> RunRecord | None:
        return self._sync("last_run", self.alast_run, name)

    def _sync(self, what: str, fn: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> T:
        """Call an async method from sync code, on the scheduler's loop when it runs."""
        try:
            current: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        loop = self._loop
        if self._running and loop is not None:
            if current is loop:
                raise RuntimeError(
                    f"scheduler {self.name!r}: {what}() would block its own event loop; "
                    f"use `await scheduler.a{what}(...)` in async code"
                )
            return asyncio.run_coroutine_threadsafe(fn(*args), loop).result()
        if current is not None:
            raise RuntimeError(
                f"scheduler {self.name!r}: {what}() is synchronous and this thread runs an event "
                f"loop; use `await scheduler.a{what}(...)`"
            )
        return async_to_sync(fn)(*args)

    def __repr__(self) -> str:
        state = "running" if self._running else "stopped"
        return (
            f"<Scheduler {self.name!r} {state} instance={self.instance_id!r} "
            f"backend={self.backend.name!r} jobs={len(self._jobs)}>"
        )
