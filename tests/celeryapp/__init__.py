"""The Celery app of the Celery tests: run by a real ``celery worker`` in a subprocess.

Its broker, result backend, queue and witness file come from the environment
(``tests/celery_support.py`` sets them), so that each test run has a queue of its own on
the shared servers. ``record`` appends one line per execution to the witness file: the
tests count executions there, never in a store the beat also writes.
"""

from __future__ import annotations

import json
import os
from typing import Any

from celery import Celery


def make_app(broker: str, backend: str, queue: str) -> Celery:
    """A Celery app with the test tasks, on ``broker``, ``backend`` and ``queue``."""
    app = Celery("anarchon_tests", set_as_current=False)
    app.conf.update(
        broker_url=broker,
        result_backend=backend,
        task_default_queue=queue,
        task_track_started=True,  # find() sees a task that a worker has begun
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        # RabbitMQ: apply_async returns once the broker has confirmed the message.
        broker_transport_options={"confirm_publish": True},
        result_expires=3600,
        worker_hijack_root_logger=False,
    )

    @app.task(bind=True, name="anarchon_tests.record", shared=False)
    def record(self: Any, job: str, slot: int, **rest: Any) -> str:
        """One line per execution: the task id, the slot arguments, the worker's pid."""
        _witness({"id": self.request.id, "job": job, "slot": slot, "rest": rest,
                  "pid": os.getpid()})
        return str(self.request.id)

    @app.task(bind=True, name="anarchon_tests.record_once", shared=False)
    def record_once(self: Any, job: str, slot: int, attempt: int = 1) -> str:
        """The idempotent pattern of docs/celery.md: the task id claimed first, then the work.

        ``attempt`` (unused) lets the pause points of the worker tests see the attempt.
        """
        import redis

        client = redis.Redis.from_url(self.app.conf.result_backend)
        try:
            first = client.set(f"anarchon-tests-done:{self.request.id}", "1", nx=True, ex=3600)
        finally:
            client.close()
        # The witness hears of a duplicate too, so that a test can wait for it to have run.
        _witness({"id": self.request.id, "job": job, "slot": slot, "pid": os.getpid(),
                  "duplicate": not first})
        return "done" if first else "duplicate"

    return app


def _witness(line: dict[str, Any]) -> None:
    with open(os.environ["ANARCHON_CELERY_WITNESS"], "a") as sink:
        sink.write(json.dumps(line) + "\n")
        sink.flush()
        os.fsync(sink.fileno())


#: The worker's app (``celery -A tests.celeryapp worker``), configured by its environment.
app = make_app(
    os.environ.get("ANARCHON_CELERY_BROKER", "redis://127.0.0.1:6379/7"),
    os.environ.get("ANARCHON_CELERY_BACKEND", "redis://127.0.0.1:6379/7"),
    os.environ.get("ANARCHON_CELERY_QUEUE", "anarchon-tests"),
)
