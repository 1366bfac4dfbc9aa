"""The beat for django.tasks in one process: registration, the slot's arguments, the races.

django-tasks-db's table is the queue (no worker here: tests/test_tasks_workers.py runs one);
each test counts its rows. The exactly-once path runs on PostgreSQL with a router that puts
django-tasks-db's table on the scheduler's alias; manual runs and the record-first path on
the default SQLite database.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from django.core.management import call_command
from django.test import override_settings

from django_anarchon import every
from django_anarchon.backends.base import ms_to_datetime
from django_anarchon.backends.database import DatabaseBackend
from django_anarchon.backends.memory import MemoryBackend
from django_anarchon.engine import JobContext, Scheduler
from django_anarchon.engine.signal import AbortSignal
from django_anarchon.enqueue import target_for
from django_anarchon.enqueue.run import EnqueueUnknownError, LeaseLostBeforeEnqueueError
from django_anarchon.exceptions import ConfigurationError
from django_anarchon.models import EnqueuedTask

from .support import fresh_registry
from .test_engine_support import stop_all, wait_for

WEB_MEMORY = {"default": {
    "BACKEND": "django_anarchon.backends.memory.MemoryBackend", "INSTANCE_ID": "web"
}}

DBTaskResult = pytest.importorskip("django_tasks_db.models").DBTaskResult
tasks = pytest.importorskip("tests.testapp.tasks")


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _rows(job: str, using: str) -> list[Any]:
    return list(DBTaskResult.objects.using(using).filter(args_kwargs__kwargs__job=job))


# -- registration -------------------------------------------------------------------------


def test_a_task_where_a_handler_goes_becomes_the_jobs_target() -> None:
    s = Scheduler(MemoryBackend(), instance_id="A")
    job = s.every("report", "1h", tasks.report)
    assert job.target is not None and job.target.kind == "django.tasks"
    assert job.target.describe() == "django.tasks tests.testapp.tasks.report (default)"
    assert job.handler.accepted == ("job", "slot", "scheduled_at", "reason", "attempt", "data")
    assert s.every("slot", "1h", tasks.just_slot).handler.accepted == (
        "job", "slot", "scheduled_at", "reason", "attempt", "data", "trace"
    )
    assert s.every("ctx", "1h", tasks.with_context).handler.accepted == ("job", "slot")
    assert s.every("bare", "1h", tasks.bare).handler.accepted == ()
    assert target_for(lambda ctx: None) is None


def test_a_plain_function_is_no_target_even_with_celery_imported() -> None:
    pytest.importorskip("celery")
    assert target_for(lambda ctx: None) is None  # the Celery target's module decides, or is absent
    assert target_for(tasks.report) is not None


def test_decorator_over_a_task_keeps_the_task_and_names_the_job_after_its_function() -> None:
    s = Scheduler(MemoryBackend(), instance_id="A")
    decorated = every("1h", scheduler=s)(tasks.report)
    assert decorated is tasks.report  # still a Task: .enqueue() works as before
    (info,) = s.jobs()
    assert info.name == "testapp.report"


def test_a_task_needing_an_argument_no_slot_gives_is_refused() -> None:
    s = Scheduler(MemoryBackend(), instance_id="A")
    with pytest.raises(ConfigurationError) as caught:
        s.every("nightly", "1h", tasks.needs_user)
    error = caught.value
    assert (error.job, error.option) == ("nightly", "handler")
    assert error.value == "django.tasks tests.testapp.tasks.needs_user (default)"
    assert "'user_id'" in str(error) and "job, slot, scheduled_at" in str(error)


# -- what is enqueued ---------------------------------------------------------------------


@pytest.mark.django_db
def test_a_manual_run_enqueues_the_task_with_the_slot_arguments() -> None:
    s = Scheduler(MemoryBackend(), instance_id="A")
    name = _name("manual")
    s.every(name, "1h", tasks.report, data={"full": True})
    record = s.run_now(name)
    assert record.status == "success", record.error
    (row,) = _rows(name, "default")
    assert row.task_path == "tests.testapp.tasks.report"
    assert row.args_kwargs == {"args": [], "kwargs": {
        "job": name, "slot": record.slot, "scheduled_at": ms_to_datetime(record.slot).isoformat(),
        "reason": "manual", "attempt": 1, "data": {"full": True},
    }}
    (mark,) = EnqueuedTask.objects.filter(job=name)
    assert (mark.slot, mark.state, mark.task_id, mark.instance_id) == (
        record.slot, "enqueued", str(row.id), "A"
    )


@pytest.mark.django_db
def test_the_records_are_kept_like_the_history() -> None:
    s = Scheduler(MemoryBackend(), instance_id="A")
    name = _name("kept")
    s.every(name, "1h", tasks.report, history_size=2)
    slots = [s.run_now(name).slot for _ in range(3)]
    assert len(_rows(name, "default")) == 3  # the tasks are the task system's to prune
    kept = sorted(EnqueuedTask.objects.filter(job=name).values_list("slot", flat=True))
    assert kept == sorted(slots)[1:]


def _ctx(job: str, slot: int, attempt: int = 2) -> JobContext:
    return JobContext(name=job, slot=slot, scheduled_at=datetime.fromtimestamp(slot / 1000, UTC),
                      instance_id="B", manual=False, data=None, signal=AbortSignal(),
                      attempt=attempt, reason="takeover")


@pytest.mark.django_db
def test_a_takeover_finds_the_task_a_dead_attempt_enqueued() -> None:
    s = Scheduler(MemoryBackend(), instance_id="B")
    name = _name("found")
    job = s.every(name, "1h", tasks.report)
    EnqueuedTask.objects.create(job=name, slot=1000, state="enqueuing", target="t", attempt=1,
                                instance_id="A")
    task_id = job.target.enqueue(name, 1000, {"job": name, "slot": 1000, "scheduled_at": "",
                                              "reason": "scheduled", "attempt": 1, "data": None})
    assert job.handler(_ctx(name, 1000)) == task_id
    assert len(_rows(name, "default")) == 1  # not enqueued again
    mark = EnqueuedTask.objects.get(job=name)
    assert (mark.state, mark.task_id, mark.attempt) == ("enqueued", task_id, 2)
    assert job.handler(_ctx(name, 1000, attempt=3)) == task_id  # and again: the record says so


@pytest.mark.django_db
def test_a_takeover_that_cannot_tell_never_enqueues_again() -> None:
    s = Scheduler(MemoryBackend(), instance_id="B")
    name = _name("unknown")
    job = s.every(name, "1h", tasks.report)
    EnqueuedTask.objects.create(job=name, slot=1000, state="enqueuing", target="t", attempt=1,
                                instance_id="A", error="OperationalError: server closed")
    with pytest.raises(EnqueueUnknownError, match=r"attempt 1 \(instance A\) was enqueueing"):
        job.handler(_ctx(name, 1000))
    assert _rows(name, "default") == []


@pytest.mark.django_db
def test_an_enqueue_that_raised_keeps_its_marker_and_is_not_retried_blindly() -> None:
    s = Scheduler(MemoryBackend(), instance_id="A")
    name = _name("raised")
    job = s.every(name, "1h", tasks.report, data=lambda ctx: object())  # not JSON: refused
    record = s.run_now(name)
    assert record.status == "failed" and record.error
    mark = EnqueuedTask.objects.get(job=name)
    assert (mark.state, mark.task_id) == ("enqueuing", "") and mark.error
    with pytest.raises(EnqueueUnknownError, match="never recorded the outcome") as caught:
        job.handler(_ctx(name, record.slot))
    assert mark.error in str(caught.value)
    assert _rows(name, "default") == []


# -- one transaction, on PostgreSQL ---------------------------------------------------------


class _TasksOn:
    def __init__(self, alias: str) -> None:
        self.alias = alias

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return self.alias if model._meta.app_label == "django_tasks_database" else None

    db_for_write = db_for_read


@pytest.fixture
def tasks_on_postgres(postgres_database: str, database_access: None) -> Iterator[str]:
    # Routed while migrating too: a django_tasks_db migration's data step queries through
    # the router, and found the tables on "default" only when an earlier test made them.
    with override_settings(DATABASE_ROUTERS=[_TasksOn(postgres_database)]):
        call_command("migrate", "django_tasks_database", database=postgres_database, verbosity=0)
        yield postgres_database


@pytest.mark.postgres
def test_four_schedulers_racing_enqueue_each_slot_once(tasks_on_postgres: str) -> None:
    alias, name = tasks_on_postgres, _name("race")
    backends = [DatabaseBackend(using=alias) for _ in range(4)]
    schedulers = [Scheduler(b, instance_id=f"S{i}", lease="5s") for i, b in enumerate(backends)]
    successes: list[int] = []
    for s in schedulers:
        s.every(name, "200ms", tasks.report, overlap="allow")
        s.on("success", lambda event: successes.append(event.slot))

    async def main() -> None:
        for s in schedulers:
            await s.start()
        try:
            await wait_for(lambda: len(set(successes)) >= 8, 30, "8 slots to run")
        finally:
            await stop_all(*schedulers)
            for b in backends:
                await b.close()

    asyncio.run(main())
    rows = _rows(name, alias)
    per_slot = Counter(row.args_kwargs["kwargs"]["slot"] for row in rows)
    assert len(per_slot) >= 8 and max(per_slot.values()) == 1, per_slot
    assert sorted(successes) == sorted(per_slot)  # one success per slot, each with its task
    marks = {m.slot: m.task_id for m in EnqueuedTask.objects.using(alias).filter(job=name)}
    assert marks == {row.args_kwargs["kwargs"]["slot"]: str(row.id) for row in rows}


@pytest.mark.postgres
def test_a_lost_lease_enqueues_nothing(tasks_on_postgres: str) -> None:
    alias, name = tasks_on_postgres, _name("lost")
    backend = DatabaseBackend(using=alias)
    job = Scheduler(backend, instance_id="B").every(name, "1h", tasks.report)
    with pytest.raises(LeaseLostBeforeEnqueueError, match="nothing was enqueued"):
        job.handler.run(_ctx(name, 1000), backend=backend, token="not-the-lease-holder")
    assert _rows(name, alias) == []
    assert not EnqueuedTask.objects.using(alias).filter(job=name).exists()


# -- what the listings show ---------------------------------------------------------------


@pytest.fixture
def task_scheduler() -> Iterator[str]:
    """settings.ANARCHON with one memory scheduler whose job enqueues ``tasks.report``."""
    name = _name("listed")
    with fresh_registry(WEB_MEMORY):
        every("1h", name=name)(tasks.report)
        yield name


def _call(*args: str) -> str:
    from io import StringIO

    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db
def test_jobs_and_history_commands_name_the_task_and_its_id(task_scheduler: str) -> None:
    import json

    from django_anarchon.handler import schedulers

    name = task_scheduler
    record = schedulers["default"].run_now(name)
    (row,) = _rows(name, "default")
    jobs = _call("anarchon_jobs")
    assert "enqueues django.tasks tests.testapp.tasks.report (default)" in jobs
    (item,) = json.loads(_call("anarchon_jobs", "--json"))
    assert item["target"] == "django.tasks tests.testapp.tasks.report (default)"
    history = _call("anarchon_history", name)
    assert history.splitlines()[0].split()[:4] == ["JOB", "SCHEDULED", "STATUS", "TASK"]
    assert f"{row.id} READY" in history
    (entry,) = json.loads(_call("anarchon_history", name, "--json"))
    assert entry["slot"] == record.slot
    assert entry["task"] == {
        "task_id": str(row.id), "state": "enqueued", "status": "READY",
        "url": f"/admin/django_tasks_database/dbtaskresult/{row.id}/change/",
    }


@pytest.mark.django_db
def test_the_admin_links_a_run_to_its_task_result(task_scheduler: str) -> None:
    from django.contrib.auth.models import User
    from django.test import Client

    from django_anarchon.handler import schedulers

    name = task_scheduler
    schedulers["default"].run_now(name)
    (row,) = _rows(name, "default")
    client = Client()
    client.force_login(User.objects.create_superuser("root-tasks"))
    link = f'href="/admin/django_tasks_database/dbtaskresult/{row.id}/change/"'
    jobs = client.get("/admin/django_anarchon/scheduledjob/").content.decode()
    assert "enqueues django.tasks tests.testapp.tasks.report (default)" in jobs and link in jobs
    page = client.get("/admin/django_anarchon/scheduledjob/history/", {
        "scheduler": "default", "job": name
    }).content.decode()
    assert link in page and "READY" in page
    assert client.get(f"/admin/django_tasks_database/dbtaskresult/{row.id}/change/").status_code == 200
    records = client.get("/admin/django_anarchon/enqueuedtask/", {"q": name}).content.decode()
    assert str(row.id) in records and "enqueued" in records


@pytest.mark.django_db
def test_the_jobs_page_reads_the_tasks_of_every_last_run_in_one_query() -> None:
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from django_anarchon.handler import schedulers

    names = [_name(f"listed-{i}") for i in range(3)]
    with fresh_registry(WEB_MEMORY):
        for name in names:
            every("1h", name=name)(tasks.report)
        for name in names:
            schedulers["default"].run_now(name)
        client = Client()
        client.force_login(User.objects.create_superuser("root-tasks-many"))
        with CaptureQueriesContext(connection) as queries:
            page = client.get("/admin/django_anarchon/scheduledjob/").content.decode()
    reads = [q["sql"] for q in queries if "django_anarchon_enqueuedtask" in q["sql"]]
    assert len(reads) == 1, reads
    for name in names:
        (row,) = _rows(name, "default")
        assert f'href="/admin/django_tasks_database/dbtaskresult/{row.id}/change/"' in page
