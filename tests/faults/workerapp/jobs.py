"""The fault workers' jobs, declared from ``FAULTS_JOBS`` (JSON, written by the harness).

Each handler appends one JSON line per start (and, for long jobs, per end) to
``$FAULTS_OUT/<instance>.jsonl`` and flushes it before doing anything else: that file,
outside the store, is the only witness the checker believes. Each answer of the store to
one of this worker's claims is a line too (``claim``, the answer in ``reason``): a worker
that keeps claiming and hears back is not idle, even when it wins nothing. ``t_ms`` is this process's
``time.time()``, which libfaketime may skew; ``skew_ms`` (``FAULTS_SKEW_MS``, set by the
harness) lets the checker put it back on the true clock.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import IO, Any

from django_anarchon import JobContext, every
from django_anarchon.signals import run_claimed

OUT = Path(os.environ.get("FAULTS_OUT", os.devnull))
SKEW_MS = int(os.environ.get("FAULTS_SKEW_MS", "0"))
LEASE_STORE = os.environ.get("FAULTS_LEASE_STORE") == "1"

_lock = threading.Lock()
_sink: IO[str] | None = None


def _write(event: str, ctx: JobContext, **extra: Any) -> None:
    """Append one line and flush it: a kill -9 right after loses nothing."""
    _append(event, ctx.name, ctx.slot, ctx.instance_id, ctx.attempt, ctx.reason, **extra)


def _append(
    event: str, job: str, slot: int, instance: str, attempt: int, reason: str, **extra: Any
) -> None:
    global _sink
    line = json.dumps({
        "event": event, "job": job, "slot": slot, "instance": instance,
        "pid": os.getpid(), "attempt": attempt, "reason": reason,
        "t_ms": round(time.time() * 1000, 3), "skew_ms": SKEW_MS, **extra,
    })
    with _lock:
        if _sink is None:
            _sink = (OUT / f"{instance}.jsonl").open("a", buffering=1)
        _sink.write(line + "\n")
        _sink.flush()


async def _claimed(sender: Any, scheduler: Any, event: Any, **kwargs: Any) -> None:
    # Async, so that the signal awaits it on the loop: a sync receiver would be run through
    # a thread hop between each won claim and its start, and widen that window.
    if event.job is not None and event.slot is not None:
        _append("claim", event.job, event.slot, event.instance_id, 0, event.reason or "")


run_claimed.connect(_claimed, dispatch_uid="faults-claims")


def _handler(run_ms: int) -> Any:
    def handler(ctx: JobContext) -> None:
        _write("start", ctx)
        if run_ms:
            ctx.signal.wait(run_ms / 1000)
            _write("end", ctx, aborted=ctx.signal.reason if ctx.signal.aborted else None)
            ctx.signal.raise_if_aborted()

    return handler


def _declare(spec: dict[str, Any]) -> None:
    options: dict[str, Any] = {}
    if spec.get("offset_ms"):
        options["offset"] = spec["offset_ms"] / 1000
    if spec.get("max_late_ms") is not None:
        options["max_late"] = spec["max_late_ms"] / 1000
    if LEASE_STORE:  # options that need leases are refused by the claim-only stores
        options["overlap"] = "allow"
        if spec.get("max_attempts", 1) > 1:
            options["max_attempts"] = spec["max_attempts"]
        if spec.get("catch_up_ms"):
            options["catch_up"] = spec["catch_up_ms"] / 1000
    every(spec["every_ms"] / 1000, name=spec["name"], **options)(_handler(spec.get("run_ms", 0)))


for _spec in json.loads(os.environ.get("FAULTS_JOBS", "[]")):
    _declare(_spec)
