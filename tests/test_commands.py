"""anarchon_jobs, anarchon_run and anarchon_history, called as Django commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from django_anarchon import every
from django_anarchon.handler import schedulers
from django_anarchon.models import RunRequest
from django_anarchon.registry import registry

from .support import ROOT

MEMORY = "django_anarchon.backends.memory.MemoryBackend"
SETTINGS = {
    "default": {"BACKEND": MEMORY, "INSTANCE_ID": "cli-1"},
    "other": {"BACKEND": MEMORY, "INSTANCE_ID": "cli-2"},
}
seen: list[Any] = []


def remember(ctx: Any) -> None:
    seen.append(ctx.data)


def explode(ctx: Any) -> None:
    raise ValueError("no stock file for today")


@pytest.fixture(autouse=True)
def jobs() -> Iterator[None]:
    saved = (registry._functions, registry._classes, registry._names)
    registry._functions, registry._classes, registry._names = {}, {}, {}
    every("10s", name="stock.sync")(remember)
    every("1h", name="stock.report")(explode)
    every("5m", name="mail.send", scheduler="other")(remember)
    every("5m", name="stock.sync", scheduler="other")(remember)  # same name, other scheduler
    seen.clear()
    try:
        with override_settings(ANARCHON=SETTINGS):
            yield
    finally:
        registry._functions, registry._classes, registry._names = saved


def run(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_jobs_table_lists_every_scheduler() -> None:
    out, _ = run("anarchon_jobs")
    lines = out.splitlines()
    assert lines[0].split() == ["SCHEDULER", "JOB", "SCHEDULE", "NEXT", "RUN", "LAST", "RUN",
                                "STATUS"]
    assert set(lines[1]) <= {"-", " "}
    body = [line.split()[:2] for line in lines[2:]]
    assert body == [["default", "stock.report"], ["default", "stock.sync"],
                    ["other", "mail.send"], ["other", "stock.sync"]]
    assert "every 10s" in out


def test_jobs_json_includes_the_last_run() -> None:
    schedulers["default"].run_now("stock.report")
    out, _ = run("anarchon_jobs", "--json", "--scheduler", "default")
    items = {item["name"]: item for item in json.loads(out)}
    assert set(items) == {"stock.report", "stock.sync"}
    assert items["stock.report"]["last_run"]["status"] == "failed"
    assert items["stock.report"]["last_run"]["instance_id"] == "cli-1"
    assert items["stock.sync"]["last_run"] is None
    assert items["stock.sync"]["next_run_at"].endswith("+00:00")
    options = items["stock.sync"]["options"]
    assert (options["overlap"], options["buffer_limit"]) == ("skip", 10)


def test_run_runs_here_with_data() -> None:
    out, _ = run("anarchon_run", "mail.send", "--data", '{"full": true}')
    assert out.startswith("mail.send: success in ") and "cli-2" in out
    assert seen == [{"full": True}]
    (record,) = schedulers["other"].history("mail.send")
    assert (record.manual, record.reason, record.status) == (True, "manual", "success")


def test_run_json_output() -> None:
    out, _ = run("anarchon_run", "stock.sync", "--scheduler", "default", "--json")
    record = json.loads(out)
    assert record["scheduler"] == "default" and record["status"] == "success"
    assert record["manual"] is True


def test_run_a_failing_job_exits_non_zero_with_the_error() -> None:
    out, err = StringIO(), StringIO()
    with pytest.raises(CommandError) as info:
        call_command("anarchon_run", "stock.report", stdout=out, stderr=err)
    assert info.value.returncode == 1
    assert "stock.report: failed" in out.getvalue()
    assert "no stock file for today" in err.getvalue()


def test_run_refuses_bad_input() -> None:
    with pytest.raises(CommandError, match="not valid JSON"):
        run("anarchon_run", "mail.send", "--data", "{oops")
    with pytest.raises(CommandError, match=r"^--data: NaN is not standard JSON"):
        run("anarchon_run", "mail.send", "--data", "NaN")
    with pytest.raises(CommandError, match=r"^--data: data nests deeper than 64 levels$"):
        run("anarchon_run", "mail.send", "--data", "[" * 5000 + "]" * 5000)
    with pytest.raises(CommandError, match=r"unknown job 'nope'; known jobs: mail.send, stock"):
        run("anarchon_run", "nope")
    with pytest.raises(CommandError, match="exists on schedulers default, other"):
        run("anarchon_run", "stock.sync")
    with pytest.raises(CommandError, match="unknown scheduler 'nightly'"):
        run("anarchon_run", "mail.send", "--scheduler", "nightly")
    assert seen == []


@pytest.mark.django_db
def test_run_via_worker_files_a_request_and_runs_nothing() -> None:
    out, _ = run("anarchon_run", "mail.send", "--via-worker", "--data", "[1, 2]")
    request = RunRequest.objects.get()
    assert (request.scheduler, request.job, request.data) == ("other", "mail.send", [1, 2])
    assert f"Filed run request {request.pk}" in out
    assert seen == [] and schedulers["other"].history("mail.send") == []


def test_history_of_one_job_newest_first_with_limit() -> None:
    for n in range(3):
        schedulers["default"].run_now("stock.sync", data=n)
    out, _ = run("anarchon_history", "stock.sync", "--scheduler", "default", "--limit", "2")
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["JOB", "SCHEDULED", "STATUS"]
    assert len(lines) == 4  # header, rule, two runs
    assert all("success" in line and "cli-1" in line for line in lines[2:])
    records = json.loads(run("anarchon_history", "stock.sync", "--scheduler", "default",
                             "--json")[0])
    assert len(records) == 3
    started = [r["started_at"] for r in records]
    assert started == sorted(started, reverse=True)


def test_history_of_every_job_shows_errors() -> None:
    schedulers["default"].run_now("stock.report")
    schedulers["other"].run_now("mail.send")
    out, _ = run("anarchon_history")
    assert "stock.report" in out and "mail.send" in out
    assert "ValueError: no stock file for today" in out
    assert json.loads(run("anarchon_history", "--json", "--limit", "1")[0])[0]["job"] == "mail.send"


def test_history_when_nothing_ran_and_bad_limit() -> None:
    assert run("anarchon_history", "mail.send")[0].strip() == "No runs recorded yet."
    for limit in ("0", "10001", "99999999999999999999", "ten"):
        message = f"argument --limit: expected a whole number from 1 to 10,000, got '{limit}'"
        with pytest.raises(CommandError, match=message):
            run("anarchon_history", "--limit", limit)
    assert run("anarchon_history", "--limit", "10000")[0].strip() == "No runs recorded yet."


def test_jobs_outside_jobs_py_are_found_when_imported_at_start() -> None:
    """docs/deployment.md's two recipes: import from jobs.py, or from AppConfig.ready()."""
    result = subprocess.run(
        [sys.executable, "-m", "django", "anarchon_jobs", "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.otherjobs_settings",
             "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, result.stderr
    names = {item["name"] for item in json.loads(result.stdout)}
    assert {"otherjobsapp.nightly_report", "otherjobsapp.retry_invoices"} <= names
    assert "otherjobsapp.never_found" not in names  # a module nothing imports
