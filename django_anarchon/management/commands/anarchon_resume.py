"""``manage.py anarchon_resume JOB``: end a job's pause on every instance.

Resuming a job that is not paused is not an error (a deploy script resumes what it
paused, whatever happened meanwhile): it says so and exits 0. The slots skipped while
paused stay skipped; ``anarchon_backfill`` runs them if they are owed.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from django_anarchon.backends.base import ms_to_datetime

from ._operator import refusals
from ._output import add_scheduler_argument, find_job, pause_text, store_errors, when


class Command(BaseCommand):
    help = "Resume a paused job on every instance: its next slots run again."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("job", help="The job's name, as anarchon_jobs lists it.")
        add_scheduler_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        name = options["job"]
        alias, scheduler = find_job(name, options["schedulers"])
        with store_errors(alias, scheduler), refusals(name, {}):
            state = scheduler.resume(name)
        if state is None:
            self.stdout.write(f"{name} (scheduler {alias!r}) was not paused")
        else:
            self.stdout.write(
                f"resumed {name} (scheduler {alias!r}), paused at "
                f"{when(ms_to_datetime(state.at))} {pause_text(state)}"
            )
