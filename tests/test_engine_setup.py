"""Building a scheduler and registering jobs: errors, register(), lifecycle, the idle cost."""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest

from django_anarchon.backends.memory import MemoryBackend
from django_anarchon.engine import AbortSignal, JobContext, Scheduler
from django_anarchon.engine.timer import Timer
from django_anarchon.exceptions import AbortedError, ConfigurationError, DuplicateJobError
from django_anarchon.jobs import Job, JobOptions
from django_anarchon.registry import JobSpec
from django_anarchon.schedules import Every

from .test_engine_support import ClaimOnlyMemoryBackend, Events, iso_in, now_ms, wait_for


def handler(ctx: JobContext) -> None:
    pass


def _error(call: object) -> ConfigurationError:
    with pytest.raises(ConfigurationError) as info:
        call()  # type: ignore[operator]
    return info.value


@pytest.mark.parametrize(
    ("register", "option", "value"),
    [
        (lambda s: s.every("j", "10s", handler, history_size="many"), "history_size", "many"),
        (lambda s: s.every("j", "10s", handler, overlap="maybe"), "overlap", "maybe"),
        (lambda s: s.every("j", "10s", handler, jitter=-1), "jitter", -1),
        (lambda s: s.every("j", "10s", handler, max_late="-5s"), "max_late", "-5s"),
        (lambda s: s.every("j", "10s", handler, colour="red"), "colour", "red"),
        (lambda s: s.every("j", "often", handler), "interval", "often"),
        (
            lambda s: s.cron("j", "0 8 * * *", handler, timezone="Mars/Olympus"),
            "timezone",
            "Mars/Olympus",
        ),
        (lambda s: s.cron("j", "0 25 * * *", handler), "expression", "0 25 * * *"),
        (lambda s: s.at("j", "2027-01-01T00:00:00", handler), "when", "2027-01-01T00:00:00"),
        (lambda s: s.at("j", iso_in(60_000), handler, overlap="allow"), "overlap", "allow"),
    ],
)
def test_registration_errors_name_job_option_and_value(
    register: object, option: str, value: object
) -> None:
    s = Scheduler(MemoryBackend(), instance_id="A")
    error = _error(lambda: register(s))  # type: ignore[operator]
    assert (error.job, error.option, error.value) == ("j", option, value)
    assert "'j'" in str(error) and repr(value) in str(error)
    assert not s.jobs()


@pytest.mark.parametrize(
    ("options", "option", "value"),
    [
        ({"max_attempts": 3}, "max_attempts", 3),
        ({"overlap": "allow"}, "overlap", "allow"),
        ({"catch_up": "1h"}, "catch_up", "1h"),
    ],
)
def test_lease_options_are_refused_on_a_claim_only_backend(
    options: dict[str, object], option: str, value: object
) -> None:
    s = Scheduler(ClaimOnlyMemoryBackend(), instance_id="A")
    error = _error(lambda: s.every("j", "1m", handler, **options))
    assert (error.job, error.option, error.value) == ("j", option, value)
    assert "lease" in str(error)
    s.every("ok", "1m", handler, max_attempts=1, overlap="skip")  # defaults are not asking


def test_duplicate_names_name_both_origins() -> None:
    s = Scheduler(MemoryBackend(), instance_id="A")

    def other(ctx: JobContext) -> None:
        pass

    s.every("dup", "1m", handler)
    with pytest.raises(DuplicateJobError) as info:
        s.every("dup", "2m", other)
    text = str(info.value)
    assert "dup" in text and "handler" in text and "other" in text
    # The line is the one ``inspect`` finds (read off the code object, not the file).
    assert f"other (line {inspect.getsourcelines(other)[1]})" in text, text
    assert f"handler (line {inspect.getsourcelines(handler)[1]})" in text, text


def test_scheduler_options_are_checked() -> None:
    backend = MemoryBackend()
    for kwargs, option in [
        ({"lease": "-1s"}, "lease"),
        ({"lease": "soon"}, "lease"),
        ({"heartbeat": "40s"}, "heartbeat"),
        ({"threads": 0}, "threads"),
        ({"job_defaults": {"history_size": 0}}, "history_size"),
        ({"job_defaults": {"offset": "1s"}}, "offset"),
        ({"default_timezone": "Nowhere/Town"}, "default_timezone"),
    ]:
        error = _error(lambda kwargs=kwargs: Scheduler(backend, name="fast", **kwargs))
        assert error.option == option, (kwargs, error)
        assert "'fast'" in str(error)
    s = Scheduler(backend, lease="9s", job_defaults={"history_size": 7, "max_late": "5s"})
    assert s.heartbeat_ms == 3000
    assert s.instance_id.count("-") >= 2
    s.every("j", "1m", handler, history_size=9)
    job = s.get_job("j")
    assert job.options.history_size == 9 and job.options.max_late_ms == 5000


