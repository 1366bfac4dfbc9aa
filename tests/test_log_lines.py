"""Log lines show slots as the run lines do (ISO 8601, UTC), and a stop says what it waits for.

Issue 11: warnings printed a slot as raw epoch milliseconds ("slot 1764595200000") next to
info lines in ISO, and during the grace of a stop nothing said which handlers the worker
waited for, or which it gave up on.
"""

from __future__ import annotations

import logging
import re
import threading

import pytest

from django_anarchon.backends.base import RunRecord, ms_to_datetime
from django_anarchon.backends.memory import MemoryBackend
from django_anarchon.engine import JobContext, Scheduler
from django_anarchon.engine.events import Event
from django_anarchon.logtime import iso

from .test_engine_support import iso_in, wait_for

ISO = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{6})?\+00:00"


def messages(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "django_anarchon" and r.levelno == level]


def test_iso_matches_the_run_lines_and_never_fails() -> None:
    slot = 1_764_595_200_123
    assert str(iso(slot)) == ms_to_datetime(slot).isoformat() == "2025-12-01T13:20:00.123000+00:00"
    assert f"{iso(1_764_595_200_000)}" == "2025-12-01T13:20:00+00:00"
    assert str(iso(None)) == "-"
    assert str(iso(10**20)) == "100000000000000000000 ms after the epoch"  # past year 9999


async def test_a_warning_shows_the_slot_as_an_iso_time(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="django_anarchon")
    s = Scheduler(MemoryBackend(), instance_id="A")
    release = threading.Event()

    def slow(ctx: JobContext) -> None:
        release.wait(5)

    s.every("slow", "1h", slow, timeout="50ms")
    try:
        record = await s.arun_now("slow")
    finally:
        release.set()
    assert record.status == "failed" and "timeout" in (record.error or "")
    (line,) = [m for m in messages(caplog, logging.WARNING) if m.startswith("job slow slot ")]
    assert re.match(rf"job slow slot {ISO} attempt 1: ", line), line
    assert record.scheduled_at.isoformat() in line
    assert not re.search(r"\b\d{13}\b", line), line  # no raw epoch milliseconds


async def test_the_stop_names_the_runs_it_waits_for_and_those_it_gave_up_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="django_anarchon")
    s = Scheduler(MemoryBackend(), instance_id="A")
    started = threading.Event()
    release = threading.Event()

    def polite(ctx: JobContext) -> None:
        started.set()
        ctx.signal.wait(5)  # ends as soon as the stop aborts it

    def stubborn(ctx: JobContext) -> None:
        release.wait(10)  # ignores its signal: the grace runs out

    records: dict[str, RunRecord] = {}

    def ended(event: Event) -> None:
        assert event.job is not None and event.record is not None
        records[event.job] = event.record

    s.on("success", ended)
    s.on("interrupted", ended)
    s.at("polite", iso_in(50), polite)
    s.at("stubborn", iso_in(50), stubborn)
    await s.start()
    try:
        await wait_for(lambda: started.is_set() and len(s._attempts) == 2, 5, "both runs")
        slots = {a.job.name: a.slot for a in s._attempts}
        await s.stop(grace="500ms")
    finally:
        release.set()
    waiting = [m for m in messages(caplog, logging.INFO) if "waiting up to" in m]
    assert len(waiting) == 1, waiting
    assert waiting[0].startswith("scheduler default: waiting up to 500ms for 2 run(s) to end: ")
    for name in ("polite", "stubborn"):
        assert f"{name}@{iso(slots[name])}" in waiting[0]
    (gave_up,) = [m for m in messages(caplog, logging.WARNING) if "after the grace" in m]
    assert gave_up == (
        "scheduler default: 1 run(s) still running after the grace, recorded interrupted and "
        f"their leases released: stubborn@{iso(slots['stubborn'])}"
    )
    assert records["stubborn"].status == "interrupted"
