"""PostgreSQL fast paths: one round trip per call through the migrations' functions.

Each call is one ``SELECT`` of a function in autocommit mode (no BEGIN, no COMMIT):
``anarchon_claim_v1`` (0001) for ``claim()``; for ``runs.claim_many()``,
``anarchon_run_claim_many_v6`` (0011), which locks every job's row of the batch first,
decides the batch's new runs together, and sends the rest through
``anarchon_run_claim_many_v4`` (0009); for a single ``runs.claim()`` of a new run,
``anarchon_run_claim_v5`` (0012), which locks its job's row, then answers as
``anarchon_run_claim_v4``; ``anarchon_finish_many_v1``
(0009) for ``runs.finish_many()``: each end's finish, its history record and each job's
prune. A claim these functions do not settle (a takeover, a retry, a pause in force, a
``late`` or ``overlap`` answer that owes its ledger mark) comes back ``'other'`` and takes
the general lock path in ``locked.py``.

``functions_level`` says which migrations' functions are there: a database behind this
release (a rolling deploy) is called through the newest functions it has, with a warning.
The older functions stay installed, unchanged, for the previous releases.
docs/backends/database.md describes each version.

The arrays go as one literal string each (``texts``, ``ints``, ``bools``): psycopg dumps a
list element by element in Python, four times the CPU of the join.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from ..base import DEFAULT_KEEP_MS, MIN_KEEP_MS, ClaimInput, ClaimOutcome, RunClaim, RunEnd

__all__ = [
    "bools",
    "claim",
    "finish_many",
    "functions_level",
    "ints",
    "run_claim",
    "run_claim_many",
    "texts",
]

CLAIM_SQL = "SELECT anarchon_claim_v1(%s, %s, %s, %s)"
RUN_CLAIM_SQL = (
    "SELECT o_kind, o_attempt, o_slot, o_now_ms, o_marked FROM anarchon_run_claim_v3("
    "%s::text, %s::bigint, %s::text, %s::text, %s::bigint, %s::text, %s::boolean, "
    "%s::bigint, %s::bigint, %s::integer)"
)
RUN_CLAIM_MANY_SQL = (
    "SELECT o_index, o_kind, o_attempt, o_slot, o_now_ms, o_marked FROM "
    "anarchon_run_claim_many_v3(%s::text[], %s::bigint[], %s::text[], %s::text[], "
    "%s::bigint[], %s::text[], %s::boolean[], %s::bigint[], %s::bigint[], %s::integer[])"
)
#: Migration 0009's claim functions: as v3, with a finished run's 'done' answered too.
RUN_CLAIM_V4_SQL = (
    "SELECT o_kind, o_attempt, o_slot, o_now_ms, o_marked FROM anarchon_run_claim_v4("
    "%s::text, %s::bigint, %s::text, %s::text, %s::bigint, %s::text, %s::boolean, "
    "%s::bigint, %s::bigint, %s::integer, %s::bigint, %s::bigint)"
)
RUN_CLAIM_MANY_V4_SQL = (
    "SELECT o_index, o_kind, o_attempt, o_slot, o_now_ms, o_marked FROM "
    "anarchon_run_claim_many_v4(%s::text[], %s::bigint[], %s::text[], %s::text[], "
    "%s::bigint[], %s::text[], %s::boolean[], %s::bigint[], %s::bigint[], %s::integer[], "
    "%s::bigint, %s::bigint)"
)
#: Migration 0010's: a batch's new runs decided set-based, the rest through v4 one by one.
RUN_CLAIM_MANY_V5_SQL = RUN_CLAIM_MANY_V4_SQL.replace("_many_v4(", "_many_v5(")
#: Migration 0011's: v5 with every job's lock taken before any run is written.
RUN_CLAIM_MANY_V6_SQL = RUN_CLAIM_MANY_V4_SQL.replace("_many_v4(", "_many_v6(")
#: Migration 0012's: v4 under its job's lock, taken first (as v6 does for a batch).
RUN_CLAIM_V5_SQL = RUN_CLAIM_V4_SQL.replace("_claim_v4(", "_claim_v5(")
FINISH_MANY_SQL = (
    "SELECT o_index, o_finished FROM anarchon_finish_many_v1(%s::text[], %s::bigint[], "
    "%s::text[], %s::text[], %s::text[], %s::integer[], %s::boolean[], %s::text[], "
    "%s::bigint[], %s::bigint[], %s::bigint[], %s::text[], %s::integer[], %s::bigint[], "
    "%s::bigint, %s::bigint)"
)
_SIGNATURES_0009 = (
    "anarchon_finish_many_v1(text[], bigint[], text[], text[], text[], integer[], boolean[],"
    " text[], bigint[], bigint[], bigint[], text[], integer[], bigint[], bigint, bigint)",
    "anarchon_run_claim_v4(text, bigint, text, text, bigint, text, boolean, bigint, bigint,"
    " integer, bigint, bigint)",
    "anarchon_run_claim_many_v4(text[], bigint[], text[], text[], bigint[], text[], boolean[],"
    " bigint[], bigint[], integer[], bigint, bigint)",
)
_SIGNATURES_0010 = (
    "anarchon_run_claim_many_v5(text[], bigint[], text[], text[], bigint[], text[], boolean[],"
    " bigint[], bigint[], integer[], bigint, bigint)",
)
_SIGNATURES_0011 = (
    "anarchon_sweep_v1(text, bigint, bigint)",
    "anarchon_run_claim_many_v6(text[], bigint[], text[], text[], bigint[], text[], boolean[],"
    " bigint[], bigint[], integer[], bigint, bigint)",
)
_SIGNATURES_0012 = (
    "anarchon_run_claim_v5(text, bigint, text, text, bigint, text, boolean, bigint, bigint,"
    " integer, bigint, bigint)",
)
#: What this release calls; a database not migrated to 0008 lacks the v3 functions, and
#: every claim then takes the general path (which honours pauses too).
_SIGNATURES = (
    "anarchon_claim_v1(text, bigint, text, text)",
    "anarchon_run_claim_v3(text, bigint, text, text, bigint, text, boolean, bigint, bigint,"
    " integer)",
    "anarchon_run_claim_many_v3(text[], bigint[], text[], text[], bigint[], text[], boolean[],"
    " bigint[], bigint[], integer[])",
)


def functions_level(connection: BaseDatabaseWrapper) -> int:
    """The newest migration whose functions this release calls are there, with those of
    every migration before it: 12, 11, 10, 9 or 8; 0 when 0008's are missing (every claim then
    takes the general path). One statement."""
    groups = [(8, _SIGNATURES), (9, _SIGNATURES_0009), (10, _SIGNATURES_0010),
              (11, _SIGNATURES_0011), (12, _SIGNATURES_0012)]
    signatures = [signature for _, group in groups for signature in group]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT " + ", ".join("to_regprocedure(%s) IS NOT NULL" for _ in signatures),
            signatures,
        )
        found = iter(cursor.fetchone())
    level = 0
    for migration, group in groups:
        if not all([next(found) for _ in group]):
            break
        level = migration
    return level


def _call(connection: BaseDatabaseWrapper, sql: str, params: list[Any]) -> tuple[Any, ...]:
    """One row from a prepared statement on the thread's connection, in one round trip."""
    rows = _rows(connection, sql, params)
    assert rows, sql
    return rows[0]


