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

from django_anarchon import cron, every
from django_anarchon.handler import schedulers
from django_anarchon.models import RunRequest

from .support import ROOT, fresh_registry

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
    with fresh_registry(SETTINGS):
        every("10s", name="stock.sync")(remember)
        every("1h", name="stock.report")(explode)
        every("5m", name="mail.send", scheduler="other")(remember)
        every("5m", name="stock.sync", scheduler="other")(remember)  # same name, other scheduler
        seen.clear()
        yield


def run(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_jobs_table_lists_every_scheduler() -> None:
    out, _ = run("anarchon_jobs")
    lines = out.splitlines()
    assert lines[0].split() == ["SCHEDULER", "JOB", "SCHEDULE", "NEXT", "RUN", "LAST", "RUN",
                                "STATUS", "POLICIES"]
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


# -- anarchon_jobs --next: the coming slots, marked where DST moved them ------------------
# March Sundays and November Sundays in New York always hold the spring-forward and the
# fall-back, so the marks below appear whatever today's date: any 5 March Sundays in a row
# hold a second Sunday of March, any 7 November slots a whole fold.

def _dst_jobs() -> None:
    cron("30 2 * 3 0", timezone="America/New_York", name="march.shift")(remember)
    cron("30 2 * 3 0", timezone="America/New_York", name="march.skip", dst_gap="skip")(remember)
    cron("30 1 * 11 0", timezone="America/New_York", name="november.both",
         dst_fold="both")(remember)


def _rows(lines: list[str], job: str) -> list[str]:
    return [line for line in lines[2:] if line.split()[1] == job]


def test_jobs_next_marks_shifted_skipped_and_doubled_slots() -> None:
    _dst_jobs()
    out, _ = run("anarchon_jobs", "--next", "7")
    lines = out.splitlines()
    assert lines[0].split() == ["SCHEDULER", "JOB", "LOCAL", "TIME", "UTC", "DST"]
    rows = _rows(lines, "march.shift")[:5]
    shifted = [row for row in rows if row.endswith("shifted from 02:30")]
    assert shifted and all("03:00:00 EDT" in row and "07:00:00 UTC" in row for row in shifted)
    assert all(row in shifted or " 02:30:00 E" in row for row in rows)
    skip = _rows(lines, "march.skip")
    skipped = [row.split() for row in skip if row.endswith("skipped 02:30")]
    assert skipped and len(skip) == 7 + len(skipped)  # skipped times are extra lines
    assert all(row[3:8] == ["02:30:00", "(not", "on", "the", "clock)"] and row[8] == "-"
               for row in skipped)
    marks = [" ".join(row.split()[-2:]) for row in _rows(lines, "november.both")]
    assert "fold: first" in marks
    for at, mark in enumerate(marks):
        if mark == "fold: first":
            assert marks[at + 1] == "fold: second"
    # every job is listed; an `every` job has no marks
    assert _rows(lines, "stock.sync")[0].endswith(" UTC")


def test_jobs_next_of_one_job_and_as_json() -> None:
    _dst_jobs()
    out, _ = run("anarchon_jobs", "--next", "2", "stock.report", "--scheduler", "default")
    assert [line.split()[1] for line in out.splitlines()[2:]] == ["stock.report"] * 2
    items = json.loads(run("anarchon_jobs", "--next", "7", "november.both", "--json")[0])
    assert [item["name"] for item in items] == ["november.both"]
    assert items[0]["schedule"] == 'cron "30 1 * 11 0" (America/New_York, dst_fold=both)'
    marks = [fire["mark"] for fire in items[0]["next"]]
    first = marks.index("fold: first")
    fold = items[0]["next"][first:first + 2]
    assert [f["local"][11:] for f in fold] == ["01:30:00 EDT", "01:30:00 EST"]
    assert [f["at"][11:] for f in fold] == ["05:30:00+00:00", "06:30:00+00:00"]


def test_jobs_shows_the_dst_options_when_set() -> None:
    _dst_jobs()
    out, _ = run("anarchon_jobs")
    assert 'cron "30 2 * 3 0" (America/New_York, dst_gap=skip)' in out
    assert 'cron "30 2 * 3 0" (America/New_York)  ' in out


def test_jobs_next_refuses_bad_input_in_one_line() -> None:
    with pytest.raises(CommandError, match=r"^unknown job 'nope'; known jobs: mail.send, stock"):
        run("anarchon_jobs", "--next", "3", "nope")
    for n in ("0", "1001", "many"):
        with pytest.raises(CommandError, match=f"argument --next: expected a whole number from "
                                               f"1 to 1,000, got '{n}'"):
            run("anarchon_jobs", "--next", n)


def test_jobs_of_one_job_without_next() -> None:
    out, _ = run("anarchon_jobs", "stock.report")
    assert [line.split()[:2] for line in out.splitlines()[2:]] == [["default", "stock.report"]]


def test_jobs_table_shows_the_policies_that_differ_from_the_defaults() -> None:
    every("1m", name="stock.buffered", overlap="buffer_all", buffer_limit=4, catch_up="1h",
          catch_up_mode="all", catch_up_limit=5)(remember)
    every("1m", name="stock.never", catch_up="1h", catch_up_mode="none")(remember)
    out, _ = run("anarchon_jobs")
    rows = {line.split()[1]: line for line in out.splitlines()[2:]}
    assert rows["stock.buffered"].endswith("overlap=buffer_all (4), catch_up=1h all (5)")
    assert rows["stock.never"].endswith("catch_up_mode=none")
    assert rows["stock.sync"].endswith(" -")
