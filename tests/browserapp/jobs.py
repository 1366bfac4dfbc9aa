"""Jobs like a shop's: a heartbeat every 5 s that sometimes fails, a long name, and a job
of the ``ops`` scheduler (the memory store, autostarted in the web process: it has a
ledger, so the browser test pauses it, reads its timeline and dry-runs a backfill)."""

from __future__ import annotations

import itertools

from django_anarchon import every

HEARTBEAT = "shop.heartbeat"
LONG_NAME = "reports.quarterly_revenue_reconciliation_for_every_region_and_currency"
OPS_JOB = "ops.sync"

_calls = itertools.count(1)


@every("5s", name=HEARTBEAT)
def heartbeat(ctx: object) -> None:
    """Every third beat fails, so the strip and the history have red in them."""
    if next(_calls) % 3 == 0:
        raise ConnectionError("payment gateway did not answer within 2s")


@every("1h", name=LONG_NAME)
def reconcile(ctx: object) -> None:
    """Does nothing; its name is what the admin has to lay out."""


@every("2s", name=OPS_JOB, scheduler="ops")
def sync(ctx: object) -> None:
    """Does nothing, every 2 s, in the web process."""
