"""anarchon_pause, anarchon_resume, anarchon_backfill, anarchon_history --all-slots and the
PAUSED column of anarchon_jobs, called as Django commands on the memory store.

The slots of a ledger are written through the store's own contract (a won claim and its
finish, ``mark_skipped``, ``mark_missed``), as the engine writes them. The database
store's case is at the end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from io import StringIO
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from django_anarchon import cron, every
from django_anarchon.backends.base import RunClaim, StoredResult, ledger_of, ms_to_datetime
from django_anarchon.backends.memory import MemoryBackend
from django_anarchon.handler import schedulers

from .support import ROOT, fresh_registry
from .test_engine_support import real_ms

MEMORY = "django_anarchon.backends.memory.MemoryBackend"
SETTINGS = {
    "default": {"BACKEND": MEMORY, "INSTANCE_ID": "cli-1"},
    "other": {"BACKEND": MEMORY, "INSTANCE_ID": "cli-2"},
    "claimonly": {"BACKEND": "tests.test_engine_support.ClaimOnlyMemoryBackend"},
}
MINUTE = 60_000


def noop(ctx: Any) -> None:
    pass


@pytest.fixture(autouse=True)
def jobs() -> Iterator[None]:
    with fresh_registry(SETTINGS):
        every("1m", name="stock.sync")(noop)
        every("1h", name="stock.report")(noop)
        cron("0 9 * * *", timezone="America/New_York", name="ny.report")(noop)
        every("5m", name="mail.send", scheduler="other")(noop)
        every("1m", name="queue.drain", scheduler="claimonly")(noop)
        yield


def run(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def refused(*args: str) -> str:
    """The one line a refusal prints (``CommandError``, exit code 1)."""
    with pytest.raises(CommandError) as info:
        run(*args)
    assert info.value.returncode == 1
    message = str(info.value)
    assert "\n" not in message, message
    return message


def ran(job: str, slot: int, alias: str = "default") -> None:
    """A scheduled run of ``slot`` that won its claim and succeeded, through the store."""
    runs = ledger_of(schedulers[alias].backend)
    assert runs is not None
    token = f"t-{slot}"
    outcome = async_to_sync(runs.claim)(RunClaim(job, slot, token, "cli-9", keep_ms=3_600_000))
    assert outcome.kind == "won", outcome
    assert async_to_sync(runs.finish)(job, slot, token, "success")
    now = real_ms()
    result = StoredResult(slot=slot, by="cli-9", attempt=1, status="success", started_at=now,
                          finished_at=now, duration_ms=0)
    async_to_sync(schedulers[alias].backend.save_result)(job, result, 100)


def minute_ago(n: int) -> int:
    """The slot of an every-minute job ``n`` whole minutes before the last one."""
    now = real_ms()
    return now - now % MINUTE - n * MINUTE


def iso(ms: int) -> str:
    return ms_to_datetime(ms).isoformat()


# -- pause and resume ------------------------------------------------------------------------


def test_pause_then_resume_each_print_one_line() -> None:
    out, _ = run("anarchon_pause", "stock.sync", "--note", "supplier API down", "--by", "ops")
    assert out == "paused stock.sync (scheduler 'default') by ops until resumed: supplier API down\n"
    (state,) = schedulers["default"].pauses().values()
    assert (state.job, state.note, state.by, state.until) == (
        "stock.sync", "supplier API down", "ops", None)
    out, _ = run("anarchon_resume", "stock.sync")
    assert out.startswith("resumed stock.sync (scheduler 'default'), paused at ")
    assert out.endswith(" by ops until resumed: supplier API down\n") and out.count("\n") == 1
    assert schedulers["default"].pauses() == {}
    # Resuming what is not paused says so and is not an error (exit 0).
    assert run("anarchon_resume", "stock.sync")[0] == (
        "stock.sync (scheduler 'default') was not paused\n")


def test_pause_until_a_duration_or_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOGNAME", "alice")  # the default `by`: the operating system's user
    out, _ = run("anarchon_pause", "stock.sync", "--until", "2h")
    state = schedulers["default"].pauses()["stock.sync"]
    assert state.until is not None and state.until - state.at == 7_200_000
    assert state.by == "alice" and state.note == ""
    assert out == (f"paused stock.sync (scheduler 'default') by alice for 2h, until "
                   f"{ms_to_datetime(state.until):%Y-%m-%d %H:%M:%S} UTC\n")
    # Again: the new pause replaces the old, and says so.
    soon = datetime.now(UTC).replace(microsecond=0) + timedelta(days=1)
    out, _ = run("anarchon_pause", "stock.sync", "--until", soon.isoformat(), "--by", "bob")
    assert out.startswith("paused stock.sync (scheduler 'default', replacing the pause of ")
    assert schedulers["default"].pauses()["stock.sync"].until == int(soon.timestamp() * 1000)


@override_settings(TIME_ZONE="Europe/Athens")
def test_a_naive_time_is_in_time_zone() -> None:
    year = datetime.now(UTC).year + 1
    run("anarchon_pause", "stock.sync", "--until", f"{year}-01-15T12:00", "--by", "ops")
    until = schedulers["default"].pauses()["stock.sync"].until
    # Athens is UTC+2 in January.
    assert until == int(datetime(year, 1, 15, 10, 0, tzinfo=UTC).timestamp() * 1000)


@override_settings(TIME_ZONE="Europe/Athens")
def test_a_naive_time_the_clocks_skip_or_repeat_is_refused() -> None:
    # Athens: 2027-03-28 03:00 -> 04:00 (gap), 2027-10-31 04:00 -> 03:00 (fold).
    assert refused("anarchon_pause", "stock.sync", "--until", "2027-03-28T03:30") == (
        "job 'stock.sync', --until '2027-03-28T03:30': does not exist in Europe/Athens (the "
        "clocks skip it); give its UTC offset, such as 2027-03-28T03:30+02:00 or "
        "2027-03-28T03:30+03:00")
    assert refused("anarchon_pause", "stock.sync", "--until", "2027-10-31T03:30") == (
        "job 'stock.sync', --until '2027-10-31T03:30': happens twice in Europe/Athens (the "
        "clocks go back); give its UTC offset, such as 2027-10-31T03:30+03:00 or "
        "2027-10-31T03:30+02:00")
    assert schedulers["default"].pauses() == {}


def test_pause_refusals_are_one_line_naming_the_job_option_and_value() -> None:
    assert refused("anarchon_pause", "stock.sync", "--until", "soon") == (
        "job 'stock.sync', --until 'soon': expected an ISO 8601 date and time (naive: "
        "settings.TIME_ZONE), a duration such as 2h or 30m, or now")
    message = refused("anarchon_pause", "stock.sync", "--until", "2020-01-01T00:00:00+00:00")
    assert message.startswith("job 'stock.sync', --until '2020-01-01T00:00:00+00:00': is not "
                              "in the future (2020-01-01T00:00:00+00:00)"), message
    assert refused("anarchon_pause", "stock.sync", "--until", "now").startswith(
        "job 'stock.sync', --until 'now': ")
    assert refused("anarchon_pause", "stock.sync", "--until", "101y").startswith(
        "job 'stock.sync', --until '101y': expected")
    assert refused("anarchon_pause", "stock.sync", "--until", "36526d") == (
        "job 'stock.sync', --until '36526d': longer than 100 years, the longest duration taken "
        "(it keeps every slot a valid date)")
    assert refused("anarchon_pause", "stock.sync", "--by", " ") == (
        "job 'stock.sync', --by ' ': expected a name of 1 to 150 characters")
    assert refused("anarchon_pause", "stock.sync", "--note", "x" * 2001) == (
        f"job 'stock.sync', --note '{'x' * 40}...': expected text of at most 2000 characters")
    assert refused("anarchon_pause", "nope").startswith("unknown job 'nope'; known jobs: ")
    assert refused("anarchon_pause", "stock.sync", "--scheduler", "nightly").startswith(
        "unknown scheduler 'nightly'")
    assert schedulers["default"].pauses() == {}


def test_a_store_without_a_ledger_refuses_pause_and_resume() -> None:
    expected = ("job 'queue.drain': {} needs a store with leases and a ledger; the "
                "memory-claim-only backend has none (docs/ledger.md)")
    assert refused("anarchon_pause", "queue.drain") == expected.format("pause")
    assert refused("anarchon_resume", "queue.drain") == expected.format("resume")


def test_the_refusal_is_one_line_on_stderr_and_exit_1() -> None:
    """As a user sees it: ``manage.py`` in a process of its own, no traceback."""
    for args in (["anarchon_pause", "tick", "--until", "soon"],
                 ["anarchon_backfill", "tick", "--from", "1h", "--to", "2h"]):
        result = subprocess.run(
            [sys.executable, "-m", "django", *args], cwd=ROOT, capture_output=True, text=True,
            timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT),
                             "DJANGO_SETTINGS_MODULE": "tests.worker_settings"},
        )
        assert result.returncode == 1, result
        assert result.stdout == "" and len(result.stderr.strip().splitlines()) == 1, result
        assert result.stderr.startswith("CommandError: job 'tick', --"), result.stderr


# -- anarchon_jobs shows the pauses ------------------------------------------------------------


def test_jobs_shows_a_paused_job_in_the_table_and_in_json() -> None:
    header = run("anarchon_jobs")[0].splitlines()[0]
    assert "PAUSED" not in header  # no column while nothing is paused
    run("anarchon_pause", "stock.sync", "--note", "deploy " + "x" * 60, "--by", "ops",
        "--until", "1h")
    lines = run("anarchon_jobs")[0].splitlines()
    assert lines[0].split()[-1] == "PAUSED"
    rows = {line.split()[1]: line for line in lines[2:]}
    state = schedulers["default"].pauses()["stock.sync"]
    assert state.until is not None
    assert rows["stock.sync"].endswith(
        f"by ops until {ms_to_datetime(state.until):%Y-%m-%d %H:%M:%S} UTC: deploy "
        + "x" * 30 + "...")
    assert rows["stock.report"].endswith(" -") and rows["mail.send"].endswith(" -")
    items = {item["name"]: item for item in json.loads(run("anarchon_jobs", "--json")[0])}
    assert items["stock.sync"]["paused"] == {
        "note": state.note, "by": "ops", "at": iso(state.at), "until": iso(state.until)}
    assert items["stock.report"]["paused"] is None
    assert items["queue.drain"]["paused"] is None  # a store without a ledger: never paused
    one = json.loads(run("anarchon_jobs", "stock.sync", "--json")[0])
    assert [item["paused"]["by"] for item in one] == ["ops"]


# -- anarchon_backfill ---------------------------------------------------------------------------


@override_settings(TIME_ZONE="Asia/Tokyo")  # (a change of settings forgets the schedulers)
def test_backfill_dry_run_lists_the_slots_in_the_zone_and_utc() -> None:
    end = minute_ago(3)
    start = end - 4 * MINUTE
    ran("stock.sync", start + MINUTE)
    out, _ = run("anarchon_backfill", "stock.sync", "--from", iso(start), "--to", iso(end),
                 "--dry-run")
    lines = out.splitlines()
    assert lines[0] == (
        f"Dry run: a backfill of stock.sync from {ms_to_datetime(start) + timedelta(hours=9):%Y-%m-%d %H:%M:%S} "
        f"JST to {ms_to_datetime(end) + timedelta(hours=9):%Y-%m-%d %H:%M:%S} JST would run "
        "4 slot(s), oldest first; 1 slot(s) of the range already ran.")
    assert lines[1].split() == ["LOCAL", "TIME", "UTC"]
    slots = [start, start + 2 * MINUTE, start + 3 * MINUTE, end]
    assert lines[3:] == [
        f"{ms_to_datetime(s) + timedelta(hours=9):%Y-%m-%d %H:%M:%S} JST  "
        f"{ms_to_datetime(s):%Y-%m-%d %H:%M:%S} UTC" for s in slots
    ]
    assert schedulers["default"].ledger("stock.sync")[0].slot == start + MINUTE  # nothing ran


def test_backfill_dry_run_of_a_cron_job_is_in_its_own_zone_and_as_json() -> None:
    out, _ = run("anarchon_backfill", "ny.report", "--from", "3d", "--to", "1m", "--dry-run")
    rows = out.splitlines()[3:]
    assert len(rows) in (2, 3, 4), out
    assert all(" 09:00:00 E" in row and ("13:00:00 UTC" in row or "14:00:00 UTC" in row)
               for row in rows), out
    plan = json.loads(run("anarchon_backfill", "ny.report", "--from", "3d", "--to", "1m",
                          "--dry-run", "--json")[0])
    assert set(plan) == {"scheduler", "job", "from", "to", "dry_run", "request_id",
                         "already_ran", "slots"}
    assert (plan["scheduler"], plan["job"], plan["dry_run"], plan["request_id"],
            plan["already_ran"]) == ("default", "ny.report", True, None, 0)
    start, end = datetime.fromisoformat(plan["from"]), datetime.fromisoformat(plan["to"])
    assert abs((end - start) - timedelta(days=3, minutes=-1)) < timedelta(seconds=1)
    assert abs(datetime.now(UTC) - timedelta(minutes=1) - end) < timedelta(seconds=30)
    slots = [datetime.fromisoformat(s) for s in plan["slots"]]
    assert slots == sorted(slots) and all(start <= s <= end for s in slots)
    assert len(slots) == len(rows)


@pytest.mark.django_db(transaction=True)  # the request is filed from a thread of its own
def test_backfill_files_a_request_for_the_workers() -> None:
    from django_anarchon.models import BackfillRequest

    end = minute_ago(2)
    start = end - 2 * MINUTE
    ran("stock.sync", end)
    out, _ = run("anarchon_backfill", "stock.sync", "--from", iso(start), "--to", iso(end),
                 "--by", "ops", "--overlap", "allow")
    request = BackfillRequest.objects.get()
    assert out == (
        f"Filed backfill request {request.pk}: the workers of scheduler 'default' will run 2 "
        f"slot(s) of stock.sync from {ms_to_datetime(start):%Y-%m-%d %H:%M:%S} UTC to "
        f"{ms_to_datetime(end):%Y-%m-%d %H:%M:%S} UTC, oldest first; 1 slot(s) of the range "
        "already ran.\n")
    assert (request.scheduler, request.job, request.requested_by, request.overlap) == (
        "default", "stock.sync", "ops", "allow")
    assert [int(s) for s in request.slots] == [start, start + MINUTE]
    plan = json.loads(run("anarchon_backfill", "stock.sync", "--from", iso(start), "--to",
                          iso(end), "--json")[0])
    assert plan["request_id"] == request.pk + 1 and plan["dry_run"] is False
    assert plan["slots"] == [iso(start), iso(start + MINUTE)] and plan["already_ran"] == 1
    # A range that ran in full: nothing is filed.
    out, _ = run("anarchon_backfill", "stock.sync", "--from", iso(end), "--to", iso(end))
    assert out == (f"Nothing to backfill for stock.sync from {ms_to_datetime(end):%Y-%m-%d %H:%M:%S} "
                   f"UTC to {ms_to_datetime(end):%Y-%m-%d %H:%M:%S} UTC: 1 slot(s) of the range "
                   "already ran.\n")
    assert BackfillRequest.objects.count() == 2


def test_backfill_refusals_are_one_line() -> None:
    job = "stock.sync"
    future = (datetime.now(UTC) + timedelta(days=1)).replace(microsecond=0).isoformat()
    assert refused("anarchon_backfill", job, "--from", "1h", "--to", future).startswith(
        f"job 'stock.sync', --to '{future}': the range ends in the future (")
    assert refused("anarchon_backfill", job, "--from", "1h", "--to", "2h").startswith(
        "job 'stock.sync', --to '2h': the range ends (")
    message = refused("anarchon_backfill", job, "--from", "3h", "--to", "1m", "--max", "10")
    assert message.startswith("job 'stock.sync', --max '10': the range holds 1"), message
    assert message.endswith(" slots that never ran, more than max=10 (narrow the range or "
                            "raise max)"), message
    assert refused("anarchon_backfill", job, "--from", "yesterday", "--to", "1h") == (
        "job 'stock.sync', --from 'yesterday': expected an ISO 8601 date and time (naive: "
        "settings.TIME_ZONE), a duration such as 2h or 30m, or now")
    assert refused("anarchon_backfill", "queue.drain", "--from", "1h", "--to", "1m") == (
        "job 'queue.drain': backfill needs a store with leases and a ledger; the "
        "memory-claim-only backend has none (docs/ledger.md)")
    run("anarchon_pause", job, "--by", "ops")
    assert refused("anarchon_backfill", job, "--from", "1h", "--to", "1m") == (
        "job 'stock.sync': is paused: resume it before a backfill")
    # Usage errors, from the parser.
    assert "argument --max: expected a whole number from 1 to 10,000, got '0'" in refused(
        "anarchon_backfill", job, "--from", "1h", "--to", "1m", "--max", "0")
    assert "argument --overlap: invalid choice: 'cancel_other'" in refused(
        "anarchon_backfill", job, "--from", "1h", "--to", "1m", "--overlap", "cancel_other")
    assert "the following arguments are required: --to" in refused(
        "anarchon_backfill", job, "--from", "1h")


class StoreClockMemory(MemoryBackend):
    """A memory store on the true clock, so that the ``skew`` fixture moves only the
    machine's (the command's) clock."""

    def __init__(self, **options: Any) -> None:
        super().__init__(clock=real_ms, **options)


def test_backfill_and_history_count_relative_times_on_the_store_clock(skew: Any) -> None:
    """This machine runs 5 minutes ahead of the store: ``--to now`` is the store's now
    (not refused as the future), and ``--since 3m`` three minutes before the store's now."""
    settings = {"default": {"BACKEND": "tests.test_ledger_commands.StoreClockMemory",
                            "INSTANCE_ID": "cli-1"}}
    with override_settings(ANARCHON=settings):
        skew(300_000)
        old, recent = minute_ago(6), minute_ago(1)
        ran("stock.sync", old)
        ran("stock.sync", recent)
        out, _ = run("anarchon_backfill", "stock.sync", "--from", "10m", "--to", "now",
                     "--dry-run", "--json")
        plan = json.loads(out)
        assert datetime.fromisoformat(plan["to"]).timestamp() * 1000 <= real_ms(), plan
        assert plan["already_ran"] == 2, plan
        out, _ = run("anarchon_history", "stock.sync", "--all-slots", "--since", "3m", "--json")
        assert [e["slot"] for e in json.loads(out)] == [recent], out


