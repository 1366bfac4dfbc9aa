"""A job: its name, schedule, handler and validated options.

Validation lives here so that every way of registering a job (decorators, the
``Scheduler`` methods, ``JOB_DEFAULTS``) gives the same error, naming the job, the
option and the bad value, at registration time.
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import time
import zoneinfo
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal, cast

from .backends.base import JobLimits, OverlapPolicy, datetime_to_ms
from .durations import format_duration, parse_duration, parse_optional_duration
from .enqueue.base import TaskTarget, target_for
from .enqueue.run import TaskBeat
from .exceptions import ConfigurationError
from .schedules import (
    FOLD_POLICIES,
    GAP_POLICIES,
    Cron,
    Every,
    FoldPolicy,
    GapPolicy,
    Once,
    Schedule,
)

JobKind = Literal["every", "cron", "once"]

#: Options every job takes.
COMMON_OPTIONS = frozenset(
    {"jitter", "max_late", "history_size", "history_ttl", "timeout", "overlap", "max_attempts",
     "catch_up", "catch_up_mode", "catch_up_limit", "data", "buffer_limit"}
)
#: Options that only make sense on a store with leases.
LEASE_OPTIONS = frozenset(
    {"overlap", "buffer_limit", "max_attempts", "catch_up", "catch_up_mode", "catch_up_limit"}
)
#: Options of one schedule type only.
KIND_OPTIONS: Mapping[str, frozenset[str]] = {
    "every": frozenset({"offset"}),
    "cron": frozenset({"timezone", "dst_gap", "dst_fold"}),
    "once": frozenset(),
}
#: Options a job on a ``once`` schedule refuses: a one-off cannot overlap itself, and has
#: only one slot to catch up.
NOT_FOR_ONCE = frozenset({"overlap", "buffer_limit", "catch_up_limit"})
CatchUpMode = Literal["latest", "all", "none"]
CATCH_UP_MODES: tuple[CatchUpMode, ...] = ("latest", "all", "none")
#: The most missed slots one start runs with ``catch_up_mode="all"``.
MAX_CATCH_UP_LIMIT = 1_000
#: What ``overlap`` accepts: what a slot does when another slot of its job is running.
OVERLAP_POLICIES: tuple[OverlapPolicy, ...] = (
    "skip", "allow", "buffer_one", "buffer_all", "cancel_other"
)
#: Bounds of ``buffer_limit`` (overlap "buffer_all"): the store holds that many slots.
MAX_BUFFER_LIMIT = 1_000

Handler = Callable[..., Any]

#: Upper bounds of the size options, documented in docs/options.md. The stores keep these
#: in integer columns and counters; past the bound every save (or claim) would fail.
MAX_HISTORY_SIZE = 1_000_000
MAX_ATTEMPTS = 1_000
#: Threads of one scheduler's pool for sync handlers: each is an OS thread.
MAX_THREADS = 1_000
#: The longest job name; the stores' job columns hold 255 characters.
MAX_NAME_LENGTH = 200
#: The longest instance id: the database backend's ``instance_id`` columns hold 255.
MAX_INSTANCE_ID_LENGTH = 255
#: One-off instants are refused outside [1970-01-01, 9000-01-01) UTC: slots are epoch
#: milliseconds, and the engine adds durations of up to 100 years to them (retention,
#: catch-up), which must stay valid dates (year 9999 at most).
MIN_INSTANT_MS = 0
MAX_INSTANT_MS = 221_845_392_000_000  # 9000-01-01T00:00:00Z


@dataclass(frozen=True)
class JobOptions:
    """Validated options of one job (durations in ms)."""

    jitter_ms: int = 0
    max_late_ms: int = 60_000
    history_size: int = 100
    history_ttl_ms: int | None = None
    timeout_ms: int | None = None
    overlap: OverlapPolicy = "skip"
    #: overlap "buffer_all": how many slots the store holds waiting, oldest first.
    buffer_limit: int = 10
    max_attempts: int = 1
    catch_up_ms: int = 0
    catch_up_mode: CatchUpMode = "latest"
    catch_up_limit: int = 10
    data: Any = None
    #: Lease options the user set to a non-default value (a backend without leases refuses them).
    lease_options_asked: frozenset[str] = field(default=frozenset())

    @property
    def keep_ms(self) -> int:
        """How long a lease store must remember a finished run."""
        return self.jitter_ms + self.max_late_ms + self.catch_up_window_ms

    @property
    def catch_up_window_ms(self) -> int:
        """How far back a start looks for missed slots (``catch_up_mode="none"``: not at all)."""
        return 0 if self.catch_up_mode == "none" else self.catch_up_ms


DEFAULTS = JobOptions()


def _positive_int(job: str, option: str, value: object, *, maximum: int, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigurationError(
            f"expected a whole number of at least {minimum}", job=job, option=option, value=value
        )
    if value < minimum:
        raise ConfigurationError(f"must be at least {minimum}", job=job, option=option, value=value)
    if value > maximum:
        raise ConfigurationError(f"must be at most {maximum:,}", job=job, option=option, value=value)
    return value


def _check_data(job: str, value: object) -> object:
    if value is None or callable(value):
        return value
    try:
        json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"must be JSON-serialisable or a callable ({exc})", job=job, option="data", value=value
        ) from None
    return value


def validate_options(
    job: str, kind: JobKind, options: Mapping[str, Any], base: JobOptions = DEFAULTS
) -> tuple[JobOptions, dict[str, Any]]:
    """Validate ``options`` over ``base``; return the job options and the schedule options.

    Schedule options (``offset``, ``timezone``, ``dst_gap``, ``dst_fold``) are returned
    apart, unparsed.
    """
    allowed = COMMON_OPTIONS | KIND_OPTIONS[kind]
    if kind == "once":
        allowed = allowed - NOT_FOR_ONCE
    for option in options:
        if option not in allowed:
            hint = ""
            for other, extra in KIND_OPTIONS.items():
                if option in extra:
                    hint = f" ({option!r} is for {other} jobs only)"
            if kind == "once" and option in NOT_FOR_ONCE:
                hint = " (a one-off job cannot overlap itself)"
            raise ConfigurationError(
                f"unknown option for {kind} jobs{hint}; known options: {', '.join(sorted(allowed))}",
                job=job, option=option, value=options[option],
            )
    values: dict[str, Any] = {}
    asked = set(base.lease_options_asked)
    if "jitter" in options:
        values["jitter_ms"] = parse_duration(options["jitter"], job=job, option="jitter")
    if "max_late" in options:
        values["max_late_ms"] = parse_duration(options["max_late"], job=job, option="max_late")
    if "history_size" in options:
        values["history_size"] = _positive_int(
            job, "history_size", options["history_size"], maximum=MAX_HISTORY_SIZE
        )
    if "history_ttl" in options:
        values["history_ttl_ms"] = parse_optional_duration(
            options["history_ttl"], job=job, option="history_ttl", allow_zero=False
        )
    if "timeout" in options:
        values["timeout_ms"] = parse_optional_duration(
            options["timeout"], job=job, option="timeout", allow_zero=False
        )
    if "overlap" in options:
        if options["overlap"] not in OVERLAP_POLICIES:
            raise ConfigurationError(
                "must be one of " + ", ".join(repr(p) for p in OVERLAP_POLICIES),
                job=job, option="overlap", value=options["overlap"],
            )
        values["overlap"] = options["overlap"]
        if options["overlap"] != DEFAULTS.overlap:
            asked.add("overlap")
    if "buffer_limit" in options:
        overlap = values.get("overlap", base.overlap)
        if overlap != "buffer_all":
            raise ConfigurationError(
                f"only applies with overlap 'buffer_all' (this job's overlap is {overlap!r})",
                job=job, option="buffer_limit", value=options["buffer_limit"],
            )
        values["buffer_limit"] = _positive_int(
            job, "buffer_limit", options["buffer_limit"], maximum=MAX_BUFFER_LIMIT
        )
        if values["buffer_limit"] != DEFAULTS.buffer_limit:
            asked.add("buffer_limit")
    if "max_attempts" in options:
        values["max_attempts"] = _positive_int(
            job, "max_attempts", options["max_attempts"], maximum=MAX_ATTEMPTS
        )
        if values["max_attempts"] != DEFAULTS.max_attempts:
            asked.add("max_attempts")
    if "catch_up" in options:
        values["catch_up_ms"] = parse_duration(options["catch_up"], job=job, option="catch_up")
        if values["catch_up_ms"] != DEFAULTS.catch_up_ms:
            asked.add("catch_up")
    if "catch_up_mode" in options:
        mode = _check_choice(job, "catch_up_mode", options["catch_up_mode"], CATCH_UP_MODES)
        values["catch_up_mode"] = mode
        if mode != DEFAULTS.catch_up_mode:
            asked.add("catch_up_mode")
    if "catch_up_limit" in options:
        values["catch_up_limit"] = _positive_int(
            job, "catch_up_limit", options["catch_up_limit"], maximum=MAX_CATCH_UP_LIMIT
        )
        asked.add("catch_up_limit")
    if "data" in options:
        values["data"] = _check_data(job, options["data"])
    schedule_options = {k: options[k] for k in KIND_OPTIONS[kind] if k in options}
    result = replace(base, **values, lease_options_asked=frozenset(asked))
    _check_catch_up(job, result, options)
    return result, schedule_options


def _check_catch_up(job: str, o: JobOptions, options: Mapping[str, Any]) -> None:
    """Refuse catch-up options that would silently do nothing."""
    if o.catch_up_mode == "all" and o.catch_up_ms == 0 and "catch_up_mode" in options:
        raise ConfigurationError(
            "needs a catch_up window (e.g. catch_up='1h'): without one nothing is caught up",
            job=job, option="catch_up_mode", value="all",
        )
    if "catch_up_limit" in options and o.catch_up_mode != "all":
        raise ConfigurationError(
            f"applies only with catch_up_mode='all' (this job's is {o.catch_up_mode!r})",
            job=job, option="catch_up_limit", value=options["catch_up_limit"],
        )


def _storable_text_problem(text: str) -> str | None:
    """Why ``text`` cannot be stored by every backend, or ``None``.

    PostgreSQL refuses NUL in text, and a lone surrogate (``"\\ud800"``) has no UTF-8 form,
    so either would fail at the first claim rather than here.
    """
    if "\x00" in text:
        return "contains a NUL character, which PostgreSQL cannot store"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid Unicode text (it has a lone surrogate and no UTF-8 form)"
    return None


def check_name(name: object) -> str:
    if not isinstance(name, str) or not name.strip():
        raise ConfigurationError("a job name must be a non-empty string", option="name", value=name)
    if len(name) > MAX_NAME_LENGTH:
        raise ConfigurationError(
            f"a job name is at most {MAX_NAME_LENGTH} characters", option="name", value=name
        )
    problem = _storable_text_problem(name)
    if problem:
        raise ConfigurationError(f"the job name {problem}", option="name", value=name)
    return name


def check_instance_id(value: object, *, option: str = "instance_id") -> str:
    """An instance id every store can hold: a non-blank string of at most 255 characters.

    The id is written into every lease and history row, so a bad one would make every
    claim fail; ``option`` names where it came from (``INSTANCE_ID``, ``--instance-id``).
    """
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError("expected a non-empty string", option=option, value=value)
    if len(value) > MAX_INSTANCE_ID_LENGTH:
        raise ConfigurationError(
            f"at most {MAX_INSTANCE_ID_LENGTH} characters (got {len(value)}), the size of the "
            "stores' instance columns",
            option=option, value=value,
        )
    problem = _storable_text_problem(value)
    if problem:
        raise ConfigurationError(f"the instance id {problem}", option=option, value=value)
    return value


def check_handler(job: str, handler: object) -> Handler:
    target = target_for(handler)
    if target is not None:
        return TaskBeat(job, target)
    if not callable(handler):
        raise ConfigurationError("the handler must be callable", job=job, option="handler", value=handler)
    return handler


def make_every(job: str, interval: object, offset: object = 0) -> Every:
    interval_ms = parse_duration(interval, job=job, option="interval", allow_zero=False)
    offset_ms = parse_duration(offset, job=job, option="offset")
    return Every(interval_ms, offset_ms)


def check_timezone(job: str, timezone: object) -> str:
    if not isinstance(timezone, str) or not timezone:
        raise ConfigurationError("expected an IANA time zone name such as 'Europe/Athens'",
                                 job=job, option="timezone", value=timezone)
    try:
        zoneinfo.ZoneInfo(timezone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ConfigurationError("unknown time zone; use an IANA name such as 'Europe/Athens'",
                                 job=job, option="timezone", value=timezone) from None
    return timezone


def _check_choice(job: str, option: str, value: object, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        listed = ", ".join(repr(c) for c in choices[:-1]) + f" or {choices[-1]!r}"
        raise ConfigurationError(f"must be {listed}", job=job, option=option, value=value)
    return value


def make_cron(
    job: str, expression: object, timezone: object, dst_gap: object = "shift",
    dst_fold: object = "first",
) -> Cron:
    tz = check_timezone(job, timezone)
    gap = _check_choice(job, "dst_gap", dst_gap, GAP_POLICIES)
    fold = _check_choice(job, "dst_fold", dst_fold, FOLD_POLICIES)
    if not isinstance(expression, str):
        raise ConfigurationError("a cron expression must be a string", job=job, option="expression",
                                 value=expression)
    try:
        return Cron(expression, tz, dst_gap=cast(GapPolicy, gap), dst_fold=cast(FoldPolicy, fold))
    except ValueError as exc:
        raise ConfigurationError(f"invalid cron expression ({exc})", job=job, option="expression",
                                 value=expression) from None


def make_once(job: str, when: object) -> Once:
    if isinstance(when, str):
        try:
            parsed = datetime.fromisoformat(when.strip().replace("Z", "+00:00"))
        except ValueError:
            raise ConfigurationError("not an ISO 8601 date-time, e.g. '2027-01-01T00:00:00+00:00'",
                                     job=job, option="when", value=when) from None
    elif isinstance(when, datetime):
        parsed = when
    else:
        raise ConfigurationError("expected an aware datetime or an ISO 8601 string",
                                 job=job, option="when", value=when)
    if parsed.tzinfo is None or parsed.tzinfo.utcoffset(parsed) is None:
        raise ConfigurationError("the instant needs a time zone (e.g. '+00:00'); a naive time is ambiguous",
                                 job=job, option="when", value=when)
    try:
        at_ms = datetime_to_ms(parsed)
    except (OverflowError, ValueError):
        at_ms = None
    if at_ms is None or not MIN_INSTANT_MS <= at_ms < MAX_INSTANT_MS:
        raise ConfigurationError("the instant must be between 1970-01-01 and 9000-01-01 (UTC)",
                                 job=job, option="when", value=when)
    return Once(at_ms)


@dataclass(frozen=True)
class Job:
    """A registered job. ``origin`` says where it was defined, for duplicate-name errors."""

    name: str
    schedule: Schedule
    handler: Handler
    options: JobOptions
    origin: str = ""
    #: The task the job enqueues once per slot instead of running a handler (then
    #: ``handler`` is the beat, ``enqueue.run.TaskBeat``); ``None`` for a plain handler.
    target: TaskTarget | None = None

    @property
    def kind(self) -> JobKind:
        return self.schedule.type

    @functools.cached_property
    def is_async(self) -> bool:
        # Cached: asked several times per run, and inspect's answer costs microseconds.
        return inspect.iscoroutinefunction(self.handler) or inspect.iscoroutinefunction(
            type(self.handler).__call__
        )

    def limits(self) -> JobLimits:
        o = self.options
        return JobLimits(
            name=self.name,
            jitter_ms=o.jitter_ms,
            max_late_ms=o.max_late_ms,
            min_gap_ms=self.schedule.min_gap_ms(),
            history_size=o.history_size,
            history_ttl_ms=o.history_ttl_ms,
        )

    def policies(self) -> str:
        """The overlap and catch-up policies that differ from the defaults, for listings.

        The DST policies are part of a cron schedule's ``describe()``.
        """
        o, parts = self.options, []
        if o.overlap != DEFAULTS.overlap and self.kind != "once":
            limit = f" ({o.buffer_limit})" if o.overlap == "buffer_all" else ""
            parts.append(f"overlap={o.overlap}{limit}")
        if o.catch_up_mode == "none":
            parts.append("catch_up_mode=none")
        elif o.catch_up_ms:
            mode = f" all ({o.catch_up_limit})" if o.catch_up_mode == "all" else ""
            parts.append(f"catch_up={format_duration(o.catch_up_ms)}{mode}")
        return ", ".join(parts)

    def is_expired(self, now_ms: int | None = None) -> bool:
        """A one-off whose instant is past even counting ``catch_up``: it will never run."""
        if not isinstance(self.schedule, Once):
            return False
        now = int(time.time() * 1000) if now_ms is None else now_ms
        return self.schedule.at_ms + self.options.catch_up_window_ms + self.options.max_late_ms < now


def build_job(
    name: object,
    kind: JobKind,
    spec: object,
    handler: object,
    options: Mapping[str, Any],
    *,
    defaults: JobOptions = DEFAULTS,
    default_timezone: str = "UTC",
    origin: str = "",
) -> Job:
    """Validate everything about one job and return it; ``spec`` is interval, expression or instant."""
    job = check_name(name)
    fn = check_handler(job, handler)
    opts, schedule_options = validate_options(job, kind, options, defaults)
    schedule: Schedule
    if kind == "every":
        schedule = make_every(job, spec, schedule_options.get("offset", 0))
    elif kind == "cron":
        schedule = make_cron(
            job, spec, schedule_options.get("timezone", default_timezone),
            schedule_options.get("dst_gap", "shift"), schedule_options.get("dst_fold", "first"),
        )
    else:
        schedule = make_once(job, spec)
    target = None
    if isinstance(fn, TaskBeat):
        target, fn.keep = fn.target, opts.history_size
    return Job(name=job, schedule=schedule, handler=fn, options=opts, origin=origin, target=target)


def check_dedupe_window(job: Job, dedupe_window_ms: float, backend_name: str) -> None:
    """Refuse a job that an instance could claim after the store forgot the claim."""
    o = job.options
    if math.isfinite(dedupe_window_ms) and o.jitter_ms + o.max_late_ms >= dedupe_window_ms:
        raise ConfigurationError(
            f"jitter + max_late ({o.jitter_ms + o.max_late_ms} ms) must be shorter than the "
            f"{backend_name} backend's dedupe window ({int(dedupe_window_ms)} ms), or a late "
            "instance could run the slot again",
            job=job.name, option="max_late", value=o.max_late_ms,
        )

