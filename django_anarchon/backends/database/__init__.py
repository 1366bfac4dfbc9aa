"""The database backend: exactly-once claims and leases in any Django database.

``DatabaseBackend`` keeps runs in the tables of ``django_anarchon.models`` on the
database named by ``OPTIONS["using"]`` (or, when absent, where the routers send writes of
those models). Claims are decided by the unique constraint on (job, slot) and by a
per-job lock row; every lease time comes from the database server's clock. The ORM runs
in the backend's own threads (``threads.py``), never on the event loop. How it works,
per database and in round trips: ``docs/backends/database.md``.
"""

from __future__ import annotations

import asyncio
import functools
import math
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import connections, router

from ...exceptions import ConfigurationError
from ..base import (
    ActiveRun,
    BaseBackend,
    ClaimInput,
    ClaimOutcome,
    FinalStatus,
    PauseState,
    RunClaim,
    RunEnd,
    RunRecord,
    SlotMark,
    StoredResult,
    Wakeup,
)
from .threads import ConnectionThreads

if TYPE_CHECKING:
    from .store import Store

__all__ = ["DatabaseBackend", "DatabaseRunStore"]

T = TypeVar("T")


class DatabaseBackend(BaseBackend):
    """Runs, leases and history in a Django database (PostgreSQL, MariaDB/MySQL, SQLite).

    Options (``OPTIONS`` in settings): ``using``, the database alias (default: what the
    routers choose for writes of the run models, else ``"default"``); ``max_connections``,
    how many threads, each with its own connection, this backend uses (default 4);
    ``fast_path``, PostgreSQL's one-round-trip claims (default ``True``).
    """

    name = "database"
    #: claim() rows are never forgotten; a finished leased run is kept until
    #: max(finished_at, slot) + kept_ms(keep_ms) has passed (docs/backends/database.md).
    dedupe_window_ms: float = math.inf

    def __init__(
        self, *, using: str | None = None, max_connections: int = 4, fast_path: bool = True
    ) -> None:
        if using is not None and not isinstance(using, str):
            raise ConfigurationError(
                "the database alias must be a string", option="OPTIONS['using']", value=using
            )
        if not isinstance(max_connections, int) or max_connections < 1:
            raise ConfigurationError(
                "max_connections must be a positive integer",
                option="OPTIONS['max_connections']",
                value=max_connections,
            )
        self._using = using
        self._max_connections = max_connections
        self._fast_path = bool(fast_path)
        self._store: Store | None = None
        self._threads: ConnectionThreads | None = None
        self.runs: DatabaseRunStore = DatabaseRunStore(self)

    @property
    def using(self) -> str:
        """The database alias: ``OPTIONS["using"]``, else the routers' choice for writes."""
        if self._using is None:
            from ...models import Run

            self._using = router.db_for_write(Run) or "default"
        if self._using not in connections:
            raise ConfigurationError(
                f"no database {self._using!r} in settings.DATABASES",
                option="OPTIONS['using']",
                value=self._using,
            )
        return self._using

    def store(self) -> Store:
        """The synchronous store (call it from a thread, never from an event loop)."""
        if self._store is None:
            from .store import Store

            self._store = Store(self.using, fast_path=self._fast_path)
        return self._store

    async def _call(self, method: Callable[..., T], *args: Any, urgent: bool = False) -> T:
        if self._threads is None:
            self._threads = ConnectionThreads(self.using, self._max_connections)
        future = self._threads.submit(functools.partial(method, *args), urgent=urgent)
        return await asyncio.wrap_future(future)

    async def _store_call(self, name: str, *args: Any, urgent: bool = False) -> Any:
        return await self._call(lambda: getattr(self.store(), name)(*args), urgent=urgent)

    # -- Backend -----------------------------------------------------------------------

    async def init(self) -> None:
        await self._store_call("check")

    async def prepare_job(self, job: str, history_size: int) -> None:
        await self._store_call("prepare_job", job)

    async def prepare_jobs(self, jobs: list[tuple[str, int]]) -> None:
        await self._store_call("prepare_jobs", [name for name, _ in jobs])

    async def claim(self, input: ClaimInput) -> bool:
        return bool(await self._store_call("claim", input))

    async def claim_many(self, inputs: list[ClaimInput]) -> list[bool]:
        """Every claim in one hop to a connection thread, each decided on its own."""
        answers: list[bool] = await self._store_call("claim_many", list(inputs))
        return answers

    async def record_manual_run(self, input: ClaimInput) -> int | None:
        slot: int | None = await self._store_call("record_manual_run", input)
        return slot

    async def save_result(
        self, job: str, result: StoredResult, history_size: int, history_ttl_ms: int | None = None
    ) -> None:
        await self._store_call("save_result", job, result, history_size, history_ttl_ms)

    async def history(self, job: str, limit: int) -> list[RunRecord]:
        records: list[RunRecord] = await self._store_call("history", job, limit)
        return records

    async def close(self) -> None:
        """Stop this backend's threads; each closes the connection it opened."""
        threads, self._threads = self._threads, None
        if threads is not None:
            await asyncio.to_thread(threads.shutdown)

    def wakeups(self) -> AsyncIterator[Wakeup] | None:
        """On PostgreSQL (psycopg 3), ``LISTEN`` on a connection of its own (``listen.py``)."""
        from . import listen

        return listen.listen(self.using) if listen.supports_push(self.using) else None

    async def wake(self, hint: Wakeup) -> None:
        """``NOTIFY`` on PostgreSQL; nothing elsewhere (MariaDB, SQLite: the polls find it)."""
        from . import listen

        if listen.supports_push(self.using):
            await self._call(functools.partial(listen.notify, self.using, hint), urgent=True)

    def describe(self) -> str:
        try:
            alias = self.using
            vendor = connections[alias].vendor
        except Exception:  # a banner never fails over a bad alias; init() reports it
            alias, vendor = str(self._using), "unknown"
        return f"database ({vendor}, alias {alias!r})"


