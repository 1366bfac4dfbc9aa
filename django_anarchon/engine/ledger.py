"""The slot ledger: every slot's fate, and the look that finds the slots nobody claimed.

A slot that ran is in history (its attempts); a slot the store skipped carries a mark
that the claim wrote in its own atomic step (``LedgerStore`` in backends/base.py). What
is left are slots nobody claimed at all (every instance was down, or the store was),
which no claim can record: the first instance back finds them by walking the schedule
over a bounded look-back and writes them as ``missed`` ranges, and an instance whose
claims got no answer owes the store those slots until it comes back.

Reading merges the two: a run of a slot wins over any mark of it (a catch-up or a
backfill may run a slot that was marked missed), so every slot has at most one fate.
Every decision here is on the store's clock (``Scheduler.clock``).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..backends.base import (
    LedgerStore,
    RunRecord,
    SlotFate,
    SlotMark,
    datetime_to_ms,
    ledger_of,
    ms_to_datetime,
)
from ..jobs import Job
from ..logtime import iso
from .calls import error_text

if TYPE_CHECKING:
    from .scheduler import Scheduler

__all__ = ["LOOK_BACK_MS", "LedgerEntry", "LedgerKeeper", "fingerprint", "merge"]

logger = logging.getLogger("django_anarchon")

#: How far back the first instance back looks for missed slots (or the job's catch_up,
#: when longer).
LOOK_BACK_MS = 86_400_000
#: Most schedule slots one look walks per job (a job every second over a day: 86,400).
MAX_WALK = 200_000
#: The look at start waits this long first: the start's own catch-up claims go first (a
#: job whose catch-up is still claiming then is looked at once it has ended).
FIRST_LOOK_DELAY_S = 5.0
#: How often a look held for a job's catch-up checks whether the catch-up has ended.
DEFERRED_POLL_S = 1.0
#: Jobs per ``job_since`` call, and how often owed slots are offered to the store again.
SINCE_CHUNK = 500
OWED_RETRY_S = 30.0
#: Most slots one fall-behind of the loop owes the ledger (a job every second: 3 hours).
MAX_OWED = 10_000


@dataclass(frozen=True)
class LedgerEntry:
    """One slot's fate (or a range of ``count`` missed slots from ``slot`` to ``last_slot``).

    ``ran``: ``attempts`` are its history records, oldest first, ``status`` the newest
    one's, ``reason`` the run's (``scheduled``, ``catch-up``, ``backfill``). ``skipped``:
    ``reason`` says why (``overlap``, ``late``, ``paused``, ``dst``). ``missed``: nobody
    claimed it. ``by`` is the instance that ran it or wrote the mark.
    """

    job: str
    slot: int
    fate: SlotFate
    reason: str
    by: str
    last_slot: int
    count: int = 1
    status: str | None = None
    attempts: tuple[RunRecord, ...] = field(default=(), compare=False)

    @property
    def scheduled_at(self) -> datetime:
        return ms_to_datetime(self.slot)

    @property
    def last_scheduled_at(self) -> datetime:
        return ms_to_datetime(self.last_slot)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["scheduled_at"] = self.scheduled_at.isoformat()
        data["last_scheduled_at"] = self.last_scheduled_at.isoformat()
        data["attempts"] = [record.to_dict() for record in self.attempts]
        return data


def fingerprint(job: Job) -> str:
    """What identifies a job's schedule in the store: a change starts its ledger anew."""
    return hashlib.sha256(repr(job.schedule).encode()).hexdigest()[:40]


def look_back_ms(job: Job) -> int:
    return max(LOOK_BACK_MS, job.options.catch_up_ms)


def reach_ms(job: Job, lease_ms: int) -> int:
    """How long after its slot a claim may still win it: no look marks a slot sooner."""
    return job.options.max_late_ms + job.options.jitter_ms + lease_ms


