"""Prometheus metrics fed by a scheduler's events (extra ``[prometheus]``).

``register(scheduler)`` subscribes to the scheduler's events and counts them in metrics
shared by every scheduler registered on the same registry. Labels are bounded: the
scheduler alias, the job name and a few fixed words (status, reason, outcome,
operation); never a slot, a token or an instance id (Prometheus adds the scrape target).

Lateness is measured on this process's clock (the handler's start minus its slot): an
observation, never a decision, so it does not need the store's clock.

``anarchon_job_paused`` is not an event: it is read from the store (``apauses()``, one
call per scheduler) by :func:`watch_pauses`, which the worker runs every
``PAUSE_REFRESH_S`` when it serves metrics; a process that never refreshes it shows no
series rather than a 0 it does not know.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from django_anarchon.redact import redact_text

if TYPE_CHECKING:
    from django_anarchon.engine import Scheduler
    from django_anarchon.engine.events import Event

__all__ = ["METRIC_NAMES", "Metrics", "Registration", "missed_count", "refresh_pauses", "register",
           "watch_pauses"]

logger = logging.getLogger("django_anarchon")

#: Start lateness buckets, in seconds: a few milliseconds (on time) to minutes (a backlog).
LATENESS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)

#: The words each bounded label may take; anything else is counted as ``other``.
CLAIM_OUTCOMES = frozenset(
    {"won", "lost", "running", "done", "early", "late", "overlap", "buffered", "none", "error"}
)
SKIP_REASONS = frozenset({"late", "overlap", "paused", "dst"})
#: The operations of ``error`` events; a task's label (it names a slot) becomes ``other``.
OPERATIONS = frozenset({"claim", "record_claim", "finish", "release", "save_result", "schedule"})
STATUSES = {"success": "success", "failure": "failed", "interrupted": "interrupted"}
#: How often the worker reads the pauses, and how long one read may take.
PAUSE_REFRESH_S = 10.0
PAUSE_READ_TIMEOUT_S = 5.0
#: A ``missed`` event's reason: "3 slot(s) to 2026-11-29T12:10:00+00:00" (engine/ledger.py).
_MISSED_COUNT = re.compile(r"(\d+) slot\(s\) to ")

#: Every metric name the collector exports, as a scrape shows it (counters with ``_total``).
METRIC_NAMES: dict[str, str] = {
    "anarchon_runs_total": "counter",
    "anarchon_run_start_lateness_seconds": "histogram",
    "anarchon_skips_total": "counter",
    "anarchon_takeovers_total": "counter",
    "anarchon_lost_leases_total": "counter",
    "anarchon_cancels_total": "counter",
    "anarchon_claims_total": "counter",
    "anarchon_store_errors_total": "counter",
    "anarchon_running_runs": "gauge",
    "anarchon_last_success_timestamp_seconds": "gauge",
    "anarchon_job_interval_seconds": "gauge",
    "anarchon_job_paused": "gauge",
    "anarchon_slots_missed_total": "counter",
}


class Metrics:
    """The metric objects of one registry (created once, whatever registers on it)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        job = ["scheduler", "job"]
        self.runs = Counter(
            "anarchon_runs", "Attempts that ended, by status (success, failed, interrupted).",
            [*job, "status"], registry=registry,
        )
        self.lateness = Histogram(
            "anarchon_run_start_lateness_seconds",
            "Handler start minus the slot it runs (scheduled and catch-up runs).",
            job, buckets=LATENESS_BUCKETS, registry=registry,
        )
        self.skips = Counter(
            "anarchon_skips", "Slots skipped, by reason (late, overlap, ...).",
            [*job, "reason"], registry=registry,
        )
        self.takeovers = Counter(
            "anarchon_takeovers", "Runs this process took over after another's lease lapsed.",
            job, registry=registry,
        )
        self.lost = Counter(
            "anarchon_lost_leases", "Runs of this process taken over by another (lease lost).",
            job, registry=registry,
        )
        self.cancels = Counter(
            "anarchon_cancels", "Runs of earlier slots this process's claims cancelled "
            "(overlap cancel_other).", job, registry=registry,
        )
        self.claims = Counter(
            "anarchon_claims", "The store's answers to claims, by outcome.",
            [*job, "outcome"], registry=registry,
        )
        self.store_errors = Counter(
            "anarchon_store_errors", "Store calls that failed after their retries, by operation.",
            ["scheduler", "operation"], registry=registry,
        )
        self.running = Gauge(
            "anarchon_running_runs", "Runs in progress in this process.",
            job, registry=registry, multiprocess_mode="livesum",
        )
        self.last_success = Gauge(
            "anarchon_last_success_timestamp_seconds",
            "When the last successful run seen by this process ended (unix time).",
            job, registry=registry, multiprocess_mode="max",
        )
        self.interval = Gauge(
            "anarchon_job_interval_seconds",
            "The shortest gap between two slots of the job (for alerts counted in intervals).",
            job, registry=registry, multiprocess_mode="max",
        )
        self.paused = Gauge(
            "anarchon_job_paused", "1 while the job is paused (read from the store), else 0.",
            job, registry=registry, multiprocess_mode="max",
        )
        self.missed = Counter(
            "anarchon_slots_missed", "Slots nobody claimed, found by this process's look back "
            "and written to the ledger as missed.", job, registry=registry,
        )


