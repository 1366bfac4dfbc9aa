"""The Celery target against real Celery workers on the local Redis and RabbitMQ.

Executions are counted in the witness file the worker's tasks append to
(tests/celeryapp), never in the result backend that ``find`` reads.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from django_anarchon.enqueue.base import accepted_arguments
from django_anarchon.enqueue.celery import CeleryTarget, maybe_target, task_id_for
from django_anarchon.enqueue.links import task_links
from django_anarchon.exceptions import ConfigurationError

from .broker_support import rabbitmq_url
from .celery_support import CELERY_REDIS_DB, CeleryEnv, CeleryWorker
from .redis_support import redis_url
from .support import ROOT, wait_for

pytest.importorskip("celery")  # the [celery] extra (in [dev])

pytestmark = pytest.mark.workers


def _redis_db_url() -> str:
    parts = urlsplit(redis_url())
    return urlunsplit(parts._replace(path=f"/{CELERY_REDIS_DB}"))


@pytest.fixture(
    params=[pytest.param("redis", marks=pytest.mark.redis),
            pytest.param("rabbitmq", marks=[pytest.mark.rabbitmq, pytest.mark.redis])]
)
def celery_env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CeleryEnv]:
    backend = _redis_db_url()
    broker = backend if request.param == "redis" else rabbitmq_url()
    env = CeleryEnv.make(broker, backend, tmp_path)
    try:
        yield env
    finally:
        env.close()


@pytest.fixture
def start_worker(celery_env: CeleryEnv, tmp_path: Path) -> Iterator[Any]:
    """``start_worker()`` starts a worker on the test's queue; all are stopped at the end."""
    workers: list[CeleryWorker] = []

    def start() -> CeleryWorker:
        worker = CeleryWorker(celery_env, tmp_path / f"worker-{len(workers)}.log")
        workers.append(worker)
        return worker.start()

    try:
        yield start
    finally:
        for worker in workers:
            worker.stop()


def _job() -> str:
    return f"celery.{uuid.uuid4().hex[:10]}"


def _settled(target: CeleryTarget, task_id: str) -> bool:
    """The task ran to its end, and no message waits in the queue or at a worker."""
    return (target.task.AsyncResult(task_id).ready() and _queue_empty(target)
            and not target.at_a_worker(task_id))


def _queue_empty(target: CeleryTarget) -> bool:
    """No message in the task's queue (a passive declare counts them on either broker)."""
    from amqp.exceptions import ChannelError

    with target.task.app.connection_for_write() as connection:
        try:
            declared = connection.default_channel.queue_declare(target.queue(), passive=True)
        except ChannelError:  # Redis: a queue's list is gone once it is empty
            return True
        return int(declared.message_count) == 0


def _works(env: CeleryEnv, task_id: str) -> list[bool]:
    """Each execution of ``task_id``: True if it did the work, False if it was a duplicate."""
    return [not e.get("duplicate", False) for e in env.executions() if e["id"] == task_id]


# -- without a broker ------------------------------------------------------------------------


def test_task_ids_are_derived_from_job_and_slot() -> None:
    first = task_id_for("reports.daily", 1_700_000_000_000)
    assert first == task_id_for("reports.daily", 1_700_000_000_000)  # any instance, any time
    assert uuid.UUID(first).version == 5
    others = {task_id_for("reports.daily", 1_700_000_000_001),
              task_id_for("reports.weekly", 1_700_000_000_000),
              task_id_for("a\x001", 2), task_id_for("a", 12)}
    assert first not in others and len(others) == 4


