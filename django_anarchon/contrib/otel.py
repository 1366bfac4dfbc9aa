"""OpenTelemetry traces of a scheduler's attempts (extra ``[otel]``).

``instrument(scheduler)`` installs the scheduler's tracing hooks (``engine/tracing.py``):

* one span per attempt, ``run <job>`` (INTERNAL), current while the attempt runs, so the
  handler's own spans (sync or async) nest under it;
* one CLIENT span per try of a store call, ``<operation> <job>``: heartbeat, finish,
  release, save_result as children of the attempt's span (on a store with
  ``runs.finish_many`` the finish writes the history record too, and says so with
  ``anarchon.with_record``: there is no ``save_result`` span then);
* the claim that won the attempt (``claim``, and ``record_claim`` or ``record_manual_run``)
  as the attempt span's first children. The attempt exists only once its claim won, so
  these spans are recorded when the answer comes and written with their own times, and
  the attempt's span starts when its winning claim was sent. A claim answered otherwise
  (lost, running, late...) or failed is a span of its own, without a parent; a
  ``claim_many`` batch is one span of its own too, and each attempt it won links to it.

The spans go to the global tracer provider (or the one given): configure the
OpenTelemetry SDK as usual. Nothing here is a secret: no token, no store URL, no
run data; error texts go through :func:`~django_anarchon.redact.redact_text`.

``inject_context()`` / ``extract_context()`` carry the current trace into an enqueued task
(W3C ``traceparent``, through the configured propagator). Without OpenTelemetry
installed this module imports, ``inject_context()`` returns ``{}`` and
``extract_context()`` ``None``; only ``instrument()`` needs the extra.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
import traceback
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from ..backends.base import ClaimOutcome, RunRecord
from ..engine.tracing import AttemptTrace, Tracing
from ..logtime import iso
from ..redact import redact_text

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.trace import Link, SpanKind, Status, StatusCode
except ImportError:  # pragma: no cover - exercised in a subprocess by tests/test_otel.py
    HAVE_OTEL = False
else:
    HAVE_OTEL = True

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, SpanContext, Tracer, TracerProvider
    from opentelemetry.util.types import AttributeValue

    from ..engine import Scheduler
    from ..engine.runner import Attempt

__all__ = ["HAVE_OTEL", "Instrumentation", "extract_context", "inject_context", "instrument"]

P = ParamSpec("P")
T = TypeVar("T")

TRACER_NAME = "django_anarchon"
#: Store calls that make a claim: their spans wait for the attempt they won.
CLAIM_CALLS = frozenset({"claim", "record_claim", "record_manual_run"})
#: Most won claims kept waiting for their attempt; past it the oldest are written alone.
MAX_PENDING = 10_000
#: Most characters of an error in a status description or an exception event.
MAX_ERROR_CHARS = 4000


def inject_context() -> dict[str, str]:
    """The current trace context as a carrier (``{"traceparent": ...}``) for a task's headers.

    Empty without OpenTelemetry, or when no span is current (or it is not sampled).
    """
    carrier: dict[str, str] = {}
    if HAVE_OTEL:
        propagate.inject(carrier)
    return carrier


def extract_context(carrier: Mapping[str, str] | None) -> Context | None:
    """The context a carrier from :func:`inject_context` describes; ``None`` without OpenTelemetry.

    Start the task's span in it (``tracer.start_as_current_span(name, context=...)``),
    or attach it (``opentelemetry.context.attach``) around the task's work.
    """
    if not HAVE_OTEL:
        return None
    return propagate.extract(dict(carrier or {}))


@dataclass
class Instrumentation:
    """What ``instrument()`` installed; ``uninstrument()`` puts the previous hooks back."""

    scheduler: Scheduler
    tracing: Tracing
    previous: Tracing

    def uninstrument(self) -> None:
        if self.scheduler.tracing is self.tracing:
            self.scheduler.tracing = self.previous


def instrument(scheduler: Scheduler, tracer_provider: TracerProvider | None = None) -> Instrumentation:
    """Trace ``scheduler``'s attempts and store calls (default: the global tracer provider)."""
    if not HAVE_OTEL:
        raise ImportError(
            "django_anarchon.contrib.otel.instrument() needs opentelemetry-api: "
            "pip install 'django-anarchon[otel]'"
        )
    tracer = trace.get_tracer(TRACER_NAME, _version(), tracer_provider=tracer_provider)
    tracing = OtelTracing(scheduler, tracer)
    previous, scheduler.tracing = scheduler.tracing, tracing
    return Instrumentation(scheduler, tracing, previous)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("django-anarchon")
    except PackageNotFoundError:  # pragma: no cover - a checkout that is not installed
        return "0"