# -- anarchon_history --all-slots ----------------------------------------------------------------


def _ledger_of_four() -> tuple[int, int, int]:
    """stock.sync: a run, a paused skip, three missed slots, and the run before them."""
    runs = ledger_of(schedulers["default"].backend)
    assert runs is not None
    newest = minute_ago(1)
    ran("stock.sync", newest)
    assert async_to_sync(runs.mark_skipped)("stock.sync", newest - MINUTE, "paused", "cli-2",
                                            100, None)
    first_missed = newest - 4 * MINUTE
    assert async_to_sync(runs.mark_missed)(
        "stock.sync", [(first_missed, newest - 2 * MINUTE, 3)], "cli-3", 100, None) == 1
    ran("stock.sync", newest - 5 * MINUTE)
    return newest, first_missed, newest - 5 * MINUTE


def test_history_all_slots_shows_each_fate() -> None:
    newest, first_missed, oldest = _ledger_of_four()
    lines = run("anarchon_history", "stock.sync", "--all-slots")[0].splitlines()
    assert lines[0].split() == ["SCHEDULED", "FATE", "REASON", "STATUS", "ATTEMPTS",
                                "INSTANCE", "RANGE"]
    rows = [line.split() for line in lines[2:]]
    assert [row[3:] for row in rows] == [
        ["ran", "scheduled", "success", "1", "cli-9"],
        ["skipped", "paused", "-", "-", "cli-2"],
        ["missed", "missed", "-", "-", "cli-3", "3", "slots,", "to",
         *f"{ms_to_datetime(newest - 2 * MINUTE):%Y-%m-%d %H:%M:%S}".split(), "UTC"],
        ["ran", "scheduled", "success", "1", "cli-9"],
    ]
    assert [" ".join(row[:3]) for row in rows] == [
        f"{ms_to_datetime(s):%Y-%m-%d %H:%M:%S} UTC" for s in
        (newest, newest - MINUTE, first_missed, oldest)]


