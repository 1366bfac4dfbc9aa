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
        if options["json"]:
            self.stdout.write(to_json([{"scheduler": a, **r.to_dict()} for a, r in records]))
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
        self.stdout.write(table(
            ["JOB", "SCHEDULED", "STATUS", "INSTANCE", "ATTEMPT", "REASON", "STARTED", "DURATION",
             "ERROR"],
            rows,
        ))


def _first_line(error: str | None) -> str:
    if not error:
        return ""
    line = error.strip().splitlines()[-1]
    return line if len(line) <= 80 else line[:77] + "..."
