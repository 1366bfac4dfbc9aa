"""``manage.py anarchon_pause JOB``: pause a job on every instance, until resumed or WHEN.

The pause lives in the store, so every worker honours it at its next claim: the job's
slots are skipped (reason ``paused``) and show so in ``anarchon_history --all-slots``.
A run already going is not stopped. Pausing a paused job replaces its note, who and until.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from django_anarchon.backends.base import ms_to_datetime
from django_anarchon.durations import format_duration

from ._operator import WHEN_HELP, operator_name, parse_when, refusals
from ._output import add_scheduler_argument, find_job, store_errors, when


class Command(BaseCommand):
    help = ("Pause a job on every instance: its slots are skipped (reason paused) until "
            "anarchon_resume, or until --until passes.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("job", help="The job's name, as anarchon_jobs lists it.")
        add_scheduler_argument(parser)
        parser.add_argument("--note", default="", help="Why (shown in anarchon_jobs and the admin).")
        parser.add_argument(
            "--until", metavar="WHEN",
            help=f"End the pause by itself at WHEN: {WHEN_HELP} (a duration is from now).",
        )
        parser.add_argument(
            "--by", metavar="NAME", help="Who pauses (default: this operating system user)."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        name = options["job"]
        alias, scheduler = find_job(name, options["schedulers"])
        typed = options["until"]
        until: datetime | timedelta | None = None
        if typed is not None:
            until = parse_when(typed, option="--until", job=name)
        by = operator_name(options["by"], job=name)
        note = options["note"]
        flags = {"until": ("--until", typed or ""), "by": ("--by", by),
                 "note": ("--note", note if len(note) <= 40 else note[:40] + "...")}
        with store_errors(alias, scheduler), refusals(name, flags):
            before = scheduler.pauses([name]).get(name)
            state = scheduler.pause(name, note=note, until=until, by=by)
        where = f"scheduler {alias!r}"
        if before is not None:
            where += f", replacing the pause of {when(ms_to_datetime(before.at))}"
        line = f"paused {name} ({where})" + (f" by {state.by}" if state.by else "")
        if state.until is None:
            line += " until resumed"
        else:
            # To the nearest second: ``at`` is the store's now, a moment after the command's.
            length = format_duration(max(round((state.until - state.at) / 1000), 1) * 1000)
            line += f" for {length}, until {when(ms_to_datetime(state.until))}"
        note = " ".join(state.note.split())
        self.stdout.write(f"{line}: {note}" if note else line)