def _rows(connection: BaseDatabaseWrapper, sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
    """The rows of a prepared statement on the thread's connection, in one round trip.

    A server-binding psycopg cursor with ``prepare=True``: PostgreSQL parses and plans
    the call once per connection, when the connection has prepared statements on
    (``OPTIONS["prepare_threshold"]``; Django turns them off by default, and psycopg then
    ignores ``prepare``). As through a Django cursor, errors become Django's and
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
            return [tuple(row) for row in cursor.fetchall()]


def claim(connection: BaseDatabaseWrapper, input: ClaimInput) -> bool:
    row = _call(connection, CLAIM_SQL, [input.job, input.slot, input.token, input.instance_id])
    return bool(row[0])


def _outcome(
    c: RunClaim, kind: str, attempt: Any, slot: Any, now: Any, marked: bool
) -> ClaimOutcome | None:
    """The function's answer; ``None`` for the lock path: 'other', 'paused' (the lock path
    writes its mark), and a skip that owes a mark."""
    if kind == "won":
        return ClaimOutcome.won(int(attempt))
    if kind == "running":
        return ClaimOutcome.running(int(attempt))
    if kind == "done":  # v4 only
        return ClaimOutcome.done()
    if kind == "late" and (marked or c.reason == "catch-up"):
        return ClaimOutcome.late(int(now) - c.slot)
    if kind == "early":
        return ClaimOutcome.early(c.slot - int(now))
    if kind == "overlap" and marked:
        return ClaimOutcome.overlap(int(slot))
    return None


def _versioned(params: list[Any], v4: bool, v3_sql: str, v4_sql: str) -> tuple[str, list[Any]]:
    """The v4 function takes the store's two keep constants after v3's arguments."""
    return (v4_sql, [*params, DEFAULT_KEEP_MS, MIN_KEEP_MS]) if v4 else (v3_sql, params)


def texts(values: Iterable[str | None]) -> str:
    """A ``text[]`` literal, sent as one string to a ``%s::text[]`` parameter.

    psycopg dumps a list element by element in Python: about 1.2 ms of a worker's CPU per
    claim batch of 200 (ten arrays), where joining the literals takes a quarter of that,
    and a burst sends dozens of batches while its handlers wait for the same core.
    """
    return "{" + ",".join(
        "NULL" if v is None else '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        for v in values
    ) + "}"


def ints(values: Iterable[int | None]) -> str:
    """A ``bigint[]`` or ``integer[]`` literal (see ``texts``)."""
    return "{" + ",".join("NULL" if v is None else str(int(v)) for v in values) + "}"


def bools(values: Iterable[bool | None]) -> str:
    """A ``boolean[]`` literal (see ``texts``)."""
    return "{" + ",".join("NULL" if v is None else ("t" if v else "f") for v in values) + "}"


#: The literal of each array argument of the claim functions, in ``_args`` order.
_CLAIM_ARRAYS: tuple[Callable[[Iterable[Any]], str], ...] = (
    texts, ints, texts, texts, ints, texts, bools, ints, ints, ints,
)


#: The literal of each array argument of ``anarchon_finish_many_v1``, in ``_end_args`` order.
_FINISH_ARRAYS: tuple[Callable[[Iterable[Any]], str], ...] = (
    texts, ints, texts, texts, texts, ints, bools, texts, ints, ints, ints, texts, ints, ints,
)


def _arrays(
    literals: tuple[Callable[[Iterable[Any]], str], ...], rows: list[list[Any]]
) -> list[str]:
    """One array literal per column of ``rows`` (a row per claim or end, in batch order)."""
    columns = zip(*rows, strict=True)
    return [literal(column) for literal, column in zip(literals, columns, strict=True)]


def set_fingerprints(
    connection: BaseDatabaseWrapper, table: str, fingerprints: dict[str, str], now: int
) -> None:
    """``job_since``'s write: the changed jobs' fingerprints from two arrays, one statement.

    Django's ``Case`` of one ``When`` per job took 100 ms for a thousand jobs, to build
    and to run (every row tests the branches in turn), while every instance starting
    waited on those rows' locks.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} AS l SET schedule_fingerprint = v.fingerprint, "
            "known_since_ms = %s FROM unnest(%s::text[], %s::text[]) AS v(job, fingerprint) "
            "WHERE l.job = v.job",
            [now, texts(fingerprints), texts(fingerprints.values())],
        )