def _ran(history: Iterable[RunRecord]) -> dict[int, list[RunRecord]]:
    ran: dict[int, list[RunRecord]] = {}
    for record in history:
        if not record.manual:
            ran.setdefault(record.slot, []).append(record)
    return ran


def _walk(job: Job, after: int, until: int) -> Iterable[int]:
    """The job's slots in ``(after, until]``, at most ``MAX_WALK`` of them."""
    slot = job.schedule.next_after(after)
    for _ in range(MAX_WALK):
        if slot is None or slot > until:
            return
        yield slot
        slot = job.schedule.next_after(slot)


def _ranges(job: Job, first: int, last: int, taken: set[int]) -> list[tuple[int, int, int]]:
    """The runs of consecutive slots in ``first..last`` that are not in ``taken``."""
    out: list[tuple[int, int, int]] = []
    current: tuple[int, int, int] | None = None
    for slot in _walk(job, first - 1, last):
        if slot in taken:
            if current is not None:
                out.append(current)
            current = None
        else:
            current = (slot, slot, 1) if current is None else (current[0], slot, current[2] + 1)
    if current is not None:
        out.append(current)
    return out


def merge(
    job: Job,
    history: Sequence[RunRecord],
    marks: Sequence[SlotMark],
    since: int | None = None,
    until: int | None = None,
) -> list[LedgerEntry]:
    """History and marks as one entry per slot (or missed range), newest first.

    A missed range that crosses ``since`` or ``until`` is split by every run, inside the
    bounds or not, so that no slot that ran is counted missed."""
    every_run = _ran(history)
    ran = {
        slot: sorted(records, key=lambda r: r.attempt)
        for slot, records in every_run.items()
        if (since is None or slot >= since) and (until is None or slot <= until)
    }
    entries = [
        LedgerEntry(
            job=job.name, slot=slot, fate="ran", reason=records[0].reason,
            by=records[0].instance_id, last_slot=slot, status=records[-1].status,
            attempts=tuple(records),
        )
        for slot, records in ran.items()
    ]
    for mark in marks:
        inside = {s for s in every_run if mark.slot <= s <= mark.last}
        if not inside:
            entries.append(_entry(job, mark, mark.slot, mark.last, mark.count))
        elif mark.fate == "missed":  # a later run of some of its slots splits the range
            for start, last, count in _ranges(job, mark.slot, mark.last, inside):
                if (since is None or last >= since) and (until is None or start <= until):
                    entries.append(_entry(job, mark, start, last, count))
    return sorted(entries, key=lambda e: e.slot, reverse=True)


def _entry(job: Job, mark: SlotMark, slot: int, last: int, count: int) -> LedgerEntry:
    return LedgerEntry(
        job=job.name, slot=slot, fate=mark.fate, reason=mark.reason, by=mark.by,
        last_slot=last, count=count,
    )