def test_history_all_slots_since_until_limit_and_json() -> None:
    newest, first_missed, oldest = _ledger_of_four()
    entries = json.loads(run("anarchon_history", "stock.sync", "--all-slots", "--json")[0])
    expected = [e.to_dict() for e in schedulers["default"].ledger("stock.sync")]
    assert json.loads(json.dumps(expected, default=str)) == entries
    assert [(e["fate"], e["count"], e["slot"]) for e in entries] == [
        ("ran", 1, newest), ("skipped", 1, newest - MINUTE), ("missed", 3, first_missed),
        ("ran", 1, oldest)]
    assert set(entries[0]) == {"job", "slot", "fate", "reason", "by", "last_slot", "count",
                               "status", "attempts", "scheduled_at", "last_scheduled_at"}
    assert entries[0]["attempts"][0]["status"] == "success"
    assert entries[2]["last_scheduled_at"] == iso(newest - 2 * MINUTE)
    window = json.loads(run("anarchon_history", "stock.sync", "--all-slots", "--json",
                            "--since", iso(first_missed), "--until", iso(newest - MINUTE))[0])
    assert [e["fate"] for e in window] == ["skipped", "missed"]
    # A duration is that long ago: from 30 s before the skipped slot on.
    back = real_ms() - (newest - MINUTE - 30_000)
    recent = json.loads(run("anarchon_history", "stock.sync", "--all-slots", "--json",
                            "--since", f"{back}ms")[0])
    assert [e["slot"] for e in recent] == [newest, newest - MINUTE]
    assert len(json.loads(run("anarchon_history", "stock.sync", "--all-slots", "--json",
                              "--limit", "2")[0])) == 2


