"""docs/migrating.md: each "before" schedule fires when the "after" job of its name fires.

``tests/test_docs_examples.py`` runs the page's after blocks (every job once, in the page's
project) and parses its before blocks. Here the readers of ``tests/migrating_readers.py``
take what each before block declares, the way its own scheduler reads it, and it is
compared with the job of the same name that the after blocks register:

* Celery ``beat_schedule`` entries, django-celery-beat ``PeriodicTask`` rows (with the
  ``IntervalSchedule`` / ``CrontabSchedule`` / ``ClockedSchedule`` they name), APScheduler
  ``add_job`` calls and django-q2 ``Schedule`` rows are read from the Python syntax tree
  (the blocks import django-celery-beat, django-apscheduler and django-q2, which are not
  installed);
* crontab lines pair with the job named after the ``manage.py`` command they run.

Then the libraries that can be had cheaply (Celery and APScheduler 3, in the ``dev`` extra
only) compute the same schedules themselves: the Celery block is executed (it only builds
an app) and beat's own ``crontab`` gives the fire times; django-celery-beat's crontab rows
go through Celery's ``crontab`` too; each ``add_job`` becomes APScheduler's own trigger.
Those must fire when the jobs fire, and the job options the page maps (``expires``,
``misfire_grace_time``, ``jitter``, ``coalesce``, ``max_instances``) must be the jobs'.

A cron schedule must fire at the same instants as its job (60 fires from each of five
starts that cover 2026's DST changes in Europe and North America), both computed by the
project's own ``Cron``, with Vixie cron's DST rules for crontab lines; an interval must be
the job's interval (the phase differs by design: the guide says so); a one-off must be the
same instant. The names of the before entries and of the page's jobs must be the same set.
The peers' semantics this encodes (each documented in the peer's own docs): Celery's
``crontab`` fields default to ``*`` and take cron's weekdays (``0`` = Sunday);
APScheduler 3's cron fields below the last one given default to their minimum, and its
numbered weekdays start at Monday (``0`` = ``mon``); a naive ``run_date`` is in the
scheduler's zone; Celery evaluates in ``app.conf.timezone`` (UTC unless set).
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import pytest

from django_anarchon.schedules import Cron

from .migrating_readers import (
    Spec,
    aps_cron,
    apscheduler_calls,
    before_specs,
    read_apscheduler,
    read_celery,
    read_crontab,
    read_django_celery_beat,
    trigger_kwargs,
)
from .support import ROOT
from .test_docs_examples import Block, Project, read_blocks

PAGE = ROOT / "docs" / "migrating.md"
UTC = datetime.UTC

# -- the after jobs, as the page's project registers them ---------------------------------------

_DESCRIBE_JOBS = '''\
import json
from django_anarchon import schedulers
jobs = {}
for alias in schedulers:
    scheduler = schedulers[alias]
    for info in scheduler.jobs():
        schedule = scheduler.get_job(info.name).schedule
        jobs[info.name] = {"kind": info.type, "options": info.options, **{
            k: getattr(schedule, k, None) for k in (
                "expression", "timezone", "dst_gap", "dst_fold", "interval_ms", "offset_ms",
                "at_ms")}}
print("JOBS " + json.dumps(jobs))
'''


@pytest.fixture(scope="module")
def after_jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    project = Project(str(PAGE.relative_to(ROOT)), tmp_path_factory.mktemp("migrating"))
    output = project.manage("shell", "-c", _DESCRIBE_JOBS)
    jobs: dict[str, dict[str, Any]] = json.loads(output.split("JOBS ", 1)[1].splitlines()[0])
    return jobs


def _before_blocks() -> list[Block]:
    return [block for block in read_blocks(PAGE) if block.marker == "before"]


# -- comparing --------------------------------------------------------------------------------

#: Where the fire times are compared from: a plain week, and the weeks of 2026's DST changes
#: in Europe and in North America.
_STARTS = [datetime.datetime(2026, m, d, tzinfo=UTC) for m, d in
           ((1, 5), (3, 7), (3, 28), (10, 24), (10, 31))]


def fires(cron: Cron, start: datetime.datetime, n: int) -> list[int]:
    out, ms = [], int(start.timestamp() * 1000)
    for _ in range(n):
        nxt = cron.next_after(ms)
        assert nxt is not None
        out.append(nxt)
        ms = nxt
    return out


def same_fires(before: Spec, after: dict[str, Any], n: int = 60) -> bool:
    old = Cron(before.expression, before.timezone)
    new = Cron(after["expression"], after["timezone"], after["dst_gap"], after["dst_fold"])
    return all(fires(old, start, n) == fires(new, start, n) for start in _STARTS)


def test_the_page_has_a_before_block_for_each_system() -> None:
    texts = [block.text for block in _before_blocks()]
    for marker in ("beat_schedule", "PeriodicTask", ".add_job(", "django_q", "manage.py"):
        assert any(marker in text for text in texts), marker


def test_each_before_schedule_is_its_after_job(after_jobs: dict[str, dict[str, Any]]) -> None:
    timezone_of = {name: job["timezone"] for name, job in after_jobs.items() if job["timezone"]}
    specs = before_specs(_before_blocks(), timezone_of)
    assert set(specs) == set(after_jobs), (sorted(specs), sorted(after_jobs))
    for name, spec in specs.items():
        job = after_jobs[name]
        assert job["kind"] == spec.kind, (name, spec, job)
        if spec.kind == "cron":
            assert same_fires(spec, job), f"{name}: {spec} fires otherwise than {job}"
        elif spec.kind == "every":
            assert job["interval_ms"] == round(spec.interval_s * 1000), (name, spec, job)
        else:
            assert spec.at is not None
            assert job["at_ms"] == int(spec.at.timestamp() * 1000), (name, spec.at, job)


# -- the readers themselves: what a wrong translation looks like --------------------------------


def _python_block(text: str) -> Block:
    return Block(page="test", line=1, lang="python", text=text, marker="before", reason=None)


def test_apscheduler_numbered_weekdays_start_on_monday() -> None:
    """``day_of_week=0`` is Monday there; the comparison catches a cron ``0`` (Sunday)."""
    block = _python_block(
        'scheduler = BlockingScheduler(timezone="UTC")\n'
        'scheduler.add_job(f, "cron", day_of_week=0, hour=6, id="x")\n'
    )
    spec = read_apscheduler(block)["x"]
    assert spec.expression == "0 0 6 * * mon"
    sunday = {"expression": "0 6 * * 0", "timezone": "UTC", "dst_gap": "shift",
              "dst_fold": "first"}
    assert not same_fires(spec, sunday)
    assert same_fires(spec, {**sunday, "expression": "0 6 * * 1"})


def test_a_zone_left_out_is_caught() -> None:
    """Celery evaluates in UTC unless told; the same expression in Athens fires otherwise."""
    block = _python_block(
        'app.conf.beat_schedule = {"d": {"task": "t", "schedule": crontab(minute=30, hour=7)}}\n'
    )
    spec = read_celery(block)["d"]
    assert spec == Spec("cron", "30 7 * * *", "UTC")
    athens = {"expression": "30 7 * * *", "timezone": "Europe/Athens", "dst_gap": "shift",
              "dst_fold": "first"}
    assert not same_fires(spec, athens)
    assert same_fires(spec, {**athens, "timezone": "UTC"})


def test_a_dst_policy_is_part_of_the_comparison() -> None:
    """Vixie cron runs a job in the skipped hour (01:30 in London on 2026-03-29) right after
    the change, as ``dst_gap="shift"`` does; ``"skip"`` does not run it that night."""
    spec = Spec("cron", "30 1 * * *", "Europe/London")
    job = {"expression": "30 1 * * *", "timezone": "Europe/London", "dst_gap": "shift",
           "dst_fold": "first"}
    assert same_fires(spec, job)
    assert not same_fires(spec, {**job, "dst_gap": "skip"})


def test_the_crontab_reader_names_lines_by_their_command(tmp_path: Path) -> None:
    block = Block(page="test", line=1, lang="crontab", marker="before", reason=None,
                  text="MAILTO=x@example.com\n0 4 * * * cd /srv && python manage.py flush_cache --all\n")
    assert read_crontab(block, {}) == {"flush_cache": Spec("cron", "0 4 * * *", "UTC")}


# -- the same before blocks, read by the libraries themselves (in the dev extra) -------------------


def _block_with(marker: str) -> Block:
    (block,) = [b for b in _before_blocks() if marker in b.text]
    return block


def _ms(when: datetime.datetime) -> int:
    return int(when.timestamp() * 1000)


def _job_cron(job: dict[str, Any]) -> Cron:
    return Cron(job["expression"], job["timezone"], job["dst_gap"], job["dst_fold"])


#: Half a minute past each start, so that no start is itself a fire time of any example.
_REAL_STARTS = [start + datetime.timedelta(seconds=30) for start in _STARTS]


def celery_fires(schedule: Any, start: datetime.datetime, n: int) -> list[int]:
    """Celery's own next times: the time left after a run at ``t``, from ``t``."""
    out, t = [], start
    for _ in range(n):
        schedule.nowfun = lambda t=t: t
        t = t + schedule.remaining_estimate(t)
        out.append(_ms(t))
    return out


