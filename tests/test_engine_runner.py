"""One attempt of one run: queued handlers, what a handler raises, aborts, heartbeats, finish.

Real threads and the real memory store. Where a test needs a slow or failing store call,
a wrapper around the real ``MemoryRunStore`` delays or breaks the transport (the call
still reaches the store, or never does), never the store's answer.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from django_anarchon.backends.base import ActiveRun, FinalStatus, RunClaim, RunEnd
from django_anarchon.backends.memory import MemoryBackend, MemoryRunStore
from django_anarchon.engine import JobContext, Scheduler
from django_anarchon.engine.events import Event

from .test_engine_support import Calls, Events, LoopThread, iso_in, wait_for, wait_for_sync

T = TypeVar("T")


def _log_records(s: Scheduler, log: Calls) -> None:
    """Append every recorded attempt's end to ``log`` (in order, with the handler bodies)."""

    def ended(event: Event) -> None:
        assert event.record is not None
        log.add(
            what="record", job=event.job, attempt=event.record.attempt, status=event.record.status
        )

    for name in ("success", "failure", "interrupted"):
        s.on(name, ended)


def _bodies_after_their_record(log: Calls) -> list[dict[str, Any]]:
    """Handler bodies that started after their own attempt had been recorded."""
    recorded: set[tuple[str, int]] = set()
    late = []
    for item in list(log.items):
        key = (item["job"], item["attempt"])
        if item["what"] == "record":
            recorded.add(key)
        elif key in recorded:
            late.append(item)
    return late


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


# -- item 4: a queued sync handler ---------------------------------------------------------


async def test_a_queued_sync_handler_starts_its_timeout_when_it_starts() -> None:
    """threads=1: the victim waits for the thread; its timeout counts from its own start."""
    s = Scheduler(MemoryBackend(), instance_id="A", threads=1)
    log = Calls()
    _log_records(s, log)

    def blocker(ctx: JobContext) -> None:
        log.add(what="body", job="blocker", attempt=ctx.attempt)
        ctx.signal.wait(3.5)  # holds the only thread longer than two victim timeouts

    def victim(ctx: JobContext) -> None:
        log.add(what="body", job="victim", attempt=ctx.attempt)
        time.sleep(0.4)  # well inside its timeout once it runs

    s.at("blocker", iso_in(50), blocker)
    await s.start()
    try:
        await wait_for(lambda: bool(log.where(what="body", job="blocker")), 5, "the blocker")
        s.at("victim", iso_in(50), victim, timeout="1s", max_attempts=2)
        await wait_for(
            lambda: (
                bool(log.where(what="record", job="victim"))
                and bool(log.where(what="body", job="victim"))
            ),
            15,
            "the victim to run and be recorded",
        )
    finally:
        await s.stop("5s")
    assert not _bodies_after_their_record(log), log.items
    victim_records = [(i["attempt"], i["status"]) for i in log.where(what="record", job="victim")]
    assert victim_records == [(1, "success")]


async def test_a_queued_sync_handler_taken_over_never_starts() -> None:
    """threads=1: the victim's run is taken over while it waits; its body never runs here."""
    offset = [0]
    backend = MemoryBackend(clock=lambda: _wall_ms() + offset[0])
    s = Scheduler(backend, instance_id="A", threads=1, lease="2s", heartbeat="100ms")
    log = Calls()
    events = Events(s)
    free = threading.Event()

    def blocker(ctx: JobContext) -> None:
        log.add(what="body", job="blocker", attempt=ctx.attempt)
        free.wait(10)

    def provider(ctx: JobContext) -> str:
        log.add(what="body", job="provider", attempt=ctx.attempt)
        return "data"

    def victim(ctx: JobContext) -> None:
        log.add(what="body", job="victim", attempt=ctx.attempt)

    s.at("blocker", iso_in(50), blocker)
    await s.start()
    try:
        await wait_for(lambda: bool(log.where(what="body", job="blocker")), 5, "the blocker")
        s.at("victim", iso_in(50), victim, data=provider, max_attempts=2)
        await wait_for(lambda: bool(events.named("start", job="victim")), 5, "the victim's attempt")
        slot = events.named("start", job="victim")[0].slot
        assert slot is not None

        async def take_over() -> bool:
            offset[0] += 3_000  # the store's clock: A's lease has lapsed
            claim = RunClaim(
                job="victim",
                slot=slot,
                token="other",
                instance_id="B",
                history_size=20,
                mode="takeover",
                reason="takeover",
                lease_ms=60_000,
                max_attempts=2,
            )
            return (await backend.runs.claim(claim)).kind == "won"

        deadline = time.monotonic() + 5
        while not await take_over():
            assert time.monotonic() < deadline, "the takeover claim never won"
        await wait_for(lambda: bool(events.named("lost", job="victim")), 5, "A losing the run")
        free.set()
        # The pool is FIFO: once a probe queued now has run, the victim's item has had its turn.
        await asyncio.wrap_future(s.executor().submit(lambda: None))
    finally:
        free.set()
        await s.stop("5s")
    assert not log.where(what="body", job="provider")
    assert not log.where(what="body", job="victim")
    (record,) = [r for r in await s.ahistory("victim") if r.instance_id == "A"]
    assert record.status == "interrupted"


