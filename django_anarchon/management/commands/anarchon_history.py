"""``manage.py anarchon_history [JOB]``: the latest runs, from every instance, newest first."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from django_anarchon.backends.base import RunRecord, sort_newest_first
from django_anarchon.durations import format_duration

from ._output import (
    add_scheduler_argument,
    bounded_int,
    find_job,
    selected_schedulers,
    store_errors,
    table,
    to_json,
    when,
)

#: The most runs one call shows: more is a dump, not a look, and a huge number is refused
#: by some stores (PostgreSQL's LIMIT is a bigint).
MAX_LIMIT = 10_000


class Command(BaseCommand):
    help = "Show the latest runs of a job (or of every job), newest first, from every instance."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("job", nargs="?", help="A job name (default: every job).")
        add_scheduler_argument(parser)
        parser.add_argument(
            "--limit", type=bounded_int(1, MAX_LIMIT), default=20,
            help=f"How many runs, 1 to {MAX_LIMIT:,} (default 20).",
        )
        parser.add_argument("--json", action="store_true", help="Print JSON instead of a table.")

    def handle(self, *args: Any, **options: Any) -> None:
        limit = options["limit"]
        records: list[tuple[str, RunRecord]] = []
        if options["job"]:
            alias, scheduler = find_job(options["job"], options["schedulers"])
            with store_errors(alias, scheduler):
                records = [(alias, r) for r in scheduler.history(options["job"], limit)]
        else:
            for alias, scheduler in selected_schedulers(options["schedulers"]):
                with store_errors(alias, scheduler):
                    for info in scheduler.jobs():
                        records.extend((alias, r) for r in scheduler.history(info.name, limit))
            order = {id(r): i for i, r in enumerate(sort_newest_first([r for _, r in records]))}
            records = sorted(records, key=lambda pair: order[id(pair[1])])[:limit]
        links = _task_links(records)
        if options["json"]:
            self.stdout.write(to_json([
                {"scheduler": a, **r.to_dict(),
                 **({"task": _link_dict(links, a, r)} if (a, r.job) in links else {})}
                for a, r in records
            ]))
            return
        if not records:
            self.stdout.write("No runs recorded yet.")
            return
        rows = [
            [r.job, when(r.scheduled_at), r.status, r.instance_id, r.attempt,
             r.reason + (" (manual)" if r.manual and r.reason != "manual" else ""),
             when(r.started_at), format_duration(r.duration_ms) if r.duration_ms else "-",
             _first_line(r.error)]
            for _, r in records
        ]
        headers = ["JOB", "SCHEDULED", "STATUS", "INSTANCE", "ATTEMPT", "REASON", "STARTED",
                   "DURATION", "ERROR"]
        if links:  # jobs that enqueue a task: which task each run enqueued
            headers.insert(3, "TASK")
            for row, (alias, r) in zip(rows, records, strict=True):
                link = _link_dict(links, alias, r)
                row.insert(3, "-" if link is None else _task_text(link))
        self.stdout.write(table(headers, rows))


def _first_line(error: str | None) -> str:
    if not error:
        return ""
    line = error.strip().splitlines()[-1]
    return line if len(line) <= 80 else line[:77] + "..."


def _task_links(records: list[tuple[str, RunRecord]]) -> dict[tuple[str, str], dict[int, Any]]:
    """(scheduler, job) -> slot -> TaskLink, for the jobs among ``records`` that have a target."""
    from django_anarchon.enqueue.links import task_links
    from django_anarchon.handler import schedulers

    slots: dict[tuple[str, str], set[int]] = {}
    for alias, r in records:
        slots.setdefault((alias, r.job), set()).add(r.slot)
    links = {}
    for (alias, job), wanted in slots.items():
        scheduler = schedulers[alias]
        found = scheduler.get_job(job)
        if found.target is not None:
            links[(alias, job)] = task_links(found, scheduler.backend, wanted)
    return links


def _link_dict(
    links: dict[tuple[str, str], dict[int, Any]], alias: str, r: RunRecord
) -> dict[str, Any] | None:
    link = links.get((alias, r.job), {}).get(r.slot)
    return None if link is None else dict(link.to_dict())


def _task_text(link: dict[str, Any]) -> str:
    if not link["task_id"]:
        return f"({link['state']})"
    return str(link["task_id"]) + (f" {link['status']}" if link["status"] else "")
