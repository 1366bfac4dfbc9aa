"""Shared by the commands: find schedulers and jobs, turn store errors into one line, print.

A command that cannot reach its store says so in one line (scheduler, backend, error)
and exits 1, through :func:`store_errors`; Django's ``--traceback`` shows the rest.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.core.management.base import CommandError, CommandParser
from django.db import DatabaseError
from django.utils import timezone

from django_anarchon import conf
from django_anarchon.backends.base import PauseState, ms_to_datetime
from django_anarchon.exceptions import AnarchonError
from django_anarchon.redact import describe_backend, redact_text

if TYPE_CHECKING:
    from django_anarchon.engine import Scheduler


def add_scheduler_argument(parser: CommandParser) -> None:
    parser.add_argument(
        "--scheduler", action="append", dest="schedulers", metavar="ALIAS",
        help="A scheduler alias from settings.ANARCHON; repeat for several (default: all).",
    )


def chosen_aliases(aliases: Sequence[str] | None) -> list[str]:
    """The scheduler aliases asked for (default: every configured one), each checked."""
    try:
        configured = list(conf.get_config())
    except AnarchonError as exc:
        raise CommandError(str(exc)) from exc
    chosen = list(aliases) if aliases else configured
    for alias in chosen:
        if alias not in configured:
            raise CommandError(f"unknown scheduler {alias!r}; configured: {', '.join(configured)}")
    return chosen


def selected_schedulers(aliases: Sequence[str] | None) -> list[tuple[str, Scheduler]]:
    """``(alias, scheduler)`` for the aliases asked for (default: every configured one)."""
    from django_anarchon.handler import schedulers

    chosen = chosen_aliases(aliases)
    try:
        return [(alias, schedulers[alias]) for alias in chosen]
    except AnarchonError as exc:
        raise CommandError(str(exc)) from exc


@contextmanager
def store_errors(alias: str, scheduler: Scheduler) -> Iterator[None]:
    """Turn an error of ``scheduler``'s store into a one-line :class:`CommandError` (exit 1).

    A store that is down, refuses the password or lacks its tables is the user's to fix,
    not a bug: the line names the scheduler, the backend and the error; the original
    stays chained for ``--traceback``.
    """
    try:
        yield
    except CommandError:
        raise
    except Exception as exc:
        raise CommandError(
            f"scheduler {alias!r}, backend {describe_backend(scheduler.backend)}: {error_line(exc)}"
        ) from exc


def error_line(exc: BaseException) -> str:
    """``Class: first line of the message``, with a hint when the app's tables are missing."""
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {redact_text(lines[0])}" if lines else type(exc).__name__
    if isinstance(exc, DatabaseError) and _names_missing_table(str(exc)):
        text += "; run `python manage.py migrate`"
    return text


def _names_missing_table(message: str) -> bool:
    """PostgreSQL, SQLite and MySQL/MariaDB's words for a missing django_anarchon table."""
    lowered = message.lower()
    return "django_anarchon_" in lowered and any(
        words in lowered for words in ("does not exist", "no such table", "doesn't exist")
    )


def bounded_int(low: int, high: int) -> Callable[[str], int]:
    """An argparse ``type``: a whole number from ``low`` to ``high``, or a clear usage error."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"expected a whole number from {low} to {high:,}, got {text!r}"
            )
        return value

    return parse


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


def pause_text(state: PauseState, note_width: int | None = None) -> str:
    """``by alice until 2026-11-29 16:10:12 UTC: deploy``, on one line.

    ``note_width`` cuts a long note (a table cell); the note's own line breaks are spaces.
    """
    parts = [f"by {state.by}"] if state.by else []
    if state.until is None:
        parts.append("until resumed")
    else:
        parts.append(f"until {when(ms_to_datetime(state.until))}")
    text = " ".join(parts)
    note = " ".join(state.note.split())
    if note_width is not None and len(note) > note_width:
        note = note[: note_width - 3] + "..."
    return f"{text}: {note}" if note else text


def pause_dict(state: PauseState | None) -> dict[str, Any] | None:
    """The ``"paused"`` value of a job in ``--json``: note, by, at and until (ISO), or null."""
    if state is None:
        return None
    until = None if state.until is None else ms_to_datetime(state.until).isoformat()
    return {"note": state.note, "by": state.by, "at": ms_to_datetime(state.at).isoformat(),
            "until": until}


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain-text table with columns as wide as their widest cell."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def to_json(value: Any) -> str:
    return json.dumps(value, indent=2, default=str)
