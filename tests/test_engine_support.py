"""Helpers shared by the engine tests (no tests here).

The backends below are the real ``MemoryBackend`` store, changed only where a test needs
it: without leases (a claim-only store), or with a claim that fails a few times first.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from django_anarchon.backends.base import ClaimInput, ClaimOutcome, RunClaim
from django_anarchon.backends.memory import MemoryBackend
from django_anarchon.engine import Scheduler
from django_anarchon.engine.events import Event

_real_time_ns = time.time_ns


def real_ms() -> int:
    """The true clock, unmoved by the ``skew`` fixture (tests/conftest.py)."""
    return _real_time_ns() // 1_000_000


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def iso_in(ms: int) -> str:
    """An ISO instant ``ms`` from now (for ``at`` jobs)."""
    return datetime.fromtimestamp((now_ms() + ms) / 1000, tz=UTC).isoformat()


def off_the_clock(interval_ms: int = 3_600_000) -> str:
    """An ``offset`` that puts an ``every`` job's slots half an interval from now.

    A job a test drives by hand must neither fall due during the test nor run a slot at
    start (one within ``max_late``): an hourly job started just after the hour did.
    """
    return f"{(now_ms() + interval_ms // 2) % interval_ms}ms"


async def wait_for(
    condition: Callable[[], bool],
    timeout: float = 5.0,  # noqa: ASYNC109 - a polling deadline, not a cancel scope
    what: str = "condition",
) -> None:
    """Poll ``condition`` until true, failing after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.01)