# -- spans ---------------------------------------------------------------------------------


@dataclass
class _Call:
    """A store call recorded for later: a claim whose attempt does not exist yet."""

    name: str
    attributes: dict[str, AttributeValue]
    parent: Context
    start: int
    end: int = 0
    error: BaseException | None = None
    #: A ``claim_many`` batch: the attempt links to its span instead.
    link: SpanContext | None = None


def _error_type(exc: BaseException) -> str:
    kind = type(exc)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def _record_error(span: Span, exc: BaseException) -> None:
    """ERROR status and a semantic-conventions ``exception`` event, with secrets masked."""
    message = redact_text(str(exc))[:MAX_ERROR_CHARS]
    stack = redact_text("".join(traceback.format_exception(exc)))[-MAX_ERROR_CHARS:]
    span.set_attribute("error.type", _error_type(exc))
    span.add_event("exception", {
        "exception.type": _error_type(exc),
        "exception.message": message,
        "exception.stacktrace": stack,
    })
    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {message}"[:MAX_ERROR_CHARS]))


def _outcome(operation: str, result: object) -> str | None:
    if isinstance(result, ClaimOutcome):
        return result.kind
    if isinstance(result, bool):
        if operation == "claim":
            return "won" if result else "lost"
        return "accepted" if result else "refused"
    return None


def _won(result: object) -> bool:
    return result is True or (isinstance(result, ClaimOutcome) and result.kind == "won")


class _OtelAttemptTrace(AttemptTrace):
    def __init__(self, span: Span, attempt: Attempt) -> None:
        self.span = span
        self.attempt = attempt
        self.ended = False

    def end(self, record: RunRecord, exception: BaseException | None) -> None:
        self.ended = True
        span = self.span
        span.set_attribute("anarchon.outcome", record.status)
        why = self.attempt.signal.reason
        if why is not None:
            span.set_attribute("anarchon.abort_reason", why)
        if record.status != "failed":
            return  # success and interrupted (a stop, a takeover) leave the status unset
        if exception is not None:
            _record_error(span, exception)
            return
        text = redact_text(record.error or "failed")
        span.set_attribute("error.type", "_OTHER")
        span.set_status(Status(StatusCode.ERROR, text.split("\n", 1)[0][:MAX_ERROR_CHARS]))


