"""The backend contract: value types, the ``Backend`` and ``RunStore`` interfaces, history.

A backend's one duty is an atomic "write unless it exists": for one job and one slot,
``claim()`` answers ``True`` to exactly one instance, and answers the same again to a
claimer that repeats itself with the same token. Backends with leases also provide a
``RunStore`` (``backend.runs``) that follows the lease rules in ``docs/concepts.md``.

Pure: nothing here imports ``django.db``.
"""

from __future__ import annotations

import abc
import json
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

RunStatus = Literal["running", "success", "failed", "interrupted"]
FinalStatus = Literal["success", "failed", "interrupted"]
RunReason = Literal["scheduled", "manual", "catch-up", "takeover", "backfill"]
OverlapPolicy = Literal["skip", "allow", "buffer_one", "buffer_all", "cancel_other"]
#: The overlap policies that need the store to keep more than one lease per run.
BUFFER_POLICIES = ("buffer_one", "buffer_all")
ClaimMode = Literal["new", "takeover"]
OutcomeKind = Literal[
    "won", "running", "done", "overlap", "none", "late", "early", "buffered", "paused"
]
#: A slot's fate in the ledger: it ran (history has its attempts), the store skipped it
#: (with why), or nobody claimed it (found by a later look).
SlotFate = Literal["ran", "skipped", "missed"]
#: Why a slot was skipped: another run in the way, too late to start, its job paused, or a
#: wall-clock time a daylight-saving gap removed (``dst_gap="skip"``).
SkipReason = Literal["overlap", "late", "paused", "dst"]
#: The claim reasons a paused job refuses (a takeover or a retry continues a run that began
#: before the pause; a manual run is the operator's own).
PAUSABLE_REASONS = ("scheduled", "catch-up", "backfill")
WakeupKind = Literal["released", "run-request", "resync"]

#: Every lease store remembers a finished run at least this long, whatever a claim says.
MIN_KEEP_MS = 10_000
#: How long a finished run is remembered when no claim said (``keep_ms`` of ``None``).
DEFAULT_KEEP_MS = 86_400_000
#: The lease status of a run that a ``cancel_other`` claim of a later slot fenced. Its
#: history attempt says ``interrupted``; the run's own status differs so that no claim
#: retries it and no ``finish()`` of its old token is taken (a previous release reads it
#: as finished and done).
CANCELLED = "cancelled"
#: The longest wait hint of a ``buffered`` answer: a waiting claimer asks again at least
#: this often, so that its buffered slot stays held (see ``buffer_hold_ms``).
BUFFER_WAIT_CAP_MS = 10_000


def ms_to_datetime(ms: float) -> datetime:
    """An epoch-milliseconds instant as an aware UTC datetime."""
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def datetime_to_ms(value: datetime) -> int:
    """An aware datetime as integer epoch milliseconds."""
    if value.tzinfo is None:
        raise ValueError(f"naive datetime {value!r}: give it a time zone")
    return round(value.timestamp() * 1000)


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    return value


@dataclass(frozen=True)
class ClaimInput:
    """What an instance sends to claim one run (job, slot)."""

    job: str
    slot: int
    token: str
    instance_id: str
    history_size: int = 100
    history_ttl_ms: int | None = None


@dataclass(frozen=True)
class RunClaim(ClaimInput):
    """A claim on a lease store: a ``ClaimInput`` plus what the lease rules need."""

    mode: ClaimMode = "new"
    reason: RunReason = "scheduled"
    lease_ms: int = 30_000
    overlap: OverlapPolicy = "skip"
    max_attempts: int = 1
    max_late_ms: int | None = None
    keep_ms: int | None = None
    #: ``overlap="buffer_all"``: how many slots of the job the store may hold waiting.
    buffer_limit: int = 10


