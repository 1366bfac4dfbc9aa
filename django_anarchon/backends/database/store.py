"""The lease rules and history over the Django ORM: synchronous, one database alias.

Everything here runs in the backend's connection threads, never on an event loop. The
layers, each a module: ``tables.py`` (transactions, retries, the server's clock, the jobs'
lock rows), ``locked.py`` (the claim rules under the job's lock, on every supported
database), ``claims.py`` (the claims decided without that lock, and PostgreSQL's
one-round-trip functions), and here what follows a claim: heartbeats, ends, results and
history. The rules are those of SPEC section 5, with the additions of SPEC section 9
(retention from the later of slot and finish, ``keep_ms`` and ``max_attempts`` that only
grow, ``early``, the sweep, a repeat-safe ``finish``).
"""

from __future__ import annotations

import contextlib

from django.db import (
    connections,
)
from django.db.models import BigIntegerField, F, Q, Value
from django.db.models.functions import Coalesce

from ..base import (
    ActiveRun,
    ClaimInput,
    FinalStatus,
    RunEnd,
    RunRecord,
    StoredResult,
    ms_to_datetime,
)
from . import postgres
from .claims import ClaimPaths
from .clock import ServerNowMs
from .tables import FINISHED, RUNNING, _as_aware, _db_datetime, _delete, _forget_after

__all__ = ["Store"]


