"""The public contract suite against ``DatabaseBackend`` on PostgreSQL, MariaDB and SQLite.

Every claimer is a backend instance of its own, with its own connection threads, so the
race's claims reach the database on separate connections; once per database the race
also runs across OS processes.

Race sizes: 50 claimers x 1,000 rounds on PostgreSQL's fast path. The general path (a
transaction per claim) costs several round trips, so MariaDB, SQLite and PostgreSQL
without the fast path race 50 x 300 (50 x 200) to keep the suite's time;
``ANARCHON_RACE_ROUNDS=1000`` runs the full count everywhere (docs/backends/database.md).
"""

from __future__ import annotations

import os
from typing import ClassVar

import pytest

from django_anarchon.backends.database import DatabaseBackend
from django_anarchon.testing import BackendContract, BackendFactory


def _rounds(default: int) -> int:
    return int(os.environ.get("ANARCHON_RACE_ROUNDS", default))


class DatabaseContract(BackendContract):
    database_fixture: ClassVar[str]
    fast_path: ClassVar[bool] = True
    race_claimers = 50
    race_rounds = _rounds(1000)

    @pytest.fixture(autouse=True)
    def _alias(self, request: pytest.FixtureRequest, database_access: None) -> str:
        alias: str = request.getfixturevalue(self.database_fixture)
        return alias

    @pytest.fixture
    def make_backend(self, _alias: str) -> BackendFactory:
        fast_path = self.fast_path
        # One connection per claimer: 50 claimers stay well inside PostgreSQL's default
        # max_connections (100), next to the other connections of the test run.
        return lambda: DatabaseBackend(using=_alias, max_connections=1, fast_path=fast_path)


@pytest.mark.postgres
class TestPostgresContract(DatabaseContract):
    database_fixture = "postgres_database"
    process_factory = "tests.db_factories:postgres"


@pytest.mark.postgres
class TestPostgresLockPathContract(DatabaseContract):
    """PostgreSQL without its one-statement fast path: the general path MariaDB uses."""

    database_fixture = "postgres_database"
    fast_path = False
    race_rounds = _rounds(200)
    race_many_jobs = 5
    race_many_rounds = 10


@pytest.mark.mysql
class TestMySQLContract(DatabaseContract):
    database_fixture = "mysql_database"
    process_factory = "tests.db_factories:mysql"
    race_rounds = _rounds(300)
    race_many_jobs = 10
    race_many_rounds = 10


class TestSQLiteContract(DatabaseContract):
    database_fixture = "sqlite_database"
    process_factory = "tests.db_factories:sqlite"
    race_rounds = _rounds(300)
    race_many_jobs = 10
    race_many_rounds = 10
