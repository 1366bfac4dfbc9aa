"""Jobs of the worker-command tests; each appends a line to $ANARCHON_TEST_OUT when it runs."""

from __future__ import annotations

import os
import time

from django_anarchon import every

OUT = os.environ.get("ANARCHON_TEST_OUT", os.devnull)


def note(line: str) -> None:
    with open(OUT, "a") as out:
        out.write(line + "\n")


@every("300ms", name="tick")
def tick(ctx) -> None:  # type: ignore[no-untyped-def]
    note(f"tick {ctx.slot} {ctx.instance_id}")


@every("1s", name="long")
def long_job(ctx) -> None:  # type: ignore[no-untyped-def]
    """Runs until the signal aborts it; later slots are skipped as overlaps meanwhile."""
    note(f"long-start {ctx.slot}")
    ctx.signal.wait(60)
    note(f"long-end {ctx.signal.reason}")
    ctx.signal.raise_if_aborted()


@every("1s", name="stubborn")
def stubborn(ctx) -> None:  # type: ignore[no-untyped-def]
    """Ignores its signal: a graceful stop can only record it interrupted after the grace."""
    note(f"stubborn-start {ctx.slot}")
    time.sleep(30)
