"""Shared test fixtures: the real database servers, and databases of this test run's own.

* ``unavailable(reason)``: a server a test needs is missing: fail under CI (``CI=true``),
  skip loudly elsewhere.
* ``postgres_database`` / ``mysql_database`` / ``sqlite_database`` (session): create a fresh
  database (a file for SQLite), point the alias of the same name in ``tests/settings.py``
  at it (and ``ANARCHON_*_NAME`` for subprocesses), migrate ``django_anarchon`` into it,
  and drop it when the session ends. Each returns the alias.
* ``database_access``: lets a test (and the threads it starts) use those databases.
  The database backend's tests use it instead of ``pytest.mark.django_db``: their threads
  and processes must see committed rows, and pytest-django would otherwise build
  ``test_*`` copies of every alias named in a ``databases=`` list.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from django.conf import settings

from tests.support import reachable, unavailable


def _run_name() -> str:
    return f"anarchon_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"


def databases() -> dict[str, dict[str, Any]]:
    """``settings.DATABASES``, typed."""
    return cast(dict[str, dict[str, Any]], settings.DATABASES)


def _point_alias(alias: str, env_var: str, name: str) -> None:
    from django.db import connections

    databases()[alias]["NAME"] = name  # the same dict the connections read
    os.environ[env_var] = name
    connections[alias].close()


def _migrate(alias: str, blocker: Any) -> None:
    from django.core.management import call_command

    with blocker.unblock():
        call_command(
            "migrate", "django_anarchon", database=alias, verbosity=0, skip_checks=True
        )


def _close(alias: str) -> None:
    from django.db import connections

    connections[alias].close()


@pytest.fixture(scope="session")
def postgres_database(django_db_blocker: Any) -> Iterator[str]:
    import psycopg

    db = databases()["postgres"]
    host, port = db["HOST"], int(db["PORT"])
    if not reachable(host, port):
        unavailable(f"no PostgreSQL server at {host}:{port} (set ANARCHON_PG_HOST/PORT)")
    name = _run_name()
    admin = dict(host=host, port=port, user=db["USER"], password=db["PASSWORD"] or None)
    with psycopg.connect(dbname="postgres", autocommit=True, connect_timeout=5, **admin) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        _point_alias("postgres", "ANARCHON_PG_NAME", name)
        _migrate("postgres", django_db_blocker)
        yield "postgres"
    finally:
        _close("postgres")
        with psycopg.connect(
            dbname="postgres", autocommit=True, connect_timeout=5, **admin
        ) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def mysql_database(django_db_blocker: Any) -> Iterator[str]:
    import MySQLdb  # type: ignore[import-untyped]

    db = databases()["mysql"]
    host, port = db["HOST"], int(db["PORT"])
    if not reachable(host, port):
        unavailable(f"no MariaDB/MySQL server at {host}:{port} (set ANARCHON_MYSQL_HOST/PORT)")
    name = _run_name()
    admin = dict(host=host, port=port, user=db["USER"], password=db["PASSWORD"], connect_timeout=5)
    conn = MySQLdb.connect(**admin)
    try:
        conn.cursor().execute(
            f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci"
        )
    finally:
        conn.close()
    try:
        _point_alias("mysql", "ANARCHON_MYSQL_NAME", name)
        _migrate("mysql", django_db_blocker)
        yield "mysql"
    finally:
        _close("mysql")
        conn = MySQLdb.connect(**admin)
        try:
            conn.cursor().execute(f"DROP DATABASE IF EXISTS `{name}`")
        finally:
            conn.close()


@pytest.fixture(scope="session")
def sqlite_database(
    django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    path: Path = tmp_path_factory.mktemp("anarchon-sqlite") / "runs.sqlite3"
    try:
        _point_alias("sqlite", "ANARCHON_SQLITE_NAME", str(path))
        _migrate("sqlite", django_db_blocker)
        yield "sqlite"
    finally:
        _close("sqlite")


@pytest.fixture(scope="session", autouse=True)
def _shared_race_rounds() -> None:
    """``ANARCHON_SHARED_RACE_ROUNDS``: the rounds of every store's race through one shared
    backend object (``race_shared_rounds``, 200), as ``ANARCHON_RACE_ROUNDS`` sets the
    others'. scripts/test lowers both on its second interpreter; the first runs them all."""
    rounds = os.environ.get("ANARCHON_SHARED_RACE_ROUNDS")
    if rounds:
        from django_anarchon.testing._base import ContractBase

        ContractBase.race_shared_rounds = int(rounds)


@pytest.fixture
def database_access(django_db_blocker: Any) -> Iterator[None]:
    with django_db_blocker.unblock():
        yield


@pytest.fixture
def skew(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``skew(ms)`` moves this process's wall clock (the worker's) by ``ms``; a store's stays.

    It shifts ``time.time_ns``, which the engine's ``now_ms`` reads; ``real_ms`` of
    tests/test_engine_support.py keeps reading the true time.
    """
    import time

    from tests.test_engine_support import _real_time_ns

    def set_skew(ms: int) -> None:
        monkeypatch.setattr(time, "time_ns", lambda: _real_time_ns() + ms * 1_000_000)

    yield set_skew
