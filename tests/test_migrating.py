"""docs/migrating.md: each "before" schedule fires when the "after" job of its name fires.

``tests/test_docs_examples.py`` runs the page's after blocks (every job once, in the page's
project) and parses its before blocks. This module reads what each before block declares,
the way its own scheduler reads it, and compares it with the job of the same name that the
after blocks register:

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

A cron schedule must fire at the same instants as its job over a year of fires and the two
2026 DST changes of its zone, computed by the project's own ``Cron``; an interval must be
the job's interval (the phase differs by design: the guide says so); a one-off must be the
same instant. The names of the before entries and of the page's jobs must be the same set.
The peers' semantics this encodes (each documented in the peer's own docs): Celery's
``crontab`` fields default to ``*`` and take cron's weekdays (``0`` = Sunday);
APScheduler 3's cron fields below the last one given default to their minimum, and its
numbered weekdays start at Monday (``0`` = ``mon``); a naive ``run_date`` is in the
scheduler's zone; Celery evaluates in ``app.conf.timezone`` (UTC unless set).
"""

from __future__ import annotations

import ast
import datetime
import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from django_anarchon.schedules import Cron

from .support import ROOT
from .test_docs_examples import Block, Project, crontab_entries, read_blocks

PAGE = ROOT / "docs" / "migrating.md"
UTC = datetime.UTC


@dataclass(frozen=True)
class Spec:
    """One schedule, as the system it comes from reads it."""

    kind: str  # "cron" | "every" | "once"
    expression: str = ""
    timezone: str = "UTC"
    interval_s: float = 0
    at: datetime.datetime | None = None


# -- reading Python literals, and the few calls the configurations use ----------------------

_DJCB_PERIODS = {"DAYS": 86400, "HOURS": 3600, "MINUTES": 60, "SECONDS": 1, "MICROSECONDS": 1e-6}
_Q_TYPES = {"ONCE": "O", "MINUTES": "I", "HOURLY": "H", "DAILY": "D", "WEEKLY": "W",
            "MONTHLY": "M", "QUARTERLY": "Q", "YEARLY": "Y", "CRON": "C"}


def _callee(node: ast.Call) -> str:
    """``crontab`` for ``crontab(...)``, ``PeriodicTask.objects.create`` for a method chain."""
    return ast.unparse(node.func)


def value(node: ast.AST, names: dict[str, Any]) -> Any:
    """A literal, a name bound earlier in the block, or one of the calls the blocks use."""
    if isinstance(node, ast.Name) and node.id in names:
        return names[node.id]
    if isinstance(node, ast.Attribute):
        dotted = ast.unparse(node)
        if dotted in ("datetime.timezone.utc", "timezone.utc", "datetime.UTC"):
            return UTC
        owner, _, attr = dotted.rpartition(".")
        if owner == "IntervalSchedule":
            return _DJCB_PERIODS[attr]
        if owner == "Schedule":
            return _Q_TYPES[attr]
        raise AssertionError(f"cannot read {dotted}")
    if isinstance(node, ast.Dict):
        return {value(k, names): value(v, names) for k, v in zip(node.keys, node.values, strict=True)
                if k is not None}
    if isinstance(node, ast.Call):
        callee = _callee(node)
        args = [value(a, names) for a in node.args]
        kwargs = {k.arg: value(k.value, names) for k in node.keywords if k.arg}
        if callee in ("datetime.datetime", "datetime"):
            return datetime.datetime(*args, **kwargs)
        if callee in ("datetime.timedelta", "timedelta"):
            return datetime.timedelta(*args, **kwargs)
        if callee == "ZoneInfo":
            return ZoneInfo(*args)
        if callee == "json.dumps":
            return json.dumps(*args, **kwargs)
        return (callee, args, kwargs)  # a call the reader of each system interprets
    return ast.literal_eval(node)


def _statements(block: Block) -> list[ast.stmt]:
    """Top-level statements, and those of functions and classes, in order."""
    return [node for node in ast.walk(ast.parse(block.text)) if isinstance(node, ast.stmt)]


# -- each system's reader ----------------------------------------------------------------------


