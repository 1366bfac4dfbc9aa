"""The Prometheus collector: each metric's values after known events on the memory store.

Real schedulers, real time; every wait is a condition with a deadline. The scrape of a
real worker process is in tests/test_worker_ops.py.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from prometheus_client import CollectorRegistry

from django_anarchon.backends.memory import MemoryBackend
from django_anarchon.contrib.prometheus import (
    METRIC_NAMES,
    missed_count,
    refresh_pauses,
    register,
    watch_pauses,
)
from django_anarchon.engine import JobContext, Scheduler

from .test_engine_support import (
    Calls,
    ClaimOnlyMemoryBackend,
    LoopThread,
    iso_in,
    now_ms,
    wait_for,
)


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    """A sample's value; an absent series is 0 (what a counter that never moved means)."""
    found = registry.get_sample_value(name, {"scheduler": "default", **labels})
    return 0.0 if found is None else found


async def test_success_failure_skips_and_gauges() -> None:
    registry = CollectorRegistry()
    s = Scheduler(MemoryBackend(), instance_id="A")
    long_calls = Calls()

    def ok(ctx: JobContext) -> None:
        pass

    def bad(ctx: JobContext) -> None:
        raise RuntimeError("boom")

    async def long(ctx: JobContext) -> None:
        long_calls.add(slot=ctx.slot)
        if len(long_calls) == 1:
            await asyncio.sleep(0.7)  # the next slots meet it: overlap skips

    async def blocker(ctx: JobContext) -> None:
        time.sleep(0.5)  # noqa: ASYNC251 - blocks the loop: "tight" claims too late

    when = iso_in(300)
    s.at("ok", when, ok)
    s.at("bad", when, bad)
    s.every("long", "200ms", long)
    s.every("tight", "100ms", ok, max_late="20ms")
    s.at("blocker", iso_in(600), blocker)
    register(s, registry)
    # Registered series exist from the start, at zero.
    assert registry.get_sample_value(
        "anarchon_running_runs", {"scheduler": "default", "job": "ok"}
    ) == 0
    assert registry.get_sample_value(
        "anarchon_job_interval_seconds", {"scheduler": "default", "job": "long"}
    ) == pytest.approx(0.2)
    before = time.time()
    await s.start()
    try:
        await wait_for(
            lambda: value(registry, "anarchon_runs_total", job="ok", status="success") == 1
            and value(registry, "anarchon_runs_total", job="bad", status="failed") == 1
            and value(registry, "anarchon_skips_total", job="long", reason="overlap") >= 1
            and value(registry, "anarchon_skips_total", job="tight", reason="late") >= 1,
            10,
            "a success, a failure, an overlap skip and a late skip",
        )
    finally:
        await s.stop(grace=2)
    after = time.time()
    assert value(registry, "anarchon_runs_total", job="ok", status="failed") == 0
    assert value(registry, "anarchon_runs_total", job="bad", status="success") == 0
    last = value(registry, "anarchon_last_success_timestamp_seconds", job="ok")
    assert before <= last <= after
    assert value(registry, "anarchon_last_success_timestamp_seconds", job="bad") == 0
    assert value(registry, "anarchon_run_start_lateness_seconds_count", job="ok") == 1
    assert 0 <= value(registry, "anarchon_run_start_lateness_seconds_sum", job="ok") < 1
    assert value(registry, "anarchon_claims_total", job="ok", outcome="won") == 1
    assert value(registry, "anarchon_claims_total", job="long", outcome="overlap") >= 1
    assert value(registry, "anarchon_claims_total", job="tight", outcome="late") >= 1
    for job in ("ok", "bad", "long", "tight", "blocker"):
        assert value(registry, "anarchon_running_runs", job=job) == 0, job
    assert value(registry, "anarchon_takeovers_total", job="ok") == 0
    # Label values are bounded: no slot, token or instance id in any of them.
    for metric in registry.collect():
        assert metric.name in {n.removesuffix("_total") for n in METRIC_NAMES}, metric.name
        for sample in metric.samples:
            assert set(sample.labels) <= {"scheduler", "job", "status", "reason", "outcome",
                                          "operation", "le"}, sample
            assert "A" not in sample.labels.values()


async def test_takeover_and_lost_lease() -> None:
    backend = MemoryBackend()
    started = threading.Event()
    taken = Calls()

    async def handler(ctx: JobContext) -> None:
        if ctx.instance_id == "A":
            started.set()
            time.sleep(2.0)  # noqa: ASYNC251 - blocks A's loop: no heartbeat can be sent
        else:
            taken.add(at=now_ms())

    a = Scheduler(backend, instance_id="A", lease="600ms", heartbeat="200ms")
    b = Scheduler(backend, instance_id="B", lease="600ms", heartbeat="200ms")
    registries = {"A": CollectorRegistry(), "B": CollectorRegistry()}
    when = iso_in(200)
    for s in (a, b):
        s.at("report", when, handler, max_attempts=2)
        register(s, registries[s.instance_id])
    runner = LoopThread(a).start()
    try:
        await asyncio.to_thread(started.wait, 5)
        assert started.is_set()
        await b.start()
        await wait_for(
            lambda: value(registries["A"], "anarchon_lost_leases_total", job="report") == 1
            and value(registries["B"], "anarchon_runs_total", job="report", status="success") == 1,
            10,
            "B's takeover and A's lost lease",
        )
    finally:
        runner.stop()
        await b.stop()
    ra, rb = registries["A"], registries["B"]
    assert value(rb, "anarchon_takeovers_total", job="report") == 1
    assert value(ra, "anarchon_takeovers_total", job="report") == 0
    assert value(ra, "anarchon_runs_total", job="report", status="interrupted") == 1
    assert value(rb, "anarchon_lost_leases_total", job="report") == 0
    assert value(ra, "anarchon_claims_total", job="report", outcome="won") == 1
    assert value(rb, "anarchon_claims_total", job="report", outcome="running") >= 1
    assert value(ra, "anarchon_running_runs", job="report") == 0
    assert value(rb, "anarchon_running_runs", job="report") == 0