_METRICS: dict[int, tuple[CollectorRegistry, Metrics]] = {}


def metrics_for(registry: CollectorRegistry) -> Metrics:
    entry = _METRICS.get(id(registry))
    if entry is None or entry[0] is not registry:
        entry = (registry, Metrics(registry))
        _METRICS[id(registry)] = entry
    return entry[1]


@dataclass
class Registration:
    """What ``register()`` subscribed; ``unregister()`` takes it back."""

    scheduler: Scheduler
    metrics: Metrics
    callbacks: list[tuple[str, Any]] = field(default_factory=list)

    def unregister(self) -> None:
        for name, callback in self.callbacks:
            self.scheduler.off(name, callback)
        self.callbacks.clear()


def register(scheduler: Scheduler, registry: CollectorRegistry | None = None) -> Registration:
    """Count ``scheduler``'s events in ``registry`` (default: prometheus_client's global one)."""
    metrics = metrics_for(REGISTRY if registry is None else registry)
    name = scheduler.name
    for info in scheduler.jobs():  # every job's series exist from the start (0, not absent)
        metrics.running.labels(name, info.name).set(0)
        for status in STATUSES.values():
            metrics.runs.labels(name, info.name, status)
        gap = scheduler.get_job(info.name).schedule.min_gap_ms()
        if gap != float("inf"):
            metrics.interval.labels(name, info.name).set(gap / 1000)

    def started(event: Event) -> None:
        record = event.record
        assert record is not None and event.job is not None
        metrics.running.labels(name, event.job).inc()
        if record.reason == "takeover":
            metrics.takeovers.labels(name, event.job).inc()
        if not record.manual:
            late = (record.started_at - record.scheduled_at).total_seconds()
            metrics.lateness.labels(name, event.job).observe(max(late, 0.0))

    def ended(event: Event) -> None:
        record = event.record
        assert record is not None and event.job is not None
        metrics.running.labels(name, event.job).dec()
        metrics.runs.labels(name, event.job, STATUSES[event.name]).inc()
        if event.name == "success":
            finished = record.finished_at or record.started_at
            metrics.last_success.labels(name, event.job).set(finished.timestamp())

    def skipped(event: Event) -> None:
        reason = event.reason if event.reason in SKIP_REASONS else "other"
        metrics.skips.labels(name, event.job or "", reason).inc()

    def lost(event: Event) -> None:
        metrics.lost.labels(name, event.job or "").inc()

    def cancelled(event: Event) -> None:
        metrics.cancels.labels(name, event.job or "").inc()

    def claimed(event: Event) -> None:
        outcome = event.reason if event.reason in CLAIM_OUTCOMES else "other"
        metrics.claims.labels(name, event.job or "", outcome).inc()

    def missed(event: Event) -> None:
        metrics.missed.labels(name, event.job or "").inc(missed_count(event.reason))

    def errored(event: Event) -> None:
        operation = event.reason if event.reason in OPERATIONS else "other"
        metrics.store_errors.labels(name, operation).inc()
        if operation == "claim" and event.job is not None:
            metrics.claims.labels(name, event.job, "error").inc()

    registration = Registration(scheduler, metrics)
    subscriptions: list[tuple[str, Any]] = [
        ("start", started), ("success", ended), ("failure", ended), ("interrupted", ended),
        ("skip", skipped), ("lost", lost), ("cancel", cancelled),
        ("claim", claimed), ("error", errored), ("missed", missed),
    ]
    for event_name, callback in subscriptions:
        scheduler.on(event_name, callback)
        registration.callbacks.append((event_name, callback))
    return registration


def missed_count(reason: str | None) -> int:
    """How many slots a ``missed`` event stands for (its reason says; 1 if it does not)."""
    found = _MISSED_COUNT.match(reason or "")
    return int(found[1]) if found else 1


async def refresh_pauses(scheduler: Scheduler, registry: CollectorRegistry | None = None) -> None:
    """Set ``anarchon_job_paused`` of each of ``scheduler``'s jobs from one read of its store.

    Raises what the read raises (a store that is down); the values stay as they were.
    """
    metrics = metrics_for(REGISTRY if registry is None else registry)
    async with asyncio.timeout(PAUSE_READ_TIMEOUT_S):
        pauses = await scheduler.apauses()
    for info in scheduler.jobs():
        metrics.paused.labels(scheduler.name, info.name).set(1 if info.name in pauses else 0)


async def watch_pauses(
    schedulers: Sequence[Scheduler], registry: CollectorRegistry | None = None,
    every: float = PAUSE_REFRESH_S,
) -> None:
    """:func:`refresh_pauses` for each scheduler now and every ``every`` seconds, until
    cancelled; a failing read is logged once per streak of failures."""
    failing: set[str] = set()
    while True:
        for scheduler in schedulers:
            try:
                await refresh_pauses(scheduler, registry)
            except Exception as exc:
                if scheduler.name not in failing:
                    first = (str(exc).strip().splitlines() or [""])[0]
                    logger.warning("scheduler %s: reading the pauses for anarchon_job_paused "
                                   "failed: %s: %s", scheduler.name, type(exc).__name__,
                                   redact_text(first))
                failing.add(scheduler.name)
            else:
                failing.discard(scheduler.name)
        await asyncio.sleep(every)
