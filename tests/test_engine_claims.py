"""The claim flows under issue 9's faults: skewed worker clocks, full pools, stops, outages.

The store is the real memory store on the real clock; the WORKER's clock is skewed by
shifting ``time.time_ns`` (what the engine's ``now_ms`` reads) while the store keeps
reading the true time. Transports that fail are wrappers around the real store.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest

from django_anarchon.backends.base import ClaimInput, ClaimOutcome, RunClaim
from django_anarchon.backends.memory import MemoryBackend
from django_anarchon.engine import JobContext, Scheduler
from django_anarchon.engine.claims import FOLLOW_DELAY_MS

from .test_engine_support import (
    RARELY,
    Calls,
    Events,
    FlakyClaimBackend,
    Recording,
    iso_in,
    off_the_clock,
    queue_behind_a_full_pool,
    real_ms,
    stop_all,
    wait_for,
)


def true_store() -> MemoryBackend:
    return MemoryBackend(clock=real_ms)


async def test_a_worker_ahead_never_starts_a_run_before_its_slot(skew: Any) -> None:
    """Item 5: 5 s ahead, it was told ``won`` 5 s early and won every slot of every job."""
    skew(5_000)
    backend = true_store()
    calls = Calls()
    ahead = Scheduler(backend, instance_id="ahead")
    ahead.every("tick", "1s", lambda ctx: calls.add(slot=ctx.slot, at=real_ms()), overlap="allow")
    await ahead.start()
    try:
        await wait_for(lambda: len(calls) >= 2, 15, "two runs")
    finally:
        await stop_all(ahead)
    for call in calls.items:
        assert call["at"] >= call["slot"], f"started {call['slot'] - call['at']} ms early"


async def test_a_lone_worker_ahead_runs_the_slots_of_its_first_seconds(skew: Any) -> None:
    """Armed by its own clock, a worker 5 s ahead skipped every slot due in its first 5 s
    (true time): it armed the slot 5 s on. Armed by the store's clock, it runs them."""
    skew(5_000)
    backend = true_store()
    recording = Recording(backend)
    calls = Calls()
    ahead = Scheduler(backend, instance_id="ahead")
    ahead.every("tick", "500ms", lambda ctx: calls.add(slot=ctx.slot, at=real_ms()),
                max_late="200ms")
    started = real_ms()
    await ahead.start()
    try:
        await wait_for(lambda: any(c["slot"] <= started + 2_000 for c in calls.items), 3,
                       "a run of a slot due in the first two seconds")
        await wait_for(lambda: len(calls) >= 4, 5, "four runs")
    finally:
        await stop_all(ahead)
    for call in calls.items:
        assert call["at"] >= call["slot"], f"started {call['slot'] - call['at']} ms early"
    early = [o for _, o in recording.claims if o.kind == "early"]
    assert len(early) <= 1, f"claims sent before their slot by the store's clock: {early}"


@pytest.mark.parametrize("store_clock", [True, False])
async def test_catch_up_window_is_judged_by_the_store(skew: Any, store_clock: bool) -> None:
    """Item 2: a worker 8 s behind re-ran a slot whose run the store had already forgotten.

    The slot lies 11.5 s back by the store's clock and 3.5 s back by the worker's: inside
    the worker's idea of ``catch_up=5s``, outside the store's. Where the store tells its
    clock the engine counts by it and catches up the next slot (1.5 s back) instead; where
    it does not, the engine claims by its own and the store must answer late. Either way
    the slot never runs.
    """
    skew(-8_000)
    backend = true_store()
    if not store_clock:
        backend.runs.now_ms = None  # type: ignore[assignment,method-assign]
    recording = Recording(backend)
    target = real_ms() - 11_500
    offset = f"{target % 10_000}ms"
    calls = Calls()
    behind = Scheduler(backend, instance_id="behind")
    behind.every(
        "nightly", "10s", lambda ctx: calls.add(slot=ctx.slot), offset=offset,
        catch_up="5s", max_late="1s",
    )
    await behind.start()
    try:
        await wait_for(lambda: any(c.reason == "catch-up" for c, _ in recording.claims), 5,
                       "a catch-up claim")
    finally:
        await stop_all(behind)
    caught = [(c, o) for c, o in recording.claims if c.reason == "catch-up"]
    if store_clock:
        (claim, outcome), = caught
        assert claim.slot == target + 10_000 and outcome.kind == "won", caught
    else:
        (claim, outcome), = caught
        assert claim.slot == target
        assert outcome.kind == "late", outcome
    assert not calls.where(slot=target)


