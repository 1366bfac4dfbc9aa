"""A backend that keeps everything in this process: the contract in its smallest form.

It coordinates schedulers that share one ``MemoryBackend`` instance, even when they run
on different event loops or threads, so it suits tests and single-process projects. It
has the full lease ``RunStore`` (``backend.runs``), so backups, overlap, retries and
catch-up can be exercised without a server.

Every method takes one ``threading.Lock`` for its whole (synchronous) body and never
awaits while holding it: that is what makes each call atomic across threads and loops.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

from ..wallclock import now_ms
from .base import (
    BUFFER_POLICIES,
    CANCELLED,
    PAUSABLE_REASONS,
    ActiveRun,
    BaseBackend,
    ClaimInput,
    ClaimOutcome,
    ClaimRecord,
    FinalStatus,
    PauseState,
    RunClaim,
    RunEnd,
    RunReason,
    RunRecord,
    SlotMark,
    StoredResult,
    Wakeup,
    buffer_answer,
    buffer_hold_ms,
    build_history,
    cancel_reason,
    forget_after_ms,
    marks_to_keep,
)

__all__ = ["MemoryBackend", "MemoryRunStore"]

# (slot, instance, attempt, manual): how build_history pairs a claim with its result.
_RecordKey = tuple[int, str, int, bool]


@dataclass
class _Run:
    """The lease state of one run (job, slot); mutable, only touched under the lock."""

    attempt: int
    token: str
    owner: str
    lease_until: int
    state: str  # "running" | "finished"
    status: str | None
    reason: RunReason
    started_at: int
    finished_at: int | None = None
    keep_ms: int | None = None
    #: The largest ``max_attempts`` any claim of this run carried.
    max_attempts: int = 1


class _History:
    """The attempts of one job: won claims and saved results, keyed like build_history."""

    __slots__ = ("claims", "results")

    def __init__(self) -> None:
        self.claims: dict[_RecordKey, ClaimRecord] = {}
        self.results: dict[_RecordKey, StoredResult] = {}

    def has_slot(self, slot: int, *, manual: bool) -> bool:
        """Whether an attempt of ``slot`` (a manual run, or a scheduled one) is in history."""
        return any(k[0] == slot and k[3] == manual for k in (*self.claims, *self.results))

    def prune(self, now: int, history_size: int, history_ttl_ms: int | None) -> None:
        """Keep the newest ``history_size`` records, and none older than the ttl."""
        keys = self.claims.keys() | self.results.keys()
        started: dict[_RecordKey, int] = {}
        ended: dict[_RecordKey, int] = {}
        for key in keys:
            result = self.results.get(key)
            if result is not None:
                started[key] = result.started_at
                ended[key] = result.finished_at
            else:
                started[key] = self.claims[key].at
                ended[key] = started[key]
        newest = sorted(keys, key=lambda k: (started[k], k[0], k[2]), reverse=True)
        drop = set(newest[max(history_size, 0) :])
        if history_ttl_ms is not None:
            drop.update(k for k in keys if ended[k] < now - history_ttl_ms)
        for key in drop:
            self.claims.pop(key, None)
            self.results.pop(key, None)


class _State:
    """Everything a ``MemoryBackend`` knows, shared with its ``MemoryRunStore``."""

    def __init__(self, clock: Callable[[], int]) -> None:
        self.lock = threading.Lock()
        self.clock = clock
        # claim(): (job, slot) -> token of the winner; remembered forever (dedupe window).
        self.claimed: dict[tuple[str, int], str] = {}
        self.history: dict[str, _History] = {}
        # RunStore: job -> slot -> lease state.
        self.runs: dict[str, dict[int, _Run]] = {}
        # overlap buffer_*: job -> buffered slot -> held until (store ms).
        self.buffers: dict[str, dict[int, int]] = {}
        # The ledger: job -> first slot -> mark; job -> pause; job -> (fingerprint, since).
        self.marks: dict[str, dict[int, SlotMark]] = {}
        self.pauses: dict[str, PauseState] = {}
        self.since: dict[str, tuple[str, int]] = {}

    def now(self) -> int:
        return int(self.clock())

    def job_history(self, job: str) -> _History:
        history = self.history.get(job)
        if history is None:
            history = self.history[job] = _History()
        return history

    def save_result(
        self, job: str, result: StoredResult, history_size: int, history_ttl_ms: int | None
    ) -> None:
        """Under ``lock``: write ``result`` over its claim's record, then prune."""
        history = self.job_history(job)
        history.results[(result.slot, result.by, result.attempt, result.manual)] = result
        history.prune(self.now(), history_size, history_ttl_ms)


