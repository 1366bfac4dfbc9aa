""""Run now" requests: filed by the admin as rows, run by a worker of the right scheduler.

A web request must never run a job itself (it would hold the request open and run on a
web worker), so the admin files a ``RunRequest`` and every ``anarchon_worker`` polls for
the unclaimed requests of its schedulers. A conditional UPDATE hands each request to
exactly one worker; that worker records and runs a manual run through ``arun_now``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.db import DatabaseError, close_old_connections
from django.utils import timezone

if TYPE_CHECKING:
    from .engine import Scheduler
    from .models import RunRequest

logger = logging.getLogger("django_anarchon")

#: How often a worker looks for new requests, and how long it backs off when it cannot.
POLL_S = 1.0
BACKOFF_S = 30.0


def file_request(scheduler: str, job: str, data: Any = None, requested_by: str = "") -> RunRequest:
    """Ask a worker of ``scheduler`` to run ``job`` now; returns the request row."""
    from .models import RunRequest

    return RunRequest.objects.create(
        scheduler=scheduler, job=job, data=data, requested_by=requested_by
    )


def claim_requests(scheduler: str, instance_id: str, limit: int = 10) -> list[RunRequest]:
    """The unclaimed requests of ``scheduler`` that this instance won (each wins once)."""
    from .models import RunRequest

    close_old_connections()
    won = []
    pending = RunRequest.objects.filter(scheduler=scheduler, claimed_at__isnull=True)
    for request in pending.order_by("requested_at")[:limit]:
        updated = RunRequest.objects.filter(pk=request.pk, claimed_at__isnull=True).update(
            claimed_by=instance_id, claimed_at=timezone.now()
        )
        if updated:
            won.append(request)
    return won


def record_slot(request_id: int, slot: int) -> None:
    from .models import RunRequest

    RunRequest.objects.filter(pk=request_id).update(slot=slot)


async def run_request(scheduler: Scheduler, request: RunRequest) -> None:
    """Run one won request; a failure of the job is recorded in history, never raised here."""
    logger.info(
        "run request %s: job=%s requested_by=%s", request.pk, request.job, request.requested_by or "?"
    )
    try:
        record = await scheduler.arun_now(request.job, data=request.data)
    except Exception:
        logger.exception("run request %s for job %s could not run", request.pk, request.job)
        return
    try:
        await sync_to_async(record_slot, thread_sensitive=False)(request.pk, record.slot)
    except DatabaseError:
        logger.warning("could not note the slot of run request %s", request.pk, exc_info=True)


async def pickup_loop(schedulers: list[Scheduler], poll_s: float = POLL_S) -> None:
    """Poll for requests until cancelled; store errors only slow it down."""
    # Runs outlive this loop's cancellation: the scheduler's stop() interrupts and records them.
    tasks: set[asyncio.Task[None]] = set()
    claim = sync_to_async(claim_requests, thread_sensitive=False)
    while True:
        delay = poll_s
        for scheduler in schedulers:
            try:
                requests = await claim(scheduler.name, scheduler.instance_id)
            except DatabaseError as exc:
                logger.warning(
                    "cannot read run requests (%s); is `manage.py migrate` done? Retrying in %ss",
                    exc, BACKOFF_S,
                )
                delay = BACKOFF_S
                continue
            for request in requests:
                task = asyncio.create_task(run_request(scheduler, request))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        await asyncio.sleep(delay)