async def test_a_full_pool_leaves_new_slots_to_idle_instances() -> None:
    """Item 6: a busy instance kept winning claims and queued them behind its long run."""
    backend = MemoryBackend()
    calls = Calls()
    release = threading.Event()

    def long_run(ctx: JobContext) -> None:
        calls.add(job="long", by=ctx.instance_id)
        release.wait(10)

    def quick(ctx: JobContext) -> None:
        calls.add(job="quick", by=ctx.instance_id, slot=ctx.slot, at=real_ms())

    busy = Scheduler(backend, instance_id="busy", threads=1)
    idle = Scheduler(backend, instance_id="idle", threads=2)
    busy.at("long", iso_in(300), long_run)  # only "busy" has it
    for s in (busy, idle):
        s.every("quick", "200ms", quick, overlap="allow")
    for s in (busy, idle):
        await s.start()
    try:
        await wait_for(lambda: calls.where(job="long"), 5, "the long run")
        first = real_ms()
        await wait_for(
            lambda: len([c for c in calls.where(job="quick") if c["slot"] > first]) >= 8,
            10,
            "eight quick runs while busy is busy",
        )
    finally:
        release.set()
        await stop_all(busy, idle)
    while_busy = [c for c in calls.where(job="quick") if c["slot"] > first]
    assert {c["by"] for c in while_busy} == {"idle"}, while_busy
    assert max(c["at"] - c["slot"] for c in while_busy) < 150, while_busy


async def test_a_burst_beyond_the_pool_is_claimed_in_batches_not_slot_by_slot() -> None:
    """300 sync jobs due at once on 2 instances of 4 threads each: every slot runs once,
    and the slots beyond the free threads go out in claim_many batches as threads free
    up (before: one claim and one waiter per slot, 0.1 s after the pool was full)."""
    backend = MemoryBackend()
    singles: list[str] = []
    batches: list[int] = []
    real_claim, real_many = backend.runs.claim, backend.runs.claim_many

    async def claim(c: RunClaim) -> ClaimOutcome:
        singles.append(c.job)
        return await real_claim(c)

    async def claim_many(claims: list[RunClaim]) -> list[ClaimOutcome]:
        batches.append(len(claims))
        return await real_many(claims)

    backend.runs.claim = claim  # type: ignore[method-assign]
    backend.runs.claim_many = claim_many  # type: ignore[method-assign]
    calls = Calls()

    def quick(ctx: JobContext) -> None:
        calls.add(job=ctx.name, by=ctx.instance_id, late=real_ms() - ctx.slot)

    schedulers = [Scheduler(backend, instance_id=i, threads=4) for i in ("A", "B")]
    at = iso_in(400)
    for s in schedulers:
        for i in range(300):
            s.at(f"burst{i:03d}", at, quick)
    for s in schedulers:
        await s.start()
    try:
        # Every claim of both instances answered: no other start can come.
        await wait_for(lambda: len(calls) >= 300 and sum(batches) + len(singles) >= 600, 10,
                       "every slot of the burst, claimed by both")
    finally:
        await stop_all(*schedulers)
    assert sorted(c["job"] for c in calls.items) == [f"burst{i:03d}" for i in range(300)]
    assert not singles, f"{len(singles)} slots claimed one by one"
    assert sum(batches) == 600 and len(batches) < 300, batches


class _SlowClaims(MemoryBackend):
    """The memory store behind a transport that holds lease claims until told to go on."""

    def __init__(self) -> None:
        super().__init__()
        self.claim_sent = asyncio.Event()
        self.go_on = asyncio.Event()
        real_claim = self.runs.claim

        async def claim(c: RunClaim) -> ClaimOutcome:
            self.claim_sent.set()
            await self.go_on.wait()
            return await real_claim(c)

        self.runs.claim = claim  # type: ignore[method-assign]


async def test_a_claim_won_while_stopping_with_one_attempt_still_runs() -> None:
    """Item 9: handed back, it used up the only attempt and the slot never ran."""
    backend = _SlowClaims()
    calls = Calls()
    scheduler = Scheduler(backend, instance_id="A")
    scheduler.every("once-only", "1s", lambda ctx: calls.add(slot=ctx.slot))
    await scheduler.start()
    await asyncio.wait_for(backend.claim_sent.wait(), 5)
    stopping = asyncio.create_task(scheduler.stop(grace="5s"))
    await asyncio.sleep(0)  # stop() has begun: the scheduler is stopping
    backend.go_on.set()
    await asyncio.wait_for(stopping, 10)
    assert len(calls) == 1
    record = (await MemoryBackend.history(backend, "once-only", 5))[0]
    assert record.status == "success", record