def _end_args(e: RunEnd) -> list[Any]:
    """An end's values for ``anarchon_finish_many_v1``'s arrays (before its two constants)."""
    r = e.result
    return [
        e.job, e.slot, e.token, e.status, r.by, r.attempt, r.manual,
        "manual" if r.manual else r.reason, r.started_at, r.finished_at, r.duration_ms,
        r.error, e.history_size, e.history_ttl_ms,
    ]


def _args(c: RunClaim) -> list[Any]:
    """A claim's arguments to ``anarchon_run_claim_v3``/``v4`` (before v4's two constants)."""
    return [
        c.job, c.slot, c.token, c.instance_id, c.lease_ms, c.reason, c.overlap == "skip",
        c.max_late_ms, c.keep_ms, c.max_attempts,
    ]


def run_claim_many(
    connection: BaseDatabaseWrapper, claims: list[RunClaim], level: int
) -> list[ClaimOutcome | None]:
    """Every claim of the batch in one round trip; ``None`` where the lock path decides.

    The batch goes in (job, slot) order, so batches of different instances take their
    locks in the same order and never wait for each other in a circle. ``level``
    (``functions_level``): from 0010, the batch's new runs are decided set-based; from
    0011, after every job's lock is taken.
    """
    if not claims:
        return []
    order = sorted(range(len(claims)), key=lambda i: (claims[i].job, claims[i].slot))
    # One array per argument of the single-claim function, in batch order.
    params: list[Any] = _arrays(_CLAIM_ARRAYS, [_args(claims[i]) for i in order])
    many_v4 = (
        RUN_CLAIM_MANY_V6_SQL if level >= 11
        else RUN_CLAIM_MANY_V5_SQL if level == 10
        else RUN_CLAIM_MANY_V4_SQL
    )
    rows = _rows(connection, *_versioned(params, level >= 9, RUN_CLAIM_MANY_SQL, many_v4))
    outcomes: list[ClaimOutcome | None] = [None] * len(claims)
    for index, kind, attempt, slot, now, marked in rows:
        original = order[int(index) - 1]
        outcomes[original] = _outcome(claims[original], kind, attempt, slot, now, bool(marked))
    return outcomes


