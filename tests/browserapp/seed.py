"""History, leases and run requests as an hour of a real deployment leaves them.

Run once, before the web server and the worker start, by tests/test_browser.py.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from django_anarchon.engine.calls import error_text
from django_anarchon.models import BackfillRequest, Run, RunAttempt, RunRequest

from .jobs import HEARTBEAT, LONG_NAME

#: A job no worker of the test knows: its lease is left alone.
ORPHAN = "legacy.nightly_import"


def _failure() -> str:
    def charge(order: int) -> None:
        raise ConnectionError(f"payment gateway did not answer within 2s (order {order})")

    try:
        charge(1042)
    except ConnectionError as exc:
        return error_text(exc)
    raise AssertionError("unreachable")


def seed(runs: int = 40) -> None:
    now_ms = int(time.time() * 1000)
    last_slot = now_ms - now_ms % 5000 - 30_000  # before anything the worker will run
    failure = _failure()
    for index in range(runs):
        slot = last_slot - index * 5000
        at = datetime.fromtimestamp(slot / 1000, tz=UTC)
        failed = index % 4 == 1
        RunAttempt.objects.create(
            job=HEARTBEAT, slot=slot, scheduled_at=at, instance_id=f"web-{index % 2 + 1}",
            attempt=1, reason="scheduled", status="failed" if failed else "success",
            started_at=at + timedelta(milliseconds=40), duration_ms=2003 if failed else 87,
            finished_at=at + timedelta(milliseconds=2043 if failed else 127),
            error=failure if failed else None,
        )
    slot = now_ms - 3_600_000
    at = datetime.fromtimestamp(slot / 1000, tz=UTC)
    RunAttempt.objects.create(
        job=LONG_NAME, slot=slot, scheduled_at=at, instance_id="web-1", attempt=2,
        reason="takeover", status="success", started_at=at + timedelta(seconds=31),
        finished_at=at + timedelta(seconds=95), duration_ms=64_000,
    )
    common = {"token": "lease-token", "reason": "scheduled", "state": "running"}
    Run.objects.create(job=ORPHAN, slot=now_ms - 300_000, attempt=1, instance_id="web-2",
                       lease_until_ms=now_ms + 1_800_816, started_at_ms=now_ms - 299_000,
                       **common)
    Run.objects.create(job=LONG_NAME, slot=now_ms - 60_000, attempt=1, instance_id="web-1",
                       lease_until_ms=now_ms - 20_000, started_at_ms=now_ms - 59_000, **common)
    for index, who in enumerate(("alice", "bob")):
        request = RunRequest.objects.create(scheduler="default", job=HEARTBEAT,
                                            requested_by=who, data={"reason": "deploy"})
        RunRequest.objects.filter(pk=request.pk).update(
            claimed_by="web-1", claimed_at=request.requested_at + timedelta(milliseconds=640),
            slot=now_ms - 600_000 * (index + 1),
        )
    # A finished backfill of the heartbeat, and one waiting for a job no worker has.
    slots = [last_slot - 3_600_000 + i * 5000 for i in range(12)]
    done = BackfillRequest.objects.create(
        scheduler="default", job=HEARTBEAT, start_ms=slots[0], end_ms=slots[-1], slots=slots,
        overlap="skip", requested_by="alice", done=12, claimed_by="web-2",
    )
    BackfillRequest.objects.filter(pk=done.pk).update(
        claimed_at=done.requested_at + timedelta(seconds=3),
        finished_at=done.requested_at + timedelta(seconds=4),
    )
    BackfillRequest.objects.create(
        scheduler="default", job=ORPHAN, start_ms=now_ms - 86_400_000, end_ms=now_ms - 3_600_000,
        slots=[now_ms - 86_400_000], overlap="allow", requested_by="bob",
    )
