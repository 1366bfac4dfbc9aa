"""The claim paths: ``claim()`` rows, and leased runs' claims without the job's lock where
they can be decided so.

A new run is decided by the unique (job, slot) with a conflict-ignoring insert; a claim
that meets a run reads it (the peek) and is answered from it where no lock is needed. On
PostgreSQL the common cases take one round trip through the functions the migrations
install (``postgres.py``); everything else goes to the lock path (``locked.py``).
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Literal, NamedTuple

from django.db import (
    DatabaseError,
    IntegrityError,
    connections,
)
from django.db.models import BigIntegerField, Case, F, Q, Value, When
from django.db.models.constants import OnConflict

from ...models import JobLock, LedgerMark, Run
from ..base import (
    PAUSABLE_REASONS,
    ClaimInput,
    ClaimOutcome,
    RunClaim,
    forget_after_ms,
)
from . import postgres
from .clock import ServerNowMs, now_ms_sql
from .ledger import JobRow
from .locked import LockedClaims
from .tables import CLAIMED, FINISHED, RUNNING, _grown

__all__ = ["ClaimPaths", "Peek"]

logger = logging.getLogger("django_anarchon")

#: The policies the PostgreSQL functions decide; the others take the general lock path.
_FAST_POLICIES = ("skip", "allow")
#: What the general path's peek leaves to the next step: the insert, or the lock path.
_Next = Literal["insert", "lock"]


class Peek(NamedTuple):
    """The general path's lock-free read: its answer and the server's ``now``."""

    answer: ClaimOutcome | _Next
    now: int


class _Row(NamedTuple):
    """What a claim that meets a run reads of it (``_peek`` and ``peek_many``)."""

    pk: int
    state: str
    token: str
    attempt: int
    lease_until: int
    keep: int | None
    attempts: int | None
    status: str | None
    slot: int
    finished: int | None


#: ``_Row``'s columns, in its order.
_ROW_COLUMNS = ("id", "state", "token", "attempt", "lease_until_ms", "keep_ms", "max_attempts",
                "status", "slot", "finished_at_ms")


def _settled(c: RunClaim, run: _Row, now: int) -> ClaimOutcome | None:
    """The answer of a claim that meets ``run`` where it is settled without a lock:
    ``done`` for a run won through ``claim()``; ``running`` for another token's live
    lease; ``done`` for a finished run still remembered that this claim may not retry
    (the instances that lose a burst of instant runs ask after the winners finished).
    ``None``: the lock path decides (a takeover, a retry, the same token, a forgotten run).
    """
    if run.state == CLAIMED:
        return ClaimOutcome.done()
    if run.state == RUNNING and run.token != c.token and run.lease_until > now:
        return ClaimOutcome.running(int(run.attempt))
    if (
        run.state == FINISHED
        and now <= forget_after_ms(
            run.slot, run.slot if run.finished is None else run.finished, run.keep
        )
        and not (run.status in ("failed", "interrupted") and run.attempt < c.max_attempts)
    ):
        return ClaimOutcome.done()
    return None


def _grows(c: RunClaim, run: _Row) -> bool:
    """Whether the claim raises the run's ``keep_ms`` or ``max_attempts`` (a write)."""
    return run.state != CLAIMED and (run.keep, run.attempts) != (
        _grown(run.keep, c.keep_ms), _grown(run.attempts, c.max_attempts)
    )



