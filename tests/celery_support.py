"""A real Celery worker for the Celery tests, on the local Redis or RabbitMQ.

* ``CeleryEnv``: one test's broker, result backend (Redis db 7), queue of its own and
  witness file (one line per task execution, written by the worker's tasks).
* ``CeleryWorker``: ``celery -A tests.celeryapp worker --pool=solo -Q <queue>`` in a
  subprocess; ``start()`` waits for its "ready" line, ``stop()`` sends SIGTERM, then
  SIGKILL if it has not exited within a bound.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .support import ROOT, wait_for

#: Redis database of the Celery tests (broker on Redis, and every result backend).
CELERY_REDIS_DB = 7
CELERY_BIN = Path(sys.executable).parent / "celery"


@dataclass
class CeleryEnv:
    broker: str
    backend: str
    queue: str
    witness: Path
    app: Any = field(default=None, repr=False)

    @classmethod
    def make(cls, broker: str, backend: str, tmp: Path) -> CeleryEnv:
        from tests.celeryapp import make_app

        queue = f"anarchon-celery-{uuid.uuid4().hex[:10]}"
        env = cls(broker, backend, queue, tmp / f"{queue}.witness")
        env.witness.touch()
        env.app = make_app(broker, backend, queue)
        return env

    def environ(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DJANGO_"))}
        env.update(
            ANARCHON_CELERY_BROKER=self.broker, ANARCHON_CELERY_BACKEND=self.backend,
            ANARCHON_CELERY_QUEUE=self.queue, ANARCHON_CELERY_WITNESS=str(self.witness),
            PYTHONPATH=str(ROOT),
        )
        return env

    def executions(self) -> list[dict[str, Any]]:
        """What the worker's tasks wrote: one dict per execution."""
        text = self.witness.read_text()
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def task(self, name: str) -> Any:
        return self.app.tasks[f"anarchon_tests.{name}"]

    def close(self) -> None:
        """Drop the queue's messages and this test's results, then the app's connections."""
        import redis

        backend = redis.Redis.from_url(self.backend)
        try:
            ids = {e["id"] for e in self.executions()}
            if ids:  # what did not run expires with result_expires
                backend.delete(*(f"celery-task-meta-{i}" for i in ids),
                               *(f"anarchon-tests-done:{i}" for i in ids))
            if self.broker.startswith("redis"):  # its lists and kombu's bindings of it
                keys = [*backend.scan_iter(match=f"{self.queue}*", count=1000),
                        *backend.scan_iter(match=f"_kombu.binding*.{self.queue}", count=1000)]
                if keys:
                    backend.delete(*keys)
        finally:
            backend.close()
        if self.broker.startswith("amqp"):
            from .broker_support import delete_queues

            delete_queues(self.broker, self.queue)
        self.app.close()


class CeleryWorker:
    """One ``celery worker`` process consuming ``env.queue``."""

    def __init__(self, env: CeleryEnv, log: Path) -> None:
        self.env = env
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60) -> CeleryWorker:
        name = f"{self.env.queue}-{uuid.uuid4().hex[:4]}@%h"
        with self.log.open("ab") as sink:
            self.proc = subprocess.Popen(
                [str(CELERY_BIN), "-A", "tests.celeryapp", "worker", "--pool=solo",
                 "--concurrency=1", "-Q", self.env.queue, "-n", name, "--without-gossip",
                 "--without-mingle", "--loglevel=INFO"],
                cwd=ROOT, env=self.env.environ(), stdout=sink, stderr=subprocess.STDOUT,
            )
        proc = self.proc

        def ready() -> bool:
            assert proc.poll() is None, f"the Celery worker exited:\n{self.log.read_text()}"
            return " ready." in self.log.read_text()

        wait_for(ready, timeout, "the Celery worker's ready line")
        return self

    def kill(self) -> None:
        """SIGKILL: the worker dies with whatever it holds."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self, grace: float = 15) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
