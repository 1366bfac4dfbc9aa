"""``manage.py demo_report``: per job and slot, which instance ran it; exit 1 on a duplicate."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from django_anarchon import get_scheduler
from django_anarchon.backends.base import RunRecord


class Command(BaseCommand):
    help = "Show which instance ran each slot of each job, and check that no slot ran twice."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--scheduler", default="default")

    def handle(self, *args: Any, **options: Any) -> None:
        scheduler = get_scheduler(options["scheduler"])
        duplicates = 0
        slots_total = 0
        per_instance: dict[str, int] = defaultdict(int)
        for info in sorted(scheduler.jobs(), key=lambda i: i.name):
            records = [r for r in scheduler.history(info.name, 1000) if not r.manual]
            by_slot: dict[int, list[RunRecord]] = defaultdict(list)
            for record in records:
                by_slot[record.slot].append(record)
            self.stdout.write(f"\n{info.name}  ({info.schedule})")
            if not by_slot:
                self.stdout.write("  no scheduled slot fell in the demo")
                continue
            for slot in sorted(by_slot):
                attempts = sorted(by_slot[slot], key=lambda r: r.attempt)
                numbers = [r.attempt for r in attempts]
                once = numbers == list(range(1, len(numbers) + 1))
                duplicates += 0 if once else 1
                slots_total += 1
                per_instance[attempts[-1].instance_id] += 1
                ran = " -> ".join(
                    f"{r.instance_id} (attempt {r.attempt}, {r.status})" for r in attempts
                )
                when = timezone.localtime(attempts[0].scheduled_at).strftime("%H:%M:%S")
                mark = "ran once" if once else "RAN MORE THAN ONCE"
                self.stdout.write(f"  {when}  {ran}  [{mark}]")
        spread = ", ".join(f"{k}: {v}" for k, v in sorted(per_instance.items()))
        self.stdout.write(f"\n{slots_total} slots; slots per instance: {spread or 'none'}")
        if duplicates:
            raise CommandError(f"{duplicates} slot(s) ran more than once")
        self.stdout.write("Every slot ran exactly once.")
