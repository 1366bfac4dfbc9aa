"""Several schedulers sharing one store: exactly once, takeover, hand-over, catch-up.

Real time and the real memory store; every wait is a condition with a deadline.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from django_anarchon.backends.base import ActiveRun, ClaimInput, ClaimOutcome, RunClaim, RunEnd
from django_anarchon.backends.memory import MemoryBackend, MemoryRunStore
from django_anarchon.engine import JobContext, Scheduler

from .test_engine_support import (
    Calls,
    ClaimOnlyMemoryBackend,
    Events,
    FlakyClaimBackend,
    LoopThread,
    iso_in,
    now_ms,
    stop_all,
    wait_for,
)

JOBS = ("alpha", "beta", "gamma", "delta")


async def _exactly_once(backend: MemoryBackend, seconds: float) -> None:
    calls = Calls()

    def make(job: str) -> Any:
        async def async_handler(ctx: JobContext) -> None:
            calls.add(job=job, slot=ctx.slot, by=ctx.instance_id)
            await asyncio.sleep(0.005)

        def sync_handler(ctx: JobContext) -> None:
            calls.add(job=job, slot=ctx.slot, by=ctx.instance_id)

        return async_handler if job in ("alpha", "gamma") else sync_handler

    schedulers = [Scheduler(backend, instance_id=i, lease="2s") for i in ("A", "B", "C")]
    # Under CPU contention a run may still be finishing when the next slot is due; with
    # overlap "skip" that slot would be skipped by design, so leases allow overlap here.
    extra = {"overlap": "allow"} if backend.runs is not None else {}
    for s in schedulers:
        for job in JOBS:
            s.every(job, "100ms", make(job), jitter="20ms" if job == "beta" else 0, **extra)
    events = Events(*schedulers, names=("skip", "error"))
    for s in schedulers:
        await s.start()
    first = now_ms()
    await asyncio.sleep(seconds)
    last = now_ms()
    await stop_all(*schedulers)

    counts = calls.count("job", "slot")
    assert counts, "nothing ran"
    assert max(counts.values()) == 1, {k: v for k, v in counts.items() if v > 1}
    for job in JOBS:
        slots = sorted(slot for (j, slot) in counts if j == job)
        # Every slot due while all three ran (with room for the claim) ran exactly once.
        due = range((first // 100 + 1) * 100, last - 150, 100)
        missing = [s for s in due if s not in slots]
        assert not missing, (job, missing, [e for e in events.items if e.job == job])
        history = await schedulers[0].ahistory(job, limit=1000)
        per_slot: dict[int, list[str]] = {}
        for record in history:
            assert record.status == "success", record
            assert record.attempt == 1 and record.reason == "scheduled", record
            per_slot.setdefault(record.slot, []).append(record.instance_id)
        assert all(len(v) == 1 for v in per_slot.values()), per_slot
        assert sorted(per_slot) == slots
    winners = {item["by"] for item in calls.items}
    assert winners <= {"A", "B", "C"}


async def test_three_schedulers_run_every_slot_exactly_once() -> None:
    await _exactly_once(MemoryBackend(), 3.0)


async def test_claim_only_backend_runs_every_slot_exactly_once() -> None:
    await _exactly_once(ClaimOnlyMemoryBackend(), 1.5)


async def test_store_error_during_claim_is_retried_with_the_same_token() -> None:
    backend = FlakyClaimBackend(failures=2)
    calls = Calls()
    s = Scheduler(backend, instance_id="A")
    s.at("once", iso_in(150), lambda ctx: calls.add(slot=ctx.slot))
    await s.start()
    try:
        await wait_for(lambda: len(calls) == 1, what="the run after two failed claims")
    finally:
        await s.stop()
    records = await s.ahistory("once")
    tokens = [t for (job, _slot, t) in backend.tokens if job == "once"]
    assert len(tokens) == 3, backend.tokens
    assert len(set(tokens)) == 1, "a retried claim must send the same token"
    assert [r.status for r in records] == ["success"]


async def test_blocked_runner_is_taken_over_and_its_late_finish_refused() -> None:
    backend = MemoryBackend()
    calls = Calls()
    started = threading.Event()

    async def handler(ctx: JobContext) -> None:
        calls.add(by=ctx.instance_id, attempt=ctx.attempt, reason=ctx.reason, at=now_ms())
        if ctx.instance_id == "A":
            started.set()
            time.sleep(2.0)  # noqa: ASYNC251 - blocks A's loop: no heartbeat can be sent

    a = Scheduler(backend, instance_id="A", lease="600ms", heartbeat="200ms")
    b = Scheduler(backend, instance_id="B", lease="600ms", heartbeat="200ms")
    events = Events(a, b)
    when = iso_in(200)
    for s in (a, b):
        s.at("report", when, handler, max_attempts=2)
    runner = LoopThread(a).start()
    try:
        await asyncio.to_thread(started.wait, 5)
        assert started.is_set()
        await b.start()
        await wait_for(lambda: bool(calls.where(by="B")), 5, "B's takeover")
        taken = calls.where(by="B")[0]
        first = calls.where(by="A")[0]
        assert taken["attempt"] == 2 and taken["reason"] == "takeover"
        # lease + heartbeat (+ B's poll and CPU contention slack)
        assert taken["at"] - first["at"] < 600 + 200 + 600, taken["at"] - first["at"]
        await wait_for(lambda: bool(events.named("lost", instance_id="A")), 5, "A's lost event")
    finally:
        runner.stop()
        await b.stop()
    lost = events.named("lost", instance_id="A")[0]
    assert lost.record is not None and lost.record.status == "interrupted"
    assert lost.reason == "takeover"
    history = await b.ahistory("report")
    by_attempt = {(r.instance_id, r.attempt): r for r in history}
    assert by_attempt[("B", 2)].status == "success"
    assert by_attempt[("B", 2)].reason == "takeover"
    assert by_attempt[("A", 1)].status == "interrupted"
    assert "lease lost" in (by_attempt[("A", 1)].error or "")
    assert len(calls) == 2


async def test_stop_hands_a_running_run_to_a_backup_at_once() -> None:
    backend = MemoryBackend()
    calls = Calls()
    release = threading.Event()
    started = threading.Event()

    def handler(ctx: JobContext) -> None:
        calls.add(by=ctx.instance_id, attempt=ctx.attempt, reason=ctx.reason, at=now_ms())
        if ctx.instance_id == "A":
            started.set()
            release.wait(10)  # ignores its abort signal: only the grace ends it

    a = Scheduler(backend, instance_id="A", lease="10s", heartbeat="200ms")
    b = Scheduler(backend, instance_id="B", lease="10s", heartbeat="200ms")
    events = Events(a, b)
    when = iso_in(150)
    for s in (a, b):
        s.at("deploy", when, handler, max_attempts=2)
    await a.start()
    try:
        await asyncio.to_thread(started.wait, 5)
        await b.start()
        stop_at = now_ms()
        await a.stop(grace="100ms")
        await wait_for(lambda: bool(calls.where(by="B")), 5, "B takes the run over")
        taken = calls.where(by="B")[0]
        assert taken["attempt"] == 2 and taken["reason"] == "takeover"
        assert taken["at"] - stop_at < 2_000, "the backup must not wait for the 10 s lease"
        await wait_for(lambda: bool(events.named("success", instance_id="B")), 5, "B's success")
    finally:
        release.set()
        await stop_all(a, b)
    history = {(r.instance_id, r.attempt): r for r in await b.ahistory("deploy")}
    assert history[("A", 1)].status == "interrupted"
    assert history[("B", 2)].status == "success"
    interrupted = events.named("interrupted", instance_id="A")
    assert interrupted and interrupted[0].reason == "stop"


async def test_a_backup_told_overlap_still_takes_the_blocking_run_over() -> None:
    """B starts after the long run's slot: its own slot is an overlap, yet it guards the run."""
    backend = MemoryBackend()
    calls = Calls()
    release = threading.Event()
    started = threading.Event()

    def handler(ctx: JobContext) -> None:
        calls.add(by=ctx.instance_id, attempt=ctx.attempt, reason=ctx.reason, slot=ctx.slot)
        if ctx.instance_id == "A":
            started.set()
            release.wait(10)  # ignores its abort signal: only the grace ends it

    a = Scheduler(backend, instance_id="A", lease="10s", heartbeat="200ms")
    b = Scheduler(backend, instance_id="B", lease="10s", heartbeat="200ms")
    events = Events(a, b)
    for s in (a, b):
        # max_late below the interval: B, started later, claims the next slot, not A's.
        s.every("long", "600ms", handler, max_attempts=2, max_late="150ms")
    await a.start()
    try:
        await asyncio.to_thread(started.wait, 5)
        first = calls.where(by="A")[0]["slot"]
        await wait_for(lambda: now_ms() > first + 200, 5, "A's slot to be past max_late")
        await b.start()
        await wait_for(
            lambda: bool(events.named("skip", instance_id="B")), 5, "B's slot skipped as an overlap"
        )
        assert events.named("skip", instance_id="B")[0].reason == "overlap"
        stop_at = now_ms()
        await a.stop(grace="100ms")
        await wait_for(lambda: bool(calls.where(by="B")), 5, "B takes the run over")
        taken = calls.where(by="B")[0]
        assert (taken["slot"], taken["attempt"], taken["reason"]) == (first, 2, "takeover")
        assert now_ms() - stop_at < 2_000, "the backup must not wait for the 10 s lease"
    finally:
        release.set()
        await stop_all(a, b)