def celery_crontab(kwargs: dict[str, Any]) -> str:
    fields = ("minute", "hour", "day_of_month", "month_of_year", "day_of_week")
    unknown = set(kwargs) - set(fields)
    assert not unknown, f"crontab() arguments this reader does not know: {unknown}"
    return " ".join(str(kwargs.get(field, "*")) for field in fields)


def read_celery(block: Block) -> dict[str, Spec]:
    """``app.conf.beat_schedule`` entries, in ``app.conf.timezone``."""
    timezone, entries = "UTC", {}
    for node in _statements(block):
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target = ast.unparse(node.targets[0])
        if target.endswith("conf.timezone"):
            timezone = value(node.value, {})
        elif target.endswith("conf.beat_schedule"):
            entries = value(node.value, {})
    specs = {}
    for name, entry in entries.items():
        schedule = entry["schedule"]
        if isinstance(schedule, tuple) and schedule[0] == "crontab":
            specs[name] = Spec("cron", celery_crontab(schedule[2]), timezone)
        elif isinstance(schedule, datetime.timedelta):
            specs[name] = Spec("every", interval_s=schedule.total_seconds())
        else:
            assert isinstance(schedule, int | float), f"{name}: schedule {schedule!r}"
            specs[name] = Spec("every", interval_s=float(schedule))
    return specs


def read_django_celery_beat(block: Block) -> dict[str, Spec]:
    """``PeriodicTask`` rows and the schedule rows they name."""
    names: dict[str, Any] = {}
    specs = {}
    for node in _statements(block):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            made = value(node.value, names)
            target = node.targets[0]
            first = target.elts[0] if isinstance(target, ast.Tuple) else target
            assert isinstance(first, ast.Name)
            names[first.id] = made
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            call = value(node.value, names)
            if not call[0].startswith("PeriodicTask.objects."):
                continue
            row = call[2]
            if "interval" in row:
                _, _, kwargs = row["interval"]
                specs[row["name"]] = Spec("every", interval_s=kwargs["every"] * kwargs["period"])
            elif "crontab" in row:
                kwargs = dict(row["crontab"][2])
                timezone = str(kwargs.pop("timezone", "UTC"))
                specs[row["name"]] = Spec("cron", celery_crontab(kwargs), timezone)
            else:
                assert row.get("one_off") is True, f"{row['name']}: a clocked row is one_off"
                specs[row["name"]] = Spec("once", at=row["clocked"][2]["clocked_time"])
    return specs


_APS_ORDER = ("year", "month", "day", "week", "day_of_week", "hour", "minute", "second")
_APS_MINIMUM = {"month": "1", "day": "1", "hour": "0", "minute": "0", "second": "0"}
_APS_DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


def aps_cron(kwargs: dict[str, Any]) -> str:
    """APScheduler 3's cron fields as a 6-field expression (seconds first)."""
    assert "year" not in kwargs and "week" not in kwargs, "year and week have no cron field"
    given = [field for field in _APS_ORDER if field in kwargs]
    last = max(_APS_ORDER.index(field) for field in given)
    fields = {}
    for index, field in enumerate(_APS_ORDER):
        if field in kwargs:
            fields[field] = str(kwargs[field])
        elif index > last and field in _APS_MINIMUM:
            fields[field] = _APS_MINIMUM[field]  # below the last given: its minimum
        else:
            fields[field] = "*"
    weekday = fields["day_of_week"]
    if weekday.isdigit():  # 0 is Monday in APScheduler, Sunday in cron: go through the name
        weekday = _APS_DAYS[int(weekday)]
    return " ".join([fields["second"], fields["minute"], fields["hour"], fields["day"],
                     fields["month"], weekday])


@dataclass(frozen=True)
class AddJob:
    """One ``add_job(func, trigger, **kwargs)`` call, and the zone of its scheduler."""

    id: str
    trigger: str
    kwargs: dict[str, Any]
    timezone: str


def apscheduler_calls(block: Block) -> list[AddJob]:
    calls = [node for node in ast.walk(ast.parse(block.text)) if isinstance(node, ast.Call)]
    timezone = "UTC"
    for node in calls:
        if _callee(node).endswith("Scheduler"):
            for keyword in node.keywords:
                if keyword.arg == "timezone":
                    timezone = value(keyword.value, {})
    found = []
    for node in calls:
        if _callee(node).endswith(".add_job"):
            kwargs = {k.arg: value(k.value, {}) for k in node.keywords if k.arg}
            found.append(AddJob(kwargs.pop("id"), value(node.args[1], {}), kwargs, timezone))
    return found