async def test_a_stopping_instance_sends_no_new_claim() -> None:
    """Claims held back by a full pool were sent after the stop began, won, and run.

    Seen in four workers on one PostgreSQL: after SIGTERM a worker kept claiming slots
    queued behind its busy pool, ran them past its grace, and recorded them interrupted
    while their handlers ran to the end.
    """
    backend = MemoryBackend()
    scheduler = Scheduler(backend, instance_id="A", threads=1)
    sent_while_stopping: list[tuple[str, int]] = []
    real_claim = backend.runs.claim

    async def claim(c: RunClaim) -> ClaimOutcome:
        if scheduler.stopping:
            sent_while_stopping.append((c.job, c.slot))
        return await real_claim(c)

    backend.runs.claim = claim  # type: ignore[method-assign]
    release = threading.Event()
    calls = Calls()

    def long_run(ctx: JobContext) -> None:
        calls.add(job="long")
        release.wait(10)

    scheduler.at("long", iso_in(100), long_run)
    for i in range(3):  # due every 50 ms, each waiting in back-pressure behind "long"
        scheduler.every(f"quick-{i}", "50ms", lambda ctx: calls.add(job=ctx.name), overlap="allow")
    await scheduler.start()
    try:
        await wait_for(lambda: calls.where(job="long"), 5, "the long run")
        await asyncio.sleep(0.3)  # claims keep queueing behind the busy pool
    finally:
        stopping = asyncio.create_task(scheduler.stop(grace="1s"))
        await asyncio.sleep(0.3)  # the back-pressure waits (100 ms) have all ended
        release.set()
        await asyncio.wait_for(stopping, 10)
    assert sent_while_stopping == []


class _DownAtStart(MemoryBackend):
    """A store that refuses connections the first ``failures`` times it is asked."""

    def __init__(self, init_failures: int, prepare_failures: int) -> None:
        super().__init__()
        self.init_failures = init_failures
        self.prepare_failures = prepare_failures

    async def init(self) -> None:
        if self.init_failures > 0:
            self.init_failures -= 1
            raise ConnectionError("the database system is starting up (test)")

    async def prepare_job(self, job: str, history_size: int) -> None:
        if self.prepare_failures > 0:
            self.prepare_failures -= 1
            raise ConnectionError("connection reset (test)")


async def test_start_waits_for_a_store_that_is_down() -> None:
    """Item 7: init() and prepare_job() were not retried, so the worker died at start."""
    backend = _DownAtStart(init_failures=3, prepare_failures=2)
    calls = Calls()
    scheduler = Scheduler(backend, instance_id="A")
    scheduler.every("tick", "200ms", lambda ctx: calls.add(slot=ctx.slot))
    await scheduler.start()
    try:
        assert scheduler.running
        await wait_for(lambda: len(calls) >= 1, 5, "a run once the store answered")
    finally:
        await stop_all(scheduler)
    assert (backend.init_failures, backend.prepare_failures) == (0, 0)


async def test_a_stop_while_the_store_is_down_at_start_ends_the_wait() -> None:
    backend = _DownAtStart(init_failures=10**9, prepare_failures=0)
    scheduler = Scheduler(backend, instance_id="A")
    scheduler.every("tick", "1s", lambda ctx: None)
    events = Events(scheduler)
    starting = asyncio.create_task(scheduler.start())
    await asyncio.sleep(0.3)
    assert not starting.done()
    began = time.monotonic()
    scheduler.request_stop()
    await asyncio.wait_for(starting, 3)
    assert time.monotonic() - began < 2.5
    assert not scheduler.running
    await scheduler.stop()
    assert not events.named("start")


class _Delayed:
    """The real memory store's clock behind a transport with 20 ms each way."""

    def __init__(self, backend: MemoryBackend) -> None:
        self.store = backend.runs
        self.runs = self

    async def now_ms(self, job: str) -> int:
        await asyncio.sleep(0.02)
        store = int(await self.store.now_ms(job))
        await asyncio.sleep(0.02)
        return store


async def test_the_store_clock_offset_is_not_biased_by_the_round_trip(skew: Any) -> None:
    """A worker 5 s ahead estimated the offset at the low end of the round trip: armed up to
    a round trip after the other instances, it lost every race (a fault run's worker
    started nothing for 12 s). The midpoint is within the trip's asymmetry of the truth."""
    from django_anarchon.engine.clock import StoreClock

    skew(5_000)
    clock = StoreClock("test")
    assert await clock.measure(_Delayed(true_store()), "tick")
    # True offset -5000 ms; the low end read -5020 (20 ms late), the midpoint about -5000.
    assert abs(clock.offset_ms + 5_000) <= 8, clock.offset_ms


