"""The beat: a job's handler when the job names a task. It enqueues the slot's task once.

Two ways, chosen per run (docs/tasks.md has the table of what each guarantees):

* **One transaction** (exactly once): the scheduler's backend is the database backend and
  the task's enqueue writes to the same database (django-tasks-db on that alias). In one
  transaction the beat locks the run's lease row (only while this attempt's token still
  holds it: the fence), enqueues, writes the ``EnqueuedTask`` record and finishes the run
  ``success``. Either all of it commits or none of it: a runner that dies, or whose lease
  was taken over, leaves no task behind, and a backup that takes over starts from nothing.
  While the row is locked no claim can take the run over.
* **Record first, look first** (at most once): anywhere else the enqueue cannot commit with
  the run. The beat writes an ``enqueuing`` marker (committed) before it enqueues and the
  task id after. A later attempt that finds a marker without an id asks the target
  (``find``); when it cannot find the task it cannot tell whether the dead attempt's
  enqueue happened, and records the run failed rather than risk a second enqueue.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, IntegrityError, router, transaction
from django.utils import timezone

from ..exceptions import AnarchonError
from ..redact import redact_text
from .base import TaskTarget, check_target, slot_kwargs

if TYPE_CHECKING:
    from ..engine.context import JobContext
    from ..models import EnqueuedTask

__all__ = ["EnqueueUnknownError", "LeaseLostBeforeEnqueueError", "TaskBeat", "records_alias"]

logger = logging.getLogger("django_anarchon")


class EnqueueUnknownError(AnarchonError):
    """An earlier attempt may have enqueued this slot's task: not enqueued again."""


class LeaseLostBeforeEnqueueError(AnarchonError):
    """The run was taken over before this attempt's transaction: nothing was enqueued."""


def _nothing() -> None:
    pass