async def test_a_sync_handler_still_queued_when_the_grace_ends_never_starts() -> None:
    s = Scheduler(MemoryBackend(), instance_id="A", threads=1)
    log = Calls()
    events = Events(s)
    free = threading.Event()
    threads: list[threading.Thread] = []

    def blocker(ctx: JobContext) -> None:
        log.add(what="body", job="blocker", attempt=ctx.attempt)
        threads.append(threading.current_thread())
        free.wait(10)  # ignores its signal: holds the thread past the grace

    def victim(ctx: JobContext) -> None:
        log.add(what="body", job="victim", attempt=ctx.attempt)

    s.at("blocker", iso_in(50), blocker)
    await s.start()
    try:
        await wait_for(lambda: bool(log.where(what="body", job="blocker")), 5, "the blocker")
        s.at("victim", iso_in(50), victim, max_attempts=2)
        await wait_for(lambda: bool(events.named("start", job="victim")), 5, "the victim's attempt")
        await s.stop("300ms")  # the blocker outlives the grace; the victim is still queued
        free.set()  # the thread is free now: the victim must still not start
        # The stopped pool's thread works through its queue, then exits.
        await wait_for(lambda: not threads[0].is_alive(), 5, "the pool thread to finish")
    finally:
        free.set()
        await s.stop()
    assert not log.where(what="body", job="victim")
    (record,) = await s.ahistory("victim")
    assert record.status == "interrupted"
    assert record.error is not None and "before its handler started" in record.error


async def test_a_run_queued_at_a_stop_still_starts_within_the_grace() -> None:
    """A stop's abort alone does not forbid the start: the won run may still run."""
    s = Scheduler(MemoryBackend(), instance_id="A", threads=1)
    log = Calls()
    events = Events(s)

    def blocker(ctx: JobContext) -> None:
        log.add(what="body", job="blocker", attempt=ctx.attempt)
        ctx.signal.wait(10)  # returns at once on the stop, freeing the thread

    def quick(ctx: JobContext) -> None:  # never looks at its signal: runs to its end
        log.add(what="body", job="quick", attempt=ctx.attempt)

    s.at("blocker", iso_in(50), blocker)
    await s.start()
    try:
        await wait_for(lambda: bool(log.where(what="body", job="blocker")), 5, "the blocker")
        s.at("quick", iso_in(50), quick)
        await wait_for(lambda: bool(events.named("start", job="quick")), 5, "quick's attempt")
    finally:
        await s.stop("5s")
    assert log.where(what="body", job="quick")
    (record,) = await s.ahistory("quick")
    assert record.status == "success"
    (blocked,) = await s.ahistory("blocker")
    assert blocked.status == "interrupted"  # it saw the abort: cut short


# -- item 12: whatever a handler raises is the attempt's failure ----------------------------


async def _wrong_signature() -> None:  # called with ctx: TypeError on call
    pass


async def _async_exit(ctx: JobContext) -> None:
    raise SystemExit(3)


def _sync_interrupt(ctx: JobContext) -> None:
    raise KeyboardInterrupt


async def _async_provider_exit(ctx: JobContext) -> None:
    raise SystemExit("provider")


