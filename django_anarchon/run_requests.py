""""Run now" requests: filed by the admin as rows, run by a worker of the right scheduler.

The same loop picks up backfill requests (``django_anarchon.backfill``), one at a time per
scheduler on each worker.

A web request must never run a job itself (it would hold the request open and run on a
web worker), so the admin files a ``RunRequest`` and every ``anarchon_worker`` polls for
the unclaimed requests of its schedulers. A conditional UPDATE hands each request to
exactly one worker; that worker records and runs a manual run through ``arun_now``. A
worker claims only requests for jobs it has, and a request whose claimer died before
the run started is taken by another worker after ``ABANDONED_AFTER_S``.

Filing a request also sends a ``run-request`` hint through the scheduler's store
(``engine/wake.py``) once the row is committed: a worker whose store has a push channel
looks at once instead of at its next poll. The look is the same conditional UPDATE, so
a repeated or forged hint never runs a request twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Collection
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from asgiref.sync import sync_to_async
from django.db import DatabaseError, close_old_connections, router, transaction
from django.db.models import Q
from django.db.models.functions import Now

if TYPE_CHECKING:
    from .engine import Scheduler
    from .models import BackfillRequest, RunRequest

    RequestRow = TypeVar("RequestRow", RunRequest, BackfillRequest)

from .backends.base import Wakeup
from .engine.wake import requests_key, send_wakeup_sync

logger = logging.getLogger("django_anarchon")

#: How often a worker looks for new requests, and how long it backs off when it cannot.
POLL_S = 1.0
BACKOFF_S = 30.0
#: A request claimed this long ago whose run never started is taken by another worker.
ABANDONED_AFTER_S = 60.0


def file_request(scheduler: str, job: str, data: Any = None, requested_by: str = "") -> RunRequest:
    """Ask a worker of ``scheduler`` to run ``job`` now; returns the request row."""
    from .models import RunRequest

    request = RunRequest.objects.create(
        scheduler=scheduler, job=job, data=data, requested_by=requested_by
    )
    # After the commit: a worker woken before it would not see the row yet.
    transaction.on_commit(
        lambda: wake_workers(scheduler, job), using=router.db_for_write(RunRequest)
    )
    return request


def wake_workers(scheduler: str, job: str) -> None:
    """Hint the workers of ``scheduler`` that a request is waiting; never raises."""
    from .handler import schedulers

    try:
        backend = schedulers[scheduler].backend
    except Exception:  # an unknown or broken alias: its workers find the row by polling
        logger.debug("no hint for run requests of scheduler %s", scheduler, exc_info=True)
        return
    send_wakeup_sync(backend, Wakeup("run-request", job=job, scheduler=scheduler))


def _open(jobs: Collection[str] | None) -> Q:
    """Requests nobody runs: unclaimed, or claimed by a worker that never started them.

    A worker notes the slot as soon as the manual run is in the store, so a claim older
    than ``ABANDONED_AFTER`` without a slot was made by a worker that died (or lost its
    database) in between; the database's clock decides, not the worker's.
    """
    stale = Now() - timedelta(seconds=ABANDONED_AFTER_S)
    query = Q(claimed_at__isnull=True) | Q(slot__isnull=True, claimed_at__lt=stale)
    if jobs is not None:
        query &= Q(job__in=list(jobs))
    return query


def claim_requests(
    scheduler: str, instance_id: str, limit: int = 10, jobs: Collection[str] | None = None
) -> list[RunRequest]:
    """The open requests of ``scheduler`` (for ``jobs``, if given) that this instance won.

    A worker passes the jobs it has, so that a request for a job another release or
    another worker defines is left for that one rather than dropped.
    """
    from .models import RunRequest

    return claim_oldest(RunRequest, _open(jobs), scheduler, instance_id, limit)


def claim_oldest(
    model: type[RequestRow], open_: Q, scheduler: str, instance_id: str, limit: int
) -> list[RequestRow]:
    """Up to ``limit`` of the oldest ``open_`` rows of ``scheduler`` that this instance won.

    Each is won by one conditional UPDATE, so two workers never both win a row."""
    close_old_connections()
    won = []
    pending = model._default_manager.filter(open_, scheduler=scheduler)
    for row in pending.order_by("requested_at")[:limit]:
        updated = model._default_manager.filter(open_, pk=row.pk).update(
            claimed_by=instance_id, claimed_at=Now()
        )
        if updated:
            row.refresh_from_db()
            won.append(row)
    return won


def record_slot(request_id: int, slot: int) -> None:
    from .models import RunRequest

    RunRequest.objects.filter(pk=request_id).update(slot=slot)


async def run_request(scheduler: Scheduler, request: RunRequest) -> None:
    """Run one won request; a failure of the job is recorded in history, never raised here."""
    logger.info(
        "run request %s: job=%s requested_by=%s", request.pk, request.job, request.requested_by or "?"
    )

    async def recorded(slot: int) -> None:
        # Noted before the job runs: from now on nobody takes the request over.
        try:
            await sync_to_async(record_slot, thread_sensitive=False)(request.pk, slot)
        except DatabaseError:
            logger.warning("could not note the slot of run request %s", request.pk, exc_info=True)

    try:
        await scheduler._run_now(request.job, request.data, recorded)
    except Exception:
        logger.exception("run request %s for job %s could not run", request.pk, request.job)


async def pickup_loop(schedulers: list[Scheduler], poll_s: float = POLL_S) -> None:
    """Poll for requests until cancelled; store errors only slow it down.

    A ``run-request`` hint on a scheduler's store ends the wait between two polls early.
    """
    with contextlib.ExitStack() as stack:
        woken = [
            stack.enter_context(s.wakes.watching(requests_key(s.name))) for s in schedulers
        ]
        await _pickup(schedulers, poll_s, woken)


async def _wait_any(events: list[asyncio.Event], seconds: float) -> None:
    waits = {asyncio.ensure_future(event.wait()) for event in events}
    try:
        if waits and not any(event.is_set() for event in events):
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        elif not waits:
            await asyncio.sleep(seconds)
    finally:
        for wait in waits:
            wait.cancel()


async def _pickup(schedulers: list[Scheduler], poll_s: float, woken: list[asyncio.Event]) -> None:
    # Runs outlive this loop's cancellation: the scheduler's stop() interrupts and records them.
    from .backfill import claim_backfills, run_backfill

    tasks: set[asyncio.Task[None]] = set()
    claim = sync_to_async(claim_requests, thread_sensitive=False)
    claim_backfill = sync_to_async(claim_backfills, thread_sensitive=False)
    #: scheduler -> the backfill it runs: one at a time per scheduler and worker.
    backfills: dict[str, asyncio.Task[None]] = {}
    while True:
        delay = poll_s
        for event in woken:
            event.clear()  # before the look: a hint during it ends the next wait at once
        for scheduler in schedulers:
            try:
                jobs = [info.name for info in scheduler.jobs()]
                requests = await claim(scheduler.name, scheduler.instance_id, 10, jobs)
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
            going = backfills.get(scheduler.name)
            if (going is None or going.done()) and scheduler.running:
                try:
                    filed = await claim_backfill(scheduler.name, scheduler.instance_id, jobs)
                except DatabaseError as exc:
                    logger.warning("cannot read backfill requests (%s)", exc)
                    filed = []
                for backfill in filed:
                    backfills[scheduler.name] = asyncio.create_task(
                        run_backfill(scheduler, backfill)
                    )
        if delay == BACKOFF_S:
            await asyncio.sleep(delay)  # the table is missing: a hint would not help
        else:
            await _wait_any(woken, delay)