class TaskBeat:
    """The handler of a job whose target is a task: ``ctx`` in, the task's id out."""

    def __init__(self, job: str, target: TaskTarget) -> None:
        self.target = target
        self.accepted = check_target(job, target)
        #: How many records of the job to keep (its ``history_size``; set by ``build_job``).
        self.keep = 100
        function = target.function()
        inner = getattr(function, "func", function)  # a functools.partial (takes_context)
        self.__module__ = getattr(inner, "__module__", type(self).__module__)
        self.__qualname__ = getattr(inner, "__qualname__", type(self).__qualname__)

    def __call__(self, ctx: JobContext) -> str:
        """Run without a lease token (a manual run, a claim-only store): record first."""
        return self.run(ctx, backend=None, token=None)

    def bind(
        self, backend: object, token: str | None, finishing: Callable[[], None] = _nothing
    ) -> Callable[[JobContext], str]:
        """The handler the runner calls for one attempt: with its store and its lease token.

        ``finishing`` is called right before the one transaction commits the run's finish.
        """
        return functools.partial(self.run, backend=backend, token=token, finishing=finishing)

    def run(
        self, ctx: JobContext, *, backend: object, token: str | None,
        finishing: Callable[[], None] = _nothing,
    ) -> str:
        kwargs = slot_kwargs(ctx, self.accepted)
        alias = self.target.database_alias()
        store = _database_store(backend)
        using = _records_alias(store, alias)
        if store is not None and token is not None and alias == store.using:
            task_id = self._in_one_transaction(ctx, kwargs, store, token, finishing)
        else:
            task_id = self._record_first(ctx, kwargs, using)
        self._prune(ctx.name, using)
        return task_id

    def _prune(self, job: str, using: str) -> None:
        """Keep the job's newest ``keep`` records, as its history keeps its newest runs.

        Best effort: the task is enqueued and recorded already, and a failed prune must
        not make the run look failed (the next run prunes again).
        """
        from ..models import EnqueuedTask

        records = EnqueuedTask._default_manager.using(using).filter(job=job)
        try:
            oldest_kept = list(
                records.order_by("-slot").values_list("slot", flat=True)[self.keep - 1 : self.keep]
            )
            if oldest_kept:
                records.filter(slot__lt=oldest_kept[0]).delete()
        except DatabaseError as exc:
            logger.warning("job %s: pruning its enqueued-task records failed: %s", job, exc)

    # -- exactly once ---------------------------------------------------------------------

    def _in_one_transaction(
        self, ctx: JobContext, kwargs: Mapping[str, Any], store: Any, token: str,
        finishing: Callable[[], None],
    ) -> str:
        from ..models import EnqueuedTask

        job, slot = ctx.name, ctx.slot
        with store.transaction():
            if not store.lock_running(job, slot, token):
                raise LeaseLostBeforeEnqueueError(
                    f"job {job!r}: the run was taken over before attempt {ctx.attempt} could "
                    "enqueue its task; nothing was enqueued"
                )
            records = EnqueuedTask._default_manager.using(store.using)
            record = records.filter(job=job, slot=slot).first()
            if record is not None and record.task_id:
                task_id = str(record.task_id)
            else:
                if record is not None:  # a marker of the other path (the settings changed)
                    task_id = self._found_or_refuse(ctx, record, kwargs)
                else:
                    task_id = self.target.enqueue(job, slot, kwargs)
                    record = EnqueuedTask(job=job, slot=slot, target=self.target.describe()[:500])
                _enqueued(record, task_id, ctx)
                record.save(using=store.using)
            if not store.finish_locked(job, slot, token, "success"):  # pragma: no cover
                raise LeaseLostBeforeEnqueueError(f"job {job!r}: the locked run did not finish")
            finishing()
        return task_id

    # -- at most once ---------------------------------------------------------------------

    def _record_first(self, ctx: JobContext, kwargs: Mapping[str, Any], using: str) -> str:
        from ..models import EnqueuedTask, EnqueueState

        job, slot = ctx.name, ctx.slot
        records = EnqueuedTask._default_manager.using(using)
        record = records.filter(job=job, slot=slot).first()
        if record is not None:
            if record.task_id:
                return str(record.task_id)  # an earlier attempt enqueued it and said so
            task_id = self._found_or_refuse(ctx, record, kwargs)
            _enqueued(record, task_id, ctx)
            record.save(using=using)
            return task_id
        marker = EnqueuedTask(
            job=job, slot=slot, target=self.target.describe()[:500], state=EnqueueState.ENQUEUING,
            attempt=ctx.attempt, instance_id=ctx.instance_id,
        )
        try:
            with transaction.atomic(using=using):
                marker.save(using=using)
        except IntegrityError:
            raise EnqueueUnknownError(
                f"job {job!r}: another attempt of this run is enqueueing its task right now; "
                "not enqueued twice"
            ) from None
        try:
            task_id = self.target.enqueue(job, slot, kwargs)
        except Exception as exc:
            # Whether it reached the task system is unknown: the marker stays, so no
            # later attempt enqueues again unless the target finds the task.
            error = f"{type(exc).__name__}: {redact_text(exc)}"[:4000]
            records.filter(pk=marker.pk).update(error=error)
            raise
        _enqueued(marker, task_id, ctx)
        marker.save(using=using)
        return task_id

    def _found_or_refuse(
        self, ctx: JobContext, record: EnqueuedTask, kwargs: Mapping[str, Any]
    ) -> str:
        """A marker without an id: the task the target finds, else refuse to enqueue again.

        A target whose task is idempotent by its id (``idempotent``, e.g. a Celery target:
        its ids come from the slot) is enqueued again instead: a second message with the
        same id does the work once.
        """
        found = self.target.find(ctx.name, ctx.slot)
        if found is not None:
            logger.info(
                "job %s slot %s: attempt %s found the task %s that attempt %s enqueued",
                ctx.name, ctx.slot, ctx.attempt, found, record.attempt,
            )
            return found
        if getattr(self.target, "idempotent", False) is True:
            task_id = self.target.enqueue(ctx.name, ctx.slot, kwargs)
            logger.info(
                "job %s slot %s: attempt %s sent the task %s again (attempt %s may have sent "
                "it; the task is idempotent by its id)",
                ctx.name, ctx.slot, ctx.attempt, task_id, record.attempt,
            )
            return task_id
        raise EnqueueUnknownError(
            f"job {ctx.name!r}: attempt {record.attempt} (instance {record.instance_id}) was "
            f"enqueueing this slot's task and never recorded the outcome"
            + (f" ({record.error})" if record.error else "")
            + f"; {self.target.describe()} finds no such task but cannot rule out that it was "
            "enqueued, so it is not enqueued again (at most once: docs/tasks.md)"
        )


def _enqueued(record: EnqueuedTask, task_id: str, ctx: JobContext) -> None:
    from ..models import EnqueueState

    record.state = EnqueueState.ENQUEUED
    record.task_id = str(task_id)[:255]
    record.attempt = ctx.attempt
    record.instance_id = ctx.instance_id
    record.enqueued_at = timezone.now()


def _database_store(backend: object) -> Any:
    """The database backend's store, if ``backend`` is the database backend."""
    from ..backends.database import DatabaseBackend

    return backend.store() if isinstance(backend, DatabaseBackend) else None


def records_alias(backend: object, target: TaskTarget) -> str:
    """The database where the beat keeps the ``EnqueuedTask`` records of ``target``'s jobs."""
    return _records_alias(_database_store(backend), target.database_alias())


def _records_alias(store: Any, alias: str | None) -> str:
    """Where the records live: the scheduler's database, else the task's, else the router's."""
    if store is not None:
        return str(store.using)
    if alias is not None:
        return alias
    from ..models import EnqueuedTask

    return router.db_for_write(EnqueuedTask) or "default"
