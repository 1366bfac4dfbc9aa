"""A Celery task as a job's target (extra ``[celery]``): one ``apply_async`` per slot.

The task id is derived from (job, slot), so every instance that reaches a slot names the
same task, and a second publish of it is recognisable by its id. No Celery broker refuses
a second message with an id it has seen (Celery's task id is only a label), so the beat
must not publish twice: it records first and looks first (``find``) before it enqueues.

``find`` looks where a published task can be, in the order a message travels: still in
the broker's queue (Redis only: AMQP has no way to read a queue without taking from it),
reserved or running at a worker (a broadcast ``query_task``), and recorded by the result
backend (``STARTED`` with ``task_track_started``, then ``SUCCESS``/``FAILURE``/...).
docs/celery.md says what each broker lets it see.

Celery is imported only by a Celery task's own module: ``maybe_target`` recognises a task
without importing it, so a project without Celery pays nothing.
"""

from __future__ import annotations

import json
import logging
import sys
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("django_anarchon")

#: The namespace of the task ids: ``uuid5(NAMESPACE, f"{job}\\x00{slot}")``.
TASK_ID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://django-anarchon/celery-task-id")

#: How long ``find`` waits for the workers' answers to ``query_task`` (seconds): a
#: broadcast has no count of answers to wait for, so a look at the workers takes this long.
INSPECT_TIMEOUT_S = 1.0
#: Messages read per ``LRANGE`` when ``find`` reads a Redis queue.
_PAGE = 1000


@dataclass(frozen=True)
class CeleryResult:
    """What the result backend says of a task, for the history's links."""

    task_id: str
    #: Celery's state: ``PENDING`` (waiting, or unknown to the backend), ``STARTED``,
    #: ``SUCCESS``, ``FAILURE``, ``RETRY``, ``REVOKED``.
    status: str


def task_id_for(job: str, slot: int) -> str:
    """The Celery task id of (job, slot): the same on every instance, distinct per slot."""
    return str(uuid.uuid5(TASK_ID_NAMESPACE, f"{job}\x00{slot}"))


