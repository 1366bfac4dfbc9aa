"""One scheduler's runs: overlap, retries, timeouts, manual runs, data, events, signals."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from django_anarchon import signals
from django_anarchon.backends.base import FinalStatus, RunEnd
from django_anarchon.backends.memory import MemoryBackend, MemoryRunStore
from django_anarchon.engine import JobContext, Scheduler
from django_anarchon.engine.events import Event

from .test_engine_support import Calls, Events, LoopThread, iso_in, wait_for


async def test_overlap_skip_skips_a_slot_while_the_previous_run_goes_on() -> None:
    s = Scheduler(MemoryBackend(), instance_id="A")
    events = Events(s)
    calls = Calls()

    async def slow(ctx: JobContext) -> None:
        calls.add(slot=ctx.slot)
        if len(calls) == 1:
            await asyncio.sleep(0.45)

    s.every("slow", "100ms", slow)
    await s.start()
    try:
        await wait_for(lambda: bool(events.named("skip", reason="overlap")), 3, "an overlap skip")
    finally:
        await s.stop()
    skip = events.named("skip", reason="overlap")[0]
    assert skip.job == "slow" and skip.instance_id == "A" and skip.slot is not None
    assert skip.scheduled_at is not None
    assert skip.slot not in {c["slot"] for c in calls.items}


async def test_overlap_allow_runs_slots_side_by_side() -> None:
    s = Scheduler(MemoryBackend(), instance_id="A")
    events = Events(s)
    running = Calls()
    concurrent = threading.Event()

    async def slow(ctx: JobContext) -> None:
        running.add(slot=ctx.slot)
        if sum(j.running_here for j in s.jobs()) >= 2:
            concurrent.set()
        await ctx.signal.sleep(0.35)

    s.every("slow", "100ms", slow, overlap="allow")
    await s.start()
    try:
        await wait_for(concurrent.is_set, 3, "two runs of one job at once")
    finally:
        await s.stop()
    assert not events.named("skip", reason="overlap")


async def test_a_failed_attempt_is_retried_while_attempts_remain() -> None:
    s = Scheduler(MemoryBackend(), instance_id="A")
    calls = Calls()

    def flaky(ctx: JobContext) -> None:
        calls.add(attempt=ctx.attempt, reason=ctx.reason)
        if ctx.attempt == 1:
            raise RuntimeError("first attempt fails")

    s.at("flaky", iso_in(100), flaky, max_attempts=2)
    await s.start()
    try:
        await wait_for(lambda: len(calls) == 2, 3, "the retry")
    finally:
        await s.stop()
    history = await s.ahistory("flaky")
    assert [(r.attempt, r.status) for r in history] == [(2, "success"), (1, "failed")]
    failed = history[1]
    assert failed.error is not None and failed.error.startswith("RuntimeError: first attempt fails")
    assert "Traceback" in failed.error


async def test_async_timeout_cancels_and_records_failed() -> None:
    s = Scheduler(MemoryBackend(), instance_id="A")
    cancelled = threading.Event()

    async def hang(ctx: JobContext) -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    s.at("hang", iso_in(50), hang, timeout="200ms")
    await s.start()
    try:
        await wait_for(lambda: s.jobs()[0].running_here == 0 and cancelled.is_set(), 3, "timeout")
    finally:
        await s.stop()
    (record,) = await s.ahistory("hang")
    assert record.status == "failed"
    assert record.error is not None and record.error.startswith("JobTimeoutError:")
    assert record.duration_ms is not None and 150 <= record.duration_ms < 3000


async def test_sync_timeout_records_failed_at_once_and_ignores_the_late_return() -> None:
    s = Scheduler(MemoryBackend(), instance_id="A")
    seen: list[str | None] = []
    finished = threading.Event()

    def hang(ctx: JobContext) -> str:
        ctx.signal.wait(5)
        seen.append(ctx.signal.reason)
        finished.set()
        return "too late"

    events = Events(s)
    s.at("hang", iso_in(50), hang, timeout="200ms")
    await s.start()
    try:
        await wait_for(lambda: bool(events.named("failure")), 3, "the timeout failure")
        await wait_for(finished.is_set, 3, "the thread to see the abort")
    finally:
        await s.stop()
    assert seen == ["timeout"]
    (record,) = await s.ahistory("hang")
    assert record.status == "failed"
    assert record.error is not None and "JobTimeoutError" in record.error


def _manual_job(s: Scheduler, calls: Calls) -> None:
    def handler(ctx: JobContext) -> None:
        calls.add(manual=ctx.manual, reason=ctx.reason, attempt=ctx.attempt, data=ctx.data)

    s.every("report", "1h", handler, data={"from": "job"})


def test_run_now_sync_when_not_running() -> None:
    s = Scheduler(MemoryBackend(), instance_id="A", data={"from": "scheduler"})
    calls = Calls()
    _manual_job(s, calls)
    record = s.run_now("report", data={"full": True})
    assert record.status == "success" and record.manual and record.reason == "manual"
    assert calls.items == [
        {"manual": True, "reason": "manual", "attempt": 1, "data": {"full": True}}
    ]
    record = s.run_now("report")
    assert calls.items[-1]["data"] == {"from": "job"}
    history = s.history("report")
    assert len(history) == 2 and all(r.manual and r.status == "success" for r in history)
    assert s.last_run("report") == history[0]


def test_run_now_sync_while_running_on_another_thread() -> None:
    s = Scheduler(MemoryBackend(), instance_id="A")
    calls = Calls()
    _manual_job(s, calls)
    runner = LoopThread(s).start()
    try:
        record = s.run_now("report")
        assert record.manual and record.status == "success"
        assert s.last_run("report") == record
    finally:
        runner.stop()


async def test_arun_now_and_the_sync_twin_refused_on_the_loop() -> None:
    s = Scheduler(MemoryBackend(), instance_id="A")
    calls = Calls()
    _manual_job(s, calls)
    await s.start()
    try:
        record = await s.arun_now("report", data=[1, 2])
        assert record.manual and record.attempt == 1 and record.reason == "manual"
        # The hourly slot may fall due while the test runs: only the manual call counts.
        assert calls.where(manual=True)[-1]["data"] == [1, 2]
        with pytest.raises(RuntimeError, match="arun_now"):
            s.run_now("report")
        assert (await s.alast_run("report")) == record
    finally:
        await s.stop()


async def test_data_providers_sync_and_async_and_a_failing_one() -> None:
    s = Scheduler(MemoryBackend(), instance_id="A")
    calls = Calls()

    def handler(ctx: JobContext) -> None:
        calls.add(job=ctx.name, data=ctx.data)

    async def async_provider(ctx: JobContext) -> dict[str, Any]:
        return {"slot": ctx.slot, "data_was": ctx.data}

    def broken(ctx: JobContext) -> None:
        raise ValueError("no data today")

    s.every("sync", "1h", handler, data=lambda ctx: {"name": ctx.name})
    s.every("async", "1h", handler, data=async_provider)
    s.every("broken", "1h", handler, data=broken)
    assert (await s.arun_now("sync")).status == "success"
    record = await s.arun_now("async")
    assert calls.where(job="async")[0]["data"] == {"slot": record.slot, "data_was": None}
    assert calls.where(job="sync")[0]["data"] == {"name": "sync"}
    failed = await s.arun_now("broken")
    assert failed.status == "failed" and "ValueError: no data today" in (failed.error or "")
    assert not calls.where(job="broken")


async def test_unknown_job_names_are_refused() -> None:
    from django_anarchon.exceptions import UnknownJobError

    s = Scheduler(MemoryBackend(), instance_id="A")
    with pytest.raises(UnknownJobError, match="nope"):
        await s.arun_now("nope")
    with pytest.raises(UnknownJobError):
        await s.ahistory("nope")
    with pytest.raises(UnknownJobError):
        s.unregister("nope")
    with pytest.raises(ValueError, match="unknown event"):
        s.on("finished", print)


async def test_events_and_django_signals_carry_the_run() -> None:
    s = Scheduler(MemoryBackend(), instance_id="A")
    events = Events(s)
    received: list[tuple[str, Event]] = []

    def receiver(sender: Any, scheduler: Scheduler, event: Event, **kw: Any) -> None:
        assert scheduler is s and sender is Scheduler and "signal" in kw
        received.append((event.name, event))

    watched = (signals.run_started, signals.run_succeeded, signals.run_failed)
    for sig in watched:
        sig.connect(receiver)
    try:
        s.every("ok", "1h", lambda ctx: None)
        s.every("bad", "1h", lambda ctx: 1 / 0)
        ok = await s.arun_now("ok")
        bad = await s.arun_now("bad")
    finally:
        for sig in watched:
            sig.disconnect(receiver)
    names = [(e.name, e.job) for e in events.items]
    assert names == [("start", "ok"), ("success", "ok"), ("start", "bad"), ("failure", "bad")]
    assert [(n, e.job) for n, e in received] == names
    start = events.items[0]
    assert start.record is not None and start.record.status == "running"
    assert start.slot == ok.slot and start.instance_id == "A" and start.reason == "manual"
    assert start.scheduled_at == ok.scheduled_at
    assert events.items[1].record == ok
    failure = events.items[3]
    assert failure.record == bad and failure.error is not None
    assert failure.error.startswith("ZeroDivisionError")
    assert failure.to_dict()["record"]["status"] == "failed"


async def test_an_event_is_built_only_for_those_listening_when_it_happens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 10: a run emits several events; with nobody listening, building each and
    asking its signal for receivers was a tenth of a worker's time in a burst. A
    receiver or callback added while the scheduler runs still gets every later one."""
    from django_anarchon.engine import runner, scheduler

    built: list[str] = []

    class Counted(Event):
        def __init__(self, **fields: Any) -> None:
            built.append(fields["name"])
            super().__init__(**fields)

    monkeypatch.setattr(runner, "Event", Counted)
    monkeypatch.setattr(scheduler, "Event", Counted)
    s = Scheduler(MemoryBackend(), instance_id="A")
    s.every("ok", "1h", lambda ctx: None)
    await s.arun_now("ok")
    assert built == []
    received: list[str] = []

    def receiver(sender: Any, scheduler: Scheduler, event: Event, **kw: Any) -> None:
        received.append(event.name)

    signals.run_succeeded.connect(receiver)
    try:
        await s.arun_now("ok")
        assert built == received == ["success"]
        s.on("start", lambda event: received.append(f"callback {event.name}"))
        await s.arun_now("ok")
    finally:
        signals.run_succeeded.disconnect(receiver)
    assert built == ["success", "start", "success"]
    assert received == ["success", "callback start", "success"]
    await s.arun_now("ok")
    assert built[3:] == ["start"]