async def test_a_full_pool_claims_each_jobs_slots_in_slot_order() -> None:
    """A job's slots leave an instance in slot order even while its pool is full.

    On Redis ``stream-id`` a later slot's claim that reaches the store first loses the
    earlier slot for every instance (XADD only takes a larger ID): a CI fault run lost one
    so. Before: a slot that fell due as a thread came free went out ahead of the older
    slots waiting for one, and the waiting slots went out as each one's own wait ended
    (longer when the pool was fuller), not in slot order.
    """
    backend = MemoryBackend()
    sent: list[tuple[str, int]] = []
    real_claim, real_many = backend.runs.claim, backend.runs.claim_many

    async def claim(c: RunClaim) -> ClaimOutcome:
        sent.append((c.job, c.slot))
        return await real_claim(c)

    async def claim_many(claims: list[RunClaim]) -> list[ClaimOutcome]:
        sent.extend((c.job, c.slot) for c in claims)
        return await real_many(claims)

    backend.runs.claim = claim  # type: ignore[method-assign]
    backend.runs.claim_many = claim_many  # type: ignore[method-assign]
    scheduler = Scheduler(backend, instance_id="A", threads=1)
    scheduler.cron("tick", RARELY, lambda ctx: None, overlap="allow")
    await scheduler.start()
    try:
        slot, first = await queue_behind_a_full_pool(scheduler, sent)
    finally:
        await stop_all(scheduler)
    assert first == [("tick", slot), ("tick", slot + 1)], first
    assert sent[2:] == [("tick", slot + 2), ("tick", slot + 3)], sent


def note_lost(scheduler: Scheduler, knew_lost: dict[int, set[int]]) -> None:
    """Note, as each slot falls due on ``scheduler``'s loop, the slots whose loss it has
    taken in by then: the order on the loop, not the store's answer times (the answer of
    a slot may come a millisecond before the next falls due and be taken in after it)."""
    flows = scheduler._claims
    lost: set[int] = set()
    note_winner, due = flows._note_winner, flows.due

    def noting(job: Any, claim: RunClaim, outcome: ClaimOutcome) -> None:
        if claim.reason == "scheduled" and outcome.kind in ("running", "done"):
            lost.add(claim.slot)
        note_winner(job, claim, outcome)

    def falling_due(job: Any, slot: int) -> None:
        knew_lost[slot] = set(lost)
        due(job, slot)

    flows._note_winner = noting  # type: ignore[method-assign]
    flows.due = falling_due  # type: ignore[method-assign]


async def test_the_instance_that_lost_a_jobs_last_slot_claims_its_next_one_later() -> None:
    """Issue 10: four instances sent the same claims at the same instant, so the winner's
    claim waited on the others' (PostgreSQL holds a row another claim is inserting) and
    shared the cores with them: steady p50 7 ms. Now an instance that lost a job's last
    slot claims its next slot ``FOLLOW_DELAY_MS`` after it, and the winner's goes alone."""
    backend = MemoryBackend(clock=real_ms)
    sends = Recording(backend)
    calls = Calls()
    schedulers = [Scheduler(backend, instance_id=i) for i in ("A", "B", "C")]
    #: instance -> slots whose loss it had noted when each slot fell due there
    knew_lost: dict[str, dict[int, set[int]]] = {}
    for s in schedulers:
        s.every("tick", "100ms", lambda ctx: calls.add(slot=ctx.slot, by=ctx.instance_id))
        note_lost(s, knew_lost.setdefault(s.instance_id, {}))
    for s in schedulers:
        await s.start()
    try:
        await wait_for(lambda: len(calls) >= 12, 10, "twelve runs")
    finally:
        await stop_all(*schedulers)
    assert max(calls.count("slot").values()) == 1, calls.items
    winners = {c["slot"]: c["by"] for c in calls.items}
    later = 0
    for previous, slot in zip(sorted(winners), sorted(winners)[1:], strict=False):
        if slot - previous != 100:
            continue
        for by in ("A", "B", "C"):
            sent = [s for s in sends.of(by) if s["slot"] == slot]
            # It knew it had lost the last slot when this one fell due (a claim held up,
            # waiting for the end of a run of its own, may be answered only after it).
            knew = previous in knew_lost[by].get(slot, set())
            if winners[previous] != by and sent and knew:
                # Lost the last slot: never asks before the delay has passed.
                assert sent[0]["at"] - slot >= FOLLOW_DELAY_MS - 2, (by, slot, sent)
                later += 1
    assert later >= 10, sends.sent
    # The previous winner's claim went first: it won (nearly) every next slot.
    kept = sum(
        winners[slot] == winners[previous]
        for previous, slot in zip(sorted(winners), sorted(winners)[1:], strict=False)
    )
    assert kept >= (len(winners) - 1) * 0.8, winners


