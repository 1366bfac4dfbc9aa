"""Store calls retried with exponential backoff, for the engine and the backends alike.

The caller keeps the same token across attempts: that is what makes a repeated claim,
heartbeat or finish safe when the first one reached the store and only the answer got lost.
Pure asyncio: no Django imports.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from .redact import redact_text
from .wallclock import now_ms

__all__ = ["retry_store_call"]

logger = logging.getLogger("django_anarchon")

T = TypeVar("T")

FIRST_DELAY_S = 0.05
MAX_DELAY_S = 2.0


async def retry_store_call(
    what: object,
    call: Callable[[], Awaitable[T]],
    *,
    deadline_ms: int | None = None,
    give_up: Callable[[], bool] | None = None,
    retryable: Callable[[BaseException], bool] | None = None,
    max_delay_s: float = MAX_DELAY_S,
    log_level: int = logging.WARNING,
) -> T:
    """Await ``call()`` until it returns; re-raise its last error once the deadline passed.

    ``what`` names the call in logs (scheduler, job, slot), as ``str(what)``, formatted
    only when a line is written. ``deadline_ms`` is epoch ms on this process's clock
    (``time.time_ns``, as the engine's ``now_ms`` reads it);
    ``give_up()`` lets the caller stop early (the scheduler is stopping); an error for
    which ``retryable(exc)`` is false is raised at once (a refusal, not an outage).
    """
    delay = FIRST_DELAY_S
    failures = 0
    while True:
        try:
            return await call()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if retryable is not None and not retryable(exc):
                raise
            failures += 1
            out_of_time = (
                deadline_ms is not None
                and now_ms() + delay * 1000 > deadline_ms
            )
            if out_of_time or (give_up is not None and give_up()):
                logger.log(
                    max(log_level, logging.INFO), "%s failed %s time(s); giving up: %s",
                    what, failures, redact_text(repr(exc)),
                )
                raise
            logger.log(log_level, "%s failed (%s); retry %s in %.2fs",
                       what, redact_text(repr(exc)), failures, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, max_delay_s)