def test_celery_runs_the_before_block_and_fires_with_the_jobs(
    after_jobs: dict[str, dict[str, Any]],
) -> None:
    """The Celery app of the page, built by Celery: its beat entries against the jobs."""
    from celery.schedules import crontab, maybe_schedule

    namespace: dict[str, Any] = {}
    block = _block_with("beat_schedule")
    exec(compile(block.text, block.id, "exec"), namespace)
    app = namespace["app"]
    assert app.conf.beat_schedule, "the block's app has no beat_schedule"
    for name, entry in app.conf.beat_schedule.items():
        job = after_jobs[name]
        schedule = maybe_schedule(entry["schedule"], app=app)
        if isinstance(schedule, crontab):
            for start in _REAL_STARTS:
                ours = fires(_job_cron(job), start, 40)
                assert celery_fires(schedule, start, 40) == ours, (name, start)
        else:
            assert schedule.run_every.total_seconds() * 1000 == job["interval_ms"], name
        expires = entry.get("options", {}).get("expires")
        if expires is not None:  # dropped when not started in time: max_late
            assert job["options"]["max_late_ms"] == expires * 1000, name


def test_django_celery_beat_rows_fire_with_the_jobs(after_jobs: dict[str, dict[str, Any]]) -> None:
    """Each row's CrontabSchedule as the Celery crontab it becomes, in the row's zone."""
    from celery import Celery
    from celery.schedules import crontab

    specs = read_django_celery_beat(_block_with("PeriodicTask"))
    crons = {name: spec for name, spec in specs.items() if spec.kind == "cron"}
    assert crons
    for name, spec in crons.items():
        app = Celery("rows")
        app.conf.timezone = spec.timezone
        minute, hour, day_of_month, month_of_year, day_of_week = spec.expression.split()
        schedule = crontab(minute=minute, hour=hour, day_of_month=day_of_month,
                           month_of_year=month_of_year, day_of_week=day_of_week, app=app)
        for start in _REAL_STARTS:
            assert celery_fires(schedule, start, 40) == fires(_job_cron(after_jobs[name]), start, 40)


