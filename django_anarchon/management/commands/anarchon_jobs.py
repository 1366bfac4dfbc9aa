"""``manage.py anarchon_jobs``: every job of every scheduler, its schedule, next and last run.

A paused job gets a PAUSED column (who, until when, the note); the pauses of a
scheduler's jobs are one read of its store. With ``--next N`` it lists the next N slots of each job (or of one JOB) instead, in the
job's zone and in UTC, marked where a DST rule shifted, skipped or doubled one.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from django.core.management.base import BaseCommand, CommandParser
from django.utils import timezone

from django_anarchon.schedules import preview

from ._output import (
    add_scheduler_argument,
    bounded_int,
    find_job,
    pause_dict,
    pause_text,
    selected_schedulers,
    store_errors,
    table,
    to_json,
    when,
)

if TYPE_CHECKING:
    from django_anarchon.engine import Scheduler

MAX_NEXT = 1_000


class Command(BaseCommand):
    help = "List the jobs of the configured schedulers with their next and last run."

    def add_arguments(self, parser: CommandParser) -> None:
        add_scheduler_argument(parser)
        parser.add_argument("--json", action="store_true", help="Print JSON instead of a table.")
        parser.add_argument(
            "--next", type=bounded_int(1, MAX_NEXT), metavar="N", dest="next",
            help="List the next N fire times of each job (in its zone and in UTC), marking "
                 "those a daylight-saving rule shifted, skipped or doubled.",
        )
        parser.add_argument("job", nargs="?", metavar="JOB", help="Only this job.")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["job"] is not None:
            alias, scheduler = find_job(options["job"], options["schedulers"])
            chosen = [(alias, scheduler)]
        else:
            chosen = selected_schedulers(options["schedulers"])
        if options["next"] is not None:
            self._next(chosen, options["next"], options["job"], options["json"])
            return
        rows: list[list[Any]] = []
        items: list[dict[str, Any]] = []
        for alias, scheduler in chosen:
            infos = [info for info in sorted(scheduler.jobs(), key=lambda i: i.name)
                     if options["job"] is None or info.name == options["job"]]
            with store_errors(alias, scheduler):
                lasts = [scheduler.last_run(info.name) for info in infos]
                # After the runs: a store without the app's tables names its runs table.
                pauses = scheduler.pauses([info.name for info in infos]) if infos else {}
            for info, last in zip(infos, lasts, strict=True):
                job = scheduler.get_job(info.name)
                target = job.target.describe() if job.target is not None else None
                paused = pauses.get(info.name)
                items.append({"scheduler": alias, **info.to_dict(),
                              "last_run": last.to_dict() if last else None,
                              "paused": pause_dict(paused),
                              **({"target": target} if target else {})})
                notes = [job.policies(), f"enqueues {target}" if target else ""]
                rows.append([
                    alias, info.name, info.schedule, when(info.next_run_at),
                    when(last.started_at) if last else "-", last.status if last else "-",
                    ", ".join(n for n in notes if n) or "-",
                    "-" if paused is None else pause_text(paused, note_width=40),
                ])
        headers = ["SCHEDULER", "JOB", "SCHEDULE", "NEXT RUN", "LAST RUN", "STATUS", "POLICIES"]
        if any(row[-1] != "-" for row in rows):  # the column only when a job is paused
            headers.append("PAUSED")
        else:
            rows = [row[:-1] for row in rows]
        if options["json"]:
            self.stdout.write(to_json(items))
        elif rows:
            self.stdout.write(table(headers, rows))
        else:
            self.stdout.write("No jobs are registered. Put them in a jobs.py module of an installed app.")

    def _next(
        self, chosen: list[tuple[str, Scheduler]], n: int, only: str | None, as_json: bool
    ) -> None:
        now = int(time.time() * 1000)
        zone = timezone.get_current_timezone_name()
        rows: list[list[Any]] = []
        items: list[dict[str, Any]] = []
        for alias, scheduler in chosen:
            for info in sorted(scheduler.jobs(), key=lambda i: i.name):
                if only is not None and info.name != only:
                    continue
                fires = preview(scheduler.get_job(info.name).schedule, now, n, zone)
                items.append({"scheduler": alias, "name": info.name, "schedule": info.schedule,
                              "next": [fire.to_dict() for fire in fires]})
                rows.extend([alias, info.name, fire.local_text(), fire.utc_text(), fire.label()]
                            for fire in fires)
                if not fires:
                    rows.append([alias, info.name, "-", "-", "no further slot"])
        if as_json:
            self.stdout.write(to_json(items))
        elif rows:
            self.stdout.write(table(["SCHEDULER", "JOB", "LOCAL TIME", "UTC", "DST"], rows))
        else:
            self.stdout.write("No jobs are registered. Put them in a jobs.py module of an installed app.")