def buffer_hold_ms(lease_ms: int) -> int:
    """How long a buffered slot stays held after its last claim: its waiters ask again
    well within it (every ``buffer_wait_ms`` at most), and when they all went away the
    slot is dropped instead of blocking the job's later slots for ever."""
    return max(lease_ms, 3 * BUFFER_WAIT_CAP_MS)


def buffer_wait_ms(lease_left_ms: int, lease_ms: int) -> int:
    """The wait hint of a ``buffered`` answer: the blocking lease's remaining time, capped."""
    return max(1, min(lease_left_ms, lease_ms // 3 or 1, BUFFER_WAIT_CAP_MS))


def buffer_answer(
    c: RunClaim, live: Mapping[int, int], buffer: Mapping[int, int], now: int
) -> ClaimOutcome | None:
    """The buffer rule of a new ``buffer_*`` claim, for stores that decide it in Python.

    ``live`` maps the job's slots with a live lease to their ``lease_until``; ``buffer``
    holds its buffered slots (stale ones already dropped). The answer is ``buffered``
    (the store then holds ``c.slot``: adds it, or renews its hold), ``overlap`` (no room),
    or ``None``: its turn, so it leaves the buffer and runs.
    """
    busy = max(live, default=None)
    head = min(buffer, default=None)
    if busy is None and (head is None or head == c.slot):
        return None
    blocker = busy if busy is not None else head
    assert blocker is not None
    left = live[busy] - now if busy is not None else c.lease_ms
    room = 1 if c.overlap == "buffer_one" else c.buffer_limit
    if c.slot in buffer or len(buffer) < room:
        return ClaimOutcome.buffered(blocker, buffer_wait_ms(left, c.lease_ms))
    return ClaimOutcome.overlap(blocker)


def cancel_reason(slot: int, instance_id: str) -> str:
    """The error of an attempt a ``cancel_other`` claim fenced (history says who did it)."""
    when = ms_to_datetime(slot).isoformat()
    return f"cancelled by slot {when} ({slot}) of instance {instance_id} (overlap cancel_other)"


@dataclass(frozen=True)
class ClaimOutcome:
    """The lease store's answer to ``runs.claim()``; build one with the class methods."""

    kind: str
    attempt: int | None = None
    slot: int | None = None
    late_ms: int | None = None
    wait_ms: int | None = None
    #: On ``won`` of a ``cancel_other`` claim: the newest slot whose run it cancelled.
    cancelled: int | None = None

    @classmethod
    def won(cls, attempt: int, cancelled: int | None = None) -> ClaimOutcome:
        return cls("won", attempt=attempt, cancelled=cancelled)

    @classmethod
    def running(cls, attempt: int) -> ClaimOutcome:
        return cls("running", attempt=attempt)

    @classmethod
    def done(cls) -> ClaimOutcome:
        return cls("done")

    @classmethod
    def overlap(cls, slot: int) -> ClaimOutcome:
        return cls("overlap", slot=slot)

    @classmethod
    def none(cls) -> ClaimOutcome:
        return cls("none")

    @classmethod
    def late(cls, late_ms: int) -> ClaimOutcome:
        return cls("late", late_ms=late_ms)

    @classmethod
    def buffered(cls, slot: int, wait_ms: int) -> ClaimOutcome:
        """The store holds this slot until the run of ``slot`` ends: claim again in ``wait_ms``
        (the same token), or at once when that run ends on this instance."""
        return cls("buffered", slot=slot, wait_ms=max(int(wait_ms), 1))

    @classmethod
    def paused(cls) -> ClaimOutcome:
        """The job is paused (by the store's clock): the slot is skipped, and marked so."""
        return cls("paused")

    @classmethod
    def early(cls, wait_ms: int) -> ClaimOutcome:
        """The slot has not come yet by the store's clock: claim again in ``wait_ms``."""
        return cls("early", wait_ms=max(int(wait_ms), 1))

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class ActiveRun:
    """A run that is not finished: its slot, current attempt, and whether its lease is alive."""

    slot: int
    attempt: int
    alive: bool


@dataclass(frozen=True)
class StoredResult:
    """How one attempt ended; times are epoch milliseconds."""

    slot: int
    by: str
    attempt: int
    status: FinalStatus
    started_at: int
    finished_at: int
    duration_ms: int
    error: str | None = None
    manual: bool = False
    reason: RunReason = "scheduled"

    def to_dict(self) -> dict[str, Any]:
        # Every field is a scalar: a shallow copy is the same dict as ``asdict``, without
        # its recursive deep copy (a tenth of a Redis worker's CPU in a burst of runs).
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StoredResult:
        """The inverse of :meth:`to_dict` (stores and the spool keep results as JSON)."""
        return cls(
            slot=int(data["slot"]),
            by=str(data["by"]),
            attempt=int(data["attempt"]),
            status=data["status"],
            started_at=int(data["started_at"]),
            finished_at=int(data["finished_at"]),
            duration_ms=int(data["duration_ms"]),
            error=data.get("error") or None,
            manual=bool(data.get("manual", False)),
            reason=data.get("reason", "scheduled"),
        )


@dataclass(frozen=True)
class RunEnd:
    """An attempt's end, for ``runs.finish_many()``: its lease's finish and its history.

    ``result`` is written only if the finish acts (the token still holds the run), in the
    same atomic step, so that history never says "success" of a run another instance took
    over, and a crash between the two cannot leave a finished run with no record.
    """

    job: str
    token: str
    status: FinalStatus
    result: StoredResult
    history_size: int
    history_ttl_ms: int | None = None

    @property
    def slot(self) -> int:
        return self.result.slot


@dataclass(frozen=True)
class ClaimRecord:
    """A won claim, as ``build_history`` pairs it with results (times in epoch ms)."""

    slot: int
    by: str
    at: int
    manual: bool = False
    attempt: int = 1
    reason: RunReason = "scheduled"


@dataclass(frozen=True)
class Wakeup:
    """A hint from a store's push channel that something may be ready *now*.

    Only a reason to look at once instead of at the next poll: the look itself goes
    through the normal claim path, which alone decides. So a hint that is lost, sent
    twice or forged can make an instance ask the store sooner or more often, never run
    a slot twice. ``released``: a lease of ``job`` was released (a hand-over);
    ``run-request``: a "Run now" request for ``scheduler`` was filed; ``resync``: the
    listener (re)connected and may have missed hints, so every waiter looks.
    """

    kind: WakeupKind
    job: str = ""
    scheduler: str = ""

    def to_json(self) -> str:
        return json.dumps({"v": 1, "kind": self.kind, "job": self.job, "scheduler": self.scheduler})

    @classmethod
    def from_json(cls, raw: str | bytes) -> Wakeup | None:
        """The hint in a message, or ``None`` for one this version does not understand."""
        try:
            data = json.loads(raw)
        except (TypeError, ValueError):
            return None
        if not isinstance(data, dict) or data.get("kind") not in ("released", "run-request"):
            return None
        job, scheduler = data.get("job", ""), data.get("scheduler", "")
        if not isinstance(job, str) or not isinstance(scheduler, str):
            return None
        return cls(kind=data["kind"], job=job, scheduler=scheduler)


@dataclass(frozen=True)
class SlotMark:
    """A slot's fate that history does not show, as a lease store keeps it (the ledger).

    ``skipped``: a claim the store answered ``late``, ``overlap`` or ``paused`` (written in
    that claim's own atomic step), or a daylight-saving gap (``dst``). ``missed``: slots
    that nobody claimed, found later; consecutive ones are one mark from ``slot`` to
    ``last`` (inclusive) holding ``count`` slots of the schedule. A skip has
    ``last == slot`` and ``count == 1``. ``at`` is the store's clock when it was written,
    ``by`` the instance that wrote it.
    """

    slot: int
    fate: Literal["skipped", "missed"]
    reason: str
    at: int
    by: str
    last: int
    count: int = 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PauseState:
    """A paused job, as the store keeps it; ``until`` (store ms) ends the pause by itself."""

    job: str
    note: str
    by: str
    at: int
    until: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@runtime_checkable
class LedgerStore(Protocol):
    """The optional ledger and pause capability of a ``RunStore`` (lease stores).

    Besides these methods, a store that offers them follows three more claim rules, in
    the claim's own atomic step, for a new run (no run of the slot exists, not early):

    * the job is paused (``until`` is ``None`` or later than the store's now) and the
      claim's reason is in ``PAUSABLE_REASONS``: answer ``paused`` and write the mark
      ``skipped``/``paused``;
    * the reason is ``backfill`` and history holds a non-manual attempt of the slot:
      answer ``done`` (it ran already);
    * an answer ``late`` (unless the reason is ``catch-up``: nothing to catch up is not a
      skip) or ``overlap`` also writes the mark ``skipped`` with that reason.

    A mark is written only where no mark of the job covers the slot (a range covers
    ``slot..last``); writing one prunes the job's marks to the newest ``history_size``
    (by slot) and drops those whose ``last`` is older than ``history_ttl_ms``.
    """

    async def marks(
        self, job: str, since: int | None, until: int | None, limit: int
    ) -> list[SlotMark]:
        """The job's marks that reach into ``since..until`` (inclusive), newest first."""
        ...

    async def mark_skipped(
        self, job: str, slot: int, reason: str, instance_id: str,
        history_size: int, history_ttl_ms: int | None,
    ) -> bool:
        """Write a ``skipped`` mark unless a mark covers the slot; ``True`` if written."""
        ...

    async def mark_missed(
        self, job: str, ranges: Sequence[tuple[int, int, int]], instance_id: str,
        history_size: int, history_ttl_ms: int | None,
    ) -> int:
        """Write each ``(slot, last, count)`` as a ``missed`` mark unless a mark of the job
        reaches into ``slot..last``; atomic per call. How many were written."""
        ...

    async def pause(self, job: str, note: str, by: str, until: int | None) -> PauseState:
        """Pause the job (again: the new note, who and until replace the old); ``at`` is now."""
        ...

    async def resume(self, job: str) -> PauseState | None:
        """Unpause; the pause that was in force (``None``: it was not paused)."""
        ...

    async def pauses(self, jobs: Sequence[str]) -> dict[str, PauseState]:
        """The pauses in force now (by the store's clock) among ``jobs``."""
        ...

    async def job_since(self, jobs: Sequence[tuple[str, str]]) -> list[int]:
        """For each ``(job, fingerprint)``: since when (store ms) the store has known the
        job with that schedule fingerprint; a new or changed one is recorded as now."""
        ...


@dataclass(frozen=True)
class JobLimits:
    """What ``check_job`` receives so a backend can refuse a job it cannot run safely."""

    name: str
    jitter_ms: int
    max_late_ms: int
    min_gap_ms: float  # math.inf for a one-off job
    history_size: int
    history_ttl_ms: int | None = None


@dataclass(frozen=True)
class RunRecord:
    """One attempt of one run, as history shows it."""

    job: str
    slot: int
    scheduled_at: datetime
    instance_id: str
    manual: bool
    attempt: int
    reason: str
    status: str
    started_at: datetime
    finished_at: datetime | None = None
    duration_ms: int | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: _jsonable(v) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class JobInfo:
    """What ``Scheduler.jobs()`` returns for each job."""

    name: str
    type: Literal["cron", "every", "once"]
    schedule: str
    next_run_at: datetime | None
    running_here: int = 0
    options: dict[str, Any] = field(default_factory=dict, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {k: _jsonable(v) for k, v in asdict(self).items()}


def build_history(
    job: str,
    claims: Iterable[ClaimRecord],
    results: Iterable[StoredResult],
    limit: int,
) -> list[RunRecord]:
    """Merge won claims and stored results into ``RunRecord``s, newest first.

    A claim without a result is a run still going (``running``); a result is matched to
    its claim by (slot, instance, attempt, manual). A result whose claim the store no
    longer has still appears. Backends that keep claims and results apart use this so
    that new record fields reach them without changes.
    """
    by_key: dict[tuple[int, str, int, bool], RunRecord] = {}
    for c in claims:
        by_key[(c.slot, c.by, c.attempt, c.manual)] = RunRecord(
            job=job,
            slot=c.slot,
            scheduled_at=ms_to_datetime(c.slot),
            instance_id=c.by,
            manual=c.manual,
            attempt=c.attempt,
            reason="manual" if c.manual else c.reason,
            status="running",
            started_at=ms_to_datetime(c.at),
        )
    for r in results:
        key = (r.slot, r.by, r.attempt, r.manual)
        claimed = by_key.get(key)
        by_key[key] = RunRecord(
            job=job,
            slot=r.slot,
            scheduled_at=ms_to_datetime(r.slot),
            instance_id=r.by,
            manual=r.manual,
            attempt=r.attempt,
            reason=claimed.reason if claimed else ("manual" if r.manual else r.reason),
            status=r.status,
            started_at=ms_to_datetime(r.started_at),
            finished_at=ms_to_datetime(r.finished_at),
            duration_ms=r.duration_ms,
            error=r.error,
        )
    return sort_newest_first(list(by_key.values()))[: max(limit, 0)]


@runtime_checkable
class RunStore(Protocol):
    """The lease capability of a backend. Every method is atomic on the store's clock."""

    async def claim(self, input: RunClaim) -> ClaimOutcome: ...

    async def heartbeat(self, job: str, slot: int, token: str, lease_ms: int) -> bool: ...

    async def finish(self, job: str, slot: int, token: str, status: FinalStatus) -> bool: ...

    async def release(self, job: str, slot: int, token: str) -> bool: ...

    async def active(self, job: str) -> list[ActiveRun]: ...


@runtime_checkable
class Backend(Protocol):
    """What the engine needs from a store. ``BaseBackend`` is a convenient base class."""

    name: str
    dedupe_window_ms: float
    runs: RunStore | None

    async def init(self) -> None: ...

    async def prepare_job(self, job: str, history_size: int) -> None: ...

    async def claim(self, input: ClaimInput) -> bool: ...

    async def record_manual_run(self, input: ClaimInput) -> int | None: ...

    async def save_result(
        self, job: str, result: StoredResult, history_size: int, history_ttl_ms: int | None = None
    ) -> None: ...

    async def history(self, job: str, limit: int) -> list[RunRecord]: ...

    async def close(self) -> None: ...


class BaseBackend(abc.ABC):
    """Base class for backends: the required methods are abstract, the optional ones real.

    Subclasses take their settings as keyword arguments: ``OPTIONS`` in settings are
    passed to the constructor as they are.
    """

    name: ClassVar[str] = "base"
    #: How long the store remembers a claim; ``math.inf`` if forever.
    dedupe_window_ms: float = math.inf
    #: The lease store, on backends that have leases.
    runs: RunStore | None = None
    #: On a store without leases that still judges an early claim by its own clock
    #: (Redis ``stream-id``): ``await store_now(job)`` reads that clock, epoch ms, and
    #: the engine arms its timers by it. A lease store's clock is ``runs.now_ms``.
    store_now: Callable[[str], Awaitable[int]] | None = None
    #: Whether the store outlives this process (so a spool of its records can be replayed).
    durable: ClassVar[bool] = True

    async def init(self) -> None:  # noqa: B027  (optional hook: nothing to do by default)
        """Connect and check the server. Called by ``start()`` and before reads; idempotent."""

    async def prepare_jobs(self, jobs: list[tuple[str, int]]) -> None:
        """Prepare several ``(job, history_size)`` at once; override to batch round trips."""
        for job, history_size in jobs:
            await self.prepare_job(job, history_size)

    async def prepare_job(self, job: str, history_size: int) -> None:  # noqa: B027  (optional hook: nothing to do by default)
        """One-time setup for a job (a stream, a queue, a lock row)."""

    @abc.abstractmethod
    async def claim(self, input: ClaimInput) -> bool:
        """``True`` for exactly one instance per (job, slot); the same token again is ``True``."""

    @abc.abstractmethod
    async def record_manual_run(self, input: ClaimInput) -> int | None:
        """Record a ``run_now()`` run, never deduplicated; return the slot used if it differs."""

    @abc.abstractmethod
    async def save_result(
        self, job: str, result: StoredResult, history_size: int, history_ttl_ms: int | None = None
    ) -> None:
        """Store how an attempt ended, and prune history to ``history_size``/``history_ttl_ms``."""

    @abc.abstractmethod
    async def history(self, job: str, limit: int) -> list[RunRecord]:
        """The latest attempts of ``job`` from every instance, newest first."""

    async def close(self) -> None:  # noqa: B027  (optional hook: nothing to do by default)
        """Close what the backend opened itself (never a client it was given)."""

    def check_job(self, job: JobLimits) -> None:  # noqa: B027  (optional hook: nothing to do by default)
        """Raise ``ConfigurationError`` to refuse a job this store cannot run safely.

        The engine already refuses ``jitter + max_late >= dedupe_window_ms``; a backend
        overrides this for limits of its own.
        """

    def describe(self) -> str:
        """A one-line description for banners and the admin (never a password)."""
        return self.name

    def wakeups(self) -> AsyncIterator[Wakeup] | None:
        """The hints of the store's push channel, or ``None`` if it has none (the default).

        An optional capability: the engine iterates it from ``start()`` to ``stop()`` (it
        cancels the iteration) and polls at its usual intervals either way. The iterator
        owns a connection of its own, reconnects with backoff when it drops, and yields
        ``Wakeup("resync")`` after each reconnection; it never ends by itself.
        """
        return None

    async def wake(self, hint: Wakeup) -> None:  # noqa: B027  (optional hook: nothing to do by default)
        """Send ``hint`` to every instance's :meth:`wakeups`; best effort, no answer awaited."""


def kept_ms(keep_ms: int | None) -> int:
    """How long a store keeps a finished run whose largest claimed ``keep_ms`` is this."""
    return max(DEFAULT_KEEP_MS if keep_ms is None else keep_ms, MIN_KEEP_MS)


def forget_after_ms(slot: int, finished_at: int, keep_ms: int | None) -> int:
    """The store instant after which a finished run may be forgotten.

    Counted from the later of its slot and its finish: a run that finished "before" its
    slot (the store's clock stepped back) is still remembered for the whole window in
    which a late claimer of that slot may arrive.
    """
    return max(finished_at, slot) + kept_ms(keep_ms)


def supports_leases(backend: Backend | BaseBackend) -> bool:
    return getattr(backend, "runs", None) is not None


def sort_newest_first(records: Sequence[RunRecord]) -> list[RunRecord]:
    return sorted(records, key=lambda rec: (rec.started_at, rec.slot, rec.attempt), reverse=True)


def ledger_of(backend: Backend | BaseBackend) -> LedgerStore | None:
    """The backend's ledger capability (its ``RunStore``, when it offers one), or ``None``."""
    runs = getattr(backend, "runs", None)
    return runs if isinstance(runs, LedgerStore) else None


def marks_to_keep(
    marks: Iterable[SlotMark], now: int, history_size: int, history_ttl_ms: int | None
) -> set[int]:
    """The slots of the marks a store keeps after a write: the newest ``history_size`` by
    slot, none whose ``last`` is older than the ttl (for stores that prune in Python)."""
    newest = sorted(marks, key=lambda m: m.slot, reverse=True)[: max(history_size, 0)]
    return {
        m.slot for m in newest if history_ttl_ms is None or m.last >= now - history_ttl_ms
    }