_APS_TRIGGER_ARGS = {
    "cron": set(_APS_ORDER) | {"timezone", "jitter"},
    "interval": {"weeks", "days", "hours", "minutes", "seconds", "jitter"},
    "date": {"run_date", "timezone"},
}


def trigger_kwargs(call: AddJob) -> dict[str, Any]:
    """The arguments of ``add_job`` that go to its trigger (the rest are job options)."""
    return {k: v for k, v in call.kwargs.items() if k in _APS_TRIGGER_ARGS[call.trigger]}


def read_apscheduler(block: Block) -> dict[str, Spec]:
    """``add_job(func, trigger, ..., id=...)`` calls, in the scheduler's zone."""
    specs = {}
    for call in apscheduler_calls(block):
        job, trigger, kwargs, timezone = call.id, call.trigger, call.kwargs, call.timezone
        if trigger == "cron":
            fields = {k: v for k, v in kwargs.items() if k in _APS_ORDER}
            specs[job] = Spec("cron", aps_cron(fields), str(kwargs.get("timezone", timezone)))
        elif trigger == "interval":
            units = ("weeks", "days", "hours", "minutes", "seconds")
            delta = datetime.timedelta(**{k: v for k, v in kwargs.items() if k in units})
            specs[job] = Spec("every", interval_s=delta.total_seconds())
        else:
            assert trigger == "date", trigger
            run_date = datetime.datetime.fromisoformat(kwargs["run_date"])
            if run_date.tzinfo is None:
                run_date = run_date.replace(tzinfo=ZoneInfo(timezone))
            specs[job] = Spec("once", at=run_date)
    return specs


def read_django_q(block: Block) -> dict[str, Spec]:
    """``Schedule.objects.create(...)`` rows; the cluster's zone is UTC, as the page says."""
    specs = {}
    for node in _statements(block):
        if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
            continue
        callee, _, row = value(node.value, {})
        if callee != "Schedule.objects.create":
            continue
        kind = row["schedule_type"]
        if kind == "C":
            specs[row["name"]] = Spec("cron", row["cron"], "UTC")
        elif kind == "I":
            specs[row["name"]] = Spec("every", interval_s=60 * row["minutes"])
        elif kind == "H":
            specs[row["name"]] = Spec("every", interval_s=3600)
        else:
            assert kind == "O", f"{row['name']}: schedule type {kind!r} has no reader here"
            specs[row["name"]] = Spec("once", at=row["next_run"])
    return specs


def read_crontab(block: Block, timezone_of: dict[str, str]) -> dict[str, Spec]:
    """Crontab lines, each named after the ``manage.py`` command it runs.

    Cron runs in the machine's zone, which a crontab does not say: the job's ``timezone``
    stands for it (the page tells the reader to name the machine's zone there).
    """
    specs = {}
    for entry in crontab_entries(block):
        words = shlex.split(entry.command)
        name = words[words.index("manage.py") + 1]
        specs[name] = Spec("cron", entry.expression, timezone_of.get(name, "UTC"))
    return specs


def before_specs(blocks: list[Block], timezone_of: dict[str, str]) -> dict[str, Spec]:
    """Every schedule the page's before blocks declare, by name; no name twice."""
    specs: dict[str, Spec] = {}
    for block in blocks:
        if block.lang == "crontab":
            found = read_crontab(block, timezone_of)
        elif "beat_schedule" in block.text:
            found = read_celery(block)
        elif "PeriodicTask" in block.text:
            found = read_django_celery_beat(block)
        elif ".add_job(" in block.text:
            found = read_apscheduler(block)
        elif "django_q" in block.text:
            found = read_django_q(block)
        else:
            pytest.fail(f"{block.id}: a before block this test cannot read")
        assert found, f"{block.id}: no schedule read"
        assert not set(found) & set(specs), f"{block.id}: names declared twice"
        specs.update(found)
    return specs


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
