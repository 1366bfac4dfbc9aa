"""Backfill requests: filed by a command or the admin as rows, run by the workers.

Like "Run now" (``run_requests``), a backfill never runs in the command or the web
request that asked for it. ``Scheduler.abackfill`` works out the slots of the range that
never ran and files one ``BackfillRequest``; every ``anarchon_worker`` of the scheduler
looks for open requests beside its run requests. A conditional UPDATE hands a request to
one worker, which runs its slots one at a time, oldest first, each through the normal
lease claim with reason ``backfill``: the store answers ``done`` for a slot that ran
meanwhile (another backfill of the same range, or a catch-up), so each slot runs once
however many requests name it. The worker notes its progress (``done``, ``claimed_at``)
after each slot, and renews ``claimed_at`` while a slot runs; a request whose note is
older than ``ABANDONED_AFTER_S`` belongs to a worker that died (or lost its database),
and another one goes on from its progress. The first worker, back, sees that the
request is no longer its own and stops, so the slots never run two at a time.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from datetime import timedelta
from typing import TYPE_CHECKING

from asgiref.sync import sync_to_async
from django.db import DatabaseError, router, transaction
from django.db.models import Q
from django.db.models.functions import Now

from .logtime import iso
from .run_requests import ABANDONED_AFTER_S, claim_oldest, wake_workers

if TYPE_CHECKING:
    from .engine import Scheduler
    from .models import BackfillRequest

__all__ = ["claim_backfills", "file_backfill", "run_backfill"]

logger = logging.getLogger("django_anarchon")


def _file(
    scheduler: str, job: str, start: int, end: int, slots: list[int], overlap: str, by: str
) -> int:
    from .models import BackfillRequest

    request = BackfillRequest.objects.create(
        scheduler=scheduler, job=job, start_ms=start, end_ms=end, slots=slots,
        overlap=overlap, requested_by=by,
    )
    transaction.on_commit(
        lambda: wake_workers(scheduler, job), using=router.db_for_write(BackfillRequest)
    )
    return int(request.pk)


async def file_backfill(
    scheduler: str, job: str, start: int, end: int, slots: list[int], overlap: str, by: str
) -> int:
    """File the request (the database of the ``BackfillRequest`` model); its id."""
    return await sync_to_async(_file, thread_sensitive=False)(
        scheduler, job, start, end, slots, overlap, by
    )


def _open(jobs: Collection[str]) -> Q:
    stale = Now() - timedelta(seconds=ABANDONED_AFTER_S)
    return (
        Q(finished_at__isnull=True)
        & (Q(claimed_at__isnull=True) | Q(claimed_at__lt=stale))
        & Q(job__in=list(jobs))
    )


def claim_backfills(
    scheduler: str, instance_id: str, jobs: Collection[str]
) -> list[BackfillRequest]:
    """The oldest open backfill request of ``scheduler`` for ``jobs``, if this instance
    won it (a worker runs one backfill at a time per scheduler)."""
    from .models import BackfillRequest

    return claim_oldest(BackfillRequest, _open(jobs), scheduler, instance_id, 1)


#: How often a worker renews its claim of a request while a slot runs.
RENEW_EVERY_S = ABANDONED_AFTER_S / 4


def _progress(request_id: int, instance_id: str, done: int, finished: bool) -> bool:
    """Note ``done`` (and the end); False when another worker holds the request now."""
    from .models import BackfillRequest

    values = {"done": done, "claimed_at": Now()}
    if finished:
        values["finished_at"] = Now()
    mine = BackfillRequest.objects.filter(
        pk=request_id, claimed_by=instance_id, finished_at__isnull=True, done__lte=done
    )
    return mine.update(**values) > 0


def _renew(request_id: int, instance_id: str) -> bool:
    from .models import BackfillRequest

    mine = BackfillRequest.objects.filter(
        pk=request_id, claimed_by=instance_id, finished_at__isnull=True
    )
    return mine.update(claimed_at=Now()) > 0


async def _keep_claimed(request_id: int, instance_id: str) -> None:
    """Renew the claim until cancelled (or until another worker holds the request)."""
    renew = sync_to_async(_renew, thread_sensitive=False)
    while True:
        await asyncio.sleep(RENEW_EVERY_S)
        try:
            if not await renew(request_id, instance_id):
                return
        except DatabaseError as exc:
            logger.warning("backfill request %s: cannot renew its claim (%s)", request_id, exc)


async def run_backfill(scheduler: Scheduler, request: BackfillRequest) -> None:
    """Run a won request's slots from its progress on; errors are logged, never raised."""
    progress = sync_to_async(_progress, thread_sensitive=False)
    slots = [int(slot) for slot in request.slots]
    logger.info(
        "backfill request %s: job=%s, %s slot(s) from %s, requested_by=%s",
        request.pk, request.job, len(slots) - request.done,
        iso(slots[request.done]) if request.done < len(slots) else "-",
        request.requested_by or "?",
    )
    me = scheduler.instance_id
    keeper = asyncio.create_task(_keep_claimed(request.pk, me))
    try:
        job = scheduler.get_job(request.job)
        done = request.done
        for slot in slots[request.done :]:
            if scheduler.stopping:
                return  # the progress stays: another worker goes on after the stop
            outcome = await scheduler.claim_flows.backfill(job, slot, request.overlap)
            if outcome == "paused":
                logger.warning(
                    "backfill request %s: job %s is paused; %s slot(s) left undone",
                    request.pk, job.name, len(slots) - done,
                )
                await progress(request.pk, me, done, True)
                return
            if outcome is None:
                return  # the store did not answer: the request is taken up again later
            done += 1
            if not await progress(request.pk, me, done, False):
                logger.warning(
                    "backfill request %s: another worker holds it now; this one stops",
                    request.pk,
                )
                return
        await progress(request.pk, me, done, True)
    except Exception:
        logger.exception("backfill request %s for job %s failed", request.pk, request.job)
    finally:
        keeper.cancel()