async def test_raising_handlers_and_callbacks_never_stop_the_scheduler() -> None:
    s = Scheduler(MemoryBackend(), instance_id="A")
    calls = Calls()

    def bad_callback(event: Event) -> None:
        raise RuntimeError("callback bug")

    async def bad_async_callback(event: Event) -> None:
        raise RuntimeError("async callback bug")

    def bad_receiver(sender: Any, **kw: Any) -> None:
        raise RuntimeError("receiver bug")

    def handler(ctx: JobContext) -> None:
        calls.add(slot=ctx.slot)
        raise KeyError("handler bug")

    for name in ("start", "failure"):
        s.on(name, bad_callback)
        s.on(name, bad_async_callback)
    signals.run_failed.connect(bad_receiver)
    s.every("bug", "100ms", handler)
    await s.start()
    try:
        await wait_for(lambda: len(calls) >= 3, 3, "runs going on despite every bug")
        assert s.running
    finally:
        signals.run_failed.disconnect(bad_receiver)
        await s.stop()
    s.off("start", bad_callback)
    history = await s.ahistory("bug")
    # A run that raises after stop() aborted its signal is "interrupted"; the rest failed.
    assert len([r for r in history if r.status == "failed"]) >= 3
    assert {r.status for r in history} <= {"failed", "interrupted"}


