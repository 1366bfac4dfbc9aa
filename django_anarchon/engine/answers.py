"""One claim on its way, and where its answer leads: a run here, a wait, a watch.

``ClaimFlows`` (``claims.py``) decides when due slots are claimed and which go together;
this module sends a claim (retried with its token, after back-pressure), follows a lease
store's answer (won, running, overlap, buffered, late, early, paused, done), watches
another instance's run and takes it over once its lease lapses, and hands back a claim
won while stopping. On a store without leases a won claim runs here at once.

Every lateness and lease decision is the store's: claims carry ``max_late_ms`` and the
store answers ``late`` or ``early`` on its own clock.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from dataclasses import replace
from typing import TYPE_CHECKING, NamedTuple

from ..backends.base import (
    BUFFER_WAIT_CAP_MS,
    ClaimInput,
    ClaimOutcome,
    RunClaim,
    RunReason,
    Wakeup,
    cancel_reason,
)
from ..jobs import Job
from ..logtime import iso
from ..retry import retry_store_call
from ..wallclock import now_ms
from .calls import error_text
from .capacity import Capacity
from .runner import Attempt
from .wake import released_key, send_wakeup

if TYPE_CHECKING:
    from .scheduler import Scheduler

__all__ = ["Answer", "ClaimAnswers", "new_token"]

logger = logging.getLogger("django_anarchon")

#: An instance whose pool is full waits this long per queued run before it claims anyway,
#: so that instances with free threads win first...
BACKLOG_DELAY_MS = 100
#: ...but never longer than this fraction of the job's ``max_late``.
BACKLOG_MAX_SHARE = 0.5
#: Longest single wait on an ``early`` answer before asking again.
EARLY_WAIT_CAP_MS = 30_000


def new_token() -> str:
    return secrets.token_hex(16)


class Answer(NamedTuple):
    """A lease store's answer to a claim, and when the claim was sent (``time.monotonic()``).

    The lease it grants started no earlier than ``asked``: the runner renews a lease whose
    answer waited before it starts the handler (``engine/runner.py``).
    """

    outcome: ClaimOutcome
    asked: float


class ClaimAnswers:
    """Claims of one scheduler (its host), each sent and followed to its end."""

    def __init__(self, host: Scheduler) -> None:
        self.host = host
        self.capacity = Capacity(host.threads)
        #: (job, slot) runs of other instances that a task of this one watches.
        self.watching: set[tuple[str, int]] = set()
        #: job -> set when a run of it ends here: its buffered slots claim again at once.
        self._ended: dict[str, asyncio.Event] = {}
        #: job -> how many of its runs ended here (a run that ended while a claim was on
        #: its way wakes that claim too).
        self._ends: dict[str, int] = {}
        #: Jobs whose last scheduled slot another instance won: claimed a little later.
        self._followed: set[str] = set()

    def reset(self) -> None:
        self.capacity = Capacity(self.host.threads)
        self.watching.clear()
        self._ended.clear()
        self._ends.clear()
        self._followed.clear()

    async def _wait_turn(self, job: Job, wait_ms: int, ends: int) -> bool:
        """Wait for a buffered slot's turn: a run of the job ending here, or ``wait_ms``.

        ``ends``: the job's count of ended runs when the claim went out; a run that ended
        since then ends the wait at once. ``True`` if a stop began (the store keeps the
        slot held for the backups).
        """
        if self._ends.get(job.name, 0) != ends:
            return self.host.stopping
        event = self._ended.setdefault(job.name, asyncio.Event())
        ended = asyncio.ensure_future(event.wait())
        stopping = asyncio.ensure_future(self.host.wait_stopping(wait_ms / 1000))
        try:
            await asyncio.wait({ended, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ended.cancel()
            stopping.cancel()
        return self.host.stopping

    def run_claim(
        self, job: Job, slot: int, reason: RunReason, max_late_ms: int | None
    ) -> RunClaim:
        o = job.options
        return RunClaim(
            job=job.name,
            slot=slot,
            token=new_token(),
            instance_id=self.host.instance_id,
            history_size=o.history_size,
            history_ttl_ms=o.history_ttl_ms,
            mode="new",
            reason=reason,
            lease_ms=self.host.lease_ms,
            overlap=o.overlap,
            max_attempts=o.max_attempts,
            max_late_ms=max_late_ms,
            keep_ms=o.keep_ms,
            buffer_limit=o.buffer_limit,
        )

    def claim_input(self, job: Job, slot: int) -> ClaimInput:
        return ClaimInput(
            job=job.name,
            slot=slot,
            token=new_token(),
            instance_id=self.host.instance_id,
            history_size=job.options.history_size,
            history_ttl_ms=job.options.history_ttl_ms,
        )

    async def _admit(self, job: Job, admitted: bool = False) -> int:
        """Back-pressure before a claim (unless ``admitted`` by the queue of slots waiting
        for a thread): the capacity units the claim will hold (0 or 1)."""
        if job.is_async:
            return 0
        if not admitted:
            await self.capacity.admit(self._backlog_s(job))
        return 1

    def _retry_until(self, due_by: int) -> int:
        """Until when (this worker's epoch ms) a scheduled claim is sent again after an
        error: the claim's lease past ``due_by`` (slot + ``max_late``, the store's clock).

        A claim that reached the store in time and lost only its answer (a restart, a cut
        connection) is answered ``won`` again for the same token while its lease holds;
        one that never reached the store is answered ``late`` by it. Retries that gave up
        at ``due_by`` by this worker's clock left the first kind held and never started
        (a fault run: a PostgreSQL restart outlasted a slot's ``max_late`` by a second).
        """
        return self.host.clock.local(due_by) + self.host.lease_ms

    def _backlog_s(self, job: Job) -> float:
        """How long a sync claim waits for a free thread before it goes out anyway."""
        backlog = self.capacity.backlog
        return min(BACKLOG_DELAY_MS * backlog, job.options.max_late_ms * BACKLOG_MAX_SHARE) / 1000

    def _note_winner(self, job: Job, claim: RunClaim, outcome: ClaimOutcome) -> None:
        """Remember whether this instance or another won a scheduled slot of ``job``."""
        if claim.reason != "scheduled" or claim.mode != "new":
            return
        if outcome.kind == "won":
            self._followed.discard(job.name)
        elif outcome.kind in ("running", "done"):
            self._followed.add(job.name)

    async def _claim_only(
        self, job: Job, slot: int, claim: ClaimInput | None = None, won: bool | None = None,
        admitted: bool = False,
    ) -> None:
        """Claim on a store without leases (unless ``won`` is known) and run on a win."""
        host = self.host
        claim = claim or self.claim_input(job, slot)
        what = (
            f"scheduler {host.name} ({host.instance_id}): claim of job {job.name} "
            f"slot {iso(slot)}"
        )
        if won is None:
            units = await self._admit(job, admitted)
            if host.stopping:
                return  # held back until the stop began: not claimed
            try:
                with self.capacity.holding(units):
                    won = await retry_store_call(
                        what,
                        lambda: host.tracing.store(
                            "claim", host.backend.claim(claim), job=job.name, slot=slot,
                            token=claim.token,
                        ),
                        deadline_ms=host.clock.local(slot + job.options.max_late_ms),
                        give_up=lambda: host.stopping,
                    )
            except Exception as exc:
                await host.emit_event("error", job, slot, error=error_text(exc), reason="claim")
                if not host.stopping:
                    await host.emit_event("skip", job, slot, reason="late")
                return
        await host.emit_event("claim", job, slot, reason="won" if won else "lost")
        if not won:
            return
        record_claim = getattr(host.backend, "record_claim", None)
        if callable(record_claim):
            try:
                await retry_store_call(
                    f"{what}: record_claim",
                    lambda: host.tracing.store(
                        "record_claim", record_claim(claim), job=job.name, slot=slot,
                        token=claim.token,
                    ),
                    deadline_ms=now_ms() + 30_000,
                )
            except Exception as exc:
                await host.emit_event(
                    "error", job, slot, error=error_text(exc), reason="record_claim"
                )
        await host.run_attempt(
            Attempt(job=job, slot=slot, attempt=1, reason="scheduled", token=claim.token)
        )

    async def _send_claim(
        self, job: Job, claim: RunClaim, deadline_ms: int, admitted: bool = False
    ) -> ClaimOutcome | None:
        """One claim, retried with the same token; ``None`` if the store never answered.

        A sync job's claim waits first while this instance's pool is full, for longer the
        fuller it is, so that instances with free threads win (back-pressure).
        """
        host = self.host
        runs = host.backend.runs
        assert runs is not None
        what = (
            f"scheduler {host.name} ({host.instance_id}): {claim.mode} claim of job {claim.job} "
            f"slot {iso(claim.slot)}"
        )
        units = await self._admit(job, admitted)
        if host.stopping:
            return None  # held back until the stop began: a stopping instance claims nothing
        try:
            with self.capacity.holding(units):
                outcome = await retry_store_call(
                    what,
                    lambda: host.tracing.store(
                        "claim", runs.claim(claim), job=claim.job, slot=claim.slot,
                        token=claim.token,
                    ),
                    deadline_ms=deadline_ms,
                    give_up=lambda: host.stopping,
                )
            logger.debug("%s -> %s", what, outcome)
            return outcome
        except Exception as exc:
            await host.emit_event("error", job, claim.slot, error=error_text(exc), reason="claim")
            return None

    async def _lease_claim(
        self,
        job: Job,
        claim: RunClaim,
        deadline_ms: int,
        answer: Answer | None = None,
        admitted: bool = False,
    ) -> None:
        """Claim on a lease store (unless answered already) and follow the answer."""
        host = self.host
        ends = self._ends.get(job.name, 0)
        if answer is None:
            asked = time.monotonic()
            outcome = await self._send_claim(job, claim, deadline_ms, admitted)
        else:
            outcome, asked = answer
        if outcome is not None:
            self._note_winner(job, claim, outcome)
        if outcome is None:
            if not host.stopping:
                await host.emit_event("skip", job, claim.slot, reason="late")
                if claim.reason == "scheduled":
                    host.ledgers.owe(job, claim.slot)  # the store never heard of it
            return
        buffered = False
        while True:
            kind = outcome.kind
            await host.emit_event("claim", job, claim.slot, reason=kind)
            next_outcome: ClaimOutcome | None
            if kind == "won":
                if outcome.cancelled is not None:
                    await self._cancelled(job, claim, outcome.cancelled)
                attempt = Attempt(
                    job=job,
                    slot=claim.slot,
                    attempt=outcome.attempt or 1,
                    reason=claim.reason if claim.mode == "new" else "takeover",
                    token=claim.token,
                    lease=True,
                    held_at=asked,
                )
                if host.stopping and attempt.attempt < job.options.max_attempts:
                    await self._hand_back(attempt)  # a backup takes it over at once
                    return
                # Won while stopping with no attempt to spare: run it within the grace,
                # since a hand-back would use up the only attempt and lose the slot.
                record = await host.run_attempt(attempt)
                if (
                    record.status == "success"
                    or attempt.lost
                    or host.stopping
                    or attempt.attempt >= job.options.max_attempts
                ):
                    return
                claim = replace(claim, token=new_token(), mode="new")  # a retry
                asked = time.monotonic()
                next_outcome = await self._send_claim(job, claim, now_ms() + host.lease_ms)
            elif kind == "early":
                # The store's clock has not reached the slot: wait and ask again, same token.
                wait_ms = min(outcome.wait_ms or 1, EARLY_WAIT_CAP_MS)
                logger.debug(
                    "scheduler %s: job %s slot %s is %s ms early by the store's clock",
                    host.name,
                    job.name,
                    iso(claim.slot),
                    outcome.wait_ms,
                )
                if await host.wait_stopping(wait_ms / 1000):
                    return
                asked = time.monotonic()
                next_outcome = await self._send_claim(job, claim, deadline_ms + wait_ms)
            elif kind == "running":
                if (outcome.attempt or 1) >= job.options.max_attempts:
                    return  # no attempt left to take over: nothing to watch for
                key = (job.name, claim.slot)
                if key in self.watching:
                    return  # another task of this instance keeps an eye on it already
                self.watching.add(key)
                try:
                    watched = await self._watch(job, claim)
                finally:
                    self.watching.discard(key)
                if watched is None:
                    return
                claim, (next_outcome, asked) = watched
            elif kind == "overlap":
                await host.emit_event("skip", job, claim.slot, reason="overlap")
                blocker = outcome.slot
                if (
                    blocker is None
                    or job.options.max_attempts < 2
                    or host.runs_here(job.name, blocker)
                ):
                    return
                # The run in the way is another instance's: watch it like a loser told
                # "running" would, so that a backup that started after its slot still
                # takes it over if its runner goes away.
                claim = replace(claim, slot=blocker, token=new_token(), reason="scheduled")
                next_outcome = ClaimOutcome.running(1)
            elif kind == "buffered":
                # The store holds this slot until the run in the way ends; every instance
                # that claimed it waits, and the first to claim it then runs it.
                if not buffered:
                    buffered = True
                    await host.emit_event(
                        "buffer", job, claim.slot, reason=f"overlap: waits for {iso(outcome.slot)}"
                    )
                wait_ms = min(outcome.wait_ms or 1, BUFFER_WAIT_CAP_MS)
                if await self._wait_turn(job, wait_ms, ends):
                    return
                ends = self._ends.get(job.name, 0)
                asked = time.monotonic()
                next_outcome = await self._send_claim(job, claim, now_ms() + host.lease_ms)
            elif kind == "late":
                if claim.reason != "catch-up":  # nothing to catch up is not a skip
                    await host.emit_event("skip", job, claim.slot, reason="late")
                return
            elif kind == "paused":  # the store marked the slot skipped: the job is paused
                await host.emit_event("skip", job, claim.slot, reason="paused")
                return
            else:  # done, none, and kinds this version does not know
                return
            if next_outcome is None:
                return
            outcome = next_outcome

    async def _cancelled(self, job: Job, claim: RunClaim, slot: int) -> None:
        """Our ``cancel_other`` claim fenced the run of ``slot``: say so, and abort it here.

        On another instance its handler learns it at its next heartbeat (refused).
        """
        reason = cancel_reason(claim.slot, self.host.instance_id)
        await self.host.emit_event("cancel", job, slot, error=reason, reason="overlap")
        self.host.cancel_here(job.name, slot, reason)

    async def _watch(self, job: Job, claim: RunClaim) -> tuple[RunClaim, Answer] | None:
        """Keep an eye on another instance's run; take it over once its lease lapses.

        A release hint of the job (``engine/wake.py``) ends the wait between two looks
        early: a hand-over is taken within the hint's delivery, not a heartbeat later.
        """
        with self.host.wakes.watching(released_key(job.name)) as woken:
            return await self._watch_until(job, claim, woken)

    async def _watch_until(
        self, job: Job, claim: RunClaim, woken: asyncio.Event
    ) -> tuple[RunClaim, Answer] | None:
        host = self.host
        runs = host.backend.runs
        assert runs is not None
        while not host.stopping:
            if await host.wait_stopping(host.heartbeat_ms / 1000, woken):
                return None
            woken.clear()
            try:
                active = await runs.active(job.name)
            except Exception as exc:
                logger.warning(
                    "scheduler %s: active(%s) failed while watching slot %s: %r",
                    host.name,
                    job.name,
                    iso(claim.slot),
                    exc,
                )
                continue
            if any(run.slot == claim.slot and run.alive for run in active):
                continue
            takeover = replace(
                claim, token=new_token(), mode="takeover", reason="takeover", max_late_ms=None
            )
            asked = time.monotonic()
            outcome = await self._send_claim(job, takeover, now_ms() + host.lease_ms)
            if outcome is None:
                continue
            if outcome.kind == "running":
                if (outcome.attempt or 1) >= job.options.max_attempts:
                    return None
                continue
            return takeover, Answer(outcome, asked)
        return None

    async def _hand_back(self, attempt: Attempt) -> None:
        """A claim won while stopping: release it so that a backup runs it at once."""
        host = self.host
        runs = host.backend.runs
        assert runs is not None and attempt.token is not None
        token = attempt.token
        try:
            released = host.tracing.store(
                "release", runs.release(attempt.job.name, attempt.slot, token),
                job=attempt.job.name, slot=attempt.slot, token=token,
            )
            if await released:
                await send_wakeup(host.backend, Wakeup("released", job=attempt.job.name))
        except Exception as exc:
            logger.warning(
                "scheduler %s: release of job %s slot %s failed: %r",
                host.name,
                attempt.job.name,
                iso(attempt.slot),
                exc,
            )
