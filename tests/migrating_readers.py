"""Readers of other schedulers' configuration, for docs/migrating.md's before blocks.

Each reads a block's syntax tree (never runs it: the blocks import libraries this project
does not install) into ``Spec`` values by name, with the semantics each library documents
written down next to its reader. ``tests/test_migrating.py`` compares them with the jobs
that replace them, and asks Celery and APScheduler themselves where it can.
"""

from __future__ import annotations

import ast
import datetime
import json
import shlex
from dataclasses import dataclass
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from .test_docs_examples import Block, crontab_entries

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