def test_history_all_slots_when_empty_and_on_a_store_without_a_ledger() -> None:
    assert run("anarchon_history", "stock.report", "--all-slots")[0] == (
        "No slots of stock.report recorded in that range.\n")
    out, err = run("anarchon_history", "queue.drain", "--all-slots")
    assert err == ("the memory-claim-only backend keeps no ledger: only the slots that ran "
                   "show\n")
    assert out == "No slots of queue.drain recorded in that range.\n"


def test_history_all_slots_refusals() -> None:
    assert refused("anarchon_history", "--all-slots") == (
        "--all-slots shows the ledger of one job: name the JOB")
    assert refused("anarchon_history", "stock.sync", "--since", "1h") == (
        "--since goes with --all-slots (the ledger of one JOB)")
    assert refused("anarchon_history", "stock.sync", "--all-slots", "--until", "later") == (
        "job 'stock.sync', --until 'later': expected an ISO 8601 date and time (naive: "
        "settings.TIME_ZONE), a duration such as 2h or 30m, or now")


# -- the worker's banner -------------------------------------------------------------------------


async def test_the_worker_banner_marks_the_paused_jobs() -> None:
    from django_anarchon.backends.memory import MemoryBackend
    from django_anarchon.engine import Scheduler
    from django_anarchon.management.commands.anarchon_worker import Worker

    s = Scheduler(MemoryBackend(), instance_id="W")
    s.every("shop.sync", "1m", noop)
    s.every("shop.report", "1h", noop)
    await s.apause("shop.sync", note="supplier\ndown", by="ops")
    lines: list[str] = []
    await Worker([s], 0, None, lines.append)._banner()
    (sync,) = [line for line in lines if "shop.sync" in line]
    assert sync.endswith("  PAUSED by ops until resumed: supplier down"), sync
    (report,) = [line for line in lines if "shop.report" in line]
    assert "PAUSED" not in report and report.split()[-3:-1] == ["next", "run"], report


