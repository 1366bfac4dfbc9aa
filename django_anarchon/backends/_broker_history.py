"""History records as the broker backends store them: versioned JSON, one message each.

A won claim and a saved result are two messages in the job's history log. Each carries
the ``history_size`` and ``history_ttl_ms`` it was written with, so a reader prunes
without knowing the job's options; a run whose result expired is dropped with its claim.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from .base import ClaimInput, ClaimRecord, RunRecord, StoredResult, build_history

FORMAT = 1  # payload version; readers accept every version they know

_Key = tuple[int, str, int, bool]


def claim_body(input: ClaimInput, *, at: int, manual: bool, slot: int | None = None) -> bytes:
    return json.dumps(
        {
            "v": FORMAT,
            "kind": "claim",
            "slot": input.slot if slot is None else slot,
            "by": input.instance_id,
            "at": at,
            "manual": manual,
            "token": input.token,
            "ttl_ms": input.history_ttl_ms,
            "size": input.history_size,
        }
    ).encode()


def result_body(result: StoredResult, history_size: int, history_ttl_ms: int | None) -> bytes:
    return json.dumps(
        {
            "v": FORMAT,
            "kind": "result",
            **result.to_dict(),
            "ttl_ms": history_ttl_ms,
            "size": history_size,
        }
    ).encode()


def parse(data: bytes) -> dict[str, Any] | None:
    """A stored body, or ``None`` for anything this release does not understand."""
    try:
        body = json.loads(data)
    except ValueError:
        return None
    if not isinstance(body, dict) or body.get("v") != FORMAT:
        return None
    return body


def manual_slots(bodies: Iterable[dict[str, Any]]) -> set[int]:
    return {int(b["slot"]) for b in bodies if b.get("kind") == "claim" and b.get("manual")}


def to_history(
    job: str, bodies: Sequence[dict[str, Any]], limit: int, now: int, *, newest_last: bool
) -> list[RunRecord]:
    """``RunRecord``s, newest first, without runs older than the ttl they were saved with.

    The newest body's ``size`` (the job's ``history_size`` when it was written) bounds the
    runs shown, so a log that keeps more than that (a stream bounded in bytes) reads as
    if pruned by count.
    """
    if bodies:
        size = (bodies[-1] if newest_last else bodies[0]).get("size")
        if isinstance(size, int) and size >= 0:
            limit = min(limit, size)
    claims: dict[_Key, tuple[ClaimRecord, int | None]] = {}
    results: dict[_Key, tuple[StoredResult, int | None]] = {}
    for b in bodies:
        if b.get("kind") == "claim":
            claim = ClaimRecord(
                slot=b["slot"], by=b["by"], at=b["at"], manual=b["manual"],
                reason="manual" if b["manual"] else "scheduled",
            )
            claims[(claim.slot, claim.by, claim.attempt, claim.manual)] = (claim, b.get("ttl_ms"))
        elif b.get("kind") == "result":
            result = StoredResult(
                slot=b["slot"], by=b["by"], attempt=b["attempt"], status=b["status"],
                started_at=b["started_at"], finished_at=b["finished_at"],
                duration_ms=b["duration_ms"], error=b.get("error"),
                manual=b.get("manual", False), reason=b.get("reason", "scheduled"),
            )
            results[(result.slot, result.by, result.attempt, result.manual)] = (
                result, b.get("ttl_ms"),
            )
    expired: set[_Key] = set()
    for key, (result, ttl) in results.items():
        if ttl is not None and result.finished_at < now - ttl:
            expired.add(key)
    for key, (claim, ttl) in claims.items():
        if key not in results and ttl is not None and claim.at < now - ttl:
            expired.add(key)
    return build_history(
        job,
        [c for k, (c, _) in claims.items() if k not in expired],
        [r for k, (r, _) in results.items() if k not in expired],
        limit,
    )
