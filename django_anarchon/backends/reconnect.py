"""What the push-channel listeners (``wakeups()``) share: their reconnection pauses and
a one-line reason for the log."""

from __future__ import annotations

import asyncio

__all__ = ["RECONNECT_MAX_S", "RECONNECT_MIN_S", "Backoff", "reason"]

RECONNECT_MIN_S = 0.1
RECONNECT_MAX_S = 5.0


class Backoff:
    """Pauses between reconnections, doubling from the first to the last; ``reset()`` once
    connected, so the next drop starts from the first again."""

    def __init__(self) -> None:
        self.delay = RECONNECT_MIN_S

    def reset(self) -> None:
        self.delay = RECONNECT_MIN_S

    async def pause(self) -> None:
        await asyncio.sleep(self.delay)
        self.delay = min(self.delay * 2, RECONNECT_MAX_S)


def reason(exc: BaseException) -> str:
    """The first line of the error, or its class when it says nothing."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    return text or type(exc).__name__
