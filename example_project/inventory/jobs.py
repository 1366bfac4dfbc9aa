"""Inventory jobs: an interval job, an async job, and one that sometimes fails.

Found by django-anarchon at start-up, like admin.py. Each job is named
``inventory.<function>`` unless it says otherwise.
"""

from __future__ import annotations

import asyncio
import logging
import time

from django_anarchon import every
from django_anarchon.engine import JobContext

logger = logging.getLogger(__name__)


@every("5s")
def sync_stock(ctx: JobContext) -> None:
    """Every 5 seconds, on one instance only, whichever wins the claim."""
    time.sleep(0.2)  # pretend to call a supplier's API
    logger.info("stock synced for slot %s on %s", ctx.scheduled_at.isoformat(), ctx.instance_id)


@every("7s", offset="1s")
async def refresh_prices(ctx: JobContext) -> None:
    """An async handler: it runs on the worker's event loop, not in a thread."""
    await asyncio.sleep(0.3)


@every("6s", max_attempts=2)
def import_orders(ctx: JobContext) -> None:
    """Fails on every third slot's first attempt; the retry (attempt 2) then succeeds.

    With ``max_attempts=2`` a failed attempt is tried once more, possibly on another
    instance. Deterministic on the slot so the demo's output can be explained.
    """
    if (ctx.slot // 6000) % 3 == 0 and ctx.attempt == 1:
        raise ConnectionError("the orders API timed out (this job fails now and then)")