def test_a_celery_task_is_a_target() -> None:
    from tests.celeryapp import make_app

    app = make_app("memory://", "cache+memory://", "anarchon-q")
    record, record_once = app.tasks["anarchon_tests.record"], app.tasks["anarchon_tests.record_once"]
    target = maybe_target(record_once)
    assert isinstance(target, CeleryTarget) and target.task is record_once
    assert (target.kind, target.database_alias()) == ("celery", None)
    assert target.describe() == "celery anarchon_tests.record_once (anarchon-q)"
    assert accepted_arguments(target.function()) == ("job", "slot", "attempt")  # bind: no self
    assert len(accepted_arguments(CeleryTarget(record).function())) == 7  # **rest takes all
    assert CeleryTarget(record, queue="other").describe().endswith("(other)")
    assert (CeleryTarget(record).idempotent, CeleryTarget(record, idempotent=True).idempotent) == (
        False, True
    )
    with pytest.raises(ConfigurationError, match="option 'idempotent' = 'yes'"):
        CeleryTarget(record, idempotent="yes")
    assert maybe_target(target) is target
    assert maybe_target(lambda ctx: None) is None
    assert maybe_target(record.run) is None  # the bare function is a handler, not a task
    with pytest.raises(ConfigurationError, match=r"option 'task_id' = 'mine': .* the beat sets"):
        CeleryTarget(record, task_id="mine")
    with pytest.raises(ConfigurationError, match="option 'inspect_timeout' = 0: "):
        CeleryTarget(record, inspect_timeout=0)


def test_a_celery_task_where_a_handler_goes_becomes_the_jobs_target() -> None:
    from django_anarchon import every
    from django_anarchon.backends.memory import MemoryBackend
    from django_anarchon.engine import Scheduler
    from tests.celeryapp import make_app

    app = make_app("memory://", "cache+memory://", "anarchon-q")
    s = Scheduler(MemoryBackend(), instance_id="A")
    job = s.every("report", "1h", app.tasks["anarchon_tests.record_once"])
    assert isinstance(job.target, CeleryTarget)
    assert job.handler.accepted == ("job", "slot", "attempt")
    decorated = every("1h", scheduler=s)(app.tasks["anarchon_tests.record"])
    assert decorated is app.tasks["anarchon_tests.record"]  # still the task: .delay() works
    assert sorted(info.name for info in s.jobs()) == ["report", "tests.celeryapp.record"]