# -- the database store ----------------------------------------------------------------------------

DB_ALIASES = [
    pytest.param("postgres_database", marks=pytest.mark.postgres, id="postgres"),
    pytest.param("sqlite_database", id="sqlite"),
]


@pytest.fixture(params=DB_ALIASES)
def on_database(request: pytest.FixtureRequest) -> Iterator[str]:
    """The commands' "default" scheduler on the database store of a migrated alias."""
    alias: str = request.getfixturevalue(request.param)
    request.getfixturevalue("database_access")
    settings = {"default": {"BACKEND": "django_anarchon.backends.database.DatabaseBackend",
                            "OPTIONS": {"using": alias}, "INSTANCE_ID": "cli-db"}}
    with override_settings(ANARCHON=settings):
        yield alias


def test_pause_resume_and_the_ledger_on_the_database_store(on_database: str) -> None:
    import uuid

    name = f"db.sync-{uuid.uuid4().hex[:8]}"  # the database outlives the test
    every("1m", name=name)(noop)
    out, _ = run("anarchon_pause", name, "--note", "deploy", "--by", "ops", "--until", "1h")
    assert out.startswith(f"paused {name} (scheduler 'default') by ops for 1h, until "), out
    (item,) = json.loads(run("anarchon_jobs", name, "--json")[0])
    assert item["paused"]["by"] == "ops" and item["paused"]["note"] == "deploy"
    assert refused("anarchon_backfill", name, "--from", "1h", "--to", "1m") == (
        f"job {name!r}: is paused: resume it before a backfill")
    out, _ = run("anarchon_resume", name)
    assert out.startswith(f"resumed {name} (scheduler 'default'), paused at "), out
    assert json.loads(run("anarchon_jobs", name, "--json")[0])[0]["paused"] is None
    assert run("anarchon_resume", name)[0] == f"{name} (scheduler 'default') was not paused\n"
    end = minute_ago(2)
    ran(name, end)
    plan = json.loads(run("anarchon_backfill", name, "--from", iso(end - 2 * MINUTE), "--to",
                          iso(end), "--dry-run", "--json")[0])
    assert plan["slots"] == [iso(end - 2 * MINUTE), iso(end - MINUTE)], plan
    assert plan["already_ran"] == 1
    entries = json.loads(run("anarchon_history", name, "--all-slots", "--json")[0])
    assert [(e["slot"], e["fate"], e["status"]) for e in entries] == [(end, "ran", "success")]