class MemoryRunStore:
    """The lease rules of SPEC section 5 over a dict, on the backend's (injectable) clock."""

    def __init__(self, state: _State) -> None:
        self._state = state

    async def claim(self, input: RunClaim) -> ClaimOutcome:
        with self._state.lock:
            return self._claim(input)

    async def claim_many(self, claims: list[RunClaim]) -> list[ClaimOutcome]:
        with self._state.lock:
            return [self._claim(c) for c in claims]

    async def peek_many(self, claims: list[RunClaim]) -> list[ClaimOutcome | None]:
        with self._state.lock:
            return [self._peek(c) for c in claims]

    async def heartbeat(self, job: str, slot: int, token: str, lease_ms: int) -> bool:
        with self._state.lock:
            run = self._mine(job, slot, token)
            if run is None:
                return False
            run.lease_until = self._state.now() + lease_ms
            return True

    async def finish(self, job: str, slot: int, token: str, status: FinalStatus) -> bool:
        with self._state.lock:
            return self._finish(job, slot, token, status)

    async def finish_many(self, ends: list[RunEnd]) -> list[bool]:
        """Each end's finish and, where it acted, its history record, under one lock."""
        with self._state.lock:
            answers = []
            for end in ends:
                finished = self._finish(end.job, end.slot, end.token, end.status)
                if finished:
                    self._state.save_result(
                        end.job, end.result, end.history_size, end.history_ttl_ms
                    )
                answers.append(finished)
            return answers

    def _finish(self, job: str, slot: int, token: str, status: FinalStatus) -> bool:
        run = self._mine(job, slot, token)
        if run is None:
            done = self._state.runs.get(job, {}).get(slot)
            if done is None or done.state != "finished" or done.token != token:
                return False
            if done.status == CANCELLED:
                return False  # fenced by a later slot's cancel_other claim
            # The same finish again (its first reply was lost) still succeeded; a run
            # the store ended ``interrupted`` (lapsed, no attempt left for anyone)
            # still takes its own runner's late word.
            if done.status == "interrupted":
                done.status = status
            return done.status == status
        run.state = "finished"
        run.status = status
        run.finished_at = self._state.now()
        return True

    async def release(self, job: str, slot: int, token: str) -> bool:
        with self._state.lock:
            run = self._mine(job, slot, token)
            if run is None:
                return False
            run.lease_until = self._state.now() - 1
            return True

    async def now_ms(self, job: str) -> int:
        """The store's (injectable) clock (optional capability)."""
        return self._state.now()

    async def active(self, job: str) -> list[ActiveRun]:
        with self._state.lock:
            now = self._state.now()
            runs = self._state.runs.get(job, {})
            return [
                ActiveRun(slot=slot, attempt=run.attempt, alive=run.lease_until > now)
                for slot, run in sorted(runs.items())
                if run.state == "running"
            ]

    # -- the ledger and pauses (LedgerStore) ------------------------------------------

    async def marks(
        self, job: str, since: int | None, until: int | None, limit: int
    ) -> list[SlotMark]:
        with self._state.lock:
            marks = self._state.marks.get(job, {}).values()
            hits = [
                m for m in marks
                if (since is None or m.last >= since) and (until is None or m.slot <= until)
            ]
        return sorted(hits, key=lambda m: m.slot, reverse=True)[: max(limit, 0)]

    async def mark_skipped(
        self, job: str, slot: int, reason: str, instance_id: str,
        history_size: int, history_ttl_ms: int | None,
    ) -> bool:
        with self._state.lock:
            return self._mark(
                job, SlotMark(slot, "skipped", reason, self._state.now(), instance_id, slot),
                history_size, history_ttl_ms,
            )

    async def mark_missed(
        self, job: str, ranges: Sequence[tuple[int, int, int]], instance_id: str,
        history_size: int, history_ttl_ms: int | None,
    ) -> int:
        with self._state.lock:
            now = self._state.now()
            return sum(
                self._mark(
                    job, SlotMark(slot, "missed", "missed", now, instance_id, last, count),
                    history_size, history_ttl_ms,
                )
                for slot, last, count in ranges
            )

    async def pause(self, job: str, note: str, by: str, until: int | None) -> PauseState:
        with self._state.lock:
            state = PauseState(job=job, note=note, by=by, at=self._state.now(), until=until)
            self._state.pauses[job] = state
            return state

    async def resume(self, job: str) -> PauseState | None:
        with self._state.lock:
            state = self._paused(job, self._state.now())
            self._state.pauses.pop(job, None)
            return state

    async def pauses(self, jobs: Sequence[str]) -> dict[str, PauseState]:
        with self._state.lock:
            now = self._state.now()
            found = {job: self._paused(job, now) for job in jobs}
        return {job: state for job, state in found.items() if state is not None}

    async def job_since(self, jobs: Sequence[tuple[str, str]]) -> list[int]:
        with self._state.lock:
            now = self._state.now()
            answers = []
            for job, fingerprint in jobs:
                known = self._state.since.get(job)
                if known is None or known[0] != fingerprint:
                    known = self._state.since[job] = (fingerprint, now)
                answers.append(known[1])
            return answers

    # -- under the lock -------------------------------------------------------------

    def _paused(self, job: str, now: int) -> PauseState | None:
        state = self._state.pauses.get(job)
        if state is not None and state.until is not None and state.until <= now:
            return None
        return state

    def _mark(
        self, job: str, mark: SlotMark, history_size: int, history_ttl_ms: int | None
    ) -> bool:
        """Write ``mark`` unless a mark of the job reaches into its slots; prune."""
        marks = self._state.marks.setdefault(job, {})
        if any(m.slot <= mark.last and m.last >= mark.slot for m in marks.values()):
            return False
        marks[mark.slot] = mark
        keep = marks_to_keep(marks.values(), mark.at, history_size, history_ttl_ms)
        for slot in [s for s in marks if s not in keep]:
            del marks[slot]
        return True

    def _skip(self, c: RunClaim, reason: str, now: int, outcome: ClaimOutcome) -> ClaimOutcome:
        """Answer a skip of a new run and mark it in the ledger (same atomic step)."""
        self._mark(
            c.job, SlotMark(c.slot, "skipped", reason, now, c.instance_id, c.slot),
            c.history_size, c.history_ttl_ms,
        )
        return outcome

    def _peek(self, c: RunClaim) -> ClaimOutcome | None:
        """``_claim``'s answer where it would change nothing, else ``None``."""
        now = self._state.now()
        run = self._state.runs.get(c.job, {}).get(c.slot)
        if (
            run is None
            or run.max_attempts < c.max_attempts
            or (c.keep_ms is not None and (run.keep_ms or 0) < c.keep_ms)
        ):
            return None
        if run.state == "running":
            if run.token != c.token and run.lease_until > now:
                return ClaimOutcome.running(run.attempt)
            return None
        if run.status in ("failed", "interrupted") and run.attempt < c.max_attempts:
            return None
        if run.finished_at is None or now > forget_after_ms(c.slot, run.finished_at, run.keep_ms):
            return None  # forgotten by the claim
        return ClaimOutcome.done()

    def _mine(self, job: str, slot: int, token: str) -> _Run | None:
        run = self._state.runs.get(job, {}).get(slot)
        if run is None or run.state != "running" or run.token != token:
            return None
        return run

    def _forget_expired(self, runs: dict[int, _Run], now: int) -> None:
        expired = [
            slot
            for slot, run in runs.items()
            if run.state == "finished"
            and run.finished_at is not None
            and now > forget_after_ms(slot, run.finished_at, run.keep_ms)
        ]
        for slot in expired:
            del runs[slot]

    def _claim(self, c: RunClaim) -> ClaimOutcome:
        state = self._state
        now = state.now()
        runs = state.runs.setdefault(c.job, {})
        self._forget_expired(runs, now)
        run = runs.get(c.slot)
        if run is not None:
            if c.keep_ms is not None:
                run.keep_ms = max(run.keep_ms or 0, c.keep_ms)  # never shrinks
            run.max_attempts = max(run.max_attempts, c.max_attempts)
            if run.state == "running":
                if run.token == c.token:
                    run.lease_until = now + c.lease_ms
                    return ClaimOutcome.won(run.attempt)
                if run.lease_until > now:
                    return ClaimOutcome.running(run.attempt)
                error = f"lease lapsed; taken over by {c.instance_id}"
                if run.attempt < c.max_attempts:
                    self._interrupt(c.job, c.slot, run, now, error)
                    self._start(c, run, run.attempt + 1, "takeover", now)
                    return ClaimOutcome.won(run.attempt)
                self._interrupt(c.job, c.slot, run, now, "lease lapsed; attempts used up")
                run.state = "finished"
                run.status = "interrupted"
                run.finished_at = now
                return ClaimOutcome.done()
            if run.status in ("failed", "interrupted") and run.attempt < c.max_attempts:
                self._start(c, run, run.attempt + 1, c.reason, now)
                return ClaimOutcome.won(run.attempt)
            return ClaimOutcome.done()
        if c.mode == "takeover":
            return ClaimOutcome.none()
        if now < c.slot:
            return ClaimOutcome.early(c.slot - now)
        if c.reason in PAUSABLE_REASONS and self._paused(c.job, now) is not None:
            state.buffers.get(c.job, {}).pop(c.slot, None)  # a buffered slot waits no more
            return self._skip(c, "paused", now, ClaimOutcome.paused())
        if c.reason == "backfill" and state.job_history(c.job).has_slot(c.slot, manual=False):
            return ClaimOutcome.done()
        buffer = self._buffer(c.job, now) if c.overlap in BUFFER_POLICIES else {}
        queued = c.slot in buffer
        # A buffered slot waited for its turn: that wait never makes it late.
        if not queued and c.max_late_ms is not None and now > c.slot + c.max_late_ms:
            if c.reason == "catch-up":
                return ClaimOutcome.late(now - c.slot)
            return self._skip(c, "late", now, ClaimOutcome.late(now - c.slot))
        self._sweep(c.job, runs, now)
        live = {
            slot: other.lease_until
            for slot, other in runs.items()
            if other.state == "running" and other.lease_until > now
        }
        busy = max(live) if live else None
        cancelled: int | None = None
        if c.overlap == "skip" and busy is not None:
            return self._skip(c, "overlap", now, ClaimOutcome.overlap(busy))
        if c.overlap in BUFFER_POLICIES:
            answer = buffer_answer(c, live, buffer, now)
            if answer is not None:
                if answer.kind == "buffered":
                    buffer[c.slot] = now + buffer_hold_ms(c.lease_ms)
                    return answer
                return self._skip(c, "overlap", now, answer)
            buffer.pop(c.slot, None)  # its turn: the run starts below
        elif c.overlap == "cancel_other":
            reason = cancel_reason(c.slot, c.instance_id)
            for slot, other in sorted(runs.items()):
                if slot != c.slot and other.state == "running":
                    self._interrupt(c.job, slot, other, now, reason)
                    other.state, other.status, other.finished_at = "finished", CANCELLED, now
                    cancelled = slot
        run = _Run(
            attempt=0,
            token=c.token,
            owner=c.instance_id,
            lease_until=now,
            state="running",
            status=None,
            reason=c.reason,
            started_at=now,
            keep_ms=c.keep_ms,
            max_attempts=c.max_attempts,
        )
        runs[c.slot] = run
        self._start(c, run, 1, c.reason, now)
        return ClaimOutcome.won(1, cancelled=cancelled)

    def _buffer(self, job: str, now: int) -> dict[int, int]:
        """The job's buffered slots still held: one whose waiters all went away is dropped."""
        buffer = self._state.buffers.setdefault(job, {})
        for slot in [s for s, until in buffer.items() if until <= now]:
            del buffer[slot]
        return buffer

    def _start(self, c: RunClaim, run: _Run, attempt: int, reason: RunReason, now: int) -> None:
        """Give the run to the claimer as ``attempt`` and show that attempt as running."""
        run.attempt = attempt
        run.token = c.token
        run.owner = c.instance_id
        run.lease_until = now + c.lease_ms
        run.state = "running"
        run.status = None
        run.reason = reason
        run.started_at = now
        run.finished_at = None
        self._state.job_history(c.job).claims[(c.slot, c.instance_id, attempt, False)] = (
            ClaimRecord(slot=c.slot, by=c.instance_id, at=now, attempt=attempt, reason=reason)
        )

    def _sweep(self, job: str, runs: dict[int, _Run], now: int) -> None:
        """End the lapsed runs whose attempts are used up: nobody may take them over."""
        for slot, run in runs.items():
            if run.state == "running" and run.lease_until <= now and (
                run.attempt >= run.max_attempts
            ):
                self._interrupt(job, slot, run, now, "lease lapsed; attempts used up")
                run.state, run.status, run.finished_at = "finished", "interrupted", now

    def _interrupt(self, job: str, slot: int, run: _Run, now: int, error: str) -> None:
        """Record the superseded attempt as interrupted, unless its runner saved a result."""
        key = (slot, run.owner, run.attempt, False)
        history = self._state.job_history(job)
        if key in history.results:
            return
        history.results[key] = StoredResult(
            slot=slot,
            by=run.owner,
            attempt=run.attempt,
            status="interrupted",
            started_at=run.started_at,
            finished_at=now,
            duration_ms=max(now - run.started_at, 0),
            error=error,
            reason=run.reason,
        )


