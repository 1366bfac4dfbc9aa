"""The claim flows: from a due slot to its claim, on every kind of store.

``Scheduler`` owns the jobs, the timer and the lifecycle; this module owns when due
slots are claimed and which go together: claims batched with ``claim_many`` (after a
look at the runs another instance won), slots held back behind another instance's last
win or a run still ending here, slots queued while the handler pool is full
(back-pressure), catch-up at start and backfills. What a claim's answer leads to (a run
here, a watch, a takeover, a hand-back) is ``answers.py``.

Every lateness, lease and catch-up decision is the store's: claims carry ``max_late_ms``
and the store answers ``late`` or ``early`` on its own clock. The worker's clock only
chooses when to ask.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections import Counter
from collections.abc import Coroutine
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

from ..backends.base import (
    ClaimOutcome,
    OverlapPolicy,
    RunClaim,
)
from ..jobs import Job
from ..logtime import iso
from ..redact import redact_text
from ..retry import retry_store_call
from ..wallclock import now_ms
from .answers import Answer, ClaimAnswers

if TYPE_CHECKING:
    from .scheduler import Scheduler

__all__ = ["CLAIM_MANY_CHUNK", "ClaimFlows"]

logger = logging.getLogger("django_anarchon")

#: Most claims sent in one ``claim_many`` call: small enough that a store which locks
#: what a batch inserts (PostgreSQL) commits it before another instance's batch of the
#: same slots has waited long on it.
CLAIM_MANY_CHUNK = 200
#: How often a catch-up slot that met another run of its job asks again.
CATCH_UP_OVERLAP_POLL_S = 1.0
#: A job whose last slot another instance won, or whose handler still runs here, is
#: claimed this long after its slot here, so that the last winner's claim goes alone...
FOLLOW_DELAY_MS = 20
#: ...but never longer than this share of the job's ``max_late``.
FOLLOW_MAX_SHARE = 0.25
#: A job whose last run here has ended but whose end the store has not answered yet is
#: claimed once it has (its run would otherwise still be ``running`` there), waiting at
#: most this share of the job's ``max_late``.
ENDING_MAX_SHARE = 0.5
#: Held slots whose wait ends within this many seconds go with those released now: the
#: jobs of a burst fall due microseconds apart, and would each take a wake of their own.
HELD_SLACK_S = 0.001


def _nothing_to_follow(job: Job, outcome: ClaimOutcome) -> bool:
    """A scheduled claim's answer that ends its flow here (``_lease_claim`` would only
    note it): another instance's run with no attempt left to take over, or one done."""
    if outcome.kind == "running":
        return (outcome.attempt or 1) >= job.options.max_attempts
    return outcome.kind == "done"


class _Held:
    """A job's due slots held back here since ``since``, in slot order: until
    ``not_before`` (the follow delay), and while a run of the job here is ending."""

    __slots__ = ("job", "not_before", "since", "slots")

    def __init__(self, job: Job, slot: int, since: float, not_before: float) -> None:
        self.job = job
        self.slots = [slot]
        self.since = since
        self.not_before = not_before


