"""The database server's clock, in epoch milliseconds, as SQL and as an ORM expression.

Every lease time (expiry, lateness, liveness) is computed on the server, so instances
whose own clocks disagree still agree on who holds a run.
"""

from __future__ import annotations

from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import BigIntegerField, Func
from django.db.models.sql.compiler import SQLCompiler

from ...exceptions import ConfigurationError

__all__ = ["SUPPORTED_VENDORS", "ServerNowMs", "now_ms_sql"]

#: ``now`` as integer epoch milliseconds, per ``connection.vendor``. MariaDB/MySQL read
#: ``UTC_TIMESTAMP(6)`` so that the session's time zone (and its DST folds) never matter;
#: SQLite's ``julianday('now')`` has millisecond precision.
_NOW_MS_SQL: dict[str, str] = {
    "postgresql": "FLOOR(EXTRACT(EPOCH FROM CLOCK_TIMESTAMP()) * 1000)::bigint",
    "mysql": "CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000"
    " AS SIGNED)",
    "sqlite": "CAST(ROUND((JULIANDAY('now') - 2440587.5) * 86400000.0) AS INTEGER)",
}

SUPPORTED_VENDORS: frozenset[str] = frozenset(_NOW_MS_SQL)


def now_ms_sql(vendor: str) -> str:
    """The SQL expression of the server's ``now`` in epoch ms on ``vendor``."""
    try:
        return _NOW_MS_SQL[vendor]
    except KeyError:
        raise ConfigurationError(
            f"the database backend supports PostgreSQL, MariaDB/MySQL and SQLite, not {vendor!r}",
            option="OPTIONS['using']",
            value=vendor,
        ) from None


class ServerNowMs(Func):
    """``now`` on the database server, in epoch milliseconds (a ``BigIntegerField``)."""

    output_field = BigIntegerField()

    def __init__(self) -> None:
        super().__init__()

    def as_sql(  # type: ignore[override]
        self,
        compiler: SQLCompiler,
        connection: BaseDatabaseWrapper,
        **extra_context: Any,
    ) -> tuple[str, list[Any]]:
        return now_ms_sql(connection.vendor), []