def wait_for_sync(condition: Callable[[], bool], timeout: float = 5.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


class Calls:
    """What handlers saw, recorded from any thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: list[dict[str, Any]] = []

    def add(self, **item: Any) -> None:
        with self.lock:
            self.items.append(item)

    def where(self, **match: Any) -> list[dict[str, Any]]:
        with self.lock:
            return [i for i in self.items if all(i.get(k) == v for k, v in match.items())]

    def count(self, *keys: str) -> Counter[tuple[Any, ...]]:
        with self.lock:
            return Counter(tuple(i[k] for k in keys) for i in self.items)

    def __len__(self) -> int:
        with self.lock:
            return len(self.items)


class Events:
    """Collects scheduler events."""

    def __init__(self, *schedulers: Scheduler, names: tuple[str, ...] = ()) -> None:
        self.items: list[Event] = []
        for scheduler in schedulers:
            for name in names or (
                "start",
                "success",
                "failure",
                "interrupted",
                "skip",
                "lost",
                "error",
            ):
                scheduler.on(name, self.items.append)

    def named(self, name: str, **match: Any) -> list[Event]:
        return [
            e
            for e in list(self.items)
            if e.name == name and all(getattr(e, k) == v for k, v in match.items())
        ]


class ClaimOnlyMemoryBackend(MemoryBackend):
    """The memory store without its lease store: the claim-only path of the engine."""

    name = "memory-claim-only"

    def __init__(self) -> None:
        super().__init__()
        self.runs = None  # type: ignore[assignment]


class FlakyClaimBackend(ClaimOnlyMemoryBackend):
    """Claims (of ``job`` only, if given) fail with ``ConnectionError`` ``failures`` times,
    then reach the store.

    Naming the job keeps a test's failures off its other jobs, whose slots may fall due at
    start depending on the wall clock (an hourly job just after the hour).
    """

    def __init__(self, failures: int = 2, job: str | None = None) -> None:
        super().__init__()
        self.failures = failures
        self.job = job
        self.tokens: list[tuple[str, int, str]] = []

    async def claim(self, input: ClaimInput) -> bool:
        self.tokens.append((input.job, input.slot, input.token))
        self.maybe_fail(input.job)
        return await super().claim(input)

    def maybe_fail(self, job: str) -> None:
        """Fail a call about ``job`` while failures are left."""
        if self.failures > 0 and self.job in (None, job):
            self.failures -= 1
            raise ConnectionError("store unreachable (test)")


class LoopThread:
    """A scheduler serving on its own event loop in its own thread."""

    def __init__(self, scheduler: Scheduler, grace: str = "5s") -> None:
        self.scheduler = scheduler
        self.grace = grace
        self.started = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        async def serve() -> None:
            await self.scheduler.start()
            self.started.set()
            await self.scheduler.serve(self.grace)  # already started: waits, then stops

        try:
            asyncio.run(serve())
        except BaseException as exc:  # surfaced by stop()
            self.error = exc
            self.started.set()

    def start(self) -> LoopThread:
        self.thread.start()
        assert self.started.wait(10), "scheduler thread did not start"
        if self.error:
            raise self.error
        return self

    def stop(self, timeout: float = 20) -> None:
        self.scheduler.request_stop()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "scheduler thread did not stop"
        if self.error:
            raise self.error


async def stop_all(*schedulers: Scheduler, grace: str = "2s") -> None:
    await asyncio.gather(*(s.stop(grace) for s in schedulers))


#: A cron whose slots are a year apart: a job whose own timer stays out of a test (unless
#: it runs in the first minute of a year).
RARELY = "0 0 1 1 *"


async def queue_behind_a_full_pool(scheduler: Scheduler, sent: list[Any]) -> tuple[int, list[Any]]:
    """Four slots of one job due while the pool of one thread is full; the first slot, and
    what ``sent`` (the claims the store saw) held after the first two.

    1. The pool 3 over, the first slot waits 0.3 s; 1 over, the next waits 0.1 s.
    2. A slot falls due just as a thread comes free, before the queue is looked at.
    The scheduler's one job is ``tick``, on the cron ``RARELY``: its timer stays out of it
    (an hourly job's last hour may be due still, within ``max_late``: a CI run at a full
    hour saw its claim among the test's).
    """
    flows = scheduler._claims
    job = scheduler.get_job("tick")
    slot = real_ms() - 1_000
    flows.capacity.take(3)
    flows.due(job, slot)
    await asyncio.sleep(0)
    flows.capacity.give(2)
    flows.due(job, slot + 1)
    await wait_for(lambda: len(sent) >= 2 and flows.capacity.used == 1, 5, "two claims")
    first = list(sent)
    flows.due(job, slot + 2)
    await asyncio.sleep(0.02)  # the queue's drain now waits (0.1 s) for a free thread
    flows.due(job, slot + 3)
    flows.capacity.give(1)
    await wait_for(lambda: len(sent) >= 4, 5, "four claims")
    return slot, first


def run(coro: Awaitable[Any]) -> Any:  # pragma: no cover - convenience for debugging
    return asyncio.run(coro)  # type: ignore[arg-type]


class Recording:
    """Passes every call through to a backend's real run store, noting each lease claim
    (alone or in a batch), when it left the instance (the true clock), and the store's
    answer; and each look (``peek_many``) that answered a claim."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.sent: list[tuple[int, RunClaim, ClaimOutcome]] = []
        #: token -> when the answer came back (the true clock)
        self.answered: dict[str, int] = {}
        #: the claims a look answered, and its answers
        self.looked: list[tuple[RunClaim, ClaimOutcome]] = []
        real_claim, real_many = backend.runs.claim, backend.runs.claim_many
        real_peek = backend.runs.peek_many

        async def claim(c: RunClaim) -> ClaimOutcome:
            at = real_ms()
            outcome = await real_claim(c)
            self.sent.append((at, c, outcome))
            self.answered[c.token] = real_ms()
            return outcome

        async def claim_many(claims: list[RunClaim]) -> list[ClaimOutcome]:
            at = real_ms()
            outcomes = await real_many(claims)
            self.sent.extend((at, c, o) for c, o in zip(claims, outcomes, strict=True))
            self.answered.update((c.token, real_ms()) for c in claims)
            return outcomes

        async def peek_many(claims: list[RunClaim]) -> list[ClaimOutcome | None]:
            answers: list[ClaimOutcome | None] = await real_peek(claims)
            self.looked.extend(
                (c, a) for c, a in zip(claims, answers, strict=True) if a is not None
            )
            return answers

        backend.runs.claim = claim
        backend.runs.claim_many = claim_many
        backend.runs.peek_many = peek_many

    @property
    def claims(self) -> list[tuple[RunClaim, ClaimOutcome]]:
        return [(c, o) for _, c, o in self.sent]

    def of(self, by: str) -> list[dict[str, Any]]:
        """The claims ``by`` sent, in order: slot, when it left, when it was answered, the
        answer's kind."""
        return [
            {"slot": c.slot, "at": at, "answered": self.answered[c.token], "kind": o.kind}
            for at, c, o in self.sent
            if c.instance_id == by
        ]