async def test_a_handler_finishing_within_the_grace_keeps_its_result() -> None:
    backend = MemoryBackend()
    started = threading.Event()

    def handler(ctx: JobContext) -> str:
        started.set()
        time.sleep(0.3)  # never looks at its signal: its work is done when it returns
        return "done"

    s = Scheduler(backend, instance_id="A")
    s.at("graceful", iso_in(100), handler)
    await s.start()
    await asyncio.to_thread(started.wait, 5)
    await s.stop(grace="5s")
    (record,) = await s.ahistory("graceful")
    assert record.status == "success"


async def test_a_handler_that_returns_once_it_saw_the_stop_is_interrupted() -> None:
    """Issue 9, item 14: ``ctx.signal.wait(20)`` cut short by a stop was recorded success."""
    backend = MemoryBackend()
    started = threading.Event()

    def handler(ctx: JobContext) -> None:
        started.set()
        ctx.signal.wait(20)

    s = Scheduler(backend, instance_id="A")
    s.at("cut-short", iso_in(100), handler)
    await s.start()
    await asyncio.to_thread(started.wait, 5)
    await s.stop(grace="5s")
    (record,) = await s.ahistory("cut-short")
    assert record.status == "interrupted", record


async def test_catch_up_runs_the_missed_slot_once_after_everyone_was_down() -> None:
    backend = MemoryBackend()
    calls = Calls()

    def handler(ctx: JobContext) -> None:
        calls.add(by=ctx.instance_id, slot=ctx.slot, reason=ctx.reason)

    # Start at least 300 ms after a 1 s slot so it is past max_late (100 ms) for sure.
    await asyncio.sleep(((300 - now_ms() % 1000) % 1000) / 1000)
    missed = now_ms() // 1000 * 1000
    a = Scheduler(backend, instance_id="A")
    a.every("nightly", "1s", handler, max_late="100ms", catch_up="10s")
    await a.start()
    try:
        await wait_for(lambda: bool(calls.where(slot=missed)), 3, "the catch-up run")
    finally:
        await a.stop()
    assert calls.where(slot=missed)[0]["reason"] == "catch-up"
    # Another instance starting later finds it done: no second run.
    b = Scheduler(backend, instance_id="B")
    b.every("nightly", "1s", handler, max_late="100ms", catch_up="10s")
    await b.start()
    try:
        await asyncio.sleep(0.2)
        history = await b.ahistory("nightly", limit=100)
    finally:
        await b.stop()
    assert len(calls.where(slot=missed)) == 1
    records = [r for r in history if r.slot == missed]
    assert [(r.instance_id, r.reason, r.status) for r in records] == [("A", "catch-up", "success")]