async def test_a_cron_job_with_seconds_runs_on_its_instants() -> None:
    s = Scheduler(MemoryBackend(), instance_id="A")
    calls = Calls()
    s.cron("each-second", "* * * * * *", lambda ctx: calls.add(slot=ctx.slot), max_late="300ms")
    await s.start()
    try:
        await wait_for(lambda: len(calls) >= 2, 4, "two cron runs")
    finally:
        await s.stop()
    slots = [c["slot"] for c in calls.items]
    assert all(slot % 1000 == 0 for slot in slots), slots
    assert slots == sorted(set(slots))


async def test_a_sync_callable_returning_a_coroutine_is_awaited() -> None:
    s = Scheduler(MemoryBackend(), instance_id="A")
    seen: list[int] = []

    async def work(ctx: JobContext) -> None:
        await asyncio.sleep(0)
        seen.append(ctx.slot)

    s.every("wrapped", "1h", lambda ctx: work(ctx))
    record = await s.arun_now("wrapped")
    assert record.status == "success" and seen == [record.slot]


async def test_a_stop_while_a_sync_callables_coroutine_runs_records_it_as_started() -> None:
    """The thread says when a sync call starts only for a timeout: a coroutine it returned
    has still started, and its record must not say the handler never did."""
    s = Scheduler(MemoryBackend(), instance_id="A")
    began = asyncio.Event()

    async def work(ctx: JobContext) -> None:
        began.set()
        await asyncio.sleep(30)

    s.every("wrapped-long", "1h", lambda ctx: work(ctx))
    await s.start()
    run = asyncio.create_task(s.arun_now("wrapped-long"))
    try:
        await asyncio.wait_for(began.wait(), 5)
    finally:
        await s.stop("50ms")
    record = await run
    assert record.status == "interrupted", record
    assert record.error is not None and "before its handler started" not in record.error, record


