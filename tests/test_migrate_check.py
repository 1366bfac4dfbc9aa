"""anarchon.E007: a database-backed scheduler whose database was never migrated.

Before, forgetting ``migrate`` passed ``manage.py check`` and then every command and the
worker died with ``relation "django_anarchon_run" does not exist``. The check is tagged
``database``, like Django's checks that query a database: it runs for the databases a
command names (``check --database default``), and never blocks ``migrate`` itself.
Against real, empty databases: a SQLite file and a fresh PostgreSQL database.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import django
import pytest

from .conftest import databases
from .support import ROOT, reachable, unavailable


def _sqlite(tmp_path: Path) -> Iterator[str]:
    yield str(tmp_path / "never-migrated.sqlite3")


def _postgres() -> Iterator[str]:
    import psycopg

    db = databases()["postgres"]
    if not reachable(db["HOST"], int(db["PORT"])):
        unavailable(f"no PostgreSQL server at {db['HOST']}:{db['PORT']}")
    name = f"anarchon_nomigrate_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    admin = dict(host=db["HOST"], port=int(db["PORT"]), user=db["USER"],
                 password=db["PASSWORD"] or None, dbname="postgres", autocommit=True,
                 connect_timeout=5)
    with psycopg.connect(**admin) as conn:  # type: ignore[arg-type]
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        with psycopg.connect(**admin) as conn:  # type: ignore[arg-type]
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, str]]:
    kind: str = request.param
    for name in (_sqlite(tmp_path) if kind == "sqlite" else _postgres()):
        yield {**os.environ, "PYTHONPATH": str(ROOT),
               "DJANGO_SETTINGS_MODULE": "tests.nomigrate_settings",
               "ANARCHON_NOMIGRATE_KIND": kind, "ANARCHON_NOMIGRATE_NAME": name}


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "django", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_check_with_the_database_says_to_run_migrate(env: dict[str, str]) -> None:
    done = manage(env, "check", "--database", "default")
    assert done.returncode == 1, done.stdout + done.stderr
    (line,) = [line for line in done.stderr.splitlines() if "anarchon.E007" in line]
    assert "scheduler 'default'" in line and "database 'default'" in line
    assert "django_anarchon_run" in line
    assert "HINT: Run `python manage.py migrate`." in done.stderr
    assert "'fast'" not in done.stderr  # the memory scheduler has no tables to miss


def test_migrate_is_not_blocked_and_then_the_check_passes(env: dict[str, str]) -> None:
    done = manage(env, "migrate", "--noinput", "-v", "0")
    assert done.returncode == 0, done.stdout + done.stderr
    done = manage(env, "check", "--database", "default")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "anarchon.E007" not in done.stderr


def test_plain_check_leaves_the_database_alone(env: dict[str, str]) -> None:
    """Like Django's own database checks: only for the databases a command names."""
    done = manage(env, "check")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "anarchon.E007" not in done.stdout + done.stderr
    # Django 6's own model checks connect to every database (the file then exists), so
    # that E007 did not run is what the return code and the output above show there.
    if env["ANARCHON_NOMIGRATE_KIND"] == "sqlite" and django.VERSION < (6,):
        assert not Path(env["ANARCHON_NOMIGRATE_NAME"]).exists()  # never even opened