async def test_at_job_runs_once_across_instances() -> None:
    backend = MemoryBackend()
    calls = Calls()
    schedulers = [Scheduler(backend, instance_id=i) for i in "ABC"]
    when = iso_in(150)
    for s in schedulers:
        s.at("launch", when, lambda ctx: calls.add(by=ctx.instance_id))
        await s.start()
    try:
        await wait_for(lambda: len(calls) == 1, what="the one-off run")
        await asyncio.sleep(0.3)
        assert all(s.jobs()[0].next_run_at is None for s in schedulers)
    finally:
        await stop_all(*schedulers)
    assert len(calls) == 1


class CountingRunStore(MemoryRunStore):
    def __init__(self, backend: MemoryBackend) -> None:
        super().__init__(backend._state)
        self.batches: list[int] = []
        self.active_calls = 0

    async def active(self, job: str) -> list[ActiveRun]:
        self.active_calls += 1
        return await super().active(job)

    async def claim_many(self, claims: list[RunClaim]) -> list[ClaimOutcome]:
        self.batches.append(len(claims))
        return await super().claim_many(claims)


class CountingClaimOnlyBackend(ClaimOnlyMemoryBackend):
    def __init__(self) -> None:
        super().__init__()
        self.batches: list[int] = []

    async def claim_many(self, inputs: list[ClaimInput]) -> list[bool]:
        self.batches.append(len(inputs))
        return await super().claim_many(inputs)