class ClaimFlows(ClaimAnswers):
    """The claim flows of one scheduler (its host)."""

    def __init__(self, host: Scheduler) -> None:
        super().__init__(host)
        self._batch: list[tuple[Job, int]] = []
        self._batch_pending = False
        #: Sync slots that fell due while the pool was full, with the ``time.monotonic()``
        #: by which each is claimed anyway; one task drains them (``_drain_overflow``).
        self._overflow: list[tuple[Job, int, float]] = []
        self._draining = False
        #: Jobs whose start-up catch-up is still claiming: the ledger's look waits for them.
        self.catching_up: set[str] = set()
        #: job -> how many of its runs here are still in user code: claimed a little later.
        self._busy: Counter[str] = Counter()
        #: job -> how many of its runs here have left user code but not had their end
        #: answered by the store (lease stores): its next claim waits for them.
        self._ending: Counter[str] = Counter()
        #: job -> its due slots held back (the follow delay, a run ending here), and one
        #: timer for all of them, at the earliest time one may go (``_release_held``).
        self._held: dict[str, _Held] = {}
        self._held_timer: asyncio.TimerHandle | None = None

    def reset(self) -> None:
        super().reset()
        self.catching_up.clear()
        self._batch, self._batch_pending = [], False
        self._overflow, self._draining = [], False
        self._busy.clear()
        self._ending.clear()
        if self._held_timer is not None:
            self._held_timer.cancel()
            self._held_timer = None
        self._held.clear()

    def user_code_started(self, job: str) -> None:
        self._busy[job] += 1

    def user_code_done(self, job: str, ending: bool = False) -> None:
        """User code of a run of ``job`` returned; ``ending``: its end (a lease store's
        finish or release) is still to be answered, and ``run_ended`` will say so."""
        self._busy[job] -= 1
        if self._busy[job] <= 0:
            del self._busy[job]
        if ending:
            self._ending[job] += 1

    def run_ended(self, job: str) -> None:
        """A run of ``job`` ended on this instance: wake the claims buffered behind it,
        and those held until its end was answered."""
        self._ends[job] = self._ends.get(job, 0) + 1
        event = self._ended.pop(job, None)
        if event is not None:
            event.set()
        if job in self._ending:
            self._ending[job] -= 1
            if self._ending[job] <= 0:
                del self._ending[job]
                if job in self._held:
                    self._check_held(job)

    def due(self, job: Job, slot: int) -> None:
        """A slot fell due (the timer fired): claims due together go out together.

        On a lease store, a job whose last slot another instance won, or whose user code
        still runs here, is claimed ``FOLLOW_DELAY_MS`` later here: the last winner's claim
        then meets no contender (no wait on rows another claim holds, no share of the
        cores), unless it is busy with the job itself, and this instance's claim still
        backs it up if that winner has gone. A job whose run here has left user code but
        whose end the store has not answered yet is claimed once it has (at most
        ``ENDING_MAX_SHARE`` of ``max_late`` later): else the store still sees that run
        ``running``, and skips (or buffers, or cancels) the next slot for a run that is
        over. Only when the store is asked changes; what it answers does not.
        """
        held = self._held.get(job.name)
        if held is not None:
            held.slots.append(slot)  # behind the job's slots held already, never ahead
            return
        follow_ms, ending_ms = self._follow_ms(job), self._ending_ms(job)
        if follow_ms <= 0 and ending_ms <= 0:
            self._due_now(job, slot)
            return
        now = asyncio.get_running_loop().time()
        self._held[job.name] = _Held(job, slot, now, now + follow_ms / 1000)
        self._check_held(job.name)

    def _follow_ms(self, job: Job) -> float:
        if self.host.backend.runs is None or (
            job.name not in self._followed and job.name not in self._busy
        ):
            return 0
        return min(FOLLOW_DELAY_MS, job.options.max_late_ms * FOLLOW_MAX_SHARE)

    def _ending_ms(self, job: Job) -> float:
        if job.name not in self._ending or job.options.overlap == "allow":
            return 0  # with "allow" a run still ending changes no answer
        return job.options.max_late_ms * ENDING_MAX_SHARE

    def _held_until(self, held: _Held, now: float) -> float | None:
        """When ``held``'s slots may go (``None``: now): after the follow delay, and once
        no run of the job here is ending (asked each time: a run whose user code was
        still going when the slot was held may be ending by the end of that delay)."""
        until = max(held.not_before, held.since + self._ending_ms(held.job) / 1000)
        return None if until <= now + HELD_SLACK_S else until

    def _check_held(self, name: str) -> None:
        """Release a job's held slots if their wait is over, else wake when it will be."""
        held = self._held.get(name)
        if held is None:
            return
        until = self._held_until(held, asyncio.get_running_loop().time())
        if until is None:
            self._release(name, held)
        else:
            self._wake_held(until)

    def _release(self, name: str, held: _Held) -> None:
        del self._held[name]
        for slot in held.slots:
            self._due_now(held.job, slot)

    def _wake_held(self, when: float) -> None:
        """Have ``_release_held`` run at ``when`` unless it runs sooner already.

        One timer for every held job: a burst holds hundreds of jobs for the same follow
        delay, and a timer each cost the loop's heap as much as the claims they led to.
        """
        loop = asyncio.get_running_loop()
        timer = self._held_timer
        if timer is not None:
            if timer.when() <= when:
                return
            timer.cancel()
        self._held_timer = loop.call_at(when, self._release_held)

    def _release_held(self) -> None:
        """Release every held job whose wait is over, in the order they were held."""
        self._held_timer = None
        now = asyncio.get_running_loop().time()
        soonest: float | None = None
        for name, held in list(self._held.items()):
            until = self._held_until(held, now)
            if until is None:
                self._release(name, held)
            elif soonest is None or until < soonest:
                soonest = until
        if soonest is not None:
            self._wake_held(soonest)

    def _due_now(self, job: Job, slot: int) -> None:
        self._batch.append((job, slot))
        if not self._batch_pending:
            self._batch_pending = True
            asyncio.get_running_loop().call_soon(self._flush_batch)

    def _flush_batch(self) -> None:
        host = self.host
        self._batch_pending = False
        batch, self._batch = self._batch, []
        if host.stopping:
            return
        free = self.capacity.free
        together: list[tuple[Job, int]] = []
        queued = {job.name: until for job, _, until in self._overflow}
        for job, slot in batch:
            if job.is_async or (free > 0 and job.name not in queued):
                free -= 0 if job.is_async else 1
                together.append((job, slot))
            else:  # the pool is full: claimed later (together where it can), so idle ones win
                # Behind the job's slots already waiting, never ahead (slot order).
                until = max(time.monotonic() + self._backlog_s(job), queued.get(job.name, 0.0))
                queued[job.name] = until
                self._overflow.append((job, slot, until))
        self._claim_together(together)
        if not self._overflow:
            return
        if self._draining:
            self.capacity.nudge()  # a new wait may end before the one the drain sleeps on
        else:
            self._draining = True
            host.spawn(self._drain_overflow(), "claims waiting for threads")

    def _claim_together(self, together: list[tuple[Job, int]], admitted: bool = False) -> None:
        """Claim in batches of ``CLAIM_MANY_CHUNK`` where the store can, else each alone;
        a lone slot alone, after its own wait for a thread, unless it was ``admitted``
        already (then at once: spawned in order, the claims go out in order)."""
        host = self.host
        if not together:
            return
        if (len(together) < 2 and not admitted) or not self._many():
            for job, slot in together:
                host.spawn(self._slot_flow(job, slot, admitted), f"{job.name}@{iso(slot)}")
            return
        # Each instance claims a burst in an order of its own (a job's slots stay in
        # order): their batches then first meet slots nobody holds yet, instead of all
        # waiting on the same rows in the same order.
        together = sorted(together, key=lambda due: (self._spread(due[0].name), due[1]))
        for start in range(0, len(together), CLAIM_MANY_CHUNK):
            chunk = together[start : start + CLAIM_MANY_CHUNK]
            host.spawn(self._claim_batch(chunk), f"{len(chunk)} claims")

    def _many(self) -> bool:
        """Whether the store decides a batch of claims in one call (``claim_many``)."""
        target = self.host.backend if self.host.backend.runs is None else self.host.backend.runs
        return callable(getattr(target, "claim_many", None))

    def _spread(self, job: str) -> int:
        return zlib.crc32(f"{self.host.instance_id}\0{job}".encode())

    async def _drain_overflow(self) -> None:
        """Claim the slots that fell due while the pool was full: as many as there are
        free threads whenever one frees up, and each one whose wait is over, in batches
        (one round trip each), not one claim and one waiter per slot.

        A batch that goes takes along every waiting slot of a job another instance won
        last (``_followed``): this instance's claim of it only backs that winner up, and
        almost always loses. Sent one per freed thread instead, the slots that a burst's
        losers held back went out as hundreds of single claims, between the winners' runs.
        """
        host, capacity = self.host, self.capacity
        try:
            while self._overflow and not host.stopping:
                now = time.monotonic()
                free = max(capacity.free, 0)
                chosen: list[tuple[Job, int]] = []
                waiting: list[tuple[Job, int, float]] = []
                for job, slot, until in self._overflow:
                    if until <= now or free > 0:
                        free -= 0 if until <= now else 1
                        chosen.append((job, slot))
                    else:
                        waiting.append((job, slot, until))
                if chosen and waiting:
                    followed = self._followed
                    chosen += [(job, slot) for job, slot, _ in waiting if job.name in followed]
                    waiting = [entry for entry in waiting if entry[0].name not in followed]
                self._overflow = waiting
                if chosen:
                    self._claim_together(chosen, admitted=True)
                    await asyncio.sleep(0)  # the claims take their units before the next look
                    continue
                await capacity.freed(min(until for _, _, until in waiting) - now)
        finally:
            self._draining = False

    async def _decide_many(
        self, live: list[tuple[Job, int]], claims: list[RunClaim], what: str, deadline: int
    ) -> list[ClaimOutcome] | None:
        """The answers to a batch of claims: ``claim_many``, after a look (``peek_many``,
        where the store has it) at the runs of jobs another instance won last.

        Those claims only back that winner up: in a burst they were three in four of the
        claims, each one a whole claim script on Redis, and almost all answered
        ``running`` or ``done``. The look answers those without a claim (it reads what
        the claim would read, and answers only where the claim would change nothing);
        the rest are claimed as before. ``None``: the answers did not match the claims
        (logged).
        """
        host, runs = self.host, self.host.backend.runs
        answers: list[ClaimOutcome | None] = [None] * len(claims)
        peek = getattr(runs, "peek_many", None)
        followed = [i for i, (job, _) in enumerate(live) if job.name in self._followed]
        if followed and callable(peek):
            looked = [claims[i] for i in followed]
            try:
                peeked: list[ClaimOutcome | None] = await host.tracing.store(
                    "peek_many", peek(looked), tokens=[c.token for c in looked]
                )
            except Exception as exc:  # not retried: the claims decide, and retry
                logger.info("%s: the look failed, claiming: %s", what, redact_text(repr(exc)))
                peeked = []
            if len(peeked) == len(followed):
                for i, answer in zip(followed, peeked, strict=True):
                    answers[i] = answer
        rest = [i for i, answer in enumerate(answers) if answer is None]
        if rest:
            asked = [claims[i] for i in rest]
            decided: list[ClaimOutcome] = await retry_store_call(
                what,
                lambda: host.tracing.store(
                    "claim_many",
                    runs.claim_many(asked),  # type: ignore[union-attr]
                    tokens=[c.token for c in asked],
                ),
                deadline_ms=deadline,
                give_up=lambda: host.stopping,
            )
            if len(decided) != len(rest):
                logger.error("%s: %s answers for %s claims", what, len(decided), len(rest))
                return None
            for i, outcome in zip(rest, decided, strict=True):
                answers[i] = outcome
        # Every claim has its answer now: the look's, or the claims' for all the rest.
        return cast("list[ClaimOutcome]", answers)

    async def _slot_flow(self, job: Job, slot: int, admitted: bool = False) -> None:
        host = self.host
        if host.stopping:
            return
        if host.backend.runs is None:
            # No lease store to ask: lateness is judged here, on the store's clock where
            # it has one (``store_now``), else this worker's (see docs/concepts.md).
            if host.clock.now() > slot + job.options.max_late_ms:
                await host.emit_event("skip", job, slot, reason="late")
                return
            await self._claim_only(job, slot, admitted=admitted)
        else:
            claim = self.run_claim(job, slot, "scheduled", job.options.max_late_ms)
            await self._lease_claim(
                job, claim, self._retry_until(slot + job.options.max_late_ms), admitted=admitted
            )

    async def _claim_batch(self, batch: list[tuple[Job, int]]) -> None:
        """Claim several due slots in one round trip (``claim_many``), then follow each."""
        host = self.host
        if host.stopping:
            return
        runs = host.backend.runs
        live = batch
        if runs is None:
            now = host.clock.now()
            live = []
            for job, slot in batch:
                if now > slot + job.options.max_late_ms:
                    await host.emit_event("skip", job, slot, reason="late")
                else:
                    live.append((job, slot))
            if not live:
                return
        deadline = min(slot + job.options.max_late_ms for job, slot in live)
        what = f"scheduler {host.name} ({host.instance_id}): claim_many of {len(live)} slot(s)"
        syncs = sum(1 for job, _ in live if not job.is_async)
        if runs is not None:
            claims = [
                self.run_claim(job, slot, "scheduled", job.options.max_late_ms)
                for job, slot in live
            ]
            outcomes: list[ClaimOutcome] | None
            asked = time.monotonic()
            with self.capacity.holding(syncs):
                try:
                    outcomes = await self._decide_many(
                        live, claims, what, self._retry_until(deadline)
                    )
                except Exception:
                    outcomes = None  # logged; each claim goes on alone with the same token
            lost: list[tuple[Job, RunClaim, ClaimOutcome]] = []
            for i, (job, slot) in enumerate(live):
                if outcomes is not None and _nothing_to_follow(job, outcomes[i]):
                    lost.append((job, claims[i], outcomes[i]))
                    continue
                host.spawn(
                    self._lease_claim(
                        job,
                        claims[i],
                        self._retry_until(slot + job.options.max_late_ms),
                        None if outcomes is None else Answer(outcomes[i], asked),
                    ),
                    f"{job.name}@{iso(slot)}",
                )
            # The runs won above are on their way; the answers that leave nothing to do
            # here are noted without a task each (most of a burst's answers, on the
            # instances that did not win).
            for job, claim, outcome in lost:
                self._note_winner(job, claim, outcome)
                await host.emit_event("claim", job, claim.slot, reason=outcome.kind)
            return
        inputs = [self.claim_input(job, slot) for job, slot in live]
        won: list[bool] | None
        with self.capacity.holding(syncs):
            try:
                won = await retry_store_call(
                    what,
                    lambda: host.tracing.store(
                        "claim_many",
                        host.backend.claim_many(inputs),  # type: ignore[union-attr]
                        tokens=[c.token for c in inputs],
                    ),
                    deadline_ms=host.clock.local(deadline),
                    give_up=lambda: host.stopping,
                )
            except Exception:
                won = None
        if won is not None and len(won) != len(inputs):
            logger.error("%s: %s answers for %s claims", what, len(won), len(inputs))
            won = None
        for i, (job, slot) in enumerate(live):
            if won is None or won[i]:
                host.spawn(
                    self._claim_only(job, slot, inputs[i], None if won is None else True),
                    f"{job.name}@{iso(slot)}",
                )
            else:
                await host.emit_event("claim", job, slot, reason="lost")

    def catch_up(self, job: Job, now: int, armed: int | None) -> None:
        """At start: claim the slots missed before ``armed`` (the timer's first), as catch-up.

        ``catch_up_mode="latest"`` claims the newest; ``"all"`` the newest
        ``catch_up_limit`` of the window, oldest first. The store judges the window (the
        claim's ``max_late_ms`` is ``catch_up``) on its own clock; a slot outside it is
        answered ``late``, quietly.
        """
        options = job.options
        if self.host.backend.runs is None or options.catch_up_window_ms <= 0:
            return
        if options.catch_up_mode == "all" and armed is not None:
            self._catching_up(job, self._catch_up_all(job, now, armed), f"catch-up {job.name}")
            return
        slot = job.schedule.latest_at_or_before(now)
        if slot is None or now <= slot + options.max_late_ms:
            return  # still due: the timer's own claim of it is coming
        claim = self.run_claim(job, slot, "catch-up", options.catch_up_ms)
        self._catching_up(
            job, self._lease_claim(job, claim, now + self.host.lease_ms),
            f"catch-up {job.name}@{iso(slot)}",
        )

    def _catching_up(self, job: Job, flow: Coroutine[Any, Any, object], label: str) -> None:
        """Spawn a catch-up, and hold the ledger's look of ``job`` until it ends: slots it
        has yet to claim are not missed."""
        self.catching_up.add(job.name)

        async def tracked() -> None:
            try:
                await flow
            finally:
                self.catching_up.discard(job.name)

        self.host.spawn(tracked(), label)

    async def _catch_up_all(self, job: Job, now: int, armed: int) -> None:
        """``catch_up_mode="all"``: the missed slots run one at a time, oldest first.

        ``now`` is on the store's clock where the store tells it (``Scheduler.clock``), so
        a worker whose clock runs ahead still reaches the window's oldest slots (each claim
        is judged by the store again). A slot that meets another run of its job waits for
        that run to end instead of being skipped: the other run is often the previous
        catch-up slot on another instance.
        """
        host, options = self.host, job.options
        window = options.catch_up_ms
        far_end = now - window  # ``now`` is the store's (engine/clock.py), where it tells
        slots: list[int] = []
        cursor = armed
        while len(slots) < options.catch_up_limit:
            slot = job.schedule.latest_at_or_before(cursor - 1)
            if slot is None or slot < far_end:
                break
            slots.append(slot)
            cursor = slot
        for slot in reversed(slots):
            # Waiting its turn below, a catch-up slot neither buffers nor cancels another.
            claim = replace(self.run_claim(job, slot, "catch-up", window), overlap="skip")
            answer = await self._claim_in_turn(job, claim)
            if host.stopping:
                return
            if answer is None:
                await host.emit_event("skip", job, slot, reason="late")
                continue
            await self._lease_claim(job, claim, now_ms() + host.lease_ms, answer)

    async def backfill(self, job: Job, slot: int, overlap: str) -> str | None:
        """One slot of a backfill request: claimed with reason ``backfill``, run here if won.

        ``overlap="skip"``: it never runs beside another run of its job and waits for that
        run to end (asking once a second), as a catch-up slot does; ``"allow"``: it runs
        beside. The kind of the store's answer, or ``None`` if it never answered.
        """
        host = self.host
        policy: OverlapPolicy = "skip" if overlap == "skip" else "allow"
        claim = replace(self.run_claim(job, slot, "backfill", None), overlap=policy)
        answer = await self._claim_in_turn(job, claim)
        if answer is None:
            return None
        await self._lease_claim(job, claim, now_ms() + host.lease_ms, answer)
        return answer.outcome.kind

    async def _claim_in_turn(self, job: Job, claim: RunClaim) -> Answer | None:
        """Claim, asking again once a second while the store answers ``overlap`` (the
        job's other run is still going): the store's last answer, ``None`` if it gave
        none or the instance is stopping."""
        host = self.host
        while True:
            asked = time.monotonic()
            outcome = await self._send_claim(job, claim, now_ms() + host.lease_ms)
            if outcome is None:
                return None
            if outcome.kind != "overlap":
                return Answer(outcome, asked)
            if await host.wait_stopping(CATCH_UP_OVERLAP_POLL_S):
                return None
