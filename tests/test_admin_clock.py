"""The admin's leases page judges leases by each database server's clock, not the web server's."""

from __future__ import annotations

import time

import pytest

from django_anarchon import admin as anarchon_admin


@pytest.mark.postgres
@pytest.mark.mysql
@pytest.mark.usefixtures("postgres_database", "mysql_database", "database_access")
def test_the_leases_page_reads_each_database_servers_clock() -> None:
    for alias in ("default", "postgres", "mysql"):
        before = int(time.time() * 1000)
        now = anarchon_admin.database_now_ms(alias)
        after = int(time.time() * 1000)
        # same machine: the server's clock agrees with ours to well within a second
        assert before - 1000 <= now <= after + 1000, (alias, before, now, after)
