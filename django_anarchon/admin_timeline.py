"""The per-job page's timeline: the job's ledger laid out on a time axis.

Pure presentation: ledger entries, the job's schedule and a window in; cells with a
position and a width (percent of the track), a colour and a title out. Each cell runs
from its slot to the job's next slot after it, so consecutive slots touch, a range of
missed slots is as wide as the time it covers, and a stretch with no entry at all
(before the store knew the job, or on a store without a ledger) is empty track: gaps
show at a glance.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal
from urllib.parse import urlencode

from django.utils import dateformat, timezone
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from .admin_format import error_summary, format_when
from .backends.base import ms_to_datetime

if TYPE_CHECKING:
    from .engine.ledger import LedgerEntry
    from .jobs import Job

__all__ = [
    "DEFAULT_SPAN", "LEDGER_LIMIT", "SPANS", "Cell", "LedgerRow", "Timeline", "build_timeline",
    "local_input", "parse_span",
]

#: The windows the page offers, newest slots on the right, ending now.
SPANS: dict[str, int] = {
    "1h": 3_600_000,
    "6h": 6 * 3_600_000,
    "24h": 24 * 3_600_000,
    "7d": 7 * 24 * 3_600_000,
}
DEFAULT_SPAN = "24h"
#: The most entries one timeline shows: a busy job's window shrinks to its newest ones.
LEDGER_LIMIT = 100
#: The narrowest cell, in percent of the track (3 px of a 1280 px window's track).
MIN_WIDTH = 0.25
#: The shortest window, however young the job.
MIN_SPAN_MS = 60_000
#: Why a slot was skipped, as the tooltip says it (the store's reason codes).
SKIP_REASONS = {
    "overlap": "the previous run was still going",
    "late": "no instance claimed it within max_late",
    "paused": "the job was paused",
    "dst": "a daylight-saving change swallowed it",
}


def parse_span(value: str | None) -> str:
    """The ``span`` query parameter, or the default for anything else."""
    return value if value in SPANS else DEFAULT_SPAN


def _when(ms: int) -> str:
    return format_when(ms_to_datetime(ms))


def local_input(ms: int, *, round_up: bool = False) -> str:
    """An instant as a ``datetime-local`` input's value, in the current time zone, to the
    second (rounded up for the end of a range, so the range holds its last slot)."""
    seconds = -(-ms // 1000) if round_up else ms // 1000
    local = timezone.localtime(ms_to_datetime(seconds * 1000))
    return local.strftime("%Y-%m-%dT%H:%M:%S")


@dataclass(frozen=True)
class Cell:
    """One entry on the track: a slot, or a range of missed slots."""

    entry: LedgerEntry
    left: float
    width: float
    css: str
    title: str
    #: The per-job page with the backfill form filled for this slot or range.
    backfill_query: str = ""

    @property
    def style(self) -> str:
        return f"left:{self.left:.3f}%;width:{self.width:.3f}%"


@dataclass(frozen=True)
class Tick:
    left: float
    label: str
    align: Literal["start", "middle", "end"]

    @property
    def style(self) -> str:
        return f"left:{self.left:.3f}%"  # a string: never localised ("25,000%")


@dataclass(frozen=True)
class LedgerRow:
    """One entry as the compact table under the timeline shows it."""

    entry: LedgerEntry
    css: str
    when: str
    fate: str
    detail: str


@dataclass(frozen=True)
class Timeline:
    start: int
    end: int
    cells: tuple[Cell, ...]
    ticks: tuple[Tick, ...]
    rows: tuple[LedgerRow, ...]
    #: The read returned ``LEDGER_LIMIT`` entries: older ones exist, the window starts later.
    truncated: bool
    #: Slots by fate in the window: {"ran": 90, "skipped": 3, "missed": 12}.
    counts: dict[str, int]

    @property
    def since(self) -> str:
        return _when(self.start)

    @property
    def caption(self) -> str:
        parts = [
            ngettext("%(n)d slot ran", "%(n)d slots ran", self.counts["ran"])
            % {"n": self.counts["ran"]},
            ngettext("%(n)d skipped", "%(n)d skipped", self.counts["skipped"])
            % {"n": self.counts["skipped"]},
            ngettext("%(n)d missed", "%(n)d missed", self.counts["missed"])
            % {"n": self.counts["missed"]},
        ]
        return ", ".join(parts)


def css_class(entry: LedgerEntry) -> str:
    if entry.fate == "ran":
        return f"anarchon-fate-ran anarchon-{entry.status or 'unknown'}"
    return f"anarchon-fate-{entry.fate}"


def _range_text(entry: LedgerEntry) -> str:
    if entry.count > 1:
        return _("%(first)s to %(last)s") % {
            "first": _when(entry.slot), "last": _when(entry.last_slot)}
    return _when(entry.slot)


def describe(entry: LedgerEntry) -> tuple[str, str]:
    """The fate in a word or two, and the detail: what the tooltip and the table say."""
    if entry.fate == "ran":
        detail = f"{entry.status or '?'} · {entry.reason} · {entry.by}"
        if len(entry.attempts) > 1:
            detail += " · " + _("%(n)d attempts") % {"n": len(entry.attempts)}
        last = entry.attempts[-1] if entry.attempts else None
        if last is not None and last.error:
            detail += f" · {error_summary(last.error, 160)}"
        return _("ran"), detail
    if entry.fate == "skipped":
        why = SKIP_REASONS.get(entry.reason, entry.reason)
        return _("skipped: %(reason)s") % {"reason": entry.reason}, _(
            "%(why)s · noted by %(by)s") % {"why": why, "by": entry.by}
    if entry.count == 1:
        return _("missed"), _("nobody claimed it · noted by %(by)s") % {"by": entry.by}
    return (_("%(n)d slots missed") % {"n": entry.count},
            _("nobody claimed them · noted by %(by)s") % {"by": entry.by})


def _tick_label(ms: int, span: int) -> str:
    local = timezone.localtime(ms_to_datetime(ms))
    if span <= 3_600_000:
        return dateformat.format(local, "H:i:s")
    if span <= 24 * 3_600_000:
        return dateformat.format(local, "H:i")
    return dateformat.format(local, "m-d H:i")


def _ticks(start: int, end: int) -> tuple[Tick, ...]:
    span = max(end - start, 1)
    ticks = []
    for i in range(5):
        at = start + span * i // 4
        align: Literal["start", "middle", "end"] = (
            "start" if i == 0 else "end" if i == 4 else "middle")
        ticks.append(Tick(left=i * 25.0, label=_tick_label(at, span), align=align))
    return tuple(ticks)


def build_timeline(
    job: Job | None,
    entries: Sequence[LedgerEntry],
    now: int,
    span_ms: int,
    limit: int = LEDGER_LIMIT,
    backfill_query: str | None = None,
) -> Timeline:
    """The window ``now - span_ms .. now``, from the oldest entry when that is later (a
    job younger than the window, or ``limit`` entries read), but a minute at least.

    ``backfill_query``: the page's query string; given, skipped and missed cells link to
    the page with the backfill form filled for their slots.
    """
    start = now - span_ms
    truncated = len(entries) >= limit
    if entries:  # from the oldest entry: what came before it is not known here
        start = max(start, min(min(e.slot for e in entries), now - MIN_SPAN_MS))
    span = max(now - start, 1)
    cells: list[Cell] = []
    counts = {"ran": 0, "skipped": 0, "missed": 0}
    rows: list[LedgerRow] = []
    for entry in entries:
        if entry.last_slot < start or entry.slot > now:
            continue
        nxt = job.schedule.next_after(entry.last_slot) if job is not None else None
        right = min(nxt if nxt is not None else entry.last_slot, now)
        left = max(entry.slot, start)
        fate, detail = describe(entry)
        title = f"{_range_text(entry)} · {fate} · {detail}"
        query = ""
        if backfill_query is not None and entry.fate != "ran":
            query = backfill_query + "&" + urlencode({
                "start": local_input(entry.slot),
                "end": local_input(entry.last_slot, round_up=True),
            })
        css = css_class(entry)
        # Never narrower than MIN_WIDTH (a slot of a week's window, a run still going at
        # the right edge), and never past the edge.
        width = max((right - left) * 100 / span, MIN_WIDTH)
        cells.append(Cell(
            entry=entry, left=min((left - start) * 100 / span, 100 - width), width=width,
            css=css, title=title, backfill_query=query,
        ))
        counts[entry.fate] = counts.get(entry.fate, 0) + entry.count
        rows.append(LedgerRow(entry=entry, css=css, when=_range_text(entry), fate=fate,
                              detail=detail))
    cells.sort(key=lambda c: c.entry.slot)  # oldest first, and the newest on top
    return Timeline(start=start, end=now, cells=tuple(cells), ticks=_ticks(start, now),
                    rows=tuple(rows), truncated=truncated, counts=counts)
