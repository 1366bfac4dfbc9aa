"""The operator's hands on a scheduler: the ledger, pause and resume, backfill.

A mixin of ``Scheduler`` (its methods and their sync twins), kept apart from the
scheduler's own lifecycle. The state lives in the store (``LedgerStore``), so every
instance honours a pause at its next claim, whichever instance or command set it; a
backfill is filed as a request (``django_anarchon.backfill``) that workers run through the
normal claim, never run here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from ..backends.base import LedgerStore, PauseState, RunRecord, datetime_to_ms, ledger_of
from ..durations import parse_duration
from ..exceptions import ConfigurationError
from ..jobs import Job
from ..logtime import iso
from .ledger import LedgerEntry, LedgerKeeper, _ran, _walk

if TYPE_CHECKING:
    from ..backends.base import Backend, BaseBackend
    from .clock import StoreClock

__all__ = ["MAX_BACKFILL", "BackfillPlan", "OperatorMixin"]

T = TypeVar("T")

#: The most slots one backfill may run (``max``'s upper bound), and its default.
MAX_BACKFILL = 10_000
DEFAULT_BACKFILL_MAX = 100
#: The longest pause note (this engine's bound) and ``by`` / ``requested_by`` (as the
#: database stores them).
MAX_NOTE = 2000
MAX_BY = 150
BackfillOverlap = Literal["skip", "allow"]


@dataclass(frozen=True)
class BackfillPlan:
    """What a backfill runs: ``slots`` oldest first; ``already_ran`` slots of the range ran.

    ``request_id`` is the filed request's id (``None`` for a dry run).
    """

    job: str
    slots: tuple[int, ...]
    already_ran: int
    request_id: int | None = None


class OperatorMixin:
    """The ledger, pauses and backfills of a ``Scheduler``."""

    name: str
    backend: Backend | BaseBackend
    clock: StoreClock
    ledgers: LedgerKeeper

    if TYPE_CHECKING:
        @property
        def running(self) -> bool: ...
        def get_job(self, name: str) -> Job: ...
        def registered_jobs(self) -> list[Job]: ...
        async def _ensure_init(self) -> None: ...
        def _sync(self, what: str, fn: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> T: ...

    async def astore_now(self, name: str) -> int:
        """The store's now (ms) as the store of ``name`` tells it: what ``until``, "future"
        and a command's relative times (``2h`` ago) are counted from."""
        self.get_job(name)
        await self._ensure_init()
        return await self._store_now(name)

    def store_now(self, name: str) -> int:
        """Sync twin of :meth:`astore_now`."""
        return self._sync("store_now", self.astore_now, name)

    async def _store_now(self, job: str) -> int:
        """The store's now: a scheduler that is not running (a command, the admin) reads
        the store's clock first, since its offset is measured only at start."""
        if not self.running:
            await self.clock.measure(self.backend, job)
        return self.clock.now()

    def _ledger_store(self, job: str, what: str) -> LedgerStore:
        store = ledger_of(self.backend)
        if store is None:
            raise ConfigurationError(
                f"{what} needs a store with leases and a ledger; the {self.backend.name} "
                "backend has none (docs/ledger.md)", job=job,
            )
        return store

    # -- the ledger ---------------------------------------------------------------------

    async def aledger(
        self, name: str, since: datetime | None = None, until: datetime | None = None,
        limit: int = 1000,
    ) -> list[LedgerEntry]:
        """Every slot of ``name`` between ``since`` and ``until`` with its fate, newest first.

        On a store without a ledger (claim-only stores) only the slots that ran show.
        """
        job = self.get_job(name)
        await self._ensure_init()
        low = None if since is None else datetime_to_ms(since)
        high = None if until is None else datetime_to_ms(until)
        return await self.ledgers.read(job, low, high, limit)

    def ledger(
        self, name: str, since: datetime | None = None, until: datetime | None = None,
        limit: int = 1000,
    ) -> list[LedgerEntry]:
        """Sync twin of :meth:`aledger`."""
        return self._sync("ledger", self.aledger, name, since, until, limit)

    # -- pause and resume -----------------------------------------------------------------

    async def apause(
        self, name: str, note: str | None = None, until: object = None, by: str = ""
    ) -> PauseState:
        """Pause ``name`` on every instance: its slots are skipped (``paused``) until resumed.

        ``until``: an aware datetime, or a duration from now (``"2h"``) by the store's
        clock; the pause then ends by itself. A run already going is not stopped.
        """
        self.get_job(name)
        store = self._ledger_store(name, "pause")
        note = "" if note is None else note
        if not isinstance(note, str) or len(note) > MAX_NOTE:
            raise ConfigurationError(
                f"expected text of at most {MAX_NOTE} characters", job=name, option="note",
                value=note if not isinstance(note, str) else note[:40] + "...",
            )
        if not isinstance(by, str) or len(by) > MAX_BY:
            raise ConfigurationError(
                f"expected text of at most {MAX_BY} characters", job=name, option="by", value=by
            )
        await self._ensure_init()
        until_ms = self._until(name, until, await self._store_now(name))
        return await store.pause(name, note, by, until_ms)

    def pause(
        self, name: str, note: str | None = None, until: object = None, by: str = ""
    ) -> PauseState:
        """Sync twin of :meth:`apause`."""
        return self._sync("pause", functools.partial(self.apause, note=note, until=until, by=by),
                          name)

    def _until(self, name: str, until: object, now: int) -> int | None:
        if until is None:
            return None
        if isinstance(until, datetime):
            if until.tzinfo is None:
                raise ConfigurationError(
                    "give the datetime a time zone", job=name, option="until", value=until
                )
            until_ms = datetime_to_ms(until)
        else:
            until_ms = now + parse_duration(until, job=name, option="until", allow_zero=False)
        if until_ms <= now:
            raise ConfigurationError(
                f"is not in the future ({iso(until_ms)})", job=name, option="until", value=until
            )
        return until_ms

    async def aresume(self, name: str) -> PauseState | None:
        """End the pause of ``name``; the pause that was in force, or ``None``."""
        self.get_job(name)
        store = self._ledger_store(name, "resume")
        await self._ensure_init()
        return await store.resume(name)

    def resume(self, name: str) -> PauseState | None:
        """Sync twin of :meth:`aresume`."""
        return self._sync("resume", self.aresume, name)

    async def apauses(self, names: Sequence[str] | None = None) -> dict[str, PauseState]:
        """The pauses in force among ``names`` (default: every job); ``{}`` without a ledger."""
        store = ledger_of(self.backend)
        if store is None:
            return {}
        jobs = list(names) if names is not None else [j.name for j in self.registered_jobs()]
        for name in jobs:
            self.get_job(name)
        await self._ensure_init()
        return await store.pauses(jobs) if jobs else {}

    def pauses(self, names: Sequence[str] | None = None) -> dict[str, PauseState]:
        """Sync twin of :meth:`apauses`."""
        return self._sync("pauses", self.apauses, names)

    # -- backfill -----------------------------------------------------------------------

    async def abackfill(
        self, name: str, start: datetime, end: datetime, *, max: int = DEFAULT_BACKFILL_MAX,
        overlap: BackfillOverlap = "skip", dry_run: bool = False, requested_by: str = "",
    ) -> BackfillPlan:
        """Run every slot of ``name`` in ``start..end`` that never ran, once, on the workers.

        Refused (``ConfigurationError``) for a range that ends in the future, one that
        holds more than ``max`` slots to run, and a paused job. ``dry_run`` only says
        which slots would run. Otherwise a request is filed and the workers of this
        scheduler run the slots one at a time, oldest first, each through the normal
        claim with reason ``backfill`` (so two backfills of one range run each slot once).
        """
        job = self.get_job(name)
        store = self._ledger_store(name, "backfill")
        if isinstance(max, bool) or not isinstance(max, int) or not 1 <= max <= MAX_BACKFILL:
            raise ConfigurationError(
                f"expected a whole number from 1 to {MAX_BACKFILL:,}", job=name, option="max",
                value=max,
            )
        if not isinstance(requested_by, str) or len(requested_by) > MAX_BY:
            raise ConfigurationError(
                f"expected text of at most {MAX_BY} characters", job=name,
                option="requested_by", value=requested_by,
            )
        if overlap not in ("skip", "allow"):
            raise ConfigurationError(
                "expected 'skip' or 'allow'", job=name, option="overlap", value=overlap
            )
        for option, value in (("from", start), ("to", end)):
            if not isinstance(value, datetime) or value.tzinfo is None:
                raise ConfigurationError(
                    "expected an aware datetime", job=name, option=option, value=value
                )
        low, high = datetime_to_ms(start), datetime_to_ms(end)
        if low > high:
            raise ConfigurationError(
                f"the range ends ({iso(high)}) before it starts", job=name, option="to",
                value=end,
            )
        await self._ensure_init()
        now = await self._store_now(name)
        if high > now:
            raise ConfigurationError(
                f"the range ends in the future ({iso(high)}; the store's now is {iso(now)})",
                job=name, option="to", value=end,
            )
        if (await store.pauses([name])).get(name) is not None:
            raise ConfigurationError(
                "is paused: resume it before a backfill", job=name
            )
        history = await self.backend.history(name, job.options.history_size)
        told = _told_since(job, history, now)
        if told is not None and low < told:
            raise ConfigurationError(
                f"history tells which slots ran only from {iso(told)} on (history_size="
                f"{job.options.history_size}, history_ttl): a slot before that may have run; "
                "start the range later", job=name, option="from", value=start,
            )
        ran = _ran(history)
        slots = list(_walk(job, low - 1, high))
        todo = tuple(slot for slot in slots if slot not in ran)
        if len(todo) > max:
            raise ConfigurationError(
                f"the range holds {len(todo):,} slots that never ran, more than max={max:,} "
                "(narrow the range or raise max)", job=name, option="max", value=max,
            )
        plan = BackfillPlan(job=name, slots=todo, already_ran=len(slots) - len(todo))
        if dry_run or not todo:
            return plan
        from ..backfill import file_backfill

        request = await file_backfill(
            self.name, name, low, high, list(todo), overlap, requested_by
        )
        return BackfillPlan(job=name, slots=todo, already_ran=plan.already_ran,
                            request_id=request)

    def backfill(
        self, name: str, start: datetime, end: datetime, *, max: int = DEFAULT_BACKFILL_MAX,
        overlap: BackfillOverlap = "skip", dry_run: bool = False, requested_by: str = "",
    ) -> BackfillPlan:
        """Sync twin of :meth:`abackfill`."""
        call = functools.partial(
            self.abackfill, max=max, overlap=overlap, dry_run=dry_run, requested_by=requested_by
        )
        return self._sync("backfill", call, name, start, end)


def _told_since(job: Job, history: Sequence[RunRecord], now: int) -> int | None:
    """From when history still tells whether a slot ran, or ``None`` (all of it): a full
    history has dropped runs that started before its oldest, and ``history_ttl`` drops
    the older ones. (The ledger's look stops at the same bound.)"""
    bounds = []
    if history and len(history) >= job.options.history_size:
        bounds.append(min(datetime_to_ms(r.started_at) for r in history))
    if job.options.history_ttl_ms is not None:
        bounds.append(now - job.options.history_ttl_ms)
    return max(bounds) if bounds else None
