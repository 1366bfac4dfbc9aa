"""The engine's tracing hooks: no-ops, unless an integration installs its own.

``Scheduler.tracing`` is a ``Tracing``; ``django_anarchon.contrib.otel.instrument()``
replaces it with one that makes OpenTelemetry spans. The engine calls it at three places:

* ``attempt(attempt)`` encloses ``Runner.run``: the span of the attempt is current while
  it runs, so the heartbeat task, an async handler's task and the store calls inherit it;
* ``thread(fn)`` wraps what the runner hands the handler pool, so that a sync handler
  runs under the same trace context (pool threads do not inherit the loop's context);
* ``store(operation, awaitable, ...)`` wraps one try of one store call.

The defaults return what they are given, so an uninstrumented scheduler pays nothing.
Pure: no OpenTelemetry import here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, ParamSpec, TypeVar

if TYPE_CHECKING:
    from ..backends.base import RunRecord
    from .runner import Attempt

__all__ = ["NO_TRACING", "AttemptTrace", "Tracing"]

P = ParamSpec("P")
T = TypeVar("T")


class AttemptTrace:
    """What the runner tells the trace of one attempt when it has its record."""

    def end(self, record: RunRecord, exception: BaseException | None) -> None:
        """The attempt ended with ``record``; ``exception`` is what the handler raised, if any."""


_NO_TRACE = AttemptTrace()


class Tracing:
    """No tracing: every hook returns what it is given."""

    def attempt(self, attempt: Attempt) -> AbstractContextManager[AttemptTrace]:
        return contextlib.nullcontext(_NO_TRACE)

    def thread(self, fn: Callable[P, T]) -> Callable[P, T]:
        return fn

    def store(
        self,
        operation: str,
        awaitable: Awaitable[T],
        *,
        job: str | None = None,
        slot: int | None = None,
        token: str | None = None,
        tokens: Sequence[str] | None = None,
        with_record: bool = False,
    ) -> Awaitable[T]:
        """One try of a store call. ``token``/``tokens``: the claims it makes (claim calls);
        ``with_record``: a finish that writes the attempt's history record too (``finish_many``).
        """
        return awaitable


NO_TRACING = Tracing()
