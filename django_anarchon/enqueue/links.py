"""From a run to its task: what the history and the admin show for a job with a target.

The run records stay as every store keeps them; the task of a run is found by (job, slot)
in ``EnqueuedTask``, and its state, where the task's backend can say it, by the target's
optional ``result(task_id)`` (django-tasks-db can; a fire-and-forget backend cannot).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from django.urls import NoReverseMatch, reverse

from .run import records_alias

if TYPE_CHECKING:
    from ..jobs import Job

__all__ = ["TaskLink", "task_links"]

logger = logging.getLogger("django_anarchon")


@dataclass(frozen=True)
class TaskLink:
    """The task one run enqueued."""

    task_id: str
    #: ``enqueued``, or ``enqueuing`` (an attempt died or failed before it recorded the id).
    state: str
    #: The task's own status where its backend can say it (``READY``, ``SUCCESSFUL`` ...).
    status: str | None
    #: The task result's admin page, where one is registered.
    url: str | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def task_links(job: Job, backend: object, slots: Iterable[int]) -> dict[int, TaskLink]:
    """The tasks of ``slots`` of ``job`` (empty for a job without a target, or on an error)."""
    target = job.target
    if target is None:
        return {}
    from ..models import EnqueuedTask

    try:
        rows = list(
            EnqueuedTask._default_manager.using(records_alias(backend, target))
            .filter(job=job.name, slot__in=set(slots))
        )
    except Exception as exc:  # a listing never fails over the links
        logger.warning("job %s: cannot read its enqueued tasks: %s", job.name, exc)
        return {}
    links = {}
    for row in rows:
        status, url = None, None
        if row.task_id:
            result = getattr(target, "result", None)
            found = result(row.task_id) if callable(result) else None
            raw = getattr(found, "status", None)
            status = None if raw is None else str(getattr(raw, "value", raw))
            url = _admin_url(target, row.task_id)
        links[row.slot] = TaskLink(task_id=row.task_id, state=row.state, status=status, url=url)
    return links


def _admin_url(target: object, task_id: str) -> str | None:
    name = getattr(target, "admin_url_name", None)
    if not isinstance(name, str):
        return None
    try:
        return reverse(name, args=[task_id])
    except NoReverseMatch:  # its admin is not installed
        return None
