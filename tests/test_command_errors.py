"""A command whose store is down, refuses the password or was never migrated says so in one line.

Issue 11: ``anarchon_jobs``, ``anarchon_history`` and ``anarchon_run`` printed 80 to 130
lines of traceback. Each case here is a real server (or file) that fails for real: a
Redis port nothing listens on, a Redis that refuses the password, a PostgreSQL database
that does not exist or a port nothing listens on, and a PostgreSQL database and an SQLite
file without the app's tables. The commands run as ``manage.py`` subprocesses, so the
exit code and standard error are exactly what a user sees.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import databases
from .redis_support import free_port
from .support import ROOT, reachable, unavailable, wait_for

SECRET = "s3cret-not-for-logs"
COMMANDS = [["anarchon_jobs"], ["anarchon_history"], ["anarchon_run", "nightly.report"],
            ["anarchon_history", "nightly.report", "--all-slots"]]
#: The commands of the pauses and backfills (they need a store with a ledger).
LEDGER_COMMANDS = [
    ["anarchon_pause", "nightly.report", "--by", "ops"],
    ["anarchon_resume", "nightly.report"],
    ["anarchon_backfill", "nightly.report", "--from", "3h", "--to", "1h", "--dry-run"],
]


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "django", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT),
             "DJANGO_SETTINGS_MODULE": "tests.store_error_settings", **env},
    )


def assert_one_line(result: subprocess.CompletedProcess[str], *expected: str) -> str:
    """Exit code 1, nothing on stdout, one line on stderr naming the scheduler and backend."""
    err = result.stderr.strip()
    assert result.returncode == 1, result.stderr
    assert len(err.splitlines()) == 1, result.stderr
    assert err.startswith("CommandError: scheduler 'default', backend "), err
    for text in expected:
        assert text in err, err
    assert SECRET not in result.stderr + result.stdout
    return err


@pytest.fixture(scope="module")
def redis_with_password() -> Iterator[int]:
    """A redis-server of this test's own that wants a password the client does not have."""
    server = shutil.which("redis-server")
    if server is None:
        unavailable("redis-server is not installed: no server refusing a password")
        return
    port = free_port()
    proc = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--requirepass", "the-right-one"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: reachable("127.0.0.1", port), 15, f"redis-server on {port}")
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="module")
def unmigrated_postgres() -> Iterator[str]:
    """An empty PostgreSQL database: reachable, but ``migrate`` never ran there."""
    import psycopg

    db = databases()["postgres"]
    host, port = db["HOST"], int(db["PORT"])
    if not reachable(host, port):
        unavailable(f"no PostgreSQL server at {host}:{port}")
    name = f"anarchon_unmigrated_{uuid.uuid4().hex[:8]}"
    admin: dict[str, Any] = dict(host=host, port=port, user=db["USER"],
                                 password=db["PASSWORD"] or None, connect_timeout=5)
    with psycopg.connect(dbname="postgres", autocommit=True, **admin) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        with psycopg.connect(dbname="postgres", autocommit=True, **admin) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: "_".join(c[0::2]))
def test_redis_port_nothing_listens_on(command: list[str]) -> None:
    url = f"redis://:{SECRET}@127.0.0.1:{free_port()}/0"
    result = manage({"ANARCHON_SE_KIND": "redis", "ANARCHON_SE_URL": url}, *command)
    assert_one_line(result, "backend redis redis://:***@127.0.0.1:", "ConnectionError")


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: "_".join(c[0::2]))
def test_redis_refuses_the_password(command: list[str], redis_with_password: int) -> None:
    url = f"redis://:{SECRET}@127.0.0.1:{redis_with_password}/0"
    result = manage({"ANARCHON_SE_KIND": "redis", "ANARCHON_SE_URL": url}, *command)
    assert_one_line(result, f"127.0.0.1:{redis_with_password}", "AuthenticationError")


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: "_".join(c[0::2]))
def test_postgres_database_that_does_not_exist(command: list[str]) -> None:
    env = {"ANARCHON_PG_NAME": "anarchon_no_such_database", "ANARCHON_PG_PASSWORD": SECRET}
    result = manage(env, *command)
    err = assert_one_line(result, "backend database (postgresql, alias 'default')",
                          'database "anarchon_no_such_database" does not exist')
    assert "migrate" not in err  # not a missing table: no misleading hint


@pytest.mark.parametrize("command", LEDGER_COMMANDS, ids=lambda c: c[0])
def test_ledger_commands_on_a_postgres_database_that_does_not_exist(command: list[str]) -> None:
    env = {"ANARCHON_PG_NAME": "anarchon_no_such_database", "ANARCHON_PG_PASSWORD": SECRET}
    assert_one_line(manage(env, *command), "backend database (postgresql, alias 'default')",
                    'database "anarchon_no_such_database" does not exist')


def test_ledger_commands_on_sqlite_without_migrations(tmp_path: Path) -> None:
    env = {"ANARCHON_SE_DB": "sqlite", "ANARCHON_SQLITE_NAME": str(tmp_path / "new.sqlite3")}
    for command in LEDGER_COMMANDS:
        assert_one_line(manage(env, *command), "backend database (sqlite, alias 'default')",
                        "no such table: django_anarchon_", "run `python manage.py migrate`")


def test_postgres_port_nothing_listens_on() -> None:
    env = {"ANARCHON_PG_PORT": str(free_port()), "ANARCHON_PG_PASSWORD": SECRET}
    assert_one_line(manage(env, "anarchon_history"), "OperationalError: connection failed")


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: "_".join(c[0::2]))
def test_postgres_without_migrations(command: list[str], unmigrated_postgres: str) -> None:
    result = manage({"ANARCHON_PG_NAME": unmigrated_postgres}, *command)
    assert_one_line(result, 'relation "django_anarchon_run" does not exist',
                    "run `python manage.py migrate`")