def run_claim(connection: BaseDatabaseWrapper, c: RunClaim, level: int) -> ClaimOutcome | None:
    """The outcome, or ``None`` when the claim must take the general lock path.

    Its job's lock before its run, as in every batch and in the lock path: from
    migration 0012 through ``anarchon_run_claim_v5``; at 0011 as a batch of one (the
    single-claim functions before v5 write the run first).
    """
    if level == 11:
        return run_claim_many(connection, [c], level)[0]
    single_v4 = RUN_CLAIM_V5_SQL if level >= 12 else RUN_CLAIM_V4_SQL
    kind, attempt, slot, now, marked = _call(
        connection, *_versioned(_args(c), level >= 9, RUN_CLAIM_SQL, single_v4)
    )
    return _outcome(c, kind, attempt, slot, now, bool(marked))


def finish_many(connection: BaseDatabaseWrapper, ends: list[RunEnd]) -> list[bool]:
    """Every end of the batch in one round trip: whether each finish acted.

    Sent in (job, slot) order, as claims are, so that batches of two instances never wait
    on each other in a circle; each job is pruned once, after its last record.
    """
    if not ends:
        return []
    order = sorted(range(len(ends)), key=lambda i: (ends[i].job, ends[i].slot))
    arrays = _arrays(_FINISH_ARRAYS, [_end_args(ends[i]) for i in order])
    rows = _rows(connection, FINISH_MANY_SQL, [*arrays, DEFAULT_KEEP_MS, MIN_KEEP_MS])
    finished = [False] * len(ends)
    for index, acted in rows:
        finished[order[int(index) - 1]] = bool(acted)
    return finished
