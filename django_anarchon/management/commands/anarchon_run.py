"""``manage.py anarchon_run JOB``: run a job now, in this process (or hand it to a worker)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from django_anarchon.durations import format_duration
from django_anarchon.run_data import RunDataError, parse_run_data
from django_anarchon.run_requests import file_request

from ._output import add_scheduler_argument, error_line, find_job, store_errors, to_json, when


class Command(BaseCommand):
    help = (
        "Run a job now and record it as a manual run. It runs in this process unless "
        "--via-worker hands it to a running anarchon_worker."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("job", help="The job's name, as anarchon_jobs lists it.")
        add_scheduler_argument(parser)
        parser.add_argument(
            "--data", help="Standard JSON given to the handler as ctx.data (at most 1 MB)."
        )
        parser.add_argument(
            "--via-worker", action="store_true",
            help="File a run request for a worker of the job's scheduler instead of running here.",
        )
        parser.add_argument("--json", action="store_true", help="Print the run record as JSON.")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            data = parse_run_data(options["data"])
        except RunDataError as exc:
            raise CommandError(f"--data: {exc}") from exc
        name = options["job"]
        alias, scheduler = find_job(name, options["schedulers"])
        if options["via_worker"]:
            try:
                request = file_request(alias, name, data=data, requested_by="manage.py anarchon_run")
            except DatabaseError as exc:  # the requests are rows in Django's database
                raise CommandError(
                    f"cannot file a run request for job {name!r}: {error_line(exc)}"
                ) from exc
            if options["json"]:
                self.stdout.write(to_json({"request": request.pk, "scheduler": alias, "job": name}))
            else:
                self.stdout.write(
                    f"Filed run request {request.pk}: a worker of scheduler {alias!r} will run {name}."
                )
            return
        with store_errors(alias, scheduler):
            record = scheduler.run_now(name, data=data)
        if options["json"]:
            self.stdout.write(to_json({"scheduler": alias, **record.to_dict()}))
        else:
            duration = format_duration(record.duration_ms) if record.duration_ms else "0ms"
            self.stdout.write(
                f"{name}: {record.status} in {duration} on {record.instance_id} "
                f"(started {when(record.started_at)})"
            )
            if record.error:
                self.stderr.write(record.error)
        if record.status != "success":
            raise CommandError(f"job {name!r} ended {record.status}", returncode=1)
