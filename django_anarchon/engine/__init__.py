"""The engine: one timer, claims, runs and their records (asyncio)."""

from __future__ import annotations

from .context import JobContext
from .events import Event
from .ledger import LedgerEntry
from .operations import BackfillPlan
from .scheduler import Scheduler
from .signal import AbortSignal

__all__ = ["AbortSignal", "BackfillPlan", "Event", "JobContext", "LedgerEntry", "Scheduler"]
