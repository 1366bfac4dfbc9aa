"""System checks: each id is triggered by the setting or job it documents, and only by it."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.checks import CheckMessage, run_checks
from django.test import override_settings

from django_anarchon import at, cron, every, scheduled
from django_anarchon.backends.base import JobLimits
from django_anarchon.backends.memory import MemoryBackend
from django_anarchon.checks import run_all
from django_anarchon.exceptions import ConfigurationError
from django_anarchon.registry import registry

MEMORY = "django_anarchon.backends.memory.MemoryBackend"
DATABASE = "django_anarchon.backends.database.DatabaseBackend"


@pytest.fixture(autouse=True)
def isolated_registry() -> Iterator[None]:
    """Each test sees only the jobs it declares; the registry is process-global."""
    saved = (registry._functions, registry._classes, registry._names, registry._errors)
    registry._functions, registry._classes, registry._names, registry._errors = {}, {}, {}, []
    try:
        yield
    finally:
        registry._functions, registry._classes, registry._names, registry._errors = saved


def ids(messages: list[CheckMessage]) -> list[str]:
    return sorted(str(m.id) for m in messages)


def handler(ctx: Any) -> None:
    """A job body; the checks never call it."""


def memory(**extra: Any) -> dict[str, Any]:
    return {"default": {"BACKEND": MEMORY, **extra}}


def test_a_valid_configuration_passes() -> None:
    with override_settings(ANARCHON=memory(LEASE="20s", HEARTBEAT="5s")):
        every("10s", name="checks.fine")(handler)
        assert run_all() == []


def test_registered_with_django_and_run_by_check_command() -> None:
    with override_settings(ANARCHON={"default": {"BACKEND": "no.such.Backend"}}):
        messages = run_checks(tags=["anarchon"])
    assert "anarchon.E002" in ids(messages)


def test_e001_settings_not_a_dict() -> None:
    with override_settings(ANARCHON=["default"]):
        (message,) = run_all()
    assert message.id == "anarchon.E001"
    assert "ANARCHON" in message.msg


def test_e001_unknown_key_names_the_key() -> None:
    with override_settings(ANARCHON={"default": {"BACKEND": MEMORY, "LEASES": "30s"}}):
        (message,) = run_all()
    assert message.id == "anarchon.E001"
    assert "LEASES" in message.msg


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ({"LEASE": "soon"}, "LEASE"),
        ({"LEASE": "10s", "HEARTBEAT": "10s"}, "HEARTBEAT"),
        ({"THREADS": 0}, "THREADS"),
        ({"INSTANCE_ID": ""}, "INSTANCE_ID"),
        ({"AUTOSTART": "yes"}, "AUTOSTART"),
        ({"OPTIONS": ["x"]}, "OPTIONS"),
        ({"JOB_DEFAULTS": "fast"}, "JOB_DEFAULTS"),
        ({"SPOOL": 5}, "SPOOL"),
        ({"SPOOL": ""}, "SPOOL"),
        ({"SPOOL": True}, "SPOOL"),
    ],
)
def test_e001_bad_scheduler_values(extra: dict[str, Any], key: str) -> None:
    with override_settings(ANARCHON=memory(**extra)):
        messages = [m for m in run_all() if m.id == "anarchon.E001"]
    assert len(messages) == 1, messages
    assert f"['default'][{key!r}]" in messages[0].msg


def test_e002_unknown_backend_path() -> None:
    with override_settings(ANARCHON={"default": {"BACKEND": "django_anarchon.backends.nope.Nope"}}):
        (message,) = run_all()
    assert message.id == "anarchon.E002"
    assert "django_anarchon.backends.nope.Nope" in message.msg


def test_e003_backend_refuses_its_options() -> None:
    with override_settings(ANARCHON=memory(OPTIONS={"colour": "blue"})):
        (message,) = run_all()
    assert message.id == "anarchon.E003"
    assert "colour" in message.msg


@pytest.mark.parametrize(
    ("defaults", "needle"),
    [({"history_size": 0}, "history_size"), ({"timezone": "UTC"}, "unknown option 'timezone'")],
)
def test_e001_bad_job_defaults(defaults: dict[str, Any], needle: str) -> None:
    every("10s", name="checks.defaults")(handler)
    with override_settings(ANARCHON=memory(JOB_DEFAULTS=defaults)):
        (message,) = run_all()
    assert message.id == "anarchon.E001"
    assert "JOB_DEFAULTS" in message.msg and needle in message.msg


def test_e004_a_scheduled_class_that_needs_arguments() -> None:
    class Reports:
        def __init__(self, mailer: object) -> None:
            self.mailer = mailer

        @every("1h")
        def weekly(self, ctx: Any) -> None:
            """Never called."""

    scheduled(prefix="reports")(Reports)
    with override_settings(ANARCHON=memory()):
        (message,) = run_all()
    assert message.id == "anarchon.E004"
    assert "scheduler 'default' cannot be built" in message.msg and "mailer" in message.msg


def test_e005_lease_option_on_a_backend_without_leases() -> None:
    every("10s", name="checks.retry", max_attempts=3, scheduler="noleases")(handler)
    config = {**memory(), "noleases": {"BACKEND": "tests.test_checks.NoLeaseBackend"}}
    with override_settings(ANARCHON=config):
        messages = run_all()
    assert ids(messages) == ["anarchon.E005"]
    assert "max_attempts" in messages[0].msg and "checks.retry" in messages[0].msg


def test_e005_default_lease_values_are_not_refused() -> None:
    every("10s", name="checks.plain", max_attempts=1, scheduler="noleases")(handler)
    config = {**memory(), "noleases": {"BACKEND": "tests.test_checks.NoLeaseBackend"}}
    with override_settings(ANARCHON=config):
        assert run_all() == []


def test_e005_backend_check_job_and_dedupe_window() -> None:
    every("10s", name="checks.late", max_late="10m", scheduler="noleases")(handler)
    config = {**memory(), "noleases": {"BACKEND": "tests.test_checks.NoLeaseBackend"}}
    with override_settings(ANARCHON=config):
        messages = run_all()
    # the 5-minute window is shorter than max_late, and check_job refuses too
    assert ids(messages) == ["anarchon.E005", "anarchon.E005"]
    assert any("dedupe window" in m.msg for m in messages)
    assert any("refuses jitter" in m.msg for m in messages)


def test_e006_jobs_for_an_unconfigured_scheduler() -> None:
    every("10s", name="checks.orphan", scheduler="nightly")(handler)
    with override_settings(ANARCHON=memory()):
        (message,) = run_all()
    assert message.id == "anarchon.E006"
    assert "nightly" in message.msg and "checks.orphan" in message.msg


def test_w002_one_off_in_the_past_warns_and_never_errors() -> None:
    past = datetime.now(UTC) - timedelta(hours=2)
    at(past, name="checks.gone")(handler)
    at(past, name="checks.caught", catch_up="3h")(handler)
    with override_settings(ANARCHON=memory()):
        messages = run_all()
    assert ids(messages) == ["anarchon.W002"]
    assert messages[0].obj == "checks.gone"
    assert messages[0].is_serious() is False


REDIS = {"BACKEND": "django_anarchon.backends.redis.RedisBackend",
         "OPTIONS": {"url": "redis://127.0.0.1:6379/0"}}


def test_w003_a_spool_directory_that_cannot_be_written(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    for spool in (tmp_path / "a-file", tmp_path / "a-file" / "spool"):
        with override_settings(ANARCHON={"default": {**REDIS, "SPOOL": str(spool)}}):
            (message,) = run_all()
        assert message.id == "anarchon.W003", message
        assert str(spool) in message.msg and "lost" in message.msg
        assert not message.is_serious()


def test_w003_silent_for_a_writable_or_absent_spool(tmp_path: Path) -> None:
    for spool in (str(tmp_path / "not" / "yet"), tmp_path, False, None):
        with override_settings(ANARCHON={"default": {**REDIS, "SPOOL": spool}}):
            assert run_all() == [], spool
    assert not (tmp_path / "not").exists()  # the check creates nothing
    (tmp_path / "a-file").write_text("")
    with override_settings(ANARCHON=memory(SPOOL=str(tmp_path / "a-file"))):
        assert run_all() == []  # the memory store has no spool


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_w001_sqlite_without_immediate() -> None:
    databases = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
    config = {"default": {"BACKEND": DATABASE}}
    with override_settings(ANARCHON=config, DATABASES=databases):
        (message,) = run_all()
    assert message.id == "anarchon.W001"
    assert "IMMEDIATE" in message.msg and "timeout" in message.msg


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_w001_silent_when_sqlite_is_configured_for_several_processes() -> None:
    databases = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:",
                             "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 20}}}
    config = {"default": {"BACKEND": DATABASE}}
    with override_settings(ANARCHON=config, DATABASES=databases):
        assert run_all() == []


def test_every_problem_is_reported_not_only_the_first() -> None:
    every("10s", name="checks.a", catch_up="1h", scheduler="noleases")(handler)
    at(datetime.now(UTC) - timedelta(days=1), name="checks.b", scheduler="noleases")(handler)
    config = {"default": {"BACKEND": MEMORY, "THREADS": -1},
              "noleases": {"BACKEND": "tests.test_checks.NoLeaseBackend"}}
    with override_settings(ANARCHON=config):
        assert ids(run_all()) == ["anarchon.E001", "anarchon.E005", "anarchon.W002"]


# Backends used above, imported by dotted path from settings.


class NoLeaseBackend(MemoryBackend):
    """A claim-only store that forgets claims after five minutes."""

    name = "no-lease"
    dedupe_window_ms = 300_000.0

    def __init__(self) -> None:
        super().__init__()
        self.runs = None  # type: ignore[assignment]

    def check_job(self, job: JobLimits) -> None:
        if job.jitter_ms + job.max_late_ms > 120_000:
            raise ConfigurationError("this store refuses jitter + max_late above 2m",
                                     job=job.name, option="max_late", value=job.max_late_ms)




def test_e003_database_backend_on_an_unknown_alias() -> None:
    config = {"default": {"BACKEND": DATABASE, "OPTIONS": {"using": "reports"}}}
    with override_settings(ANARCHON=config):
        (message,) = run_all()
    assert message.id == "anarchon.E003"
    assert "reports" in message.msg


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_the_default_settings_use_the_database_backend() -> None:
    """No ANARCHON setting (None): the database backend on "default", SQLite here."""
    databases = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:",
                             "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 20}}}
    with override_settings(DATABASES=databases, ANARCHON=None):
        assert run_all() == []
    with override_settings(ANARCHON=None):
        assert ids(run_all()) == ["anarchon.W001"]  # tests.settings: SQLite without IMMEDIATE


def test_scheduler_databases_names_where_database_schedulers_keep_runs() -> None:
    from django_anarchon.checks import scheduler_databases

    config = {
        "default": {"BACKEND": DATABASE},
        "reports": {"BACKEND": DATABASE, "OPTIONS": {"using": "sqlite"}},
        "again": {"BACKEND": DATABASE, "OPTIONS": {"using": "sqlite"}},
        "fast": {"BACKEND": MEMORY},
        "broken": {"BACKEND": DATABASE, "OPTIONS": {"using": "nowhere"}},
    }
    with override_settings(ANARCHON=config):
        assert scheduler_databases() == ["default", "sqlite"]
        assert scheduler_databases(["fast", "reports"]) == ["sqlite"]
        assert scheduler_databases(["unknown"]) == []
    with override_settings(ANARCHON=["not a dict"]):
        assert scheduler_databases() == []  # E001 says why


def test_e007_runs_only_for_the_databases_a_command_names(
    django_db_blocker: Any, tmp_path: Path
) -> None:
    """A fresh SQLite file has no tables: E007 once its alias is named, never before."""
    from django.db import connections

    from django_anarchon.checks import anarchon_database_check

    connections.settings["fresh"] = {**connections.settings["default"],
                                     "NAME": str(tmp_path / "fresh.sqlite3")}
    config = {"default": {"BACKEND": DATABASE, "OPTIONS": {"using": "fresh"}}}
    try:
        with override_settings(ANARCHON=config):
            # Database-tagged: a plain `manage.py check` leaves it out, as Django's own.
            assert "database" in anarchon_database_check.tags  # type: ignore[attr-defined]
            assert anarchon_database_check(databases=None) == []
            assert anarchon_database_check(databases=["default"]) == []  # not the scheduler's
            with django_db_blocker.unblock():
                (message,) = anarchon_database_check(databases=["fresh"])
    finally:
        if "fresh" in connections:
            connections["fresh"].close()
            del connections["fresh"]
        del connections.settings["fresh"]
    assert (message.id, message.obj) == ("anarchon.E007", "fresh")
    assert "django_anarchon_run" in message.msg
    assert message.hint == "Run `python manage.py migrate --database fresh`."


JAN_2026 = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp() * 1000)


def test_w004_names_the_dates_and_the_policy_of_gaps_and_folds() -> None:
    cron("30 2 * * *", timezone="America/New_York", name="checks.gap")(handler)
    cron("30 1 * * *", timezone="America/New_York", name="checks.fold")(handler)
    cron("15 2 * * *", timezone="Australia/Lord_Howe", name="checks.lord_howe")(handler)
    with override_settings(ANARCHON=memory()):
        messages = {m.obj: m for m in run_all(now_ms=JAN_2026)}
    assert ids(list(messages.values())) == ["anarchon.W004"] * 3
    assert all(not m.is_serious() for m in messages.values())
    assert messages["checks.gap"].msg == (
        "scheduler 'default': the cron job 'checks.gap' (cron \"30 2 * * *\" (America/New_York)) "
        "meets daylight-saving changes within a year: 2026-03-08 (02:30 does not exist; "
        "dst_gap='shift' fires once, at the end of the gap)")
    assert "2026-11-01 (01:30 happens twice; dst_fold='first' fires at the first occurrence)" in (
        messages["checks.fold"].msg)
    assert "2026-03-08" not in messages["checks.fold"].msg
    assert "2026-10-04 (02:15 does not exist" in messages["checks.lord_howe"].msg


def test_w004_is_silent_for_elapsed_time_no_transitions_and_a_chosen_policy() -> None:
    cron("*/15 * * * *", timezone="America/New_York", name="checks.quarterly")(handler)
    cron("0 * * * *", timezone="Australia/Lord_Howe", name="checks.hourly")(handler)
    cron("30 2 * * *", timezone="Asia/Tokyo", name="checks.tokyo")(handler)
    cron("30 2 * * *", timezone="UTC", name="checks.utc")(handler)
    cron("30 2 * * *", timezone="America/New_York", name="checks.chosen", dst_gap="shift")(handler)
    cron("30 1 * * *", timezone="America/New_York", name="checks.both",
         dst_fold="both")(handler)
    cron("0 8 * * *", timezone="Europe/Athens", name="checks.morning")(handler)
    with override_settings(ANARCHON=memory()):
        assert run_all(now_ms=JAN_2026) == []


def test_w004_when_only_the_other_policy_was_chosen() -> None:
    cron("30 1,2 * * *", timezone="America/New_York", name="checks.half", dst_gap="skip")(handler)
    with override_settings(ANARCHON=memory()):
        (message,) = run_all(now_ms=JAN_2026)
    assert message.id == "anarchon.W004"
    assert "2026-11-01 (01:30 happens twice; dst_fold='first'" in message.msg
    assert "2026-03-08" not in message.msg
