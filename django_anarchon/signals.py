"""Django signals that mirror the scheduler events, for apps without a scheduler object.

Each is sent with ``sender`` = the :class:`~django_anarchon.engine.Scheduler` class and two
keyword arguments: ``scheduler`` (the instance) and ``event`` (the frozen
:class:`~django_anarchon.engine.events.Event` payload: job, slot, scheduled_at,
instance_id, record, error, reason). Receivers run through ``asend_robust``: an exception
in a receiver is logged and never breaks a run.

Each signal caches its receivers per sender (``use_caching``): the scheduler asks whether
anyone listens several times per run, and Django clears the cache on every connect and
disconnect.
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

run_started = Signal(use_caching=True)
run_succeeded = Signal(use_caching=True)
run_failed = Signal(use_caching=True)
run_interrupted = Signal(use_caching=True)
run_skipped = Signal(use_caching=True)
run_lost = Signal(use_caching=True)
#: overlap "buffer_one"/"buffer_all": a slot waits in the store for its job's running slot.
run_buffered = Signal(use_caching=True)
#: overlap "cancel_other": this instance's claim cancelled the run of an earlier slot.
run_cancelled = Signal(use_caching=True)
scheduler_error = Signal(use_caching=True)
#: The ledger: slots that nobody claimed were found and written as missed.
slots_missed = Signal(use_caching=True)
#: Each answer of the store to a claim (``event.reason``): what metrics count as claim outcomes.
run_claimed = Signal(use_caching=True)