def test_sqlite_without_migrations(tmp_path: Path) -> None:
    env = {"ANARCHON_SE_DB": "sqlite", "ANARCHON_SQLITE_NAME": str(tmp_path / "new.sqlite3")}
    for command in COMMANDS:
        assert_one_line(manage(env, *command), "backend database (sqlite, alias 'default')",
                        "no such table: django_anarchon_run", "run `python manage.py migrate`")


def test_run_via_worker_without_the_request_table(tmp_path: Path) -> None:
    env = {"ANARCHON_SE_DB": "sqlite", "ANARCHON_SQLITE_NAME": str(tmp_path / "new.sqlite3")}
    result = manage(env, "anarchon_run", "nightly.report", "--via-worker")
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "CommandError: cannot file a run request for job 'nightly.report': OperationalError: "
        "no such table: django_anarchon_runrequest; run `python manage.py migrate`"
    )


def test_traceback_option_shows_the_whole_traceback() -> None:
    url = f"redis://:{SECRET}@127.0.0.1:{free_port()}/0"
    result = manage({"ANARCHON_SE_KIND": "redis", "ANARCHON_SE_URL": url},
                    "anarchon_jobs", "--traceback")
    assert result.returncode != 0
    assert "Traceback (most recent call last)" in result.stderr
    assert "redis.exceptions.ConnectionError" in result.stderr
    assert "The above exception was the direct cause" in result.stderr


@pytest.mark.parametrize("store", ["postgres", "sqlite"])
def test_worker_refuses_to_start_without_migrations(
    store: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The worker names its databases to the checks: anarchon.E007 stops it at start."""
    env = (
        {"ANARCHON_PG_NAME": request.getfixturevalue("unmigrated_postgres")}
        if store == "postgres"
        else {"ANARCHON_SE_DB": "sqlite", "ANARCHON_SQLITE_NAME": str(tmp_path / "new.sqlite3")}
    )
    result = manage(env, "anarchon_worker", "--instance-id", "W")
    assert result.returncode == 1, result.stderr
    assert "anarchon.E007" in result.stderr and "Run `python manage.py migrate`." in result.stderr
    assert "Traceback" not in result.stderr and "Press Ctrl+C" not in result.stdout


# -- the worker: an outage is waited out, a refusal ends the start in one line -------------


def assert_worker_refused(result: subprocess.CompletedProcess[str], *expected: str) -> None:
    """Exit 1 before the banner; the last line says why; no traceback, no secret."""
    assert result.returncode == 1, result.stderr
    assert "Press Ctrl+C" not in result.stdout and "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("CommandError: scheduler 'default', backend "), result.stderr
    for text in expected:
        assert text in last, last
    assert SECRET not in result.stderr + result.stdout


def test_worker_stops_at_once_when_redis_refuses_the_password(redis_with_password: int) -> None:
    url = f"redis://:{SECRET}@127.0.0.1:{redis_with_password}/0"
    result = manage({"ANARCHON_SE_KIND": "redis", "ANARCHON_SE_URL": url}, "anarchon_worker")
    assert_worker_refused(result, "AuthenticationError")


def test_worker_stops_at_once_when_the_database_does_not_exist() -> None:
    env = {"ANARCHON_PG_NAME": "anarchon_no_such_database", "ANARCHON_PG_PASSWORD": SECRET}
    result = manage(env, "anarchon_worker")
    assert_worker_refused(result, 'database "anarchon_no_such_database" does not exist')


def test_worker_stops_at_once_when_mariadb_refuses_the_user() -> None:
    db = databases()["mysql"]
    if not reachable(db["HOST"], int(db["PORT"])):
        unavailable(f"no MariaDB server at {db['HOST']}:{db['PORT']}")
    env = {"ANARCHON_SE_DB": "mysql", "ANARCHON_MYSQL_USER": "anarchon_nobody",
           "ANARCHON_MYSQL_PASSWORD": SECRET}
    result = manage(env, "anarchon_worker")
    assert_worker_refused(result, "Access denied for user 'anarchon_nobody'")


@pytest.mark.parametrize("store", ["mysql", "redis"])
def test_worker_waits_for_a_store_that_is_down(store: str, tmp_path: Path) -> None:
    """Down is an outage: the worker waits (no exit, no traceback) and stops on SIGTERM."""
    port = free_port()
    env = (
        {"ANARCHON_SE_DB": "mysql", "ANARCHON_MYSQL_PORT": str(port)}
        if store == "mysql"
        else {"ANARCHON_SE_KIND": "redis", "ANARCHON_SE_URL": f"redis://127.0.0.1:{port}/0"}
    )
    log = tmp_path / "stderr.log"
    with log.open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "django", "anarchon_worker", "--grace", "1s"],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr, text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT),
                 "DJANGO_SETTINGS_MODULE": "tests.store_error_settings", **env},
        )
        try:
            wait_for(lambda: "retry" in log.read_text() or proc.poll() is not None, 60,
                     "a retry line of the waiting worker")
            assert proc.poll() is None, log.read_text()
            began = time.monotonic()
            proc.terminate()
            proc.wait(timeout=30)
            took = time.monotonic() - began
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0, log.read_text()
    assert "Traceback" not in log.read_text()
    # A stop while the start waits for its store is immediate (issue 15): no grace, no bound.
    assert took < 3, f"SIGTERM to exit took {took:.1f}s"
