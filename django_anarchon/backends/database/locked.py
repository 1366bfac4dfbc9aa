"""The general claim path's lock rules: one transaction under the job's ``JobLock`` row.

Every database takes this path for what the lock-free steps (``claims.py``) and
PostgreSQL's functions leave to it: takeovers, retries, the buffers, ``cancel_other``,
paused jobs, backfills. It applies the rules of SPEC section 5 exactly as
``MemoryRunStore`` does, with the server's ``now`` read under the lock.
"""

from __future__ import annotations

from django.db.models import F, Q

from ...models import BufferedSlot, Run
from ..base import (
    BUFFER_POLICIES,
    CANCELLED,
    PAUSABLE_REASONS,
    ClaimOutcome,
    RunClaim,
    RunReason,
    buffer_answer,
    buffer_hold_ms,
    cancel_reason,
    forget_after_ms,
)
from .tables import CLAIMED, FINISHED, RUNNING, Tables, _db_datetime, _delete, _grown

__all__ = ["LockedClaims"]

_USED_UP = "lease lapsed; attempts used up"


class LockedClaims(Tables):
    """The claim rules under the job's lock, and the sweep of runs nobody may take over."""

    def _run_claim_locked(self, c: RunClaim) -> ClaimOutcome:
        with self._write():
            job = self._lock_job_row(c.job)
            return self._decide(c, job.now, job.pause(c.job) is not None)

    def _mark_skip(self, c: RunClaim, reason: str, now: int) -> None:
        """The ``skipped`` mark of a claim's answer, in its transaction, under the job's lock."""
        self.ledger.skip(
            c.job, c.slot, reason, c.instance_id, now, c.history_size, c.history_ttl_ms
        )

    def _decide(self, c: RunClaim, now: int, paused: bool) -> ClaimOutcome:
        """The lease rules, under the job's lock, with ``now`` from the server.

        ``paused``: the job's pause is in force (read with the lock). A new run of a
        paused job, or one answered ``late`` (not a catch-up) or ``overlap``, is marked
        ``skipped`` here, in the same transaction.
        """
        # Locked too: a heartbeat or a same-token renewal (which take no job lock) waits
        # for this decision, or this decision sees them.
        run: Run | None = (
            self._runs().select_for_update().filter(job=c.job, slot=c.slot).first()
        )
        if (
            run is not None
            and run.state == FINISHED
            and now > forget_after_ms(
                run.slot,
                run.slot if run.finished_at_ms is None else run.finished_at_ms,
                run.keep_ms,
            )
        ):
            run.delete()  # forgotten, as the store may once its retention has passed
            run = None
        if run is not None:
            return self._decide_existing(c, run, now)
        if c.mode == "takeover":
            return ClaimOutcome.none()
        if now < c.slot:
            return ClaimOutcome.early(c.slot - now)
        if paused and c.reason in PAUSABLE_REASONS:
            self._mark_skip(c, "paused", now)
            # A buffered slot of it waits no more (it would hold the next slot back).
            _delete(BufferedSlot.objects.using(self.using).filter(job=c.job, slot=c.slot))
            return ClaimOutcome.paused()
        if c.reason == "backfill" and self.ledger.ran(c.job, c.slot):
            return ClaimOutcome.done()
        buffer = self._buffer(c.job, now) if c.overlap in BUFFER_POLICIES else {}
        queued = c.slot in buffer
        # A buffered slot waited for its turn: that wait never makes it late.
        if not queued and c.max_late_ms is not None and now > c.slot + c.max_late_ms:
            if c.reason != "catch-up":  # nothing to catch up is not a skip
                self._mark_skip(c, "late", now)
            return ClaimOutcome.late(now - c.slot)
        live = self._sweep_live(c.job, c.slot, now)
        busy = max(live, default=None)
        cancelled: int | None = None
        if c.overlap == "skip" and busy is not None:
            self._mark_skip(c, "overlap", now)
            return ClaimOutcome.overlap(busy)
        if c.overlap in BUFFER_POLICIES:
            answer = buffer_answer(c, live, buffer, now)
            if answer is not None:
                if answer.kind == "buffered":
                    self._hold(c, now, queued)
                else:
                    self._mark_skip(c, "overlap", now)
                return answer
            if queued:  # its turn: the run starts below
                _delete(BufferedSlot.objects.using(self.using).filter(job=c.job, slot=c.slot))
        elif c.overlap == "cancel_other":
            cancelled = self._cancel_others(c, now)
        run = Run(job=c.job, slot=c.slot, keep_ms=c.keep_ms, max_attempts=c.max_attempts)
        self._start(c, run, 1, c.reason, now)
        return ClaimOutcome.won(1, cancelled=cancelled)

    def _buffer(self, job: str, now: int) -> dict[int, int]:
        """The job's buffered slots still held (under its lock); stale ones are dropped."""
        slots = BufferedSlot.objects.using(self.using).filter(job=job)
        _delete(slots.filter(hold_until_ms__lte=now))
        return dict(slots.values_list("slot", "hold_until_ms"))

    def _hold(self, c: RunClaim, now: int, queued: bool) -> None:
        """Put ``c``'s slot in the buffer, or push its hold on (a waiter asked again)."""
        until = now + buffer_hold_ms(c.lease_ms)
        slots = BufferedSlot.objects.using(self.using)
        if queued:
            slots.filter(job=c.job, slot=c.slot).update(hold_until_ms=until)
        else:
            slots.create(job=c.job, slot=c.slot, hold_until_ms=until)

    def _cancel_others(self, c: RunClaim, now: int) -> int | None:
        """Fence every other running run of the job, and record each attempt as cancelled.

        The record is written here, in the claim's transaction: the cancelled runner
        never writes over it (docs/decisions.md). Returns the newest slot cancelled.
        """
        others = list(
            self._runs()
            .select_for_update()
            .filter(job=c.job, state=RUNNING)
            .exclude(slot=c.slot)
            .order_by("slot")
        )
        if not others:
            return None
        reason = cancel_reason(c.slot, c.instance_id)
        for run in others:
            self._interrupt(run, now, reason)
        self._runs().filter(pk__in=[run.pk for run in others]).update(
            state=FINISHED, status=CANCELLED, finished_at_ms=now
        )
        return int(others[-1].slot)

    def _decide_existing(self, c: RunClaim, run: Run, now: int) -> ClaimOutcome:
        if run.state == CLAIMED:
            return ClaimOutcome.done()  # won through claim(): not a leased run
        dirty: list[str] = []
        keep, most = _grown(run.keep_ms, c.keep_ms), _grown(run.max_attempts, c.max_attempts)
        if keep != run.keep_ms:
            run.keep_ms = keep
            dirty.append("keep_ms")
        if most != run.max_attempts:
            run.max_attempts = most
            dirty.append("max_attempts")
        if run.state == RUNNING:
            if run.token == c.token:
                run.lease_until_ms = now + c.lease_ms
                run.save(using=self.using, update_fields=["lease_until_ms", *dirty])
                return ClaimOutcome.won(run.attempt)
            if run.lease_until_ms > now:
                self._save(run, dirty)
                return ClaimOutcome.running(run.attempt)
            if run.attempt < c.max_attempts:
                self._interrupt(run, now, f"lease lapsed; taken over by {c.instance_id}")
                self._start(c, run, run.attempt + 1, "takeover", now)
                return ClaimOutcome.won(run.attempt)
            self._interrupt(run, now, _USED_UP)
            run.state, run.status, run.finished_at_ms = FINISHED, "interrupted", now
            self._save(run, [*dirty, "state", "status", "finished_at_ms"])
            return ClaimOutcome.done()
        if run.status in ("failed", "interrupted") and run.attempt < c.max_attempts:
            self._start(c, run, run.attempt + 1, c.reason, now)
            return ClaimOutcome.won(run.attempt)
        self._save(run, dirty)
        return ClaimOutcome.done()

    def _save(self, run: Run, fields: list[str]) -> None:
        if fields:
            run.save(using=self.using, update_fields=fields)

    def _start(self, c: RunClaim, run: Run, attempt: int, reason: RunReason, now: int) -> None:
        """Give the run to the claimer as ``attempt`` and record that attempt as running."""
        run.attempt = attempt
        run.token = c.token
        run.instance_id = c.instance_id
        run.lease_until_ms = now + c.lease_ms
        run.state = RUNNING
        run.status = None
        run.reason = reason
        run.started_at_ms = now
        run.finished_at_ms = None  # finish() relies on it: a running run has no finish
        run.keep_ms = _grown(run.keep_ms, c.keep_ms)
        run.max_attempts = _grown(run.max_attempts, c.max_attempts)
        run.save(using=self.using)
        self._put_attempt(
            c.job, c.slot, c.instance_id, attempt, False,
            reason=reason, status="running", started_at=now,
        )

    def _interrupt(self, run: Run, now: int, error: str) -> None:
        """Record the superseded attempt as interrupted, unless its runner saved a result."""
        key = {
            "job": run.job,
            "slot": run.slot,
            "instance_id": run.instance_id,
            "attempt": run.attempt,
            "manual": False,
        }
        values = {
            "status": "interrupted",
            "finished_at": _db_datetime(now),
            "duration_ms": max(now - run.started_at_ms, 0),
            "error": error,
        }
        if self._attempts().filter(**key, status="running").update(**values):
            return
        if not self._attempts().filter(**key).exists():  # its claim was pruned meanwhile
            self._attempts().create(
                **key,
                **values,
                scheduled_at=_db_datetime(run.slot),
                reason=run.reason,
                started_at=_db_datetime(run.started_at_ms),
            )

    def _sweep(self, job: str, slot: int, now: int) -> int | None:
        live = self._sweep_live(job, slot, now)
        return max(live, default=None)

    def _sweep_live(self, job: str, slot: int, now: int) -> dict[int, int]:
        """End the job's lapsed runs with their attempts used up; return its live runs.

        Before a new run of ``job`` is decided: every other running run whose lease lapsed
        by ``now`` and whose attempt reached its stored ``max_attempts`` becomes finished,
        ``interrupted`` (its attempt too, unless its runner saved a result), so that a
        crashed runner nobody may take over does not stay ``running`` forever. A row with
        no ``max_attempts`` (the previous release wrote it) is left alone. The live runs
        (slot: lease end) are what overlap "skip" and the buffers refuse to run beside.
        One read finds both; lapsed runs that may still be taken over are not read.
        """
        rows = list(
            self._runs()
            .filter(job=job, state=RUNNING)
            .exclude(slot=slot)
            .filter(Q(lease_until_ms__gt=now) | self._used_up(now))
            .values_list("pk", "slot", "lease_until_ms")
        )
        self._sweep_rows([pk for pk, _, lease_until in rows if lease_until <= now], now)
        return {int(other): int(lease_until) for _, other, lease_until in rows
                if lease_until > now}

    def _sweep_used_up(self, job: str, slot: int, now: int) -> None:
        """``_sweep_live`` without the live runs (overlap "allow" runs beside them)."""
        used_up = list(
            self._runs()
            .filter(self._used_up(now), job=job, state=RUNNING)
            .exclude(slot=slot)
            .values_list("pk", flat=True)
        )
        if used_up:
            with self._write():
                self._sweep_rows(used_up, now)

    @staticmethod
    def _used_up(now: int) -> Q:
        return Q(
            lease_until_ms__lte=now, max_attempts__isnull=False, attempt__gte=F("max_attempts")
        )

    def _sweep_rows(self, candidates: list[int], now: int) -> None:
        """Finish the ``candidates`` still used up, re-read under their row locks, so that
        a heartbeat or finish that got there first keeps its run."""
        if not candidates:
            return
        swept = list(
            self._runs()
            .select_for_update()
            .filter(self._used_up(now), pk__in=candidates, state=RUNNING)
            .order_by("slot")
        )
        if swept:
            self._runs().filter(pk__in=[run.pk for run in swept]).update(
                state=FINISHED, status="interrupted", finished_at_ms=now
            )
            for run in swept:
                self._interrupt(run, now, _USED_UP)