class MemoryBackend(BaseBackend):
    """Coordinates the schedulers of one process that share this instance.

    ``clock`` returns the store's "now" in epoch milliseconds (default: ``time.time()``);
    tests pass their own to move time without sleeping.
    """

    durable = False  # nothing outlives the process: nothing to spool for a later one

    name = "memory"
    #: Claims are never forgotten, so an instance may be as late as it likes.
    dedupe_window_ms: float = math.inf

    def __init__(self, *, clock: Callable[[], int] | None = None) -> None:
        self._state = _State(clock or now_ms)
        self.runs: MemoryRunStore = MemoryRunStore(self._state)
        #: The queues of the listening schedulers, each with its loop (any thread).
        self._listeners: set[tuple[asyncio.AbstractEventLoop, asyncio.Queue[Wakeup]]] = set()

    async def claim(self, input: ClaimInput) -> bool:
        with self._state.lock:
            return self._claim(input)

    async def claim_many(self, inputs: list[ClaimInput]) -> list[bool]:
        with self._state.lock:
            return [self._claim(i) for i in inputs]

    def _claim(self, input: ClaimInput) -> bool:
        key = (input.job, input.slot)
        holder = self._state.claimed.get(key)
        if holder is not None:
            return holder == input.token  # the same claim sent again is still ours
        self._state.claimed[key] = input.token
        self._state.job_history(input.job).claims[(input.slot, input.instance_id, 1, False)] = (
            ClaimRecord(slot=input.slot, by=input.instance_id, at=self._state.now())
        )
        return True

    async def record_manual_run(self, input: ClaimInput) -> int | None:
        """Record a manual run; a slot that already has one moves on by 1 ms, returned."""
        with self._state.lock:
            history = self._state.job_history(input.job)
            slot = input.slot
            while history.has_slot(slot, manual=True):
                slot += 1
            history.claims[(slot, input.instance_id, 1, True)] = ClaimRecord(
                slot=slot, by=input.instance_id, at=self._state.now(), manual=True, reason="manual"
            )
            return None if slot == input.slot else slot

    async def save_result(
        self, job: str, result: StoredResult, history_size: int, history_ttl_ms: int | None = None
    ) -> None:
        with self._state.lock:
            self._state.save_result(job, result, history_size, history_ttl_ms)

    async def history(self, job: str, limit: int) -> list[RunRecord]:
        with self._state.lock:
            history = self._state.history.get(job)
            if history is None:
                return []
            claims = list(history.claims.values())
            results = list(history.results.values())
        return build_history(job, claims, results, limit)

    def wakeups(self) -> AsyncIterator[Wakeup]:
        """Hints straight from :meth:`wake` in this process: nothing to drop or reconnect."""
        return self._wakeups()

    async def _wakeups(self) -> AsyncIterator[Wakeup]:
        entry = (asyncio.get_running_loop(), asyncio.Queue[Wakeup]())
        with self._state.lock:
            self._listeners.add(entry)
        try:
            while True:
                yield await entry[1].get()
        finally:
            with self._state.lock:
                self._listeners.discard(entry)

    async def wake(self, hint: Wakeup) -> None:
        with self._state.lock:
            listeners = list(self._listeners)
        for loop, queue in listeners:
            with contextlib.suppress(RuntimeError):  # that loop has closed meanwhile
                loop.call_soon_threadsafe(queue.put_nowait, hint)

    def describe(self) -> str:
        return "memory (this process only)"
