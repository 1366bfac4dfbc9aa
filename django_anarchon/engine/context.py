"""What a handler receives: the run's identity, its data and its abort signal."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..backends.base import RunReason
from .signal import AbortSignal

__all__ = ["JobContext"]


@dataclass(frozen=True)
class JobContext:
    """One attempt of one run, as the handler sees it.

    ``slot`` (epoch ms) with ``name`` identifies the run on every instance;
    ``scheduled_at`` is the same instant as an aware UTC datetime.
    """

    name: str
    slot: int
    scheduled_at: datetime
    instance_id: str
    manual: bool
    data: Any
    signal: AbortSignal
    attempt: int = 1
    reason: RunReason = "scheduled"