def test_backend_check_job_and_dedupe_window_refuse_jobs() -> None:
    class Forgetful(MemoryBackend):
        dedupe_window_ms = 10_000.0

        def check_job(self, job: object) -> None:
            if getattr(job, "name", "") == "refused":
                raise ConfigurationError("not here", job="refused", option="jitter", value=0)

    s = Scheduler(Forgetful(), instance_id="A")
    error = _error(lambda: s.every("late", "1m", handler, max_late="20s"))
    assert (error.job, error.option) == ("late", "max_late")
    error = _error(lambda: s.every("refused", "1m", handler))
    assert error.job == "refused"


def test_past_one_off_is_registered_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    s = Scheduler(MemoryBackend(), instance_id="A")
    past = (datetime.now(UTC) - timedelta(days=2)).isoformat()
    with caplog.at_level(logging.WARNING, logger="django_anarchon"):
        s.at("old", past, handler)
    assert "old" in caplog.text
    (info,) = s.jobs()
    assert info.type == "once" and info.next_run_at is None


def test_decorator_forms_and_register_a_scheduled_object() -> None:
    s = Scheduler(MemoryBackend(), instance_id="A")

    @s.every("tick", "10s", offset="1s")
    def tick(ctx: JobContext) -> None:
        pass

    @s.cron("morning", "0 8 * * 1-5", timezone="Europe/Athens")
    async def morning(ctx: JobContext) -> None:
        pass

    class Billing:
        def reconcile(self, ctx: JobContext) -> str:
            return "reconciled"

        def close(self, ctx: JobContext) -> None:
            pass

    Billing.reconcile._anarchon_jobs = [  # type: ignore[attr-defined]
        JobSpec(name=None, kind="every", spec="1h", options={"jitter": "30s"}, origin="x:1")
    ]
    Billing.close._anarchon_jobs = [  # type: ignore[attr-defined]
        JobSpec(name="month-end", kind="cron", spec="0 0 1 * *", options={}, origin="x:2")
    ]
    jobs = s.register(Billing(), defaults={"history_size": 5})
    assert sorted(j.name for j in jobs) == ["Billing.month-end", "Billing.reconcile"]
    s.register(Billing(), prefix="billing")
    infos = {i.name: i for i in s.jobs()}
    assert infos["tick"].schedule == "every 10s (offset 1s)"
    assert infos["morning"].type == "cron" and "Europe/Athens" in infos["morning"].schedule
    assert infos["Billing.reconcile"].options["jitter_ms"] == 30_000
    assert infos["Billing.reconcile"].options["history_size"] == 5
    assert infos["billing.reconcile"].options["history_size"] == 100
    assert s.get_job("billing.reconcile").handler(None) == "reconciled"
    with pytest.raises(DuplicateJobError):
        s.register(Billing())
    s.unregister("tick")
    assert "tick" not in {i.name for i in s.jobs()}


async def test_jobs_registered_while_running_are_armed() -> None:
    s = Scheduler(MemoryBackend(), instance_id="A")
    ran = threading.Event()
    await s.start()
    try:
        s.at("late-comer", iso_in(100), lambda ctx: ran.set())
        await wait_for(ran.is_set, 3, "the job added while running")
    finally:
        await s.stop()
    assert not s.running


async def test_serve_returns_after_request_stop_and_after_cancel() -> None:
    s = Scheduler(MemoryBackend(), instance_id="A")
    s.every("j", "1h", handler)
    task = asyncio.create_task(s.serve(grace="1s"))
    await wait_for(lambda: s.running, 3, "serving")
    s.request_stop()
    await asyncio.wait_for(task, 5)
    assert not s.running
    task = asyncio.create_task(s.serve(grace="1s"))
    await wait_for(lambda: s.running, 3, "serving again")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not s.running


async def test_ten_thousand_idle_jobs_use_one_timer_task() -> None:
    s = Scheduler(MemoryBackend(), instance_id="A")
    # Slots 10 to 27 minutes ahead: none is due or within max_late at start.
    base = now_ms() + 600_000
    for i in range(10_000):
        s.every(f"job-{i}", "1h", handler, offset=f"{(base + i * 100) % 3_600_000}ms")
    before = set(asyncio.all_tasks())
    await s.start()
    try:
        await asyncio.sleep(0.05)
        # The scheduler's own few tasks, whatever the number of jobs: the timer, the
        # store's push channel, the store clock's refresh and the ledger's look for missed
        # slots (the spool replay ends).
        started = {t.get_name() for t in asyncio.all_tasks() - before}
        assert started <= {"anarchon-scheduler default", "anarchon wake-ups scheduler default",
                           "anarchon store clock", "anarchon spool replay",
                           "anarchon ledger"}, started
        assert len(s.jobs()) == 10_000
    finally:
        await s.stop()


