"""Durations as users write them ("1m30s", timedelta, seconds) <-> integer milliseconds.

Pure: no Django imports, so schedules and value types can use it anywhere.
"""

from __future__ import annotations

import math
import re
from datetime import timedelta

from .exceptions import ConfigurationError

Duration = str | int | float | timedelta

_UNITS_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_WHOLE = re.compile(r"(?:\d+(?:\.\d+)?(?:ms|s|m|h|d|w))+")

#: The longest duration any option or setting takes: 100 years (36,525 days). Slots are
#: epoch milliseconds that the stores keep as signed 64-bit integers and show as dates, and
#: the engine adds durations to them (a lease's expiry, a run's retention, a catch-up
#: window); with this bound every such sum stays a valid ``datetime`` (year 9999) and fits
#: a database ``bigint``, where 1e17 s would fail every claim with "bigint out of range".
MAX_DURATION_MS = 36_525 * 86_400_000


def parse_duration(
    value: object,
    *,
    job: str | None = None,
    option: str = "duration",
    allow_zero: bool = True,
) -> int:
    """Return ``value`` in whole milliseconds, or raise an error naming job, option and value.

    Accepts "250ms", "10s", "1m30s", "2h", "1d", "1w", a ``timedelta``, or a number of seconds.
    Booleans are refused: ``True`` as "1 second" is always a mistake. At most
    :data:`MAX_DURATION_MS` (100 years).
    """
    ms: float
    if isinstance(value, bool) or value is None:
        raise ConfigurationError(
            "expected a duration such as '10s', '1m30s', a timedelta or a number of seconds",
            job=job, option=option, value=value,
        )
    if isinstance(value, timedelta):
        ms = value / timedelta(milliseconds=1)
    elif isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise ConfigurationError("a duration must be finite", job=job, option=option, value=value)
        ms = value * 1000
    elif isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        if not _WHOLE.fullmatch(text):
            raise ConfigurationError(
                "not a duration; write it like '250ms', '10s', '1m30s', '2h' or '1d'",
                job=job, option=option, value=value,
            )
        ms = sum(float(n) * _UNITS_MS[unit] for n, unit in _PART.findall(text))
    else:
        raise ConfigurationError(
            f"expected a duration, got {type(value).__name__}", job=job, option=option, value=value
        )
    if ms < 0:
        raise ConfigurationError("a duration cannot be negative", job=job, option=option, value=value)
    if ms > MAX_DURATION_MS:
        raise ConfigurationError(
            "longer than 100 years, the longest duration taken (it keeps every slot a valid date)",
            job=job, option=option, value=value,
        )
    result = round(ms)
    if result == 0 and ms > 0:
        raise ConfigurationError("shorter than 1 ms", job=job, option=option, value=value)
    if result == 0 and not allow_zero:
        raise ConfigurationError("must be longer than zero", job=job, option=option, value=value)
    return result


def parse_optional_duration(
    value: object, *, job: str | None = None, option: str = "duration", allow_zero: bool = True
) -> int | None:
    """Like :func:`parse_duration`, with ``None`` meaning "not set"."""
    if value is None:
        return None
    return parse_duration(value, job=job, option=option, allow_zero=allow_zero)


def format_duration(ms: float) -> str:
    """The shortest spelling of ``ms`` that :func:`parse_duration` reads back: 90000 -> '1m30s'."""
    if ms == math.inf:
        return "forever"
    ms = int(ms)
    if ms == 0:
        return "0s"
    out = []
    for unit in ("d", "h", "m", "s", "ms"):
        size = _UNITS_MS[unit]
        if ms >= size:
            count, ms = divmod(ms, size)
            out.append(f"{count}{unit}")
    return "".join(out)