class _CountingEnds(MemoryRunStore):
    """The memory lease store, counting the ends each ``finish_many`` call carried."""

    def __init__(self, backend: MemoryBackend) -> None:
        super().__init__(backend._state)
        self.batches: list[int] = []
        self.finishes = 0

    async def finish(self, job: str, slot: int, token: str, status: FinalStatus) -> bool:
        self.finishes += 1
        return await super().finish(job, slot, token, status)

    async def finish_many(self, ends: list[RunEnd]) -> list[bool]:
        self.batches.append(len(ends))
        return await super().finish_many(ends)


async def test_runs_that_end_together_are_finished_and_recorded_in_few_store_calls() -> None:
    """50 runs ending at once: their finishes and records go in one or two calls, not 100."""
    backend = MemoryBackend()
    runs = backend.runs = _CountingEnds(backend)
    calls = Calls()
    go = asyncio.Event()

    async def handler(ctx: JobContext) -> None:
        calls.add(job=ctx.name)
        await go.wait()

    s = Scheduler(backend, instance_id="A")
    at = iso_in(200)
    for i in range(50):
        s.at(f"end{i}", at, handler)
    await s.start()
    try:
        await wait_for(lambda: len(calls) == 50, 10, "50 runs started")
        go.set()
        await wait_for(lambda: sum(runs.batches) == 50, 10, "50 ends sent")
        for i in range(50):
            (record,) = await s.ahistory(f"end{i}")
            assert record.status == "success", record
    finally:
        await s.stop()
    assert runs.finishes == 0
    assert len(runs.batches) <= 2, runs.batches
