"""PostgreSQL fast paths: one round trip per claim through the migration's functions.

``anarchon_claim_v1`` decides ``claim()``; ``anarchon_run_claim_v1`` decides the common
cases of ``runs.claim()`` (a new run, the same token again, a live lease) and answers
``'other'`` for the rest, which then take the general lock path in ``store.py``. Each is
one ``SELECT`` in autocommit mode: no BEGIN, no COMMIT, one round trip.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from ..base import ClaimInput, ClaimOutcome, RunClaim

__all__ = ["claim", "functions_installed", "run_claim"]

CLAIM_SQL = "SELECT anarchon_claim_v1(%s, %s, %s, %s)"
RUN_CLAIM_SQL = (
    "SELECT o_kind, o_attempt, o_slot, o_now_ms "
    "FROM anarchon_run_claim_v1(%s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
_SIGNATURES = (
    "anarchon_claim_v1(text, bigint, text, text)",
    "anarchon_run_claim_v1(text, bigint, text, text, bigint, text, boolean, bigint, bigint)",
)


def functions_installed(connection: BaseDatabaseWrapper) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT " + ", ".join("to_regprocedure(%s) IS NOT NULL" for _ in _SIGNATURES),
            list(_SIGNATURES),
        )
        row = cursor.fetchone()
    return all(row)


def _call(connection: BaseDatabaseWrapper, sql: str, params: list[Any]) -> tuple[Any, ...]:
    """One row from a prepared statement on the thread's connection, in one round trip.

    A server-binding psycopg cursor with ``prepare=True``: PostgreSQL parses and plans
    the call once per connection. As through a Django cursor, errors become Django's and
    ``connection.execute_wrapper()`` wrappers see the statement.
    """
    import psycopg

    connection.ensure_connection()
    with psycopg.Cursor(connection.connection) as cursor:

        def execute(sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
            with connection.wrap_database_errors:
                return cursor.execute(sql, params, prepare=True)

        executor: Callable[..., Any] = execute
        context: dict[str, Any] = {"connection": connection, "cursor": cursor}
        for wrapper in reversed(connection.execute_wrappers):
            executor = functools.partial(wrapper, executor)
        executor(sql, params, False, context)
        with connection.wrap_database_errors:
            row = cursor.fetchone()
    assert row is not None
    return tuple(row)


def claim(connection: BaseDatabaseWrapper, input: ClaimInput) -> bool:
    row = _call(connection, CLAIM_SQL, [input.job, input.slot, input.token, input.instance_id])
    return bool(row[0])


def run_claim(connection: BaseDatabaseWrapper, c: RunClaim) -> ClaimOutcome | None:
    """The outcome, or ``None`` when the claim must take the general lock path."""
    kind, attempt, slot, now = _call(
        connection,
        RUN_CLAIM_SQL,
        [
            c.job,
            c.slot,
            c.token,
            c.instance_id,
            c.lease_ms,
            c.reason,
            c.overlap == "skip",
            c.max_late_ms,
            c.keep_ms,
        ],
    )
    if kind == "won":
        return ClaimOutcome.won(int(attempt))
    if kind == "running":
        return ClaimOutcome.running(int(attempt))
    if kind == "late":
        return ClaimOutcome.late(int(now) - c.slot)
    if kind == "overlap":
        return ClaimOutcome.overlap(int(slot))
    return None
