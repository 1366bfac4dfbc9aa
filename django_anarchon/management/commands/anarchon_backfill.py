"""``manage.py anarchon_backfill JOB --from WHEN --to WHEN``: run the slots that never ran.

The command only works out the slots (``Scheduler.backfill``) and files a request; the
workers of the job's scheduler run them, one at a time, oldest first, each through the
normal claim (reason ``backfill``), so a slot that ran meanwhile is not run again.
``--dry-run`` lists the slots instead, in the job's zone and in UTC.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from django.core.management.base import BaseCommand, CommandParser
from django.utils import timezone

from django_anarchon.backends.base import ms_to_datetime
from django_anarchon.engine.operations import DEFAULT_BACKFILL_MAX, MAX_BACKFILL

from ._operator import WHEN_HELP, ago, operator_name, parse_when, refusals
from ._output import (
    add_scheduler_argument,
    bounded_int,
    find_job,
    store_errors,
    table,
    to_json,
    when,
)

if TYPE_CHECKING:
    from django_anarchon.engine import BackfillPlan
    from django_anarchon.jobs import Job


class Command(BaseCommand):
    help = ("Run the slots of a past range that never ran, once each, on the workers "
            "(oldest first); --dry-run lists them.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("job", help="The job's name, as anarchon_jobs lists it.")
        add_scheduler_argument(parser)
        for flag, what in (("--from", "The range's first instant"),
                           ("--to", "The range's last instant (not in the future)")):
            parser.add_argument(
                flag, metavar="WHEN", required=True, dest=flag[2:],
                help=f"{what}: {WHEN_HELP} (a duration is that long ago).",
            )
        parser.add_argument(
            "--max", type=bounded_int(1, MAX_BACKFILL), default=DEFAULT_BACKFILL_MAX,
            metavar="N",
            help=f"Refuse a range with more than N slots to run (1 to {MAX_BACKFILL:,}; "
                 f"default {DEFAULT_BACKFILL_MAX}).",
        )
        parser.add_argument(
            "--overlap", choices=["skip", "allow"], default="skip",
            help="skip (default): a slot waits for a run of the job still going; "
                 "allow: it runs beside it.",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="List the slots it would run; file nothing."
        )
        parser.add_argument(
            "--by", metavar="NAME", help="Who asks (default: this operating system user)."
        )
        parser.add_argument("--json", action="store_true", help="Print the plan as JSON.")

    def handle(self, *args: Any, **options: Any) -> None:
        name = options["job"]
        alias, scheduler = find_job(name, options["schedulers"])
        typed = {flag: parse_when(options[flag], option=f"--{flag}", job=name)
                for flag in ("from", "to")}
        by = operator_name(options["by"], job=name)
        flags = {"from": ("--from", options["from"]), "to": ("--to", options["to"]),
                 "max": ("--max", str(options["max"])), "overlap": ("--overlap", options["overlap"])}
        with store_errors(alias, scheduler), refusals(name, flags):
            # "2h" and "now" are counted on the store's clock, as the refusals are.
            now = scheduler.store_now(name)
            start, end = ago(typed["from"], now), ago(typed["to"], now)
            plan = scheduler.backfill(
                name, start, end, max=options["max"], overlap=options["overlap"],
                dry_run=options["dry_run"], requested_by=by,
            )
        job = scheduler.get_job(name)
        zone = _zone(job)
        if options["json"]:
            self.stdout.write(to_json({
                "scheduler": alias, "job": name, "from": start.isoformat(),
                "to": end.isoformat(), "dry_run": options["dry_run"],
                "request_id": plan.request_id, "already_ran": plan.already_ran,
                "slots": [ms_to_datetime(slot).isoformat() for slot in plan.slots],
            }))
            return
        span = f"{name} from {when(start)} to {when(end)}"
        self.stdout.write(self._summary(plan, span, alias, options["dry_run"]))
        if options["dry_run"] and plan.slots:
            self.stdout.write(table(
                ["LOCAL TIME", "UTC"],
                [[_local(slot, zone), ms_to_datetime(slot).strftime("%Y-%m-%d %H:%M:%S UTC")]
                 for slot in plan.slots],
            ))

    @staticmethod
    def _summary(plan: BackfillPlan, span: str, alias: str, dry_run: bool) -> str:
        ran = f"{plan.already_ran} slot(s) of the range already ran"
        if not plan.slots:
            return f"Nothing to backfill for {span}: {ran}."
        if dry_run:
            return (f"Dry run: a backfill of {span} would run {len(plan.slots)} slot(s), "
                    f"oldest first; {ran}.")
        return (f"Filed backfill request {plan.request_id}: the workers of scheduler {alias!r} "
                f"will run {len(plan.slots)} slot(s) of {span}, oldest first; {ran}.")


def _zone(job: Job) -> str:
    """The zone ``anarchon_jobs --next`` shows the job in: a cron job's, else TIME_ZONE."""
    zone = getattr(job.schedule, "timezone", None)
    return zone if isinstance(zone, str) else timezone.get_current_timezone_name()


def _local(slot: int, zone: str) -> str:
    return ms_to_datetime(slot).astimezone(ZoneInfo(zone)).strftime("%Y-%m-%d %H:%M:%S %Z")
