"""OpenTelemetry traces (``django_anarchon.contrib.otel``) with the real SDK.

Spans are exported to an ``InMemorySpanExporter`` of a tracer provider of the test's own
(the global one is never set). Real schedulers, real time, the memory store, PostgreSQL
and Redis; every wait is a condition with a deadline.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from django_anarchon.backends.base import Backend, BaseBackend, ClaimInput
from django_anarchon.backends.memory import MemoryBackend
from django_anarchon.contrib.otel import extract_context, inject_context, instrument
from django_anarchon.engine import JobContext, Scheduler

from .support import ROOT, worker_group
from .support import wait_for as sync_wait_for
from .test_engine_support import FlakyClaimBackend, iso_in, off_the_clock

user_tracer_provider = TracerProvider()
user_exporter = InMemorySpanExporter()
user_tracer_provider.add_span_processor(SimpleSpanProcessor(user_exporter))


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    user_exporter.clear()
    yield user_exporter
    user_exporter.clear()


def spans(exporter: InMemorySpanExporter, name: str | None = None) -> list[ReadableSpan]:
    found = list(exporter.get_finished_spans())
    return [s for s in found if name is None or s.name == name]


def children(exporter: InMemorySpanExporter, parent: ReadableSpan) -> list[ReadableSpan]:
    assert parent.context is not None
    return [
        s for s in exporter.get_finished_spans()
        if s.parent is not None and s.parent.span_id == parent.context.span_id
    ]


def names(found: Sequence[ReadableSpan]) -> list[str]:
    return sorted(s.name for s in found)


def attempt_tree(exporter: InMemorySpanExporter, job: str) -> tuple[ReadableSpan, list[ReadableSpan]]:
    (run,) = spans(exporter, f"run {job}")
    return run, children(exporter, run)


async def finished(s: Scheduler, job: str) -> bool:
    """The latest attempt of ``job`` has ended (history lists running attempts too)."""
    return any(r.status != "running" for r in await s.ahistory(job, 1))


async def run_one(
    backend: Backend | BaseBackend, job: str, handler: Any, *, instrumented: bool = True,
    instance: str = "A", **options: Any,
) -> Scheduler:
    """Run one slot of ``job`` on a scheduler of its own and wait for its history record."""
    s = Scheduler(backend, instance_id=instance, heartbeat="50ms", lease="1s")
    s.at(job, iso_in(200), handler, **options)
    if instrumented:
        instrument(s, tracer_provider=user_tracer_provider)
    await s.start()
    try:
        for _ in range(400):
            if await finished(s, job):
                break
            await asyncio.sleep(0.025)
        assert await finished(s, job), f"no run of {job} ended"
    finally:
        await s.stop("2s")
    return s


def check_attempt(run: ReadableSpan, job: str, *, outcome: str, instance: str = "A") -> None:
    attributes = dict(run.attributes or {})
    assert run.kind is SpanKind.INTERNAL
    assert attributes["anarchon.job"] == job
    assert attributes["anarchon.attempt"] == 1
    assert attributes["anarchon.reason"] == "scheduled"
    assert attributes["anarchon.instance"] == instance
    assert attributes["anarchon.outcome"] == outcome
    assert attributes["anarchon.scheduler"] == "default"
    assert str(attributes["anarchon.slot"]).endswith("+00:00")


def check_finish_with_record(below: list[ReadableSpan], job: str) -> None:
    """A lease store with ``finish_many``: the finish wrote the record, no ``save_result``."""
    (finish,) = [s for s in below if s.name == f"finish {job}"]
    assert dict(finish.attributes or {}).get("anarchon.with_record") is True
    assert f"save_result {job}" not in names(below), names(below)


# -- the memory store ----------------------------------------------------------------------


async def test_a_sync_attempt_is_one_span_with_its_claim_store_calls_and_user_span(
    exporter: InMemorySpanExporter,
) -> None:
    tracer = user_tracer_provider.get_tracer("shop")
    seen: dict[str, Any] = {}

    def handler(ctx: JobContext) -> None:
        with tracer.start_as_current_span("fetch prices"):
            seen["carrier"] = inject_context()
        seen["current"] = trace.get_current_span().get_span_context()

    await run_one(MemoryBackend(), "otel.sync", handler)
    run, below = attempt_tree(exporter, "otel.sync")
    check_attempt(run, "otel.sync", outcome="success")
    assert run.parent is None
    assert run.status.status_code is StatusCode.UNSET
    assert {"claim otel.sync", "finish otel.sync", "fetch prices"} <= set(names(below)), names(below)
    check_finish_with_record(below, "otel.sync")
    (claim,) = [s for s in below if s.name == "claim otel.sync"]
    assert claim.kind is SpanKind.CLIENT
    assert dict(claim.attributes or {})["anarchon.outcome"] == "won"
    assert dict(claim.attributes or {})["anarchon.store"] == "memory"
    # The attempt's span starts when its winning claim was sent and encloses it.
    assert run.start_time is not None and claim.start_time is not None
    assert run.start_time == claim.start_time
    assert claim.end_time is not None and run.end_time is not None
    assert claim.end_time <= run.end_time
    # In the pool thread, the attempt's span was current (not a copy of another context).
    assert run.context is not None and seen["current"].span_id == run.context.span_id
    # The carrier is the user span's: a task enqueued there continues this trace.
    (user,) = spans(exporter, "fetch prices")
    assert user.context is not None
    traceparent = seen["carrier"]["traceparent"]
    assert traceparent.split("-")[1:3] == [
        f"{user.context.trace_id:032x}", f"{user.context.span_id:016x}"
    ]
    restored = trace.get_current_span(extract_context(seen["carrier"])).get_span_context()
    assert (restored.trace_id, restored.span_id) == (user.context.trace_id, user.context.span_id)
    # One trace: every span of the attempt shares its trace id.
    assert {s.context.trace_id for s in [*below, run] if s.context} == {run.context.trace_id}


async def test_an_async_handler_runs_under_the_attempt_span(exporter: InMemorySpanExporter) -> None:
    tracer = user_tracer_provider.get_tracer("shop")

    async def handler(ctx: JobContext) -> None:
        with tracer.start_as_current_span("async work"):
            await asyncio.sleep(0.12)  # a heartbeat (every 50 ms) or two meanwhile

    await run_one(MemoryBackend(), "otel.async", handler)
    run, below = attempt_tree(exporter, "otel.async")
    check_attempt(run, "otel.async", outcome="success")
    assert "async work" in names(below)
    assert "heartbeat otel.async" in names(below), names(below)
    (beat, *_) = [s for s in below if s.name == "heartbeat otel.async"]
    assert dict(beat.attributes or {})["anarchon.outcome"] == "accepted"


async def test_a_failing_handler_sets_error_status_without_secrets(
    exporter: InMemorySpanExporter,
) -> None:
    def handler(ctx: JobContext) -> None:
        raise RuntimeError("cannot reach redis://shop:hunter2@cache.example:6379/0")

    await run_one(MemoryBackend(), "otel.fails", handler)
    run, below = attempt_tree(exporter, "otel.fails")
    check_attempt(run, "otel.fails", outcome="failed")
    assert run.status.status_code is StatusCode.ERROR
    assert run.status.description is not None
    assert run.status.description.startswith("RuntimeError: cannot reach redis://")
    assert dict(run.attributes or {})["error.type"] == "RuntimeError"
    (event,) = [e for e in run.events if e.name == "exception"]
    event_attributes = dict(event.attributes or {})
    assert event_attributes["exception.type"] == "RuntimeError"
    assert "raise RuntimeError" in str(event_attributes["exception.stacktrace"])
    everything = repr([(s.name, s.attributes, s.status, [e.attributes for e in s.events])
                       for s in exporter.get_finished_spans()])
    assert "hunter2" not in everything
    assert "cache.example" in everything  # the error is there, only its password masked
    # The run's records still went to the store, under the attempt.
    check_finish_with_record(below, "otel.fails")


async def test_a_timeout_is_the_recorded_error(exporter: InMemorySpanExporter) -> None:
    async def handler(ctx: JobContext) -> None:
        await asyncio.sleep(5)

    await run_one(MemoryBackend(), "otel.timeout", handler, timeout="100ms")
    run, _ = attempt_tree(exporter, "otel.timeout")
    assert run.status.status_code is StatusCode.ERROR
    assert dict(run.attributes or {})["error.type"] == "django_anarchon.exceptions.JobTimeoutError"
    assert dict(run.attributes or {})["anarchon.abort_reason"] == "timeout"


async def test_nothing_is_exported_unless_instrumented(exporter: InMemorySpanExporter) -> None:
    tracer = user_tracer_provider.get_tracer("shop")
    seen: dict[str, Any] = {}

    def handler(ctx: JobContext) -> None:
        seen["carrier"] = inject_context()  # no current span: nothing to carry
        with tracer.start_as_current_span("user span"):
            pass

    await run_one(MemoryBackend(), "otel.off", handler, instrumented=False)
    assert names(spans(exporter)) == ["user span"]  # the user's own, as a root
    assert spans(exporter)[0].parent is None
    assert seen["carrier"] == {}


async def test_uninstrument_stops_the_spans(exporter: InMemorySpanExporter) -> None:
    s = Scheduler(MemoryBackend(), instance_id="A")
    s.at("otel.undone", iso_in(150), lambda ctx: None)
    instrumentation = instrument(s, tracer_provider=user_tracer_provider)
    assert s.tracing is instrumentation.tracing
    instrumentation.uninstrument()
    await s.start()
    try:
        for _ in range(200):
            if await finished(s, "otel.undone"):
                break
            await asyncio.sleep(0.025)
        assert await finished(s, "otel.undone")
    finally:
        await s.stop("2s")
    assert spans(exporter) == []


async def test_the_loser_s_claim_is_a_span_of_its_own(exporter: InMemorySpanExporter) -> None:
    backend = MemoryBackend()
    a = Scheduler(backend, instance_id="A")
    b = Scheduler(backend, instance_id="B")
    when = iso_in(200)

    async def slow(ctx: JobContext) -> None:
        await asyncio.sleep(0.1)

    for s in (a, b):
        s.at("otel.race", when, slow)
        instrument(s, tracer_provider=user_tracer_provider)
    await asyncio.gather(a.start(), b.start())
    try:
        for _ in range(400):
            if await finished(a, "otel.race"):
                break
            await asyncio.sleep(0.025)
    finally:
        await asyncio.gather(a.stop("2s"), b.stop("2s"))
    runs = spans(exporter, "run otel.race")
    assert len(runs) == 1, names(spans(exporter))
    claims = spans(exporter, "claim otel.race")
    assert len(claims) == 2
    (alone,) = [c for c in claims if c.parent is None]
    assert dict(alone.attributes or {})["anarchon.outcome"] in {"running", "done"}
    (won,) = [c for c in claims if c.parent is not None]
    assert runs[0].context is not None and won.parent is not None
    assert won.parent.span_id == runs[0].context.span_id


async def test_claim_many_is_linked_from_each_attempt(exporter: InMemorySpanExporter) -> None:
    s = Scheduler(MemoryBackend(), instance_id="A")
    when = iso_in(200)
    s.at("otel.many1", when, lambda ctx: None)
    s.at("otel.many2", when, lambda ctx: None)
    instrument(s, tracer_provider=user_tracer_provider)
    await s.start()
    try:
        for _ in range(400):
            if await finished(s, "otel.many1") and await finished(s, "otel.many2"):
                break
            await asyncio.sleep(0.025)
    finally:
        await s.stop("2s")
    (batch,) = spans(exporter, "claim_many")
    assert batch.parent is None and batch.context is not None
    assert dict(batch.attributes or {})["anarchon.claims"] == 2
    assert dict(batch.attributes or {})["anarchon.won"] == 2
    for job in ("otel.many1", "otel.many2"):
        run, below = attempt_tree(exporter, job)
        assert [link.context.span_id for link in run.links] == [batch.context.span_id]
        assert "finish " + job in names(below)


class RecordingBackend(FlakyClaimBackend):
    """A claim-only store that fails a claim once, then records each won claim (as brokers do)."""

    def __init__(self) -> None:
        super().__init__(failures=1, job="otel.claimonly")
        self.recorded: list[int] = []

    async def record_claim(self, input: ClaimInput) -> None:
        self.recorded.append(input.slot)


async def test_claim_only_store_and_run_now(exporter: InMemorySpanExporter) -> None:
    backend = RecordingBackend()
    s = Scheduler(backend, instance_id="A")
    s.at("otel.claimonly", iso_in(200), lambda ctx: None)
    s.every("otel.manual", "1h", lambda ctx: None, offset=off_the_clock())
    instrument(s, tracer_provider=user_tracer_provider)
    await s.start()
    try:
        for _ in range(400):
            if await finished(s, "otel.claimonly"):
                break
            await asyncio.sleep(0.025)
        record = await s.arun_now("otel.manual")
        assert record.status == "success"
    finally:
        await s.stop("2s")
    run, below = attempt_tree(exporter, "otel.claimonly")
    assert backend.recorded
    assert {"claim otel.claimonly", "record_claim otel.claimonly",
            "save_result otel.claimonly"} <= set(names(below)), names(below)
    (won,) = [c for c in below if c.name == "claim otel.claimonly"]
    assert dict(won.attributes or {})["anarchon.outcome"] == "won"
    assert run.start_time == won.start_time
    # The try that failed (the store was down) is a span of its own, an error.
    (failed,) = [c for c in spans(exporter, "claim otel.claimonly") if c.parent is None]
    assert failed.status.status_code is StatusCode.ERROR
    assert dict(failed.attributes or {})["error.type"] == "ConnectionError"
    assert failed.end_time is not None and won.start_time is not None
    assert failed.end_time <= won.start_time
    manual, below = attempt_tree(exporter, "otel.manual")
    assert dict(manual.attributes or {})["anarchon.reason"] == "manual"
    assert "record_manual_run otel.manual" in names(below)


async def test_a_stop_releases_and_the_backup_s_takeover_is_its_own_trace(
    exporter: InMemorySpanExporter,
) -> None:
    backend = MemoryBackend()
    started = asyncio.Event()

    async def handler(ctx: JobContext) -> None:
        if ctx.instance_id == "A":
            started.set()
            await ctx.signal.sleep(30)  # woken by the stop: the attempt is interrupted

    a = Scheduler(backend, instance_id="A", lease="10s", heartbeat="200ms")
    b = Scheduler(backend, instance_id="B", lease="10s", heartbeat="200ms")
    when = iso_in(150)
    for s in (a, b):
        s.at("otel.handover", when, handler, max_attempts=2)
        instrument(s, tracer_provider=user_tracer_provider)
    await a.start()
    try:
        await asyncio.wait_for(started.wait(), 5)
        await b.start()
        await a.stop(grace="2s")
        for _ in range(400):
            if any(r.instance_id == "B" and r.status == "success"
                   for r in await b.ahistory("otel.handover")):
                break
            await asyncio.sleep(0.025)
    finally:
        await asyncio.gather(a.stop("2s"), b.stop("2s"))
    by_instance = {
        dict(run.attributes or {})["anarchon.instance"]: run
        for run in spans(exporter, "run otel.handover")
    }
    assert set(by_instance) == {"A", "B"}, names(spans(exporter))
    first, second = dict(by_instance["A"].attributes or {}), dict(by_instance["B"].attributes or {})
    assert (first["anarchon.outcome"], first["anarchon.abort_reason"]) == ("interrupted", "stop")
    assert by_instance["A"].status.status_code is StatusCode.UNSET  # a stop is not an error
    released = [s for s in children(exporter, by_instance["A"]) if s.name == "release otel.handover"]
    assert [dict(s.attributes or {})["anarchon.outcome"] for s in released] == ["accepted"]
    assert (second["anarchon.reason"], second["anarchon.attempt"]) == ("takeover", 2)
    assert second["anarchon.outcome"] == "success"
    assert "claim otel.handover" in names(children(exporter, by_instance["B"]))
    assert by_instance["A"].context is not None and by_instance["B"].context is not None
    assert by_instance["A"].context.trace_id != by_instance["B"].context.trace_id


# -- real stores ---------------------------------------------------------------------------


def check_real_store(exporter: InMemorySpanExporter, job: str, store: str) -> None:
    run, below = attempt_tree(exporter, job)
    check_attempt(run, job, outcome="success")
    assert {f"claim {job}", f"finish {job}", "user"} <= set(names(below))
    check_finish_with_record(below, job)
    for span in below:
        if span.name != "user":
            assert dict(span.attributes or {})["anarchon.store"] == store


async def handler_with_span(ctx: JobContext) -> None:
    with user_tracer_provider.get_tracer("shop").start_as_current_span("user"):
        await asyncio.sleep(0.01)


@pytest.mark.postgres
@pytest.mark.usefixtures("database_access")
async def test_postgres(exporter: InMemorySpanExporter, postgres_database: str) -> None:
    from django_anarchon.backends.database import DatabaseBackend

    job = f"otel.pg.{uuid.uuid4().hex[:8]}"
    await run_one(DatabaseBackend(using=postgres_database), job, handler_with_span)
    check_real_store(exporter, job, "database")


@pytest.mark.redis
async def test_redis(exporter: InMemorySpanExporter) -> None:
    from django_anarchon.backends.redis import RedisBackend

    from .redis_support import delete_prefix, redis_url

    url, prefix = redis_url(), f"anarchon-otel-{uuid.uuid4().hex[:10]}"
    backend = RedisBackend(url=url, key_prefix=prefix)
    try:
        await run_one(backend, "otel.redis", handler_with_span)
    finally:
        await backend.close()
        delete_prefix(url, prefix)
    check_real_store(exporter, "otel.redis", "redis")


# -- without OpenTelemetry -----------------------------------------------------------------

_BLOCKED = textwrap.dedent('''
    import importlib.abc, sys

    class Blocker(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "opentelemetry" or name.startswith("opentelemetry."):
                raise ModuleNotFoundError(f"No module named {name!r}")
            return None

    sys.meta_path.insert(0, Blocker())
    import django
    from django.conf import settings
    settings.configure(INSTALLED_APPS=["django_anarchon"], USE_TZ=True)
    django.setup()
    import django_anarchon, django_anarchon.engine
    from django_anarchon.contrib import otel
    from django_anarchon.backends.memory import MemoryBackend
    assert not otel.HAVE_OTEL
    assert otel.inject_context() == {}
    assert otel.extract_context({"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}) is None
    try:
        otel.instrument(django_anarchon.engine.Scheduler(MemoryBackend()))
    except ImportError as exc:
        print("REFUSED", exc)
    record = django_anarchon.engine.Scheduler(MemoryBackend()).every(
        "j", "1h", lambda ctx: None)
    print("OK", "opentelemetry" in sys.modules)
''')


def test_importable_without_opentelemetry() -> None:
    done = subprocess.run([sys.executable, "-c", _BLOCKED], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "REFUSED django_anarchon.contrib.otel.instrument() needs opentelemetry-api: " \
        "pip install 'django-anarchon[otel]'" in done.stdout
    assert "OK False" in done.stdout, done.stdout


# -- anarchon_worker --traces --------------------------------------------------------------


@pytest.mark.workers
def test_the_worker_traces_with_the_global_provider(tmp_path: Path) -> None:
    spans_file = tmp_path / "spans.jsonl"
    spans_file.touch()
    env = {"DJANGO_SETTINGS_MODULE": "tests.otel_worker_settings",
           "ANARCHON_TEST_OUT": str(tmp_path / "out.txt"), "ANARCHON_TEST_SPANS": str(spans_file)}

    def written() -> list[dict[str, Any]]:
        return [json.loads(line) for line in spans_file.read_text().splitlines()]

    def a_whole_tick() -> bool:
        found = written()
        runs = [s for s in found if s["name"] == "run tick"]
        return any(
            any(s["name"] == "finish tick" and s["attributes"].get("anarchon.with_record")
                for s in found if s["parent"] == run["span_id"])
            and "claim tick" in {s["name"] for s in found if s["parent"] == run["span_id"]}
            for run in runs
        )

    with worker_group(tmp_path, env) as group:
        group.start("W1", "--traces", grace="2s")
        group.wait_started()
        assert "  traces OpenTelemetry (opentelemetry.sdk.trace.TracerProvider)" in group.output("W1")
        sync_wait_for(a_whole_tick, 30, "a tick's attempt span with its claim and store calls")
        proc = group.procs["W1"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, group.output("W1")
    run = next(s for s in written() if s["name"] == "run tick")
    assert run["attributes"]["anarchon.instance"] == "W1"
    assert run["parent"] is None


def test_traces_without_opentelemetry_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from django.core.management.base import CommandError

    from django_anarchon.contrib import otel
    from django_anarchon.management.commands._probes import start_traces

    monkeypatch.setattr(otel, "HAVE_OTEL", False)
    with pytest.raises(CommandError, match=r"^--traces needs opentelemetry-api: "
                       r"pip install 'django-anarchon\[otel\]'$"):
        start_traces([Scheduler(MemoryBackend())])


@pytest.mark.django_db(transaction=True)
async def test_an_enqueued_task_carries_the_attempt_s_trace_context(
    exporter: InMemorySpanExporter,
) -> None:
    """A job that names a task: the task's ``trace`` argument continues the attempt's trace."""
    pytest.importorskip("django_tasks_db")
    from asgiref.sync import sync_to_async
    from django_tasks_db.models import DBTaskResult

    from tests.testapp import tasks

    job = f"otel.task-{uuid.uuid4().hex[:8]}"
    await run_one(MemoryBackend(), job, tasks.traced)
    run, _ = attempt_tree(exporter, job)
    check_attempt(run, job, outcome="success")
    rows = await sync_to_async(
        lambda: list(DBTaskResult.objects.filter(args_kwargs__kwargs__job=job))
    )()
    (row,) = rows
    carrier = row.args_kwargs["kwargs"]["trace"]
    assert run.context is not None
    assert carrier["traceparent"].split("-")[1:3] == [
        f"{run.context.trace_id:032x}", f"{run.context.span_id:016x}"
    ]