def _sync_provider_interrupt(ctx: JobContext) -> None:
    raise KeyboardInterrupt


def test_handlers_and_providers_raising_anything_are_recorded_failed() -> None:
    backend = MemoryBackend()
    s = Scheduler(backend, instance_id="A", lease="5s")
    ticks = Calls()
    cases: dict[str, tuple[Any, Any, str]] = {
        "wrong-signature": (_wrong_signature, None, "TypeError"),
        "async-exit": (_async_exit, None, "SystemExit: 3"),
        "sync-interrupt": (_sync_interrupt, None, "KeyboardInterrupt"),
        "async-provider-exit": (_async_exit, _async_provider_exit, "SystemExit: provider"),
        "sync-provider-interrupt": (_async_exit, _sync_provider_interrupt, "KeyboardInterrupt"),
    }
    at = iso_in(150)
    for name, (handler, data, _) in cases.items():
        s.at(name, at, handler, data=data)
    s.every("tick", "100ms", lambda ctx: ticks.add(slot=ctx.slot))
    loop = LoopThread(s).start()
    try:

        def all_recorded() -> bool:
            return all(s.history(name) for name in cases)

        wait_for_sync(all_recorded, 10, "a record of every raising handler")
        ticked = len(ticks)
        wait_for_sync(lambda: len(ticks) >= ticked + 3, 5, "the scheduler going on")
        for name, (_, _, error) in cases.items():
            (record,) = s.history(name)
            assert record.status == "failed", (name, record)
            assert record.error is not None and error in record.error, (name, record.error)
            # The lease was finished: the run is no longer active in the store.
            assert asyncio.run(backend.runs.active(name)) == [], name
    finally:
        loop.stop()


# -- item 14: a handler that returns after its signal was aborted --------------------------


async def test_a_handler_returning_after_a_stop_is_interrupted_and_handed_over() -> None:
    backend = MemoryBackend()
    a = Scheduler(backend, instance_id="A", lease="10s", heartbeat="100ms")
    b = Scheduler(backend, instance_id="B", lease="10s", heartbeat="100ms")
    runs = Calls()

    def report(ctx: JobContext) -> None:
        runs.add(by=ctx.instance_id, attempt=ctx.attempt)
        if ctx.instance_id == "A":
            ctx.signal.wait(20)  # the README's pattern; cut short by the stop

    at = iso_in(100)
    for s in (a, b):
        s.at("report", at, report, max_attempts=2, max_late="30s")
    await a.start()
    try:
        await wait_for(lambda: len(runs) == 1, 5, "A's run")
        await b.start()
        await a.stop("5s")
        # Released, not left to lapse: B takes over well inside the 10 s lease.
        await wait_for(lambda: len(runs) == 2, 5, "B taking the run over")
    finally:
        await a.stop()
        await b.stop()
    assert runs.items == [{"by": "A", "attempt": 1}, {"by": "B", "attempt": 2}]
    history = {r.attempt: r for r in await b.ahistory("report")}
    assert history[1].status == "interrupted" and history[1].instance_id == "A"
    assert history[2].status == "success" and history[2].instance_id == "B"


async def test_an_async_handler_returning_after_an_abort_is_interrupted() -> None:
    s = Scheduler(MemoryBackend(), instance_id="A")
    started = asyncio.Event()

    async def polite(ctx: JobContext) -> None:
        started.set()
        await ctx.signal.sleep(20)

    s.at("polite", iso_in(50), polite)
    await s.start()
    try:
        await asyncio.wait_for(started.wait(), 5)
    finally:
        await s.stop("5s")
    (record,) = await s.ahistory("polite")
    assert record.status == "interrupted"
    assert record.error is not None and "stop" in record.error


# -- item 4 (suspected): heartbeats against finish and release -----------------------------