class Store(ClaimPaths):
    """The database backend's store on one alias; every method is one batch of work."""

    def check(self) -> None:
        """Fail now, with the database's own error, if the tables (or a migration) are missing.

        ``max_attempts`` is read so that a database without migration 0002 fails here, not
        at the first claim.
        """
        self._retrying(lambda: self._runs().filter(job="").values_list("max_attempts").first())
        self._use_functions()

    def record_manual_run(self, input: ClaimInput) -> int | None:
        def record() -> int:
            with self._write():
                now = self._lock_job(input.job)
                window, slot = input.slot, None
                while slot is None:  # the first slot from input.slot without a manual run
                    used = set(
                        self._attempts()
                        .filter(job=input.job, manual=True, slot__gte=window, slot__lt=window + 100)
                        .values_list("slot", flat=True)
                    )
                    slot = next((s for s in range(window, window + 100) if s not in used), None)
                    window += 100
                self._attempts().create(
                    job=input.job,
                    slot=slot,
                    scheduled_at=_db_datetime(slot),
                    instance_id=input.instance_id,
                    manual=True,
                    attempt=1,
                    reason="manual",
                    status="running",
                    started_at=_db_datetime(now),
                )
                return slot

        slot = self._retrying(record)
        return None if slot == input.slot else slot

    def save_result(
        self, job: str, result: StoredResult, history_size: int, history_ttl_ms: int | None
    ) -> None:
        def save() -> None:
            with self._write():
                self._put_result(job, result)
                self._prune(job, history_size, history_ttl_ms)

        self._retrying(save)

    def _put_result(self, job: str, result: StoredResult) -> None:
        self._put_attempt(
            job, result.slot, result.by, result.attempt, result.manual,
            reason="manual" if result.manual else result.reason,
            status=result.status,
            started_at=result.started_at,
            finished_at=result.finished_at,
            duration_ms=result.duration_ms,
            error=result.error,
            keep_reason=True,
        )

    def _prune(self, job: str, history_size: int, history_ttl_ms: int | None) -> None:
        """Set-based: the newest ``history_size`` attempts stay, none older than the ttl.

        Also forgets finished runs once ``now > max(finished_at, slot) + kept_ms(keep_ms)``
        (the lease table's own pruning; ``forget_after_ms`` in SQL).
        """
        attempts = self._attempts().filter(job=job)
        if history_size <= 0:
            _delete(attempts)
        else:
            cut = list(
                attempts.order_by("-started_at", "-slot", "-attempt", "-id").values_list(
                    "started_at", "slot", "attempt", "id"
                )[history_size : history_size + 1]
            )
            if cut:
                started, slot, attempt, pk = cut[0]
                _delete(attempts.filter(
                    Q(started_at__lt=started)
                    | Q(started_at=started, slot__lt=slot)
                    | Q(started_at=started, slot=slot, attempt__lt=attempt)
                    | Q(started_at=started, slot=slot, attempt=attempt, id__lte=pk)
                ))
        if history_ttl_ms is not None:
            oldest = _db_datetime(self.now_ms() - history_ttl_ms)
            _delete(attempts.filter(
                Q(finished_at__lt=oldest) | Q(finished_at__isnull=True, started_at__lt=oldest)
            ))
        _delete(
            self._runs()
            .alias(forget_after=_forget_after())
            .filter(job=job, state=FINISHED, forget_after__lt=ServerNowMs())
        )

    def history(self, job: str, limit: int) -> list[RunRecord]:
        if limit <= 0:
            return []

        def read() -> list[RunRecord]:
            rows = (
                self._attempts()
                .filter(job=job)
                .order_by("-started_at", "-slot", "-attempt")
                .values_list(
                    "slot", "instance_id", "manual", "attempt", "reason", "status",
                    "started_at", "finished_at", "duration_ms", "error",
                )[:limit]
            )
            return [
                RunRecord(
                    job=job,
                    slot=slot,
                    scheduled_at=ms_to_datetime(slot),
                    instance_id=instance_id,
                    manual=manual,
                    attempt=attempt,
                    reason=reason,
                    status=status,
                    started_at=_as_aware(started_at),
                    finished_at=None if finished_at is None else _as_aware(finished_at),
                    duration_ms=duration_ms,
                    error=error,
                )
                for (
                    slot, instance_id, manual, attempt, reason, status,
                    started_at, finished_at, duration_ms, error,
                ) in rows
            ]

        return self._retrying(read)

    def heartbeat(self, job: str, slot: int, token: str, lease_ms: int) -> bool:
        def beat() -> bool:
            with self._single_write():
                return bool(
                    self._runs()
                    .filter(job=job, slot=slot, token=token, state=RUNNING)
                    .update(lease_until_ms=ServerNowMs() + Value(lease_ms, output_field=BigIntegerField()))
                )

        return self._retrying(beat)

    def finish(self, job: str, slot: int, token: str, status: FinalStatus) -> bool:
        """Running with ``token``: finished now. Finished so already: True again (repeat-safe).

        One UPDATE for both: a repeat (the first call's reply was lost) matches the finished
        row and leaves its finish time, since a running run has no ``finished_at_ms``. A run
        the store ended ``interrupted`` with this token (its lease lapsed with no attempt
        left, so nobody else could run it) takes its own runner's late word too.
        """

        def end() -> bool:
            with self._single_write():
                return self._end(job, slot, token, status)

        return self._retrying(end)

    def finish_many(self, ends: list[RunEnd]) -> list[bool]:
        """Each end's ``finish()`` and, where it acted, its record, in one transaction.

        Runs are ended in (job, slot) order, so that two instances' batches never wait on
        each other in a circle; each job's history is pruned once, after its records.
        """
        if self._v4():
            return self._retrying(
                lambda: postgres.finish_many(connections[self.using], ends)
            )
        order = sorted(range(len(ends)), key=lambda i: (ends[i].job, ends[i].slot))

        def end_all() -> list[bool]:
            answers = [False] * len(ends)
            pruned: dict[str, RunEnd] = {}
            with self._write():
                for i in order:
                    end = ends[i]
                    if self._end(end.job, end.slot, end.token, end.status):
                        answers[i] = True
                        self._put_result(end.job, end.result)
                        pruned[end.job] = end
                for job, end in pruned.items():
                    self._prune(job, end.history_size, end.history_ttl_ms)
            return answers

        return self._retrying(end_all)

    def _end(self, job: str, slot: int, token: str, status: FinalStatus) -> bool:
        return bool(
            self._runs()
            .filter(Q(state=RUNNING) | Q(state=FINISHED, status__in=[status, "interrupted"]),
                    job=job, slot=slot, token=token)
            .update(
                finished_at_ms=Coalesce(F("finished_at_ms"), ServerNowMs()),
                state=FINISHED,
                status=status,
            )
        )

    # -- for work that commits with a run's finish (enqueue/run.py) ---------------------

    def transaction(self) -> contextlib.AbstractContextManager[None]:
        """A write transaction on this alias, queued like the store's own (SQLite)."""
        return self._write()

    def lock_running(self, job: str, slot: int, token: str) -> bool:
        """Inside ``transaction()``: lock the run if it is running with ``token``.

        Once locked, no claim can take the run over until the transaction ends, so work
        done in it and ``finish_locked()`` commit, or roll back, together.
        """
        return bool(
            list(
                self._runs()
                .select_for_update()
                .filter(job=job, slot=slot, token=token, state=RUNNING)
                .values_list("pk", flat=True)[:1]
            )
        )

    def finish_locked(self, job: str, slot: int, token: str, status: FinalStatus) -> bool:
        """Inside ``transaction()``, after ``lock_running()``: ``finish()`` in that transaction.

        The runner's own finish afterwards is a repeat, answered True (repeat-safe).
        """
        return self._end(job, slot, token, status)

    def release(self, job: str, slot: int, token: str) -> bool:
        def let_go() -> bool:
            with self._single_write():
                return bool(
                    self._runs()
                    .filter(job=job, slot=slot, token=token, state=RUNNING)
                    .update(lease_until_ms=ServerNowMs() - Value(1, output_field=BigIntegerField()))
                )

        return self._retrying(let_go)

    def active(self, job: str) -> list[ActiveRun]:
        def read() -> list[ActiveRun]:
            rows = (
                self._runs()
                .filter(job=job, state=RUNNING)
                .annotate(now=ServerNowMs())
                .order_by("slot")
                .values_list("slot", "attempt", "lease_until_ms", "now")
            )
            return [
                ActiveRun(slot=slot, attempt=attempt, alive=lease_until > now)
                for slot, attempt, lease_until, now in rows
            ]

        return self._retrying(read)
