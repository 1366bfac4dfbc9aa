"""Imported at start-up by the fault runs' skewed workers (``tests/faults/harness.py``).

Under libfaketime with ``FAKETIME_DONT_FAKE_MONOTONIC=1`` (the workers' monotonic clock
stays true; faking it makes every timed thread wait hang), libfaketime's
``clock_nanosleep`` fails, so every ``time.sleep()`` raises ``OSError(EINVAL)``: a skewed
database worker's store retry could not back off, and after a server restart it could
not reconnect (a short run failed "idle"). A timed ``Event`` wait sleeps as long, and
works there. Nothing of this runs outside those workers.
"""

from __future__ import annotations

import threading
import time


def _sleep(seconds: float) -> None:
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    threading.Event().wait(seconds)


time.sleep = _sleep