class _Transport:
    """The runs store of a ``MemoryBackend`` behind a transport that the test slows or breaks."""

    def __init__(self, inner: MemoryRunStore) -> None:
        self.inner = inner
        self.heartbeat_latency = 0.0
        self.heartbeats_in_flight = 0
        self.heartbeat_answers: list[bool] = []
        #: What each finish call does: "lost-reply" (reaches the store, then raises),
        #: "down" (raises without reaching it); once empty, calls go through.
        self.finish_plan: list[str] = []
        self.finish_calls = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def heartbeat(self, job: str, slot: int, token: str, lease_ms: int) -> bool:
        self.heartbeats_in_flight += 1

        async def travel() -> bool:
            try:
                await asyncio.sleep(self.heartbeat_latency)  # the request is on its way
                alive = await self.inner.heartbeat(job, slot, token, lease_ms)
                self.heartbeat_answers.append(alive)
                return alive
            finally:
                self.heartbeats_in_flight -= 1

        # Like a call already in a database thread: cancelling the caller does not stop it.
        return await asyncio.shield(asyncio.ensure_future(travel()))

    async def finish(self, job: str, slot: int, token: str, status: FinalStatus) -> bool:
        return await self._finishing(self.inner.finish(job, slot, token, status))

    async def finish_many(self, ends: list[RunEnd]) -> list[bool]:
        return await self._finishing(self.inner.finish_many(ends))

    async def _finishing(self, call: Coroutine[Any, Any, T]) -> T:
        self.finish_calls += 1
        step = self.finish_plan.pop(0) if self.finish_plan else "ok"
        if step == "down":
            call.close()
            raise ConnectionError("store unreachable (test)")
        answer = await call
        if step == "lost-reply":
            raise ConnectionError("connection reset after the request was sent (test)")
        return answer

    async def active(self, job: str) -> list[ActiveRun]:
        return await self.inner.active(job)


def _transport_backend() -> tuple[MemoryBackend, _Transport]:
    backend = MemoryBackend()
    transport = _Transport(backend.runs)
    backend.runs = transport  # type: ignore[assignment]
    return backend, transport


async def test_a_heartbeat_in_flight_cannot_renew_a_released_lease() -> None:
    backend, transport = _transport_backend()
    transport.heartbeat_latency = 0.5
    s = Scheduler(backend, instance_id="A", lease="3s", heartbeat="200ms")
    started = asyncio.Event()

    async def deaf(ctx: JobContext) -> None:
        started.set()
        await asyncio.sleep(30)  # ignores its signal: the stop interrupts it

    s.at("deaf", iso_in(50), deaf, max_attempts=2)
    await s.start()
    try:
        await asyncio.wait_for(started.wait(), 5)
        await wait_for(lambda: transport.heartbeats_in_flight > 0, 5, "a heartbeat in flight")
    finally:
        await s.stop(0)  # interrupted at once, its lease released
    await wait_for(lambda: transport.heartbeats_in_flight == 0, 5, "the heartbeat to land")
    (run,) = await backend.runs.active("deaf")
    assert not run.alive, "a heartbeat landed after release() and renewed the lease"
    (record,) = await s.ahistory("deaf")
    assert record.status == "interrupted"


async def test_heartbeats_go_on_while_finish_is_retried() -> None:
    """A finish retried for longer than the lease: no watcher may take the run over."""
    backend, transport = _transport_backend()
    transport.finish_plan = ["down"] * 5  # 50+100+200+400+800 ms of retries > the lease
    schedulers = [
        Scheduler(backend, instance_id=i, lease="600ms", heartbeat="100ms") for i in ("A", "B")
    ]
    runs = Calls()
    events = Events(*schedulers)

    def quick(ctx: JobContext) -> None:
        runs.add(by=ctx.instance_id, attempt=ctx.attempt)

    at = iso_in(300)
    for s in schedulers:
        s.at("quick", at, quick, max_attempts=2)
    for s in schedulers:
        await s.start()
    try:
        await wait_for(
            lambda: bool(events.named("success") or events.named("lost")), 10, "the finish"
        )
    finally:
        for s in schedulers:
            await s.stop()
    assert transport.finish_calls >= 6
    assert len(runs) == 1, f"the run ran again while its finish was retried: {runs.items}"
    assert not events.named("lost")
    history = await schedulers[0].ahistory("quick")
    assert [(r.attempt, r.status) for r in history] == [(1, "success")]


# -- a claim whose answer waited before the start ----------------------------------------