def test_recognising_a_task_does_not_import_celery() -> None:
    script = (
        "import sys\n"
        "from django_anarchon.enqueue.celery import maybe_target\n"
        "assert maybe_target(print) is None and maybe_target(lambda: 0) is None\n"
        "assert not [m for m in sys.modules if m.split('.')[0] in ('celery', 'kombu')]\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.stdout.strip() == "ok", done.stderr


# -- with a real worker ------------------------------------------------------------------------


def test_enqueue_runs_the_task_once_with_the_slot_arguments(
    celery_env: CeleryEnv, start_worker: Any
) -> None:
    start_worker()
    target = CeleryTarget(celery_env.task("record"))
    job, slot = _job(), 1_700_000_000_000
    assert target.find(job, slot) is None
    kwargs = {"job": job, "slot": slot, "reason": "scheduled", "attempt": 1, "data": {"a": 1}}
    task_id = target.enqueue(job, slot, kwargs)
    assert task_id == task_id_for(job, slot)
    wait_for(lambda: _settled(target, task_id), 30, "the task's end")
    assert target.find(job, slot) == task_id
    assert target.find(job, slot + 1) is None
    (run,) = celery_env.executions()
    assert (run["id"], run["job"], run["slot"]) == (task_id, job, slot)
    assert run["rest"] == {"reason": "scheduled", "attempt": 1, "data": {"a": 1}}


@pytest.mark.django_db
def test_a_manual_run_sends_the_task_once(celery_env: CeleryEnv, start_worker: Any) -> None:
    """The beat's own path (enqueue/run.py): record, send, record the task id."""
    from django_anarchon.backends.memory import MemoryBackend
    from django_anarchon.engine import Scheduler
    from django_anarchon.models import EnqueuedTask

    start_worker()
    s = Scheduler(MemoryBackend(), instance_id="A")
    name = _job()
    s.every(name, "1h", celery_env.task("record"), data={"full": True})
    record = s.run_now(name)
    assert record.status == "success", record.error
    task_id = task_id_for(name, record.slot)
    (mark,) = EnqueuedTask.objects.filter(job=name)
    assert (mark.slot, mark.state, mark.task_id) == (record.slot, "enqueued", task_id)
    wait_for(lambda: celery_env.executions(), 30, "the task to run")
    (run,) = celery_env.executions()
    assert (run["id"], run["slot"], run["rest"]["reason"], run["rest"]["data"]) == (
        task_id, record.slot, "manual", {"full": True})
    # The history's link to the task, with the state its result backend records.
    job = s.get_job(name)
    wait_for(lambda: task_links(job, s.backend, [record.slot])[record.slot].status == "SUCCESS",
             30, "the task's SUCCESS in the history's link")
    link = task_links(job, s.backend, [record.slot])[record.slot]
    assert (link.task_id, link.state, link.url) == (task_id, "enqueued", None)


def test_a_queued_task_is_found_on_redis_only(celery_env: CeleryEnv, start_worker: Any) -> None:
    """No worker yet: Redis lets ``find`` read the queue; AMQP cannot without taking from it."""
    target = CeleryTarget(celery_env.task("record"))
    job, slot = _job(), 1_700_000_000_000
    task_id = target.enqueue(job, slot, {"job": job, "slot": slot})
    on_redis = celery_env.broker.startswith("redis")
    assert target.find(job, slot) == (task_id if on_redis else None)
    start_worker()
    wait_for(lambda: _settled(target, task_id), 30, "the task's end")
    assert target.find(job, slot) == task_id
    assert [e["id"] for e in celery_env.executions()] == [task_id]


@pytest.mark.redis
def test_a_queued_task_is_found_under_a_global_key_prefix(tmp_path: Path) -> None:
    """kombu's ``global_keyprefix`` on the Redis broker: ``find`` reads the prefixed lists."""
    from tests.celeryapp import make_app

    url, prefix = _redis_db_url(), f"anarchon-test-{uuid.uuid4().hex[:8]}:"
    app = make_app(url, url, f"anarchon-celery-{uuid.uuid4().hex[:10]}")
    app.conf.broker_transport_options = {"global_keyprefix": prefix}
    target = CeleryTarget(app.tasks["anarchon_tests.record"], priority=3)
    job = _job()
    try:
        ids = [target.enqueue(job, slot, {"job": job, "slot": slot}) for slot in range(3)]
        assert [target.in_broker_queue(i) for i in ids] == [True, True, True]
        assert not target.in_broker_queue(task_id_for(job, 3))
    finally:
        import redis

        client = redis.Redis.from_url(url)
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        assert keys, "the messages were not under the prefix"
        client.delete(*keys)
        client.close()
        app.close()


@pytest.mark.redis
def test_the_message_carries_the_current_trace_context() -> None:
    """Sent under a span, the message's headers hold its ``traceparent`` (the ``[otel]`` extra)."""
    import json

    import redis
    from opentelemetry.sdk.trace import TracerProvider

    from tests.celeryapp import make_app

    url, queue = _redis_db_url(), f"anarchon-celery-{uuid.uuid4().hex[:10]}"
    app = make_app(url, url, queue)
    target, job = CeleryTarget(app.tasks["anarchon_tests.record"]), _job()
    client = redis.Redis.from_url(url)
    try:
        with TracerProvider().get_tracer("t").start_as_current_span("attempt") as span:
            target.enqueue(job, 1, {"job": job, "slot": 1})
        (raw,) = client.lrange(queue, 0, -1)
        headers = json.loads(raw)["headers"]
        context = span.get_span_context()
        assert headers["traceparent"].split("-")[1:3] == [
            f"{context.trace_id:032x}", f"{context.span_id:016x}"
        ]
        target.enqueue(job, 2, {"job": job, "slot": 2})  # no span: no header
        assert "traceparent" not in json.loads(client.lrange(queue, 0, 0)[0])["headers"]
    finally:
        client.delete(queue)
        client.close()
        app.close()


def test_celery_runs_a_task_id_twice_if_it_is_sent_twice(
    celery_env: CeleryEnv, start_worker: Any
) -> None:
    """What docs/celery.md says: no broker de-duplicates by task id; the idempotent task does."""
    start_worker()
    job, slot = _job(), 1_700_000_000_000
    ids = {name: task_id_for(f"{job}.{name}", slot) for name in ("record", "record_once")}
    for name, task_id in ids.items():
        for _ in range(2):
            celery_env.task(name).apply_async(kwargs={"job": job, "slot": slot}, task_id=task_id)
    wait_for(lambda: all(len(_works(celery_env, i)) == 2 for i in ids.values()), 30,
             "both copies of each task")
    assert _works(celery_env, ids["record"]) == [True, True]  # the work done twice
    assert _works(celery_env, ids["record_once"]) == [True, False]  # once, then recognised


# -- a beat instance killed (kill -9) around its enqueue, and the takeover -------------------

_CRASH = """\
import os, signal, sys
from tests.celeryapp import make_app
from django_anarchon.enqueue.celery import CeleryTarget
broker, backend, queue, name, job, slot, point = sys.argv[1:]
target = CeleryTarget(make_app(broker, backend, queue).tasks["anarchon_tests." + name])
if point == "after-enqueue":
    target.enqueue(job, int(slot), {"job": job, "slot": int(slot)})
print("killing", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _crash(env: CeleryEnv, name: str, job: str, slot: int, point: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _CRASH, env.broker, env.backend, env.queue, name, job,
         str(slot), point],
        cwd=ROOT, env=env.environ(), capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == -signal.SIGKILL and "killing" in done.stdout, done.stderr


def _takeover(target: CeleryTarget, job: str, slot: int) -> str:
    """What the flow does for a takeover: look first, enqueue only if nothing is there."""
    return target.find(job, slot) or target.enqueue(job, slot, {"job": job, "slot": slot})


@pytest.mark.parametrize("point", ["before-enqueue", "after-enqueue"])
def test_killed_with_the_worker_up_the_slot_runs_once(
    celery_env: CeleryEnv, start_worker: Any, point: str
) -> None:
    start_worker()
    target = CeleryTarget(celery_env.task("record"))
    job, slot = _job(), 1_700_000_000_000
    _crash(celery_env, "record", job, slot, point)
    task_id = _takeover(target, job, slot)
    wait_for(lambda: _settled(target, task_id), 30, "the task's end")
    assert [e["id"] for e in celery_env.executions()] == [task_id]


def test_killed_after_enqueue_with_no_worker_up(celery_env: CeleryEnv, start_worker: Any) -> None:
    """The task waits in the queue at the takeover: found on Redis; on RabbitMQ it is not,
    the takeover sends it again, and the idempotent task runs its work once all the same."""
    job, slot = _job(), 1_700_000_000_000
    on_redis = celery_env.broker.startswith("redis")
    for name in ("record", "record_once"):
        _crash(celery_env, name, f"{job}.{name}", slot, "after-enqueue")
        _takeover(CeleryTarget(celery_env.task(name)), f"{job}.{name}", slot)
    start_worker()
    for name in ("record", "record_once"):
        target = CeleryTarget(celery_env.task(name))
        task_id = task_id_for(f"{job}.{name}", slot)
        wait_for(lambda: _settled(target, task_id), 30, f"{name}'s end")  # noqa: B023
    copies = 1 if on_redis else 2
    assert _works(celery_env, task_id_for(f"{job}.record", slot)) == [True] * copies
    assert _works(celery_env, task_id_for(f"{job}.record_once", slot)) == [True, False][:copies]
