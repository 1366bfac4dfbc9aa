"""``manage.py anarchon_history [JOB]``: the latest runs, from every instance, newest first.

With ``--all-slots`` it shows one job's ledger instead: every slot with its fate (ran,
skipped and why, missed), newest first, between ``--since`` and ``--until``.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_anarchon.backends.base import RunRecord, ledger_of, sort_newest_first
from django_anarchon.durations import format_duration

from ._operator import WHEN_HELP, ago, parse_when, refusals
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
            help=f"How many runs (ledger lines with --all-slots), 1 to {MAX_LIMIT:,} (default 20).",
        )
        parser.add_argument("--json", action="store_true", help="Print JSON instead of a table.")
        parser.add_argument(
            "--all-slots", action="store_true",
            help="The job's ledger: every slot with its fate (ran, skipped, missed), not "
                 "only the runs.",
        )
        for flag, what in (("--since", "first"), ("--until", "last")):
            parser.add_argument(
                flag, metavar="WHEN",
                help=f"With --all-slots: the {what} slot to show, as {WHEN_HELP} "
                     "(a duration is that long ago).",
            )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["all_slots"]:
            self._ledger(options)
            return
        for flag in ("since", "until"):
            if options[flag] is not None:
                raise CommandError(f"--{flag} goes with --all-slots (the ledger of one JOB)")
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

    def _ledger(self, options: dict[str, Any]) -> None:
        name = options["job"]
        if not name:
            raise CommandError("--all-slots shows the ledger of one job: name the JOB")
        alias, scheduler = find_job(name, options["schedulers"])
        typed = {flag: parse_when(options[flag], option=f"--{flag}", job=name)
                for flag in ("since", "until") if options[flag] is not None}
        flags = {flag: (f"--{flag}", options[flag] or "") for flag in ("since", "until")}
        with store_errors(alias, scheduler), refusals(name, flags):
            now = scheduler.store_now(name) if typed else 0  # "2h" ago on the store's clock
            bounds = {flag: ago(typed[flag], now) if flag in typed else None
                      for flag in ("since", "until")}
            entries = scheduler.ledger(name, bounds["since"], bounds["until"], options["limit"])
        if options["json"]:
            self.stdout.write(to_json([entry.to_dict() for entry in entries]))
            return
        if ledger_of(scheduler.backend) is None:
            self.stderr.write(
                f"the {scheduler.backend.name} backend keeps no ledger: only the slots that "
                "ran show"
            )
        if not entries:
            self.stdout.write(f"No slots of {name} recorded in that range.")
            return
        rows = []
        for e in entries:
            ran = e.fate == "ran"
            span = "" if e.count == 1 else f"{e.count} slots, to {when(e.last_scheduled_at)}"
            rows.append([when(e.scheduled_at), e.fate, e.reason, e.status if ran else "-",
                         len(e.attempts) if ran else "-", e.by or "-", span])
        self.stdout.write(table(
            ["SCHEDULED", "FATE", "REASON", "STATUS", "ATTEMPTS", "INSTANCE", "RANGE"], rows
        ))


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
