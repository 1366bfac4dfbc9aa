"""Jobs of tests/test_database_workers.py, chosen by ``ANARCHON_DBW_SCENARIO``.

* ``many``: ``ANARCHON_DBW_JOBS`` jobs (20) every 200 ms, each writing one ``Execution``.
* ``long``: one job every 2 s that runs until its signal aborts it (max_attempts 2), and
  writes an ``Execution`` when it starts and when it ends.
* ``catchup``: one job every 10 s that catches up its 3 newest missed slots of 100 s
  (``catch_up_mode="all"``); each run takes 300 ms.
* ``ledger``: the slot ledger's fates (tests/test_ledger_workers.py): ``ledger-overlap``
  every second runs 1.4 s (every other slot is skipped, overlap); ``ledger-late`` every
  second with ``max_late`` 1 ms and ``jitter`` 300 ms (most claims are late); ``ledger-pulse`` every 200 ms (the
  job the test pauses); ``ledger-backfill`` every minute (the job it backfills).
* ``tasks``: one job every 2 s that enqueues ``tasks.beat_task`` (max_attempts 3). With
  ``ANARCHON_DBW_PAUSE`` = ``enqueue`` (before the enqueue) or ``enqueued`` (after it, before
  the run's finish), the first attempt 1 to get there in any process writes
  ``$ANARCHON_DBW_PAUSE_DIR/paused`` (its pid, job and slot) and blocks until the test
  kills it; ``claimed`` pauses earlier, in the run's data provider: the slot is won, the
  beat has not started.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from django_anarchon import every

from .models import Execution

SCENARIO = os.environ.get("ANARCHON_DBW_SCENARIO", "")


def record(ctx: Any, note: str = "") -> None:
    Execution._default_manager.create(
        job=ctx.name, slot=ctx.slot, instance_id=ctx.instance_id, attempt=ctx.attempt, note=note
    )


def _tick() -> Callable[[Any], None]:
    def tick(ctx: Any) -> None:
        record(ctx)

    return tick


if SCENARIO == "many":
    for i in range(int(os.environ.get("ANARCHON_DBW_JOBS", "20"))):
        every("200ms", name=f"tick-{i:02d}", overlap="allow")(_tick())

if SCENARIO == "long":

    @every("2s", name="long", max_attempts=2)
    def long_job(ctx: Any) -> None:
        record(ctx, "start")
        ctx.signal.wait(60)
        record(ctx, f"end {ctx.signal.reason}")
        ctx.signal.raise_if_aborted()

if SCENARIO == "ledger":

    @every("1s", name="ledger-overlap", max_late="500ms")
    def ledger_overlap(ctx: Any) -> None:
        record(ctx, ctx.reason)
        time.sleep(1.4)

    # Each worker waits up to 300 ms (its jitter) before it claims, and a claim more than
    # 1 ms after the slot is late: nearly every slot is skipped late, whatever the speed
    # of the claim path (with max_late alone, claims got within 1 ms of the slot and a
    # CI run saw no late slot at all).
    @every("1s", name="ledger-late", max_late="1ms", jitter="300ms", overlap="allow")
    def ledger_late(ctx: Any) -> None:
        record(ctx, ctx.reason)

    @every("200ms", name="ledger-pulse", max_late="500ms", overlap="allow")
    def ledger_pulse(ctx: Any) -> None:
        record(ctx, ctx.reason)

    @every("1m", name="ledger-backfill", max_late="500ms")
    def ledger_backfill(ctx: Any) -> None:
        record(ctx, ctx.reason)
        time.sleep(0.1)

if SCENARIO == "catchup":

    @every("10s", name="report", max_late="500ms", catch_up="100s", catch_up_mode="all",
           catch_up_limit=3)
    def report(ctx: Any) -> None:
        record(ctx, ctx.reason)
        time.sleep(0.3)


def _pause(point: str, job: str, slot: int, kwargs: Mapping[str, Any]) -> None:
    """Block here for good, once per test, if the test asked for ``point`` (see above)."""
    if os.environ.get("ANARCHON_DBW_PAUSE") != point or kwargs.get("attempt") != 1:
        return
    try:
        fd = os.open(Path(os.environ["ANARCHON_DBW_PAUSE_DIR"]) / "paused",
                     os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return  # another process paused already: one kill per test
    os.write(fd, f"{os.getpid()} {job} {slot}".encode())
    os.close(fd)
    while True:  # until the test's kill -9
        time.sleep(0.05)


def claimed_pause(ctx: Any) -> None:
    """The beat jobs' data provider: the pause point ``claimed`` (won, the beat not started)."""
    _pause("claimed", ctx.name, ctx.slot, {"attempt": ctx.attempt})


class PausingTarget:
    """The real django.tasks target, with the test's pause points around its enqueue."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.kind = inner.kind
        self.idempotent = getattr(inner, "idempotent", False)

    def describe(self) -> str:
        return str(self.inner.describe())

    def function(self) -> Callable[..., Any]:
        return self.inner.function()  # type: ignore[no-any-return]

    def find(self, job: str, slot: int) -> str | None:
        return self.inner.find(job, slot)  # type: ignore[no-any-return]

    def database_alias(self) -> str | None:
        return self.inner.database_alias()  # type: ignore[no-any-return]

    def enqueue(self, job: str, slot: int, kwargs: Mapping[str, Any]) -> str:
        _pause("enqueue", job, slot, kwargs)
        task_id = str(self.inner.enqueue(job, slot, kwargs))
        _pause("enqueued", job, slot, kwargs)
        return task_id


if SCENARIO == "tasks":
    from django_anarchon.enqueue.tasks import DjangoTaskTarget

    from .tasks import beat_task

    every("2s", name="beat", max_attempts=3, data=claimed_pause)(
        PausingTarget(DjangoTaskTarget(beat_task))
    )
