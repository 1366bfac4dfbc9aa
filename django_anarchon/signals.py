"""Django signals that mirror the scheduler events, for apps without a scheduler object.

Each is sent with ``sender`` = the :class:`~django_anarchon.engine.Scheduler` class and two
keyword arguments: ``scheduler`` (the instance) and ``event`` (the frozen
:class:`~django_anarchon.engine.events.Event` payload: job, slot, scheduled_at,
instance_id, record, error, reason). Receivers run through ``asend_robust``: an exception
in a receiver is logged and never breaks a run.
"""

from __future__ import annotations

from django.dispatch import Signal

__all__ = [
    "run_buffered",
    "run_cancelled",
    "run_claimed",
    "run_failed",
    "run_interrupted",
    "run_lost",
    "run_skipped",
    "run_started",
    "run_succeeded",
    "scheduler_error",
    "slots_missed",
]

run_started = Signal()
run_succeeded = Signal()
run_failed = Signal()
run_interrupted = Signal()
run_skipped = Signal()
run_lost = Signal()
#: overlap "buffer_one"/"buffer_all": a slot waits in the store for its job's running slot.
run_buffered = Signal()
#: overlap "cancel_other": this instance's claim cancelled the run of an earlier slot.
run_cancelled = Signal()
scheduler_error = Signal()
#: The ledger: slots that nobody claimed were found and written as missed.
slots_missed = Signal()
#: Each answer of the store to a claim (``event.reason``): what metrics count as claim outcomes.
run_claimed = Signal()