class LedgerKeeper:
    """The looks for missed slots of one scheduler (its host), and the slots it owes."""

    def __init__(self, host: Scheduler) -> None:
        self.host = host
        #: job -> slots whose claims got no answer from the store: offered again later.
        self.owed: dict[str, set[int]] = {}
        #: job -> (the job, since when the store knows it): looks held for a catch-up.
        self.deferred: dict[str, tuple[Job, int]] = {}

    @property
    def store(self) -> LedgerStore | None:
        return ledger_of(self.host.backend)

    async def read(
        self, job: Job, since: int | None, until: int | None, limit: int
    ) -> list[LedgerEntry]:
        history = await self.host.backend.history(job.name, max(job.options.history_size, limit))
        store = self.store
        marks = [] if store is None else await store.marks(job.name, since, until, limit)
        return merge(job, history, marks, since, until)[:limit]

    def owe(self, job: Job, slot: int) -> None:
        """A claim of ``slot`` never got the store's answer: mark it missed once it can."""
        if self.store is not None:
            self.owed.setdefault(job.name, set()).add(slot)

    def owe_from(self, job: Job, first: int, before: int | None) -> None:
        """This instance's loop fell behind: the slots from ``first`` up to ``before``
        were never claimed here (at most ``MAX_OWED`` of them; the next instance's look
        at start finds the rest)."""
        if self.store is None:
            return
        owed = self.owed.setdefault(job.name, set())
        owed.add(first)
        until = before - 1 if before is not None else first + look_back_ms(job)
        for count, slot in enumerate(_walk(job, first, until), start=2):
            if count > MAX_OWED:
                break
            owed.add(slot)

    async def keep(self) -> None:
        """At start: since when each job is known, then the look back (twice); then the
        owed slots.

        ``job_since`` goes first, at once: an instance that runs only a few seconds still
        tells the next one back where its look may start.
        """
        jobs = [job for job in self.host.registered_jobs() if job.kind != "once"]
        started = self.host.clock.now()
        since = await self.since(jobs)
        if await self.host.wait_stopping(FIRST_LOOK_DELAY_S):
            return
        await self.look_back(jobs, since)
        # Slots due just before the start were still within reach of a claim at the first
        # look; once none is, look again (this instance's timer began after them).
        reach = max((reach_ms(job, self.host.lease_ms) for job in jobs), default=0)
        wait_s = (started + reach - self.host.clock.now()) / 1000 + 1
        if wait_s > 0:
            if await self.host.wait_stopping(wait_s):
                return
            await self.look_back(jobs, since)
        owed_at = time.monotonic() + OWED_RETRY_S
        while not await self.host.wait_stopping(DEFERRED_POLL_S if self.deferred else OWED_RETRY_S):
            await self.look_deferred()
            if time.monotonic() >= owed_at:
                owed_at = time.monotonic() + OWED_RETRY_S
                await self.pay_owed()

    async def since(self, jobs: Sequence[Job]) -> dict[str, int]:
        """Since when the store has known each job with its schedule (``job_since``)."""
        store = self.store
        known: dict[str, int] = {}
        if store is None:
            return known
        for start in range(0, len(jobs), SINCE_CHUNK):
            chunk = jobs[start : start + SINCE_CHUNK]
            try:
                answers = await store.job_since([(job.name, fingerprint(job)) for job in chunk])
            except Exception as exc:
                self._failed("job_since", exc)
                break
            known.update(zip((job.name for job in chunk), answers, strict=True))
        return known

    async def look_back(self, jobs: Sequence[Job], since: dict[str, int]) -> int:
        """Mark the slots of ``jobs`` that nobody claimed; how many marks were written.

        ``since``: from ``since()``; a job missing from it is not looked at.
        """
        store = self.store
        if store is None:
            return 0
        written = 0
        for job in jobs:
            if self.host.stopping:
                break
            known_since = since.get(job.name)
            if known_since is None:
                continue
            if job.name in self.host.claim_flows.catching_up:
                self.deferred[job.name] = (job, known_since)  # looked at once it is done
                continue
            try:
                written += await self._look(store, job, known_since)
            except Exception as exc:
                self._failed(f"the look back of job {job.name}", exc)
            self.deferred.pop(job.name, None)
            await asyncio.sleep(0)  # thousands of jobs: let the claims go first
        return written

    async def look_deferred(self) -> int:
        """The looks held for a catch-up that has ended since."""
        busy = self.host.claim_flows.catching_up
        ready = [entry for name, entry in self.deferred.items() if name not in busy]
        if not ready:
            return 0
        return await self.look_back([job for job, _ in ready],
                                    {job.name: since for job, since in ready})

    async def _look(self, store: LedgerStore, job: Job, known_since: int) -> int:
        o = job.options
        now = self.host.clock.now()
        low = max(known_since, now - look_back_ms(job))
        if o.history_ttl_ms is not None:
            low = max(low, now - o.history_ttl_ms)
        high = now - reach_ms(job, self.host.lease_ms)
        if high <= low:
            return 0
        low, covered = await self._covered(store, job, low, high)
        ranges = _ranges(job, low + 1, high, covered)
        written = await self._mark(store, job, ranges)
        await self._mark_gaps(store, job, low, high)
        return written

    async def _covered(
        self, store: LedgerStore, job: Job, low: int, high: int
    ) -> tuple[int, set[int]]:
        """The slots in ``(low, high]`` that history or a mark covers, and how far back the
        store still tells: ``low``, raised past what it may have pruned."""
        o = job.options
        history = await self.host.backend.history(job.name, o.history_size)
        marks = await store.marks(job.name, low, high, o.history_size)
        # What history or the marks no longer hold (pruned) cannot be told from missed.
        # History keeps the runs that started last, and a run starts after its slot: every
        # slot since the oldest start it kept would still be there if it had run.
        if len(history) >= o.history_size:
            low = max(low, min(datetime_to_ms(r.started_at) for r in history))
        if len(marks) >= o.history_size:
            low = max(low, min(m.slot for m in marks))
        taken = set(_ran(history))
        spans = [(m.slot, m.last) for m in marks]
        covered = {
            slot for slot in _walk(job, low, high)
            if slot in taken or any(a <= slot <= b for a, b in spans)
        }
        return low, covered

    async def _mark(
        self, store: LedgerStore, job: Job, ranges: Sequence[tuple[int, int, int]]
    ) -> int:
        if not ranges:
            return 0
        o = job.options
        count = await store.mark_missed(
            job.name, ranges, self.host.instance_id, o.history_size, o.history_ttl_ms
        )
        written = list(ranges) if count == len(ranges) else []
        if 0 < count < len(ranges):
            # Another instance's marks covered some ranges: only what this one wrote is
            # logged and counted (events, metrics), so read which.
            marks = await store.marks(
                job.name, ranges[0][0], ranges[-1][1], len(ranges) + o.history_size
            )
            mine = {(m.slot, m.last) for m in marks
                    if m.fate == "missed" and m.by == self.host.instance_id}
            written = [r for r in ranges if (r[0], r[1]) in mine]
        if written:
            total = sum(count for _, _, count in written)
            logger.warning(
                "scheduler %s: job %s: %s slot(s) from %s to %s were missed (nobody claimed "
                "them)", self.host.name, job.name, total, iso(written[0][0]), iso(written[-1][1]),
            )
            for slot, last, count in written:
                await self.host.emit_event(
                    "missed", job, slot, reason=f"{count} slot(s) to {iso(last)}"
                )
        return len(written)

    async def _mark_gaps(self, store: LedgerStore, job: Job, low: int, high: int) -> None:
        """``dst_gap="skip"``: the wall-clock times a spring-forward swallowed, as skips."""
        gap_skips = getattr(job.schedule, "gap_skips", None)
        if gap_skips is None:
            return
        o = job.options
        for change in gap_skips(low, high):
            await store.mark_skipped(
                job.name, change, "dst", self.host.instance_id, o.history_size, o.history_ttl_ms
            )

    async def pay_owed(self) -> None:
        """Offer the owed slots to the store again; those it took are paid."""
        store = self.store
        if store is None:
            return
        for name, owed in list(self.owed.items()):
            slots = set(owed)  # claims that fail meanwhile add to the live set
            try:
                job = self.host.get_job(name)
            except Exception:
                self.owed.pop(name, None)
                continue
            first, last = min(slots), max(slots)
            try:
                # Another instance may have won some meanwhile, or a look marked them.
                low, covered = await self._covered(store, job, first - 1, last)
                others = set(_walk(job, first - 1, last)) - slots
                ranges = _ranges(job, max(first, low + 1), last, covered | others)
                await self._mark(store, job, ranges)
            except Exception as exc:
                self._failed(f"marking the missed slots of job {name}", exc)
                continue
            owed -= slots
            if not owed:
                self.owed.pop(name, None)

    def _failed(self, what: str, exc: BaseException) -> None:
        logger.warning("scheduler %s: %s failed: %s", self.host.name, what, error_text(exc))