async def test_timer_fires_in_order_and_moves_entries() -> None:
    fired: list[str] = []
    timer = Timer(lambda key, due: fired.append(key))
    timer.start()
    try:
        now = now_ms()
        timer.schedule("late", now + 120)
        timer.schedule("early", now + 30)
        timer.schedule("moved", now + 10_000)
        timer.schedule("moved", now + 60)
        timer.schedule("gone", now + 40)
        timer.cancel("gone")
        await wait_for(lambda: len(fired) == 3, 3, "three timers")
        assert fired == ["early", "moved", "late"]
        assert len(timer) == 0
    finally:
        await timer.stop()


async def test_abort_signal_wakes_sync_and_async_sleepers() -> None:
    signal = AbortSignal()
    assert not signal.aborted and signal.reason is None
    signal.raise_if_aborted()
    assert signal.wait(0.01) is False
    assert await signal.sleep(0.01) is False

    woke: list[bool] = []
    thread = threading.Thread(target=lambda: woke.append(signal.wait(10)))
    thread.start()
    sleeper = asyncio.create_task(signal.sleep(10))
    await asyncio.sleep(0.05)
    started = time.monotonic()
    threading.Thread(target=signal.abort, args=("stop",)).start()
    assert await asyncio.wait_for(sleeper, 2) is True
    thread.join(2)
    assert woke == [True] and time.monotonic() - started < 2
    assert signal.abort("timeout") is False and signal.reason == "stop"
    with pytest.raises(AbortedError, match="stop"):
        signal.raise_if_aborted()


async def test_stop_now_cuts_the_grace_short() -> None:
    s = Scheduler(MemoryBackend(), instance_id="A")
    started = threading.Event()
    release = threading.Event()

    def stubborn(ctx: JobContext) -> None:
        started.set()
        release.wait(10)

    s.at("stubborn", iso_in(50), stubborn)
    await s.start()
    try:
        await asyncio.to_thread(started.wait, 5)
        stopping = asyncio.create_task(s.stop(grace="30s"))
        await asyncio.sleep(0.05)
        began = time.monotonic()
        s.stop_now()
        await asyncio.wait_for(stopping, 5)
        assert time.monotonic() - began < 2
    finally:
        release.set()
    (record,) = await s.ahistory("stubborn")
    assert record.status == "interrupted"


class _BrokenSchedule(Every):
    """Gives its first slots, then fails: a bug in a schedule must not stop the others."""

    def next_after(self, after_ms: int) -> int | None:
        if after_ms > self.broken_after:
            raise ArithmeticError("schedule bug")
        return super().next_after(after_ms)

    broken_after = 0


async def test_a_failing_schedule_stops_only_its_own_job() -> None:
    s = Scheduler(MemoryBackend(), instance_id="A")
    events = Events(s, names=("error",))
    seen = threading.Event()
    schedule = _BrokenSchedule(100)
    schedule.broken_after = now_ms()
    s.add_job(Job(name="broken", schedule=schedule, handler=handler, options=JobOptions()))
    s.every("healthy", "100ms", lambda ctx: seen.set() if ctx.slot > now_ms() - 50 else None)
    await s.start()
    try:
        await wait_for(lambda: bool(events.named("error", job="broken")), 3, "the error event")
        seen.clear()
        await wait_for(seen.is_set, 3, "the healthy job going on")
        assert s.running
    finally:
        await s.stop()
    assert "ArithmeticError" in (events.named("error", job="broken")[0].error or "")


_STUCK_SCRIPT = """
import asyncio, threading, time
import django
django.setup()
from django_anarchon.backends.memory import MemoryBackend
from django_anarchon.engine import Scheduler

started = threading.Event()

def stuck(ctx):
    started.set()
    threading.Event().wait(600)  # never returns, ignores its signal

async def main():
    s = Scheduler(MemoryBackend(), instance_id="A")
    half_away = (time.time_ns() // 1_000_000 + 1_800_000) % 3_600_000  # no slot at start
    s.every("stuck", "1h", stuck, offset=f"{half_away}ms")
    await s.start()
    task = asyncio.ensure_future(s.arun_now("stuck"))
    await asyncio.to_thread(started.wait, 10)
    await s.stop(grace="100ms")
    print((await task).status, flush=True)

asyncio.run(main())
"""


def test_a_stuck_sync_handler_does_not_keep_the_process_alive() -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(root)}
    result = subprocess.run(
        [sys.executable, "-c", _STUCK_SCRIPT],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "interrupted"