class DatabaseRunStore:
    """``backend.runs``: the lease rules of SPEC section 5 on the database server's clock,
    and the ledger and pauses (``LedgerStore``; ``ledger.py``)."""

    def __init__(self, backend: DatabaseBackend) -> None:
        self._backend = backend

    async def claim(self, input: RunClaim) -> ClaimOutcome:
        outcome: ClaimOutcome = await self._backend._store_call("run_claim", input)
        return outcome

    async def claim_many(self, claims: list[RunClaim]) -> list[ClaimOutcome]:
        outcomes: list[ClaimOutcome] = await self._backend._store_call(
            "run_claim_many", list(claims)
        )
        return outcomes

    async def peek_many(self, claims: list[RunClaim]) -> list[ClaimOutcome | None]:
        """A look before the claims that only back another instance up (``Store.peek_many``)."""
        answers: list[ClaimOutcome | None] = await self._backend._store_call(
            "peek_many", list(claims)
        )
        return answers

    # A live runner's lease calls go ahead of queued claims (threads.py): behind a burst
    # of claims its heartbeat could otherwise arrive after the lease lapsed.

    async def heartbeat(self, job: str, slot: int, token: str, lease_ms: int) -> bool:
        return bool(
            await self._backend._store_call(
                "heartbeat", job, slot, token, lease_ms, urgent=True
            )
        )

    async def finish(self, job: str, slot: int, token: str, status: FinalStatus) -> bool:
        return bool(
            await self._backend._store_call("finish", job, slot, token, status, urgent=True)
        )

    async def finish_many(self, ends: list[RunEnd]) -> list[bool]:
        """The finishes and their records in one hop to a thread and one transaction."""
        answers: list[bool] = await self._backend._store_call(
            "finish_many", list(ends), urgent=True
        )
        return answers

    async def release(self, job: str, slot: int, token: str) -> bool:
        return bool(await self._backend._store_call("release", job, slot, token, urgent=True))

    async def now_ms(self, job: str) -> int:
        """The database server's clock (optional capability; the same for every job)."""
        now: int = await self._backend._store_call("now_ms")
        return now

    async def active(self, job: str) -> list[ActiveRun]:
        runs: list[ActiveRun] = await self._backend._store_call("active", job)
        return runs

    # -- the ledger and pauses (LedgerStore), in the backend's threads -------------------

    async def _ledger(self, name: str, *args: Any) -> Any:
        backend = self._backend
        return await backend._call(lambda: getattr(backend.store().ledger, name)(*args))

    async def marks(
        self, job: str, since: int | None, until: int | None, limit: int
    ) -> list[SlotMark]:
        marks: list[SlotMark] = await self._ledger("marks", job, since, until, limit)
        return marks

    async def mark_skipped(
        self, job: str, slot: int, reason: str, instance_id: str,
        history_size: int, history_ttl_ms: int | None,
    ) -> bool:
        return bool(
            await self._ledger(
                "mark_skipped", job, slot, reason, instance_id, history_size, history_ttl_ms
            )
        )

    async def mark_missed(
        self, job: str, ranges: Sequence[tuple[int, int, int]], instance_id: str,
        history_size: int, history_ttl_ms: int | None,
    ) -> int:
        return int(
            await self._ledger(
                "mark_missed", job, list(ranges), instance_id, history_size, history_ttl_ms
            )
        )

    async def pause(self, job: str, note: str, by: str, until: int | None) -> PauseState:
        state: PauseState = await self._ledger("pause", job, note, by, until)
        return state

    async def resume(self, job: str) -> PauseState | None:
        state: PauseState | None = await self._ledger("resume", job)
        return state

    async def pauses(self, jobs: Sequence[str]) -> dict[str, PauseState]:
        found: dict[str, PauseState] = await self._ledger("pauses", list(jobs))
        return found

    async def job_since(self, jobs: Sequence[tuple[str, str]]) -> list[int]:
        since: list[int] = await self._ledger("job_since", list(jobs))
        return since