async def test_the_claims_that_back_up_other_instances_are_answered_by_a_look() -> None:
    """Issue 10: in a burst three claims in four only back up the instance that won the
    job's last slot, and on Redis each was a whole claim script. A batch's claims of jobs
    another instance won last are answered by ``peek_many`` where that is the claim's
    answer; with the leader stopped, the look answers nothing and the claims win."""
    backend = MemoryBackend(clock=real_ms)
    sends = Recording(backend)
    calls = Calls()
    schedulers = {i: Scheduler(backend, instance_id=i) for i in ("A", "B", "C")}
    for s in schedulers.values():
        for n in range(20):
            s.every(f"job{n}", "200ms",
                    lambda ctx: calls.add(job=ctx.name, slot=ctx.slot, by=ctx.instance_id))
    for s in schedulers.values():
        await s.start()
    try:
        await wait_for(lambda: len(calls) >= 20 * 4, 10, "four slots of each job")
        runs_of = Counter(c["by"] for c in calls.items)
        leader = runs_of.most_common(1)[0][0]
        await stop_all(schedulers[leader])
        gone = real_ms()
        await wait_for(
            lambda: len([c for c in calls.items if c["slot"] > gone + 200]) >= 20 * 3, 10,
            "three slots of each job after the leader stopped",
        )
    finally:
        await stop_all(*schedulers.values())
    slots = Counter((c["job"], c["slot"]) for c in calls.items)
    assert max(slots.values()) == 1, [k for k, n in slots.items() if n > 1]
    for n in range(20):  # none lost, before the stop and after it (the stop's own aside)
        for part in (lambda slot: slot < gone - 200, lambda slot: slot > gone + 200):
            mine = sorted(slot for job, slot in slots if job == f"job{n}" and part(slot))
            assert mine == list(range(mine[0], mine[0] + 200 * len(mine), 200)), (n, mine)
    # The followers' claims of the leader's slots were looks, answered without a claim.
    answered = {(c.instance_id, c.job, c.slot, a.kind) for c, a in sends.looked}
    assert len(answered) >= 20, answered
    assert {kind for *_, kind in answered} <= {"running", "done"}, answered
    claimed = {(c.instance_id, c.job, c.slot) for c, _ in sends.claims}
    assert not {(by, job, slot) for by, job, slot, _ in answered} & claimed
    # ...and after the leader stopped, the looks answered nothing and the claims won.
    after = [c for c in calls.items if c["slot"] > gone + 200]
    assert {c["by"] for c in after} <= set(schedulers) - {leader}, after


