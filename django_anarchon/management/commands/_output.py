"""Shared by the read-only commands: find schedulers and jobs, print tables and JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.core.management.base import CommandError, CommandParser
from django.utils import timezone

from django_anarchon import conf
from django_anarchon.exceptions import AnarchonError

if TYPE_CHECKING:
    from django_anarchon.engine import Scheduler


def add_scheduler_argument(parser: CommandParser) -> None:
    parser.add_argument(
        "--scheduler", action="append", dest="schedulers", metavar="ALIAS",
        help="A scheduler alias from settings.ANARCHON; repeat for several (default: all).",
    )


def selected_schedulers(aliases: Sequence[str] | None) -> list[tuple[str, Scheduler]]:
    """``(alias, scheduler)`` for the aliases asked for (default: every configured one)."""
    from django_anarchon.handler import schedulers

    try:
        configured = list(conf.get_config())
    except AnarchonError as exc:
        raise CommandError(str(exc)) from exc
    chosen = list(aliases) if aliases else configured
    for alias in chosen:
        if alias not in configured:
            raise CommandError(f"unknown scheduler {alias!r}; configured: {', '.join(configured)}")
    try:
        return [(alias, schedulers[alias]) for alias in chosen]
    except AnarchonError as exc:
        raise CommandError(str(exc)) from exc


def find_job(name: str, aliases: Sequence[str] | None) -> tuple[str, Scheduler]:
    """The one scheduler that has job ``name``; ambiguous or unknown names are errors."""
    found = [
        (alias, scheduler)
        for alias, scheduler in selected_schedulers(aliases)
        if any(info.name == name for info in scheduler.jobs())
    ]
    if not found:
        known = sorted(
            info.name for _, scheduler in selected_schedulers(aliases) for info in scheduler.jobs()
        )
        hint = f"; known jobs: {', '.join(known)}" if known else "; no jobs are registered"
        raise CommandError(f"unknown job {name!r}{hint}")
    if len(found) > 1:
        raise CommandError(
            f"job {name!r} exists on schedulers {', '.join(a for a, _ in found)}; "
            "choose one with --scheduler"
        )
    return found[0]


def when(value: datetime | None) -> str:
    """A datetime in the project's time zone, to the second, or '-'."""
    if value is None:
        return "-"
    return timezone.localtime(value).strftime("%Y-%m-%d %H:%M:%S %Z")


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain-text table with columns as wide as their widest cell."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def to_json(value: Any) -> str:
    return json.dumps(value, indent=2, default=str)
