"""From a run to its task: what the history and the admin show for a job with a target.

The run records stay as every store keeps them; the task of a run is found by (job, slot)
in ``EnqueuedTask``, and its state, where the task's backend can say it, by the target's
optional ``result(task_id)`` (django-tasks-db can; a fire-and-forget backend cannot).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from django.urls import NoReverseMatch, reverse

from .run import records_alias

if TYPE_CHECKING:
    from ..jobs import Job

__all__ = ["TaskLink", "task_links", "task_links_of_many"]

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
    found = task_links_of_many(backend, [(job, slot) for slot in set(slots)])
    return {slot: link for (_, slot), link in found.items()}


def task_links_of_many(
    backend: object, wanted: Sequence[tuple[Job, int]]
) -> dict[tuple[str, int], TaskLink]:
    """The tasks of many ``(job, slot)`` pairs of one scheduler, keyed ``(job name, slot)``.

    One query per database that holds records (the Jobs page asks for every job's last
    run at once), not one per job. Jobs without a target are left out; an error leaves
    out that database's links.
    """
    from django.db.models import Q

    from ..models import EnqueuedTask

    by_alias: dict[str, dict[str, tuple[Job, set[int]]]] = {}
    for job, slot in wanted:
        if job.target is None:
            continue
        jobs = by_alias.setdefault(records_alias(backend, job.target), {})
        jobs.setdefault(job.name, (job, set()))[1].add(slot)
    links: dict[tuple[str, int], TaskLink] = {}
    for alias, jobs in by_alias.items():
        match = Q()
        for name, (_, slots) in jobs.items():
            match |= Q(job=name, slot__in=sorted(slots))
        try:
            rows = list(EnqueuedTask._default_manager.using(alias).filter(match))
        except Exception as exc:  # a listing never fails over the links
            logger.warning("jobs %s: cannot read their enqueued tasks: %s",
                           ", ".join(sorted(jobs)), exc)
            continue
        for row in rows:
            found = jobs.get(row.job)
            if found is not None and row.slot in found[1]:
                links[(row.job, row.slot)] = _link(found[0], row)
    return links


def _link(job: Job, row: Any) -> TaskLink:
    target = job.target
    status, url = None, None
    if row.task_id and target is not None:
        result = getattr(target, "result", None)
        found = result(row.task_id) if callable(result) else None
        raw = getattr(found, "status", None)
        status = None if raw is None else str(getattr(raw, "value", raw))
        url = _admin_url(target, row.task_id)
    return TaskLink(task_id=row.task_id, state=row.state, status=status, url=url)


def _admin_url(target: object, task_id: str) -> str | None:
    name = getattr(target, "admin_url_name", None)
    if not isinstance(name, str):
        return None
    try:
        return reverse(name, args=[task_id])
    except NoReverseMatch:  # its admin is not installed
        return None