async def test_a_look_that_fails_leaves_the_decision_to_the_claims(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The look is not retried: its claims go out at once, and they retry as ever."""
    backend = MemoryBackend(clock=real_ms)
    failed: list[int] = []

    async def peek_many(claims: list[RunClaim]) -> list[ClaimOutcome | None]:
        failed.append(len(claims))
        raise ConnectionError("the store went away")

    backend.runs.peek_many = peek_many  # type: ignore[method-assign]
    calls = Calls()
    schedulers = [Scheduler(backend, instance_id=i) for i in ("A", "B")]
    for s in schedulers:
        for n in range(5):
            s.every(f"job{n}", "100ms",
                    lambda ctx: calls.add(job=ctx.name, slot=ctx.slot, at=real_ms()))
    caplog.set_level("INFO", logger="django_anarchon")
    for s in schedulers:
        await s.start()
    try:
        await wait_for(lambda: len(failed) >= 3 and len(calls) >= 5 * 6, 10, "six slots a job")
    finally:
        await stop_all(*schedulers)
    slots = Counter((c["job"], c["slot"]) for c in calls.items)
    assert max(slots.values()) == 1, slots
    for n in range(5):
        mine = sorted(slot for job, slot in slots if job == f"job{n}")
        assert mine == list(range(mine[0], mine[0] + 100 * len(mine), 100)), (n, mine)
    assert "the look failed, claiming: ConnectionError" in caplog.text


async def test_a_follower_still_runs_every_slot_once_its_leader_has_gone() -> None:
    """The delay only moves when a claim is sent: with the winner of the job's last slots
    stopped, the other instance wins the next one a delay later and then leads."""
    backend = MemoryBackend(clock=real_ms)
    sends = Recording(backend)
    calls = Calls()
    leader, follower = (Scheduler(backend, instance_id=i) for i in ("leader", "follower"))
    for s in (leader, follower):
        s.every("tick", "100ms", lambda ctx: calls.add(slot=ctx.slot, by=ctx.instance_id))
    await leader.start()
    try:
        await wait_for(lambda: len(calls) >= 2, 10, "two runs on the leader alone")
        await follower.start()
        await wait_for(
            lambda: any(s["kind"] != "won" for s in sends.of("follower")), 10,
            "a claim the follower lost",
        )
        await stop_all(leader)
        gone = real_ms()
        await wait_for(
            lambda: len([c for c in calls.items if c["slot"] > gone]) >= 5, 10,
            "five runs after the leader stopped",
        )
    finally:
        await stop_all(leader, follower)
    assert max(calls.count("slot").values()) == 1, calls.items
    after = sorted(c["slot"] for c in calls.items if c["slot"] > gone)
    assert {c["by"] for c in calls.items if c["slot"] > gone} == {"follower"}
    assert after == list(range(after[0], after[0] + 100 * len(after), 100)), after
    # Its first win came a delay late; it then leads and claims at once.
    first_win = next(s for s in sends.of("follower") if s["kind"] == "won")
    assert first_win["at"] - first_win["slot"] >= FOLLOW_DELAY_MS - 2, first_win
    leading = [s for s in sends.of("follower") if s["slot"] > first_win["slot"]]
    assert leading and all(s["kind"] == "won" for s in leading), leading


async def test_an_instance_still_in_a_jobs_user_code_claims_its_next_slot_later() -> None:
    """Its claim would otherwise always win and run the slots of a slow job side by side
    on one instance: it waits as those that lost the last slot do, and so they meet."""
    backend = MemoryBackend(clock=real_ms)
    sends = Recording(backend)
    calls = Calls()

    def slow(ctx: JobContext) -> None:
        calls.add(slot=ctx.slot)
        time.sleep(0.15)

    scheduler = Scheduler(backend, instance_id="A")
    scheduler.every("slow", "100ms", slow, overlap="allow")
    await scheduler.start()
    try:
        await wait_for(lambda: len(calls) >= 6, 10, "six runs")
    finally:
        await stop_all(scheduler)
    started = sorted(c["slot"] for c in calls.items)
    busy = [s for s in sends.of("A") if s["slot"] - 100 in started[:-1]]
    assert len(busy) >= 4, sends.sent
    assert all(s["at"] - s["slot"] >= FOLLOW_DELAY_MS - 2 for s in busy), busy


async def test_the_next_claim_waits_for_the_end_of_the_jobs_last_run_here() -> None:
    """Issue 10: in a PostgreSQL burst the store answered finishes seconds after the
    handlers returned, the next slot's claims met those runs still ``running``, and 133
    slots were skipped as overlap for runs that were over. The instance whose run is
    ending claims once its end is answered (the memory store's first end is slowed past the
    job's period)."""
    backend = MemoryBackend(clock=real_ms)
    sends = Recording(backend)
    real_finish_many = backend.runs.finish_many
    slow = {"ends": 1}
    answered: list[tuple[int, int]] = []

    async def finish_many(ends: list[Any]) -> list[bool]:
        # The first end of a run that started on time (a run of the slot found due at
        # start starts late, and its end would hold two slots back).
        on_time = all(end.result.started_at - end.slot < 50 for end in ends)
        if slow["ends"] > 0 and on_time:
            slow["ends"] -= 1
            await asyncio.sleep(0.25)  # longer than the job's period
        result = await real_finish_many(ends)
        answered.extend((end.slot, real_ms()) for end in ends)
        return result

    backend.runs.finish_many = finish_many  # type: ignore[method-assign]
    calls = Calls()
    await _ticks_run_without_a_skip(backend, lambda ctx: calls.add(slot=ctx.slot), calls, 6)
    # Each claim left only once the end of the slot before had been answered.
    ended = dict(answered)
    for sent in sends.of("A"):
        if sent["slot"] - 200 in ended:
            assert sent["at"] >= ended[sent["slot"] - 200], (sent, ended)


async def test_a_full_pool_sends_the_slots_it_follows_with_the_next_batch() -> None:
    """Issue 10: at +20 ms a burst's losers held back the jobs another instance won last,
    and sent them one claim per freed thread, hundreds of round trips between the runs.
    They go together with the first batch that leaves."""
    backend = MemoryBackend(clock=real_ms)
    batches: list[int] = []
    real_many = backend.runs.claim_many

    async def claim_many(claims: list[RunClaim]) -> list[ClaimOutcome]:
        batches.append(len(claims))
        return await real_many(claims)

    backend.runs.claim_many = claim_many  # type: ignore[method-assign]
    s = Scheduler(backend, instance_id="F", threads=2)
    names = [f"followed{i}" for i in range(50)]
    for name in names:
        s.every(name, "1h", lambda ctx: None, offset=off_the_clock())
    await s.start()
    try:
        flows = s._claims
        flows._followed.update(names)  # another instance won each job's last slot
        flows.capacity.take(40)  # and this instance's pool is full, runs queued for it
        slot = real_ms() - 10
        for name in names:
            flows.due(s.get_job(name), slot)
        await asyncio.sleep(0.2)  # past the follow delay: held back for a thread
        assert batches == []
        flows.capacity.give(39)  # a thread is free: one claim goes, and the backups with it
        await wait_for(lambda: sum(batches) == 50, 2, "every slot claimed")
        assert batches == [50], batches
    finally:
        await stop_all(s)


async def test_held_slots_share_one_timer_and_each_goes_when_its_own_wait_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 10: a burst's losers held hundreds of jobs the follow delay, a loop timer
    each. One timer serves them all now, set for the earliest; a job held for a run
    still ending here goes at its follow delay once that end is answered, not at the
    later time the timer was first set for."""
    from django_anarchon.engine import claims

    monkeypatch.setattr(claims, "FOLLOW_DELAY_MS", 100)
    backend = MemoryBackend(clock=real_ms)
    sent: dict[str, float] = {}
    real_many, real_claim = backend.runs.claim_many, backend.runs.claim

    async def claim_many(batch: list[RunClaim]) -> list[ClaimOutcome]:
        sent.update((c.job, time.monotonic()) for c in batch)
        return await real_many(batch)

    async def claim(c: RunClaim) -> ClaimOutcome:
        sent[c.job] = time.monotonic()
        return await real_claim(c)

    backend.runs.claim_many = claim_many  # type: ignore[method-assign]
    backend.runs.claim = claim  # type: ignore[method-assign]
    s = Scheduler(backend, instance_id="F")
    followed = [f"followed{i}" for i in range(100)]
    for name in [*followed, "ending", "still-ending"]:
        # An ending holds up to 2 s.
        s.every(name, "1h", lambda ctx: None, max_late="4s", offset=off_the_clock())
    await s.start()
    try:
        flows, loop = s._claims, asyncio.get_running_loop()
        flows._followed.update([*followed, "ending", "still-ending"])
        for name in ("ending", "still-ending"):  # a run of each left user code here
            flows.user_code_started(name)
            flows.user_code_done(name, ending=True)
        timers = len(loop._scheduled)  # type: ignore[attr-defined]
        began, slot = time.monotonic(), real_ms() - 10
        for name in followed:
            flows.due(s.get_job(name), slot)
        assert len(loop._scheduled) == timers + 1  # type: ignore[attr-defined]
        await wait_for(lambda: len(sent) == 100, 2, "the followed jobs claimed")
        assert all(0.095 <= sent[name] - began < 0.5 for name in followed), sent
        # Held for a run ending here too: the one timer is set for the end of that wait.
        began = time.monotonic()
        for name in ("ending", "still-ending"):
            flows.due(s.get_job(name), slot)
        await asyncio.sleep(0.03)
        flows.run_ended("ending")  # answered within the follow delay
        await wait_for(lambda: "ending" in sent, 2, "'ending' claimed")
        assert 0.095 <= sent["ending"] - began < 0.5, sent["ending"] - began
        assert "still-ending" not in sent
        flows.run_ended("still-ending")  # answered after it: goes at once
        await wait_for(lambda: "still-ending" in sent, 2, "'still-ending' claimed")
    finally:
        await stop_all(s)


async def test_a_run_still_in_user_code_when_the_next_slot_falls_due_is_waited_for_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The next slot fell due while the run was still in its handler (held the follow
    delay), and the run was ending when that delay was over: the claim waits for its end.
    A CI run on a loaded machine skipped the slot as overlap when the wait was decided at
    the slot alone."""
    from django_anarchon.engine import claims

    monkeypatch.setattr(claims, "FOLLOW_DELAY_MS", 100)
    backend = MemoryBackend(clock=real_ms)
    real_finish_many = backend.runs.finish_many
    first = {"run": True, "end": True}

    async def finish_many(ends: list[Any]) -> list[bool]:
        if first["end"] and not first["run"]:  # 150 ms after the handler below returned
            first["end"] = False
            await asyncio.sleep(0.15)
        return await real_finish_many(ends)

    backend.runs.finish_many = finish_many  # type: ignore[method-assign]
    calls = Calls()

    def handler(ctx: JobContext) -> None:
        calls.add(slot=ctx.slot)
        if first["run"] and real_ms() - ctx.slot < 50:  # a run that started on time:
            # still here when the next slot falls due, gone 5 ms later
            time.sleep(max(ctx.slot / 1000 + 0.205 - time.time(), 0))
            first["run"] = False

    await _ticks_run_without_a_skip(backend, handler, calls, 4)


async def _ticks_run_without_a_skip(
    backend: MemoryBackend, handler: Any, calls: Calls, runs: int
) -> None:
    """One instance runs ``tick`` every 200 ms until ``runs`` ran: none was skipped, and
    every slot ran, one after the other."""
    scheduler = Scheduler(backend, instance_id="A")
    events = Events(scheduler, names=("skip",))
    scheduler.every("tick", "200ms", handler, max_late="2s")
    await scheduler.start()
    try:
        await wait_for(lambda: len(calls) >= runs, 10, f"{runs} runs")
    finally:
        await stop_all(scheduler)
    assert events.named("skip") == [], events.items
    slots = sorted(c["slot"] for c in calls.items)
    assert slots == list(range(slots[0], slots[0] + 200 * len(slots), 200)), slots


@pytest.mark.parametrize("how", ["alone", "batch"])
async def test_a_claim_whose_answer_was_lost_is_asked_again_past_max_late(how: str) -> None:
    """A fault run (PostgreSQL restarted): a batch's claim reached the store, its answer
    was lost with the connection, and the retries with the same token met a server still
    starting until after the slot's ``max_late``. They gave up there, so the run stayed
    held and never started. A claim is asked again within its lease past ``max_late``:
    the store answers the same token ``won`` (and one it never saw ``late``)."""
    backend = MemoryBackend(clock=real_ms)
    lost_until = time.monotonic() + 0.5  # the store answers nothing for 500 ms
    real_claim, real_many = backend.runs.claim, backend.runs.claim_many

    async def claim(c: RunClaim) -> ClaimOutcome:
        outcome = await real_claim(c)
        if time.monotonic() < lost_until:
            raise ConnectionError("server closed the connection unexpectedly")
        return outcome

    async def claim_many(batch: list[RunClaim]) -> list[ClaimOutcome]:
        outcomes = await real_many(batch)
        if time.monotonic() < lost_until:
            raise ConnectionError("server closed the connection unexpectedly")
        return outcomes

    backend.runs.claim = claim  # type: ignore[method-assign]
    backend.runs.claim_many = claim_many  # type: ignore[method-assign]
    calls = Calls()
    s = Scheduler(backend, instance_id="A")
    names = ["lost"] if how == "alone" else ["lost", "lost-too"]
    for name in names:
        s.every(name, "1h", lambda ctx: calls.add(job=ctx.name, slot=ctx.slot), max_late="200ms",
                offset=off_the_clock())
    await s.start()
    try:
        slot = real_ms() - 10
        for name in names:
            s._claims.due(s.get_job(name), slot)
        await wait_for(lambda: len(calls) == len(names), 3, "every slot started")
        assert time.monotonic() >= lost_until  # after the answers came back, past max_late
    finally:
        await stop_all(s)
    assert sorted(c["job"] for c in calls.items) == names


class _FlakyClockedClaimOnly(FlakyClaimBackend):
    """A claim-only store that tells its clock (as Redis ``stream-id`` does), whose claims
    and batches of claims fail ``failures`` times first."""

    async def store_now(self, job: str) -> int:  # type: ignore[override]
        return real_ms()

    async def claim_many(self, inputs: list[ClaimInput]) -> list[bool]:
        self.maybe_fail(inputs[0].job)
        return await super().claim_many(inputs)


@pytest.mark.parametrize("jobs", [1, 2])
async def test_a_worker_ahead_retries_a_claim_until_the_stores_deadline(
    skew: Any, jobs: int
) -> None:
    """On a claim-only store that tells its clock, a claim that fails is sent again until
    ``slot + max_late`` by the store's clock. A worker 5 s ahead gave up by its own clock,
    at once here, and skipped the slot as late while the store would still take it: a
    slot missed whenever every worker's claim met an outage. Alone (``claim``) and due
    together (``claim_many``, retried as a batch: one that gave up went on as a claim
    per slot)."""
    skew(5_000)
    backend = _FlakyClockedClaimOnly(failures=2)
    calls = Calls()
    ahead = Scheduler(backend, instance_id="ahead")
    events = Events(ahead)
    when = datetime.fromtimestamp((real_ms() + 400) / 1000, tz=UTC).isoformat()
    for i in range(jobs):
        ahead.at(f"once{i}", when, lambda ctx: calls.add(slot=ctx.slot, at=real_ms()),
                 max_late="3s")
    await ahead.start()
    try:
        await wait_for(lambda: len(calls) == jobs or bool(events.named("skip")), 10,
                       "the runs, or a skip")
    finally:
        await stop_all(ahead)
    assert not events.named("skip"), [(e.job, e.reason) for e in events.named("skip")]
    assert len(calls) == jobs and backend.failures == 0
    if jobs > 1:
        assert not backend.tokens, f"the batch gave up: {backend.tokens}"