class OtelTracing(Tracing):
    """The tracing hooks of one instrumented scheduler."""

    def __init__(self, scheduler: Scheduler, tracer: Tracer) -> None:
        self.scheduler = scheduler
        self.tracer = tracer
        #: claim token -> the calls of a won claim, until its attempt starts.
        self._pending: OrderedDict[str, list[_Call]] = OrderedDict()

    def _attributes(self, operation: str | None, job: str | None, slot: int | None) -> dict[str, AttributeValue]:
        attributes: dict[str, AttributeValue] = {"anarchon.scheduler": self.scheduler.name}
        if operation is not None:
            attributes["anarchon.operation"] = operation
            attributes["anarchon.store"] = str(getattr(self.scheduler.backend, "name", "?"))
        if job is not None:
            attributes["anarchon.job"] = job
        if slot is not None:
            attributes["anarchon.slot"] = str(iso(slot))
        return attributes

    # -- the attempt ---------------------------------------------------------------------

    @contextlib.contextmanager
    def attempt(self, attempt: Attempt) -> Iterator[AttemptTrace]:
        calls = self._pending.pop(attempt.token, []) if attempt.token else []
        attributes = self._attributes(None, attempt.job.name, attempt.slot)
        attributes.update({
            "anarchon.attempt": attempt.attempt,
            "anarchon.reason": attempt.reason,
            "anarchon.instance": self.scheduler.instance_id,
        })
        span = self.tracer.start_span(
            f"run {attempt.job.name}",
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            links=[Link(call.link) for call in calls if call.link is not None],
            start_time=min((call.start for call in calls), default=None),
        )
        inside = trace.set_span_in_context(span)
        for call in calls:
            if call.link is None:
                self._write(call, inside)
        handle = _OtelAttemptTrace(span, attempt)
        try:
            with trace.use_span(span, record_exception=False, set_status_on_exception=False):
                yield handle
        except BaseException as exc:
            if not handle.ended:
                cancelled = isinstance(exc, asyncio.CancelledError)
                span.set_attribute("anarchon.outcome", "cancelled" if cancelled else "error")
                if not cancelled:
                    _record_error(span, exc)
            raise
        finally:
            span.end()

    def thread(self, fn: Callable[P, T]) -> Callable[P, T]:
        """``fn`` in a pool thread under the trace context current now (the attempt's)."""
        current = otel_context.get_current()

        @functools.wraps(fn)
        def in_context(*args: P.args, **kwargs: P.kwargs) -> T:
            token = otel_context.attach(current)
            try:
                return fn(*args, **kwargs)
            finally:
                otel_context.detach(token)

        return in_context

    # -- store calls ---------------------------------------------------------------------

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
        if operation in CLAIM_CALLS and token is not None:
            return self._claim(operation, awaitable, job, slot, token)
        if token is not None:  # a won claim handed back: its spans will have no attempt
            self._flush(token)
        return self._live(operation, awaitable, job, slot, tokens, with_record)

    async def _live(
        self, operation: str, awaitable: Awaitable[T], job: str | None, slot: int | None,
        tokens: Sequence[str] | None, with_record: bool = False,
    ) -> T:
        attributes = self._attributes(operation, job, slot)
        if tokens is not None:
            attributes["anarchon.claims"] = len(tokens)
        if with_record:
            attributes["anarchon.with_record"] = True
        name = operation if job is None else f"{operation} {job}"
        start = time.time_ns()
        with self.tracer.start_as_current_span(
            name, kind=SpanKind.CLIENT, attributes=attributes,
            record_exception=False, set_status_on_exception=False,
        ) as span:
            try:
                result = await awaitable
            except asyncio.CancelledError:
                span.set_attribute("anarchon.outcome", "cancelled")
                raise
            except BaseException as exc:
                _record_error(span, exc)
                raise
            outcome = _outcome(operation, result)
            if outcome is not None:
                span.set_attribute("anarchon.outcome", outcome)
            if tokens is not None and isinstance(result, list):
                won = [t for t, answer in zip(tokens, result, strict=False) if _won(answer)]
                span.set_attribute("anarchon.won", len(won))
                for claim_token in won:
                    link = _Call(name, {}, otel_context.get_current(), start, link=span.get_span_context())
                    self._keep(claim_token, link)
            return result

    async def _claim(
        self, operation: str, awaitable: Awaitable[T], job: str | None, slot: int | None,
        token: str,
    ) -> T:
        """A claim: recorded now, written as a child of the attempt it wins, or alone."""
        name = operation if job is None else f"{operation} {job}"
        call = _Call(name, self._attributes(operation, job, slot), otel_context.get_current(),
                     time.time_ns())
        try:
            result = await awaitable
        except BaseException as exc:
            call.end = time.time_ns()
            if isinstance(exc, asyncio.CancelledError):
                call.attributes["anarchon.outcome"] = "cancelled"
            else:
                call.error = exc
            self._write(call, call.parent)
            raise
        call.end = time.time_ns()
        outcome = _outcome(operation, result)
        if outcome is not None:
            call.attributes["anarchon.outcome"] = outcome
        if operation == "claim" and not _won(result):
            self._write(call, call.parent)
        elif operation == "record_claim" and token not in self._pending:
            self._write(call, call.parent)  # its claim's attempt began already (or never will)
        else:
            self._keep(token, call)
        return result

    def _keep(self, token: str, call: _Call) -> None:
        self._pending.setdefault(token, []).append(call)
        while len(self._pending) > MAX_PENDING:
            oldest, _ = next(iter(self._pending.items()))
            self._flush(oldest)

    def _flush(self, token: str) -> None:
        """The claim won by ``token`` will have no attempt here: write its spans alone."""
        for call in self._pending.pop(token, []):
            if call.link is None:
                self._write(call, call.parent)

    def _write(self, call: _Call, parent: Context) -> None:
        span = self.tracer.start_span(
            call.name, context=parent, kind=SpanKind.CLIENT, attributes=call.attributes,
            start_time=call.start,
        )
        if call.error is not None:
            _record_error(span, call.error)
        span.end(end_time=call.end)
