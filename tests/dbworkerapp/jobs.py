"""Jobs of tests/test_database_workers.py, chosen by ``ANARCHON_DBW_SCENARIO``.

* ``many``: ``ANARCHON_DBW_JOBS`` jobs (20) every 200 ms, each writing one ``Execution``.
* ``long``: one job every 2 s that runs until its signal aborts it (max_attempts 2), and
  writes an ``Execution`` when it starts and when it ends.
* ``catchup``: one job every 10 s that catches up its 3 newest missed slots of 100 s
  (``catch_up_mode="all"``); each run takes 300 ms.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
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

if SCENARIO == "catchup":

    @every("10s", name="report", max_late="500ms", catch_up="100s", catch_up_mode="all",
           catch_up_limit=3)
    def report(ctx: Any) -> None:
        record(ctx, ctx.reason)
        time.sleep(0.3)
