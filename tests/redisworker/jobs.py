"""Ten jobs every 200 ms; each run appends "job slot" to this instance's own file.

On ``lease`` the jobs allow overlap: under CPU contention a run can still be finishing
when the next slot is due, and a skipped overlap is not what the count is about. They
also have a ``jitter``: on a lease store the instance that won a job's last slot claims
its next one first (docs/concepts.md#claims), so without it the first worker up would
win every slot, and the count would not be of several winners.
"""

from __future__ import annotations

import os
from pathlib import Path

from django_anarchon import every

OUT = Path(os.environ.get("ANARCHON_TEST_OUT", os.devnull))
OPTIONS = (
    {"overlap": "allow", "jitter": "100ms"}
    if os.environ.get("ANARCHON_REDIS_STRATEGY") == "lease"
    else {}
)


def _make(n: int) -> None:
    def handler(ctx) -> None:  # type: ignore[no-untyped-def]
        if OUT.name != os.devnull:
            with (OUT / f"{ctx.instance_id}.txt").open("a") as out:
                out.write(f"{ctx.name} {ctx.slot}\n")

    every("200ms", name=f"redis-count-{n}", **OPTIONS)(handler)


for _n in range(10):
    _make(_n)