async def _claims_due_together(backend: MemoryBackend, batches: list[int]) -> None:
    calls = Calls()
    # Threads for all thirty: a full pool would claim the rest later, alone (back-pressure).
    schedulers = [Scheduler(backend, instance_id=i, threads=40) for i in "AB"]
    extra = {"overlap": "allow"} if backend.runs is not None else {}  # see _exactly_once
    for s in schedulers:
        for i in range(30):
            s.every(
                f"job-{i}", "200ms", lambda ctx: calls.add(job=ctx.name, slot=ctx.slot), **extra
            )
        await s.start()
    events = Events(*schedulers, names=("skip", "error"))
    try:
        await wait_for(
            lambda: len({slot for (_, slot) in calls.count("job", "slot")}) >= 3,
            5,
            "three slots of thirty jobs",
        )
    finally:
        await stop_all(*schedulers)
    counts = calls.count("job", "slot")
    assert max(counts.values()) == 1
    assert batches and max(batches) >= 30, batches
    for slot in sorted({slot for (_, slot) in counts})[:-1]:  # the last may still be partial
        assert sum(1 for (_, s) in counts if s == slot) == 30, (slot, events.items)


async def test_claims_due_together_go_in_one_claim_many_call() -> None:
    backend = MemoryBackend()
    runs = backend.runs = CountingRunStore(backend)
    await _claims_due_together(backend, runs.batches)
    # With one attempt per run there is nothing to take over: losers do not watch.
    assert runs.active_calls == 0


async def test_claim_only_claims_due_together_go_in_one_claim_many_call() -> None:
    backend = CountingClaimOnlyBackend()
    await _claims_due_together(backend, backend.batches)


class FlakyRunStore(MemoryRunStore):
    """The memory lease store whose claim, heartbeat and finish each fail twice first."""

    def __init__(self, backend: MemoryBackend) -> None:
        super().__init__(backend._state)
        self.failures = {"claim": 2, "heartbeat": 2, "finish": 2}
        self.tokens: dict[str, list[str]] = {"claim": [], "heartbeat": [], "finish": []}

    def _maybe_fail(self, call: str, token: str) -> None:
        self.tokens[call].append(token)
        if self.failures[call] > 0:
            self.failures[call] -= 1
            raise ConnectionError(f"{call}: store unreachable (test)")

    async def claim(self, input: RunClaim) -> ClaimOutcome:
        self._maybe_fail("claim", input.token)
        return await super().claim(input)

    async def heartbeat(self, job: str, slot: int, token: str, lease_ms: int) -> bool:
        self._maybe_fail("heartbeat", token)
        return await super().heartbeat(job, slot, token, lease_ms)

    async def finish(self, job: str, slot: int, token: str, status: Any) -> bool:
        self._maybe_fail("finish", token)
        return await super().finish(job, slot, token, status)

    async def finish_many(self, ends: list[RunEnd]) -> list[bool]:
        for end in ends:
            self._maybe_fail("finish", end.token)
        return await super().finish_many(ends)


class FlakyOneByOneRunStore(FlakyRunStore):
    """The same, without ``finish_many``: finish(), then save_result(), as other stores do."""

    finish_many = None  # type: ignore[assignment]


class FlakySaveBackend(MemoryBackend):
    def __init__(self) -> None:
        super().__init__()
        self.save_failures = 2

    async def save_result(
        self, job: str, result: Any, history_size: int, history_ttl_ms: int | None = None
    ) -> None:
        if self.save_failures > 0:
            self.save_failures -= 1
            raise ConnectionError("save_result: store unreachable (test)")
        await super().save_result(job, result, history_size, history_ttl_ms)


@pytest.mark.parametrize("one_by_one", [False, True], ids=["finish_many", "finish-then-save"])
async def test_store_errors_on_a_lease_store_are_retried_and_no_record_is_lost(
    one_by_one: bool, caplog: pytest.LogCaptureFixture,
) -> None:
    backend = FlakySaveBackend()
    runs = backend.runs = (FlakyOneByOneRunStore if one_by_one else FlakyRunStore)(backend)
    calls = Calls()

    async def handler(ctx: JobContext) -> None:
        calls.add(attempt=ctx.attempt)
        await asyncio.sleep(0.5)  # long enough for a few heartbeats

    s = Scheduler(backend, instance_id="A", lease="1s", heartbeat="100ms")
    events = Events(s)
    s.at("flaky", iso_in(100), handler)
    await s.start()
    try:
        await wait_for(lambda: bool(events.named("success")), 10, "the run despite store errors")
    finally:
        await s.stop()
    assert len(calls) == 1
    for call in ("claim", "heartbeat", "finish"):
        assert runs.failures[call] == 0, call
        assert len(set(runs.tokens[call])) == 1, (call, runs.tokens[call])
    # With finish_many the record went with the finish: save_result was never called.
    assert backend.save_failures == (0 if one_by_one else 2)
    (record,) = await s.ahistory("flaky")
    assert (record.status, record.attempt) == ("success", 1)
    assert not events.named("lost")
    # The retries' log lines name the call (formatted only when written).
    slot = record.scheduled_at.isoformat()
    assert f"scheduler {s.name}: finish of job flaky slot {slot} attempt 1 failed" in caplog.text