def test_unregister_stops_counting() -> None:
    registry = CollectorRegistry()
    s = Scheduler(MemoryBackend(), instance_id="A")
    s.at("ok", iso_in(100), lambda ctx: None)
    registration = register(s, registry)
    registration.unregister()
    s.run_now("ok")
    assert value(registry, "anarchon_runs_total", job="ok", status="success") == 0
    register(s, registry)  # the same registry again: the same metrics, no duplicate error
    s.run_now("ok")
    assert value(registry, "anarchon_runs_total", job="ok", status="success") == 1


async def test_claim_only_store_counts_won_and_lost() -> None:
    backend = ClaimOnlyMemoryBackend()
    schedulers = [Scheduler(backend, instance_id=i) for i in "AB"]
    registry = CollectorRegistry()  # one registry, one scheduler alias: the sum of both
    when = iso_in(200)
    for s in schedulers:
        s.at("once", when, lambda ctx: None)
        register(s, registry)
    for s in schedulers:
        await s.start()
    try:
        await wait_for(
            lambda: value(registry, "anarchon_claims_total", job="once", outcome="won")
            + value(registry, "anarchon_claims_total", job="once", outcome="lost") == 2
            and value(registry, "anarchon_runs_total", job="once", status="success") == 1,
            10,
            "both claims answered and the run done",
        )
    finally:
        for s in schedulers:
            await s.stop(grace=2)
    assert value(registry, "anarchon_claims_total", job="once", outcome="won") == 1
    assert value(registry, "anarchon_claims_total", job="once", outcome="lost") == 1


async def test_paused_skips_and_the_paused_gauge_follow_the_store() -> None:
    registry = CollectorRegistry()
    s = Scheduler(MemoryBackend(), instance_id="A")
    s.every("tick", "200ms", lambda ctx: None, max_late="150ms")
    s.every("other", "1h", lambda ctx: None)
    register(s, registry)
    assert registry.get_sample_value(
        "anarchon_job_paused", {"scheduler": "default", "job": "tick"}
    ) is None  # not read yet: no series, rather than a 0 nobody knows
    await s.start()
    watcher = asyncio.create_task(watch_pauses([s], registry, every=0.05))
    try:
        await wait_for(lambda: registry.get_sample_value(
            "anarchon_job_paused", {"scheduler": "default", "job": "tick"}) == 0, 5,
            "the first read of the pauses")
        await s.apause("tick", note="deploy", by="ops")
        await wait_for(
            lambda: value(registry, "anarchon_job_paused", job="tick") == 1
            and value(registry, "anarchon_skips_total", job="tick", reason="paused") >= 2,
            10, "the paused gauge at 1 and two paused skips",
        )
        assert value(registry, "anarchon_job_paused", job="other") == 0
        await s.aresume("tick")
        await wait_for(lambda: value(registry, "anarchon_job_paused", job="tick") == 0, 5,
                       "the paused gauge back at 0")
    finally:
        watcher.cancel()
        await s.stop(grace=2)
    assert value(registry, "anarchon_skips_total", job="tick", reason="other") == 0


async def test_a_claim_only_store_is_never_paused() -> None:
    registry = CollectorRegistry()
    s = Scheduler(ClaimOnlyMemoryBackend(), instance_id="A")
    s.every("tick", "1m", lambda ctx: None)
    register(s, registry)
    await refresh_pauses(s, registry)
    assert registry.get_sample_value(
        "anarchon_job_paused", {"scheduler": "default", "job": "tick"}) == 0


async def test_missed_slots_are_counted_one_by_one() -> None:
    """The look back writes a range of missed slots as one event: the counter adds them all."""
    registry = CollectorRegistry()
    s = Scheduler(MemoryBackend(), instance_id="B", lease="1s")
    s.every("gap", "1m", lambda ctx: None, max_late="1s")
    s.every("gap.fast", "10s", lambda ctx: None, max_late="1s")
    register(s, registry)
    events: list[str | None] = []
    s.on("missed", lambda event: events.append(event.reason))
    jobs = s.registered_jobs()
    known = now_ms() - 10 * 60_000  # the store has known the jobs for ten minutes
    assert await s.ledgers.look_back(jobs, {job.name: known for job in jobs}) == 2
    for name in ("gap", "gap.fast"):
        entries = [e for e in await s.aledger(name) if e.fate == "missed"]
        total = sum(e.count for e in entries)
        assert total >= {"gap": 9, "gap.fast": 59}[name], entries
        assert value(registry, "anarchon_slots_missed_total", job=name) == total
    assert all(missed_count(reason) > 1 for reason in events), events


def test_the_count_of_a_missed_event_is_read_from_its_reason() -> None:
    assert missed_count("12 slot(s) to 2026-11-29T12:10:00+00:00") == 12
    assert missed_count("1 slot(s) to 2026-11-29T12:10:00+00:00") == 1
    assert missed_count(None) == 1 and missed_count("missed") == 1