class ClaimPaths(LockedClaims):
    """Claims of runs and of ``claim()`` slots, each decided with as few statements as it can."""

    def claim(self, input: ClaimInput) -> bool:
        if self._use_functions():
            return self._retrying(lambda: postgres.claim(connections[self.using], input))
        return self._retrying(lambda: self._claim(input))

    def claim_many(self, inputs: list[ClaimInput]) -> list[bool]:
        return [self.claim(i) for i in inputs]

    def _holder(self, input: ClaimInput) -> str | None:
        token: str | None = (
            self._runs()
            .filter(job=input.job, slot=input.slot)
            .values_list("token", flat=True)
            .first()
        )
        return token

    def _claim(self, input: ClaimInput) -> bool:
        """The unique (job, slot) decides, in autocommit: no transaction to hold open.

        A claimer that comes after the winner committed only reads (one statement).
        """
        holder = self._holder(input)
        if holder is not None:
            return holder == input.token
        with self._single_write():
            try:
                self._runs().create(
                    job=input.job,
                    slot=input.slot,
                    attempt=1,
                    token=input.token,
                    instance_id=input.instance_id,
                    lease_until_ms=ServerNowMs(),
                    state=CLAIMED,
                    reason="scheduled",
                    started_at_ms=ServerNowMs(),
                )
            except IntegrityError:
                return self._holder(input) == input.token
            # Should this process die right here, the run is still claimed, and the
            # winner's save_result() writes the history row anyway.
            self._put_attempt(
                input.job, input.slot, input.instance_id, 1, False,
                reason="scheduled", status="running", started_at=self.now_ms(),
            )
        return True

    def run_claim(self, c: RunClaim) -> ClaimOutcome:
        if c.mode == "new" and (c.overlap not in _FAST_POLICIES or c.reason == "backfill"):
            # buffer_*/cancel_other: one transaction under the job's lock decides it all
            # (the buffer, the cancel and its history record), on every database; and a
            # backfill, whose history must be read in the same transaction.
            return self._retrying(lambda: self._run_claim_locked(c), also_conflicts=True)
        if c.mode == "new" and self._use_functions():
            level = self._level
            outcome = self._retrying(
                lambda: postgres.run_claim(connections[self.using], c, level)
            )
            if outcome is not None:
                return outcome
            return self._retrying(lambda: self._run_claim_locked(c), also_conflicts=True)
        return self._retrying(lambda: self._run_claim_generic(c), also_conflicts=True)

    def run_claim_many(self, claims: list[RunClaim]) -> list[ClaimOutcome]:
        """On PostgreSQL, the new runs of the batch in one round trip; the rest one by one."""
        fresh = [
            c for c in claims
            if c.mode == "new" and c.overlap in _FAST_POLICIES and c.reason != "backfill"
        ]
        if len(fresh) < 2 or not self._use_functions():
            return [self.run_claim(c) for c in claims]
        level = self._level
        decided = self._retrying(
            lambda: postgres.run_claim_many(connections[self.using], fresh, level)
        )
        answers = dict(zip(map(id, fresh), decided, strict=True))
        outcomes: list[ClaimOutcome] = []
        for c in claims:
            outcome = answers.get(id(c))
            if outcome is None:
                outcome = (
                    self._retrying(
                        functools.partial(self._run_claim_locked, c), also_conflicts=True
                    )
                    if id(c) in answers
                    else self.run_claim(c)
                )
            outcomes.append(outcome)
        return outcomes

    def _run_claim_generic(self, c: RunClaim) -> ClaimOutcome:
        if c.mode == "new":
            peeked = self._peek(c)
            if isinstance(peeked.answer, ClaimOutcome):
                return peeked.answer
            if peeked.answer == "insert":
                outcome = self._claim_new(c, peeked)
                if outcome is not None:
                    return outcome
        return self._run_claim_locked(c)

    def _peek(self, c: RunClaim) -> Peek:
        """One read, no lock: ``running`` or ``done``, or for a run that does not exist
        ``early``/``late``; with the server's ``now`` of that read.

        Each answer was true when the row was read and changes nothing, so no lock is
        needed; ``running`` still raises the run's ``keep_ms``/``max_attempts`` to the
        claim's (a rare second statement: only when the job's options grew). ``late`` is
        answered here only when it writes no mark (a catch-up, or the slot's mark is there
        already); else, and for a paused job, the lock path decides and marks. The read
        also takes the job's pause and the slot's mark. ``"insert"``: the insert decides.
        It reads no other run of the job: every claimer of a slot peeks, often twice, and
        only the winner sweeps (``_claim_new``).
        """
        connection = connections[self.using]
        quote = connection.ops.quote_name
        columns = ", ".join(f"r.{quote(name)}" for name in _ROW_COLUMNS)
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT {now_ms_sql(self.vendor)}, {columns}, l.{quote('paused_at_ms')}, "
                f"l.{quote('paused_until_ms')}, m.{quote('id')} "
                f"FROM (SELECT 1 AS one) d "
                f"LEFT JOIN {quote(Run._meta.db_table)} r "
                f"ON r.{quote('job')} = %s AND r.{quote('slot')} = %s "
                f"LEFT JOIN {quote(JobLock._meta.db_table)} l ON l.{quote('job')} = %s "
                f"LEFT JOIN {quote(LedgerMark._meta.db_table)} m "
                f"ON m.{quote('job')} = %s AND m.{quote('slot')} = %s",
                [c.job, c.slot, c.job, c.job, c.slot],
            )
            row = cursor.fetchone()
        now, paused, until, mark = int(row[0]), row[-3], row[-2], row[-1]
        if row[1] is None:
            if now < c.slot:
                return Peek(ClaimOutcome.early(c.slot - now), now)
            if c.reason == "backfill" or (
                c.reason in PAUSABLE_REASONS and JobRow(now, paused, until).pause(c.job)
            ):
                return Peek("lock", now)
            if c.max_late_ms is not None and now > c.slot + c.max_late_ms:
                if c.reason == "catch-up" or mark is not None:
                    return Peek(ClaimOutcome.late(now - c.slot), now)
                return Peek("lock", now)
            return Peek("insert", now)
        run = _Row(*row[1:-3])
        answer = _settled(c, run, now)
        if answer is None:
            return Peek("lock", now)
        if _grows(c, run):
            self._grow(run.pk, c)
        return Peek(answer, now)

    def peek_many(self, claims: list[RunClaim]) -> list[ClaimOutcome | None]:
        """What each claim would be answered where it would change nothing, else ``None``:
        one read of the batch's runs, no lock, no write, no wait on another's insert.

        The engine sends it for the claims that only back another instance up (a burst's
        losers): each was a claim function call (or, off PostgreSQL, the general path);
        most answer ``running`` or ``done`` here. A claim that would raise the run's
        ``keep_ms`` or ``max_attempts`` is left to the claim, which writes them.
        """
        if not claims:
            return []
        connection = connections[self.using]
        quote = connection.ops.quote_name
        jobs, slots = sorted({c.job for c in claims}), sorted({c.slot for c in claims})
        columns = ", ".join(f"r.{quote(name)}" for name in ("job", *_ROW_COLUMNS))
        if self.vendor == "postgresql":  # two literals: one short statement, parsed once
            where = f"r.{quote('job')} = ANY(%s::text[]) AND r.{quote('slot')} = ANY(%s::bigint[])"
            params: list[Any] = [postgres.texts(jobs), postgres.ints(slots)]
        else:
            where = (f"r.{quote('job')} IN ({', '.join(['%s'] * len(jobs))}) "
                     f"AND r.{quote('slot')} IN ({', '.join(['%s'] * len(slots))})")
            params = [*jobs, *slots]
        with connection.cursor() as cursor:
            # The (job, slot) index answers it; the pairs no claim asked for (a job's
            # other slots of the batch) are dropped below.
            cursor.execute(
                f"SELECT {now_ms_sql(self.vendor)}, {columns} "
                f"FROM {quote(Run._meta.db_table)} r WHERE {where}",
                params,
            )
            rows = cursor.fetchall()
        found = {(row[1], int(row[10])): (int(row[0]), _Row(*row[2:])) for row in rows}
        answers: list[ClaimOutcome | None] = []
        for c in claims:
            seen = found.get((c.job, c.slot))
            if seen is None:
                answers.append(None)
                continue
            now, run = seen
            answer = _settled(c, run, now)
            answers.append(None if answer is None or _grows(c, run) else answer)
        return answers

    def _grow(self, pk: int, c: RunClaim) -> None:
        """Raise a run's ``keep_ms`` and ``max_attempts`` to the claim's; never lower them.

        One conditional UPDATE: it commutes with every other write, so it needs no lock.
        """
        values: dict[str, Any] = {}
        for name, claimed in (("keep_ms", c.keep_ms), ("max_attempts", c.max_attempts)):
            if claimed is not None:
                smaller = Q(**{f"{name}__isnull": True}) | Q(**{f"{name}__lt": claimed})
                values[name] = Case(
                    When(smaller, then=Value(claimed)),
                    default=F(name),
                    output_field=BigIntegerField(),
                )
        if values:
            with self._single_write():
                self._runs().filter(pk=pk).update(**values)

    def _claim_new(self, c: RunClaim, peeked: Peek) -> ClaimOutcome | None:
        """A new run: the unique (job, slot) decides first, then overlap.

        ``peeked`` found no run, the slot due by the server's clock, the claim in time and
        the job not paused; the lease starts at its ``now`` (never later than the insert).
        The insert ignores a conflict, so claimers of one slot wait on the winner's insert
        only, and learn the outcome by peeking again. With overlap "skip", claims of
        other slots take turns on the job's lock row before looking for a live run, and
        an ``overlap`` answer writes its mark under that lock: the insert, that look and
        the history row are one transaction. With "allow" nothing else is decided, so the
        insert and the history row are a statement each (a runner that dies between them
        gets its record when the run is taken over or swept: ``_interrupt``), and then the
        winner alone reads the job's other runs for the sweep. ``None``:
        the run exists but is not live (the general lock path decides).
        """
        now = peeked.now
        if c.overlap == "skip":
            with self._write():
                if not self._insert_run(c, now):
                    return self._lost_insert(c)
                locked_now = self._lock_job(c.job)
                busy = self._sweep(c.job, c.slot, locked_now)
                if busy is not None:
                    self._runs().filter(job=c.job, slot=c.slot, token=c.token).delete()
                    self._mark_skip(c, "overlap", locked_now)
                    return ClaimOutcome.overlap(busy)
                self._put_attempt(
                    c.job, c.slot, c.instance_id, 1, False,
                    reason=c.reason, status="running", started_at=now,
                )
            return ClaimOutcome.won(1)
        with self._single_write():
            inserted = self._insert_run(c, now)
        if not inserted:
            return self._lost_insert(c)
        with self._single_write():
            self._put_attempt(
                c.job, c.slot, c.instance_id, 1, False,
                reason=c.reason, status="running", started_at=now,
            )
        try:
            self._sweep_used_up(c.job, c.slot, now)
        except DatabaseError as exc:  # housekeeping: the next claim of the job sweeps
            logger.debug("database backend: sweep of job %s failed: %s", c.job, exc)
        return ClaimOutcome.won(1)

    def _lost_insert(self, c: RunClaim) -> ClaimOutcome | None:
        """Another claimer's run is there: what it is (``None``: the lock path decides)."""
        answer = self._peek(c).answer
        return answer if isinstance(answer, ClaimOutcome) else None

    def _insert_run(self, c: RunClaim, now: int) -> bool:
        """Insert the claim's run unless (job, slot) exists; whether it was inserted."""
        values = {
            "job": c.job, "slot": c.slot, "attempt": 1, "token": c.token,
            "instance_id": c.instance_id, "lease_until_ms": now + c.lease_ms,
            "state": RUNNING, "status": None, "reason": c.reason, "manual": False,
            "started_at_ms": now, "finished_at_ms": None, "keep_ms": c.keep_ms,
            "max_attempts": c.max_attempts,
        }
        return self._insert(Run, values, OnConflict.IGNORE) == 1
