"""Run requests (the admin's "Run now") are never dropped: issue 9's suspected losses.

A request claimed by a worker that lacks the job was logged and gone; one claimed by a
worker that died before the run started was never run. Real database, real scheduler.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.db.models import F

from django_anarchon.backends.memory import MemoryBackend
from django_anarchon.engine import Scheduler
from django_anarchon.models import RunRequest
from django_anarchon.run_requests import ABANDONED_AFTER_S, claim_requests, run_request

pytestmark = pytest.mark.django_db


def _ok(ctx: object) -> None:
    """Succeeds."""


def test_a_worker_without_the_job_leaves_the_request_to_one_that_has_it() -> None:
    request = RunRequest.objects.create(scheduler="default", job="reports.nightly")
    assert claim_requests("default", "old-release", jobs=["mail.digest"]) == []
    (won,) = claim_requests("default", "new-release", jobs=["mail.digest", "reports.nightly"])
    assert won.pk == request.pk and won.claimed_by == "new-release"


def test_a_request_whose_claimer_died_before_the_run_started_is_taken_over() -> None:
    dead = RunRequest.objects.create(scheduler="default", job="mail.digest")
    started = RunRequest.objects.create(scheduler="default", job="mail.digest")
    assert len(claim_requests("default", "dies", jobs=["mail.digest"])) == 2
    RunRequest.objects.filter(pk=started.pk).update(slot=1)  # its run did start
    assert claim_requests("default", "other", jobs=["mail.digest"]) == []  # fresh claims stay
    long_ago = timedelta(seconds=ABANDONED_AFTER_S + 1)
    RunRequest.objects.update(claimed_at=F("claimed_at") - long_ago)
    (taken,) = claim_requests("default", "other", jobs=["mail.digest"])
    assert taken.pk == dead.pk and taken.claimed_by == "other"


@pytest.mark.django_db(transaction=True)
def test_the_slot_is_noted_before_the_job_runs() -> None:
    scheduler = Scheduler(MemoryBackend(), instance_id="w")
    seen: list[int | None] = []

    def handler(ctx: object) -> None:
        seen.append(RunRequest.objects.get(job="mail.digest").slot)

    scheduler.every("mail.digest", "1h", handler)
    RunRequest.objects.create(scheduler="default", job="mail.digest")
    (request,) = claim_requests("default", "w", jobs=["mail.digest"])
    async_to_sync(run_request)(scheduler, request)
    request.refresh_from_db()
    assert seen == [request.slot] and request.slot is not None