def test_apscheduler_triggers_fire_with_the_jobs(after_jobs: dict[str, dict[str, Any]]) -> None:
    """Each ``add_job`` of the page as APScheduler 3 builds its trigger, and its job options."""
    from apscheduler.triggers.cron import CronTrigger
    from apscheduler.triggers.date import DateTrigger
    from apscheduler.triggers.interval import IntervalTrigger

    calls = apscheduler_calls(_block_with(".add_job("))
    assert {call.trigger for call in calls} == {"cron", "interval", "date"}
    for call in calls:
        job, arguments = after_jobs[call.id], trigger_kwargs(call)
        arguments.pop("jitter", None)  # a random delay: compared below, as an option
        if call.trigger == "cron":
            trigger = CronTrigger(**{"timezone": call.timezone, **arguments})
            for start in _REAL_STARTS:
                theirs, previous, now = [], None, start
                for _ in range(40):
                    previous = now = trigger.get_next_fire_time(previous, now)
                    theirs.append(_ms(previous))
                assert theirs == fires(_job_cron(job), start, 40), (call.id, start)
        elif call.trigger == "interval":
            interval = IntervalTrigger(**arguments, timezone=call.timezone).interval
            assert interval.total_seconds() * 1000 == job["interval_ms"], call.id
        else:
            when = DateTrigger(**arguments, timezone=call.timezone).run_date
            assert _ms(when) == job["at_ms"], call.id
        options, given = job["options"], call.kwargs
        if "jitter" in given:
            assert options["jitter_ms"] == given["jitter"] * 1000, call.id
        if "misfire_grace_time" in given:  # a later run is dropped, late or missed while down
            grace_ms = given["misfire_grace_time"] * 1000
            assert options["max_late_ms"] == grace_ms, call.id
            assert options["catch_up_ms"] == grace_ms, call.id
        if given.get("coalesce", True):  # of the missed runs, only the newest
            assert options["catch_up_mode"] == "latest", call.id
        if given.get("max_instances") == 1:
            assert options["overlap"] == "skip", call.id


def test_apscheduler_reader_agrees_with_apscheduler() -> None:
    """The reader's translation (minimum fields, Monday-0 weekdays) is APScheduler's own."""
    from apscheduler.triggers.cron import CronTrigger

    cases = [{"day_of_week": 0, "hour": 6}, {"day_of_week": "mon-fri", "hour": 7, "minute": 30},
             {"day": 1, "hour": 2}, {"minute": "*/20"}, {"day_of_week": 6, "hour": 23}]
    for fields in cases:
        cron = Cron(aps_cron(fields), "Europe/Berlin")
        trigger = CronTrigger(timezone="Europe/Berlin", **fields)
        for start in _REAL_STARTS:
            theirs, previous, now = [], None, start
            for _ in range(30):
                previous = now = trigger.get_next_fire_time(previous, now)
                theirs.append(_ms(previous))
            assert theirs == fires(cron, start, 30), (fields, start)
