"""Scheduler events: ``on()``/``off()`` callbacks and the Django signals that mirror them.

A callback is user code next to the run, so nothing it does may break the run: its
exceptions are logged on the ``django_anarchon`` logger and swallowed.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, Literal

from django.dispatch import Signal

from .. import signals
from ..backends.base import RunRecord, ms_to_datetime
from ..logtime import iso

__all__ = ["EVENTS", "Event", "EventName", "EventRegistry"]

logger = logging.getLogger("django_anarchon")

EventName = Literal[
    "start", "success", "failure", "interrupted", "skip", "lost", "error", "claim", "buffer",
    "cancel", "missed",
]
EVENTS: tuple[str, ...] = (
    "start", "success", "failure", "interrupted", "skip", "lost", "error", "claim", "buffer",
    "cancel", "missed",
)

_SIGNALS: dict[str, Signal] = {
    "start": signals.run_started,
    "success": signals.run_succeeded,
    "failure": signals.run_failed,
    "interrupted": signals.run_interrupted,
    "skip": signals.run_skipped,
    "lost": signals.run_lost,
    "error": signals.scheduler_error,
    "claim": signals.run_claimed,
    "buffer": signals.run_buffered,
    "cancel": signals.run_cancelled,
    "missed": signals.slots_missed,
}

Callback = Callable[["Event"], Any]


@dataclass(frozen=True)
class Event:
    """The payload of every event. ``job``/``slot`` are ``None`` for a scheduler-wide error.

    ``record`` is the attempt (``status == "running"`` on ``start``); ``error`` the error
    text; ``reason`` why (a skip's ``late``/``overlap``, a run's ``takeover``/``stop``...).
    A ``claim`` event's ``reason`` is the store's answer: ``won``, ``lost`` (a claim-only
    store's no), ``running``, ``done``, ``early``, ``late``, ``overlap``, ``buffered``, or ``error``.
    ``missed``: slots nobody claimed were written to the ledger, from ``slot`` on (``reason``
    says how many, to when); a ``skip``'s reason ``paused``: the job is paused.
    ``buffer``: the slot waits in the store for the run of another slot (``reason`` says
    which); ``cancel``: ``slot`` is the run this instance's claim cancelled.
    """

    name: EventName
    scheduler: str
    instance_id: str
    job: str | None = None
    slot: int | None = None
    record: RunRecord | None = None
    error: str | None = None
    reason: str | None = None

    @property
    def scheduled_at(self) -> datetime | None:
        return None if self.slot is None else ms_to_datetime(self.slot)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["scheduled_at"] = None if self.slot is None else self.scheduled_at.isoformat()  # type: ignore[union-attr]
        data["record"] = None if self.record is None else self.record.to_dict()
        return data


def check_event(name: str) -> EventName:
    if name not in EVENTS:
        raise ValueError(f"unknown event {name!r}; known events: {', '.join(EVENTS)}")
    return name  # type: ignore[return-value]


class EventRegistry:
    """Callbacks per event name, called in registration order."""

    def __init__(self) -> None:
        self._callbacks: dict[str, list[Callback]] = {name: [] for name in EVENTS}

    def on(self, name: str, callback: Callback) -> None:
        self._callbacks[check_event(name)].append(callback)

    def off(self, name: str, callback: Callback) -> None:
        """Remove ``callback``; removing one that is not there is not an error."""
        callbacks = self._callbacks[check_event(name)]
        if callback in callbacks:
            callbacks.remove(callback)

    def wanted(self, name: str) -> bool:
        """Whether an event of ``name`` would reach anyone: a callback, or a receiver of
        its signal. Asked before an event is built: a run emits several, and in a burst
        of 1,000 runs with nobody listening, building them and asking the signal for its
        receivers (per sender, through a weak dictionary) was a tenth of a worker's time."""
        return bool(self._callbacks[name]) or bool(_SIGNALS[name].receivers)

    async def emit(self, event: Event, sender: type, scheduler: object) -> None:
        """Call every callback (awaiting async ones), then send the Django signal."""
        for callback in list(self._callbacks[event.name]):
            try:
                result = callback(event)
                if inspect.isawaitable(result):
                    await _awaited(result)
            except Exception:
                logger.exception(
                    "scheduler %s: %s callback %r raised (job %s, slot %s)",
                    event.scheduler,
                    event.name,
                    callback,
                    event.job,
                    iso(event.slot),
                )
        signal = _SIGNALS[event.name]
        if not signal.has_listeners(sender):
            return
        try:
            responses = await signal.asend_robust(sender, scheduler=scheduler, event=event)
        except Exception:
            logger.exception(
                "scheduler %s: sending the %s signal failed", event.scheduler, event.name
            )
            return
        for receiver, response in responses:
            if isinstance(response, Exception):
                logger.error(
                    "scheduler %s: %s signal receiver %r raised %r (job %s, slot %s)",
                    event.scheduler,
                    event.name,
                    receiver,
                    response,
                    event.job,
                    iso(event.slot),
                    exc_info=response,
                )


async def _awaited(value: Awaitable[Any]) -> Any:
    return await value
