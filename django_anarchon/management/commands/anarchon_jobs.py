"""``manage.py anarchon_jobs``: every job of every scheduler, its schedule, next and last run."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from ._output import add_scheduler_argument, selected_schedulers, store_errors, table, to_json, when


class Command(BaseCommand):
    help = "List the jobs of the configured schedulers with their next and last run."

    def add_arguments(self, parser: CommandParser) -> None:
        add_scheduler_argument(parser)
        parser.add_argument("--json", action="store_true", help="Print JSON instead of a table.")

    def handle(self, *args: Any, **options: Any) -> None:
        rows: list[list[Any]] = []
        items: list[dict[str, Any]] = []
        for alias, scheduler in selected_schedulers(options["schedulers"]):
            for info in sorted(scheduler.jobs(), key=lambda i: i.name):
                with store_errors(alias, scheduler):
                    last = scheduler.last_run(info.name)
                items.append({"scheduler": alias, **info.to_dict(),
                              "last_run": last.to_dict() if last else None})
                rows.append([
                    alias, info.name, info.schedule, when(info.next_run_at),
                    when(last.started_at) if last else "-", last.status if last else "-",
                ])
        if options["json"]:
            self.stdout.write(to_json(items))
        elif rows:
            self.stdout.write(table(
                ["SCHEDULER", "JOB", "SCHEDULE", "NEXT RUN", "LAST RUN", "STATUS"], rows
            ))
        else:
            self.stdout.write("No jobs are registered. Put them in a jobs.py module of an installed app.")
