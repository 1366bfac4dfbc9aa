"""The operator's words for the ledger commands: WHEN, who, and the engine's refusals.

``anarchon_pause``, ``anarchon_backfill`` and ``anarchon_history --all-slots`` take times
as WHEN: an ISO 8601 date and time (naive means ``settings.TIME_ZONE``), a duration
(``2h``, ``1d12h``) or ``now``. What a duration means is the command's: from now for
``--until`` of a pause, that long ago for a range (docs/decisions.md). A naive time that
the zone skips or shows twice (a daylight-saving change) is refused: only an offset says
which instant was meant. The engine refuses what it cannot do with a
``ConfigurationError`` naming its own option (``until``, ``to``, ``max``); the commands
say it with their flag and the text the operator typed.
"""

from __future__ import annotations

import getpass
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

from django.core.management.base import CommandError
from django.utils import timezone

from django_anarchon.backends.base import ms_to_datetime
from django_anarchon.durations import parse_duration
from django_anarchon.exceptions import ConfigurationError

__all__ = ["ago", "operator_name", "parse_when", "refusals"]

WHEN_HELP = ("an ISO 8601 date and time (naive: settings.TIME_ZONE), a duration "
             "such as 2h or 30m, or now")
#: ``--by``'s longest value: the database's column (``operations.MAX_BY``).
MAX_BY = 150


def parse_when(text: str, *, option: str, job: str) -> datetime | timedelta:
    """``text`` as an aware datetime, or as a duration (``now`` is a zero duration)."""
    cleaned = text.strip()
    if cleaned.lower() == "now":
        return timedelta(0)
    try:
        moment = datetime.fromisoformat(cleaned)
    except ValueError:
        moment = None
    if moment is not None:
        return moment if moment.tzinfo is not None else _aware(moment, text, option, job)
    try:
        return timedelta(milliseconds=parse_duration(cleaned, job=job, option=option))
    except ConfigurationError as exc:
        # A duration's own refusal (too long) says more than "not a WHEN".
        if "not a duration" not in exc.reason:
            raise CommandError(f"job {job!r}, {option} {text!r}: {exc.reason}") from exc
    raise CommandError(f"job {job!r}, {option} {text!r}: expected {WHEN_HELP}")


def _aware(naive: datetime, text: str, option: str, job: str) -> datetime:
    """A naive time in the project's zone; one the zone skips or repeats is refused."""
    zone = timezone.get_default_timezone()
    first, second = naive.replace(tzinfo=zone, fold=0), naive.replace(tzinfo=zone, fold=1)
    if first.utcoffset() == second.utcoffset():
        return first
    name = timezone.get_default_timezone_name()
    if first.astimezone(UTC).astimezone(zone).replace(tzinfo=None) != naive:
        why = f"does not exist in {name} (the clocks skip it)"
    else:
        why = f"happens twice in {name} (the clocks go back)"
    raise CommandError(
        f"job {job!r}, {option} {text!r}: {why}; give its UTC offset, such as "
        f"{first.isoformat(timespec='minutes')} or {second.isoformat(timespec='minutes')}"
    )


def ago(value: datetime | timedelta, now_ms: int) -> datetime:
    """A range's end: a datetime as it is, a duration as that long before ``now_ms``."""
    if isinstance(value, datetime):
        return value
    return ms_to_datetime(now_ms) - value


def operator_name(given: str | None, *, job: str) -> str:
    """Who acts, for the pause's ``by`` and a backfill's ``requested_by``.

    ``--by`` when given (a deploy script names itself), else the operating system's
    login name; a process without one (a container's random uid) is ``uid N``.
    """
    if given is not None:
        name = given.strip()
        if not name or len(name) > MAX_BY:
            raise CommandError(
                f"job {job!r}, --by {given!r}: expected a name of 1 to {MAX_BY} characters"
            )
        return name
    try:
        return getpass.getuser()[:MAX_BY]
    except (OSError, KeyError):  # no LOGNAME/USER and no passwd entry
        return f"uid {os.getuid()}"


@contextmanager
def refusals(job: str, flags: Mapping[str, tuple[str, str]]) -> Iterator[None]:
    """The engine's ``ConfigurationError`` as a one-line ``CommandError``.

    ``flags``: the engine's option name -> (the command's flag, the text as typed), so the
    line names what the operator wrote (``--to '1h'``), not the engine's datetime.
    """
    try:
        yield
    except ConfigurationError as exc:
        if exc.option is not None and exc.option in flags:
            flag, typed = flags[exc.option]
            raise CommandError(f"job {exc.job or job!r}, {flag} {typed!r}: {exc.reason}") from exc
        raise CommandError(str(exc)) from exc
