"""A job whose async handler swallows every cancellation (tests/test_worker.py).

Its own app, so that the other worker tests never run it: a worker with this job must
still exit promptly after SIGTERM.
"""

from __future__ import annotations

import asyncio
import os

from django_anarchon import every

OUT = os.environ.get("ANARCHON_TEST_OUT", os.devnull)


def note(line: str) -> None:
    with open(OUT, "a") as out:
        out.write(line + "\n")


@every("1s", name="swallow")
async def swallow(ctx) -> None:  # type: ignore[no-untyped-def]
    note(f"swallow-start {ctx.slot}")
    while True:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            note("swallow-cancelled")  # and goes on, as a buggy handler would
