"""PostgreSQL fast paths: one round trip per claim through the migration's functions.

``anarchon_claim_v1`` decides ``claim()``; ``anarchon_run_claim_v1`` decides the common
cases of ``runs.claim()`` (a new run, the same token again, a live lease) and answers
``'other'`` for the rest, which then take the general lock path in ``store.py``. Each is
one ``SELECT`` in autocommit mode: no BEGIN, no COMMIT, one round trip.
"""

from __future__ import annotations

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


def claim(connection: BaseDatabaseWrapper, input: ClaimInput) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(CLAIM_SQL, [input.job, input.slot, input.token, input.instance_id])
        row = cursor.fetchone()
    return bool(row[0])


def run_claim(connection: BaseDatabaseWrapper, c: RunClaim) -> ClaimOutcome | None:
    """The outcome, or ``None`` when the claim must take the general lock path."""
    with connection.cursor() as cursor:
        cursor.execute(
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
        kind, attempt, slot, now = cursor.fetchone()
    if kind == "won":
        return ClaimOutcome.won(int(attempt))
    if kind == "running":
        return ClaimOutcome.running(int(attempt))
    if kind == "late":
        return ClaimOutcome.late(int(now) - c.slot)
    if kind == "overlap":
        return ClaimOutcome.overlap(int(slot))
    return None
