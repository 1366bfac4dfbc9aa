"""Two jobs every second; each run appends what it did to this instance's own file.

``overlap-buffer``: every fourth slot runs 2.5 s, so the next slot is buffered and the
one after it skipped. ``overlap-cancel``: every run waits up to 3 s for its signal, so
each is cancelled by the next slot's run.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from django_anarchon import every

OUT = Path(os.environ.get("ANARCHON_TEST_OUT", os.devnull))


def _write(ctx, *words: object) -> None:  # type: ignore[no-untyped-def]
    if OUT.name != os.devnull:
        with (OUT / f"{ctx.instance_id}.txt").open("a") as out:
            out.write(" ".join(str(w) for w in (ctx.name, ctx.slot, *words)) + "\n")


@every("1s", name="overlap-buffer", overlap="buffer_one")
def buffer_one(ctx) -> None:  # type: ignore[no-untyped-def]
    _write(ctx, "start", time.time_ns() // 1_000_000)
    time.sleep(2.5 if (ctx.slot // 1000) % 4 == 0 else 0.05)
    _write(ctx, "end", time.time_ns() // 1_000_000)


@every("1s", name="overlap-cancel", overlap="cancel_other")
def cancel_other(ctx) -> None:  # type: ignore[no-untyped-def]
    _write(ctx, "start", time.time_ns() // 1_000_000)
    aborted = ctx.signal.wait(3)
    _write(ctx, "end", time.time_ns() // 1_000_000, int(aborted), ctx.signal.reason)
