"""Ten jobs every 200 ms; each run appends "job slot" to this instance's own file."""

from __future__ import annotations

import os
from pathlib import Path

from django_anarchon import JobContext, every

OUT = Path(os.environ.get("ANARCHON_TEST_OUT", os.devnull))
PREFIX = os.environ.get("ANARCHON_TEST_JOB_PREFIX", "broker-count")


def _make(n: int) -> None:
    def handler(ctx: JobContext) -> None:
        if OUT.name != os.devnull:
            with (OUT / f"{ctx.instance_id}.txt").open("a") as out:
                out.write(f"{ctx.name} {ctx.slot}\n")

    every("200ms", name=f"{PREFIX}.{n}")(handler)


for _n in range(10):
    _make(_n)