async def _stall_after_the_win(
    take_over: bool,
) -> tuple[Scheduler, _Transport, Calls, Events]:
    """A wins a lease of 300 ms; its loop then waits 0.5 s before the attempt starts (as a
    stalled event loop does); meanwhile B takes the lapsed run over, or nobody does."""
    backend, transport = _transport_backend()
    s = Scheduler(backend, instance_id="A", lease="300ms", heartbeat="100ms")
    bodies = Calls()
    events = Events(s)

    async def stall(event: Event) -> None:
        if event.job != "victim" or event.reason != "won":
            return
        await asyncio.sleep(0.5)  # the stall itself: longer than the whole lease
        if not take_over:
            return
        assert event.slot is not None
        claim = RunClaim(
            job="victim", slot=event.slot, token="other", instance_id="B", history_size=20,
            mode="takeover", reason="takeover", lease_ms=60_000, max_attempts=2,
        )
        deadline = time.monotonic() + 5
        while (await backend.runs.claim(claim)).kind != "won":
            assert time.monotonic() < deadline, "the takeover claim never won"

    def victim(ctx: JobContext) -> None:
        bodies.add(by=ctx.instance_id, attempt=ctx.attempt)

    s.on("claim", stall)
    s.at("victim", iso_in(50), victim, max_attempts=2)
    await s.start()
    try:
        await wait_for(
            lambda: bool(events.named("success") or events.named("interrupted")), 5, "A's record"
        )
    finally:
        await s.stop()
    return s, transport, bodies, events


async def test_a_won_claim_taken_over_before_its_start_never_starts() -> None:
    """The start renews a lease older than a heartbeat: refused, the handler never runs
    (before, it ran beside the backup's attempt until its first heartbeat was refused)."""
    s, transport, bodies, events = await _stall_after_the_win(take_over=True)
    assert not bodies.items, "A started a run that B had taken over"
    assert transport.heartbeat_answers == [False]  # the renewal before the start, refused
    assert events.named("lost", job="victim")
    (record,) = [r for r in await s.ahistory("victim") if r.instance_id == "A"]
    assert record.status == "interrupted"
    assert record.error is not None and "not started" in record.error


async def test_a_won_claim_still_held_after_a_stall_is_renewed_and_runs() -> None:
    s, transport, bodies, events = await _stall_after_the_win(take_over=False)
    assert [item["by"] for item in bodies.items] == ["A"]
    assert transport.heartbeat_answers[:1] == [True]  # the renewal before the start
    assert not events.named("lost")
    (record,) = await s.ahistory("victim")
    assert record.status == "success"


# -- finish() whose first reply was lost --------------------------------------------------


async def _run_with_lost_finish_reply(
    handler: Callable[[JobContext], Awaitable[None]], max_attempts: int
) -> tuple[Scheduler, _Transport, Events]:
    backend, transport = _transport_backend()
    # First finish reaches the store and its reply is lost; the first retry finds the store
    # down; heartbeats (every 30 ms) land in between and are refused: the run is finished.
    transport.finish_plan = ["lost-reply", "down"]
    s = Scheduler(backend, instance_id="A", lease="1s", heartbeat="30ms")
    events = Events(s)
    s.at("job", iso_in(50), handler, max_attempts=max_attempts)
    await s.start()
    try:
        await wait_for(lambda: bool(events.named("success")), 10, "a successful attempt")
    finally:
        await s.stop()
    return s, transport, events


async def test_a_finish_whose_reply_was_lost_still_records_success() -> None:
    async def ok(ctx: JobContext) -> None:
        pass

    s, transport, events = await _run_with_lost_finish_reply(ok, 1)
    assert transport.finish_calls == 3
    assert False in transport.heartbeat_answers  # the refused heartbeats did happen
    assert not events.named("lost") and not events.named("interrupted")
    assert [(r.attempt, r.status) for r in await s.ahistory("job")] == [(1, "success")]


async def test_a_failed_attempt_whose_finish_reply_was_lost_is_still_retried() -> None:
    async def flaky(ctx: JobContext) -> None:
        if ctx.attempt == 1:
            raise RuntimeError("first attempt fails")

    s, _, events = await _run_with_lost_finish_reply(flaky, 2)
    assert not events.named("lost")
    history = await s.ahistory("job")
    assert [(r.attempt, r.status) for r in history] == [(2, "success"), (1, "failed")]