class CeleryTarget:
    """A Celery task that a job enqueues once per slot.

    A task given where a handler goes becomes ``CeleryTarget(task)``; wrap it yourself to
    pass ``apply_async`` options (``queue``, ``priority``, ``expires``, ...). The options
    ``task_id``, ``args`` and ``kwargs`` are the beat's. ``idempotent=True`` says the task
    does its work once per task id (docs/celery.md): a takeover that cannot tell whether
    the dead attempt sent the message then sends it again, with the same id, instead of
    failing the slot.
    """

    kind = "celery"

    def __init__(
        self, task: Any, *, idempotent: bool = False,
        inspect_timeout: float = INSPECT_TIMEOUT_S, **options: Any,
    ) -> None:
        from ..exceptions import ConfigurationError

        taken = sorted({"task_id", "args", "kwargs"} & set(options))
        if taken:
            raise ConfigurationError(
                f"Celery task {getattr(task, 'name', task)!r}: the beat sets this option "
                "(the task id is derived from the job and slot, the arguments from the slot)",
                option=taken[0], value=options[taken[0]],
            )
        if not isinstance(inspect_timeout, int | float) or not inspect_timeout > 0:
            raise ConfigurationError(
                f"Celery task {getattr(task, 'name', task)!r}: a number of seconds above 0",
                option="inspect_timeout", value=inspect_timeout,
            )
        if not isinstance(idempotent, bool):
            raise ConfigurationError(
                f"Celery task {getattr(task, 'name', task)!r}: True or False",
                option="idempotent", value=idempotent,
            )
        self.task = task
        self.options = options
        self.inspect_timeout = inspect_timeout
        #: Read by the beat (enqueue/run.py): a second message of one id does no harm.
        self.idempotent = idempotent

    def describe(self) -> str:
        return f"celery {self.task.name} ({self.queue()})"

    def function(self) -> Callable[..., Any]:
        run: Callable[..., Any] = self.task.run  # bound for bind=True: ``self`` is not an argument
        return run

    def database_alias(self) -> str | None:
        return None  # a broker is not a Django database: no shared transaction

    def queue(self) -> str:
        """The queue the task is sent to: the option, the task's routes, or the default."""
        if "queue" in self.options:
            return str(self.options["queue"])
        route = self.task.app.amqp.router.route(dict(self.options), self.task.name, (), {})
        queue = route.get("queue")
        name = getattr(queue, "name", queue)
        return str(name or self.task.app.conf.task_default_queue)

    def enqueue(self, job: str, slot: int, kwargs: Mapping[str, Any]) -> str:
        from ..contrib.otel import inject_context

        task_id = task_id_for(job, slot)
        options = dict(self.options)
        # The attempt's trace context, where opentelemetry-instrumentation-celery looks.
        trace = inject_context()
        if trace:
            options["headers"] = {**options.get("headers", {}), **trace}
        self.task.apply_async(kwargs=dict(kwargs), task_id=task_id, **options)
        return task_id

    def find(self, job: str, slot: int) -> str | None:
        task_id = task_id_for(job, slot)
        # The order a message travels: queue -> worker -> result backend. A message that
        # moves on between two looks is found by the next one.
        if self.in_broker_queue(task_id) or self.at_a_worker(task_id) or self.in_results(task_id):
            return task_id
        return None

    def result(self, task_id: str) -> CeleryResult | None:
        """The task's state in the result backend; ``None`` without one, or on an error."""
        from celery.backends.base import DisabledBackend

        backend = self.task.backend
        if isinstance(backend, DisabledBackend):
            return None
        try:
            return CeleryResult(task_id, str(backend.get_state(task_id)))
        except Exception as exc:  # a listing never fails over a link
            logger.warning("celery task %s: no state from the result backend: %s", task_id, exc)
            return None

    # -- the three places ----------------------------------------------------------------

    def in_broker_queue(self, task_id: str) -> bool:
        """Whether a message with ``task_id`` waits in the task's queue (Redis broker only).

        Kombu's Redis transport keeps a queue as lists (one per priority step) of JSON
        messages, and a message delivered but not acknowledged in its ``unacked`` hash.
        ``LRANGE`` and ``HVALS`` are not among the commands kombu prefixes with
        ``global_keyprefix``, so the prefix is added here.
        """
        with self.task.app.connection_for_read() as connection:
            if connection.transport.driver_type != "redis":
                return False
            channel = connection.default_channel
            client, prefix = channel.client, channel.global_keyprefix or ""
            needle = task_id.encode()
            lists = [channel._q_for_pri(self.queue(), pri) for pri in channel.priority_steps]
            for name in dict.fromkeys(lists):
                for start in range(0, int(client.llen(name)), _PAGE):  # kombu prefixes LLEN
                    page = client.lrange(prefix + name, start, start + _PAGE - 1)
                    if any(needle in raw and _message_id(raw) == task_id for raw in page):
                        return True
            for raw in client.hvals(prefix + channel.unacked_key):
                if needle in raw and _message_id(raw, unacked=True) == task_id:
                    return True
        return False

    def at_a_worker(self, task_id: str) -> bool:
        """Whether a worker holds the task (reserved, scheduled by ETA, or running).

        A worker of the solo pool does not answer while it runs a task; the result
        backend (``STARTED``) covers that case.
        """
        inspect = self.task.app.control.inspect(timeout=self.inspect_timeout)
        replies = inspect.query_task(task_id) or {}
        return any(task_id in (tasks or {}) for tasks in replies.values())

    def in_results(self, task_id: str) -> bool:
        """Whether the result backend knows the task (any state but ``PENDING``)."""
        from celery.backends.base import DisabledBackend

        backend = self.task.backend
        if isinstance(backend, DisabledBackend):
            return False
        state: str = backend.get_state(task_id)
        return state != "PENDING"


def _message_id(raw: bytes, *, unacked: bool = False) -> str | None:
    """The task id of a kombu Redis message: ``headers.id`` (task protocol 2), else the
    correlation id, which Celery sets to the task id on every protocol."""
    try:
        message = json.loads(raw)
        if unacked:  # [message, exchange, routing key]
            message = message[0]
        headers = message.get("headers") or {}
        found = headers.get("id") or message.get("properties", {}).get("correlation_id")
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return None
    return str(found) if found else None


def maybe_target(obj: Any) -> CeleryTarget | None:
    """``obj`` as a target if it is a Celery task (or already a ``CeleryTarget``).

    Celery is not imported here: an object can only be a Celery task if its module, which
    defines the class, is already imported.
    """
    if isinstance(obj, CeleryTarget):
        return obj
    module = sys.modules.get("celery.app.task")
    if module is None:
        return None
    if isinstance(obj, module.Task):
        return CeleryTarget(obj)
    return None

