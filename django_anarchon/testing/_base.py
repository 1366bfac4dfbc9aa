"""What every part of the contract suite shares: tuning, plumbing, small assertions."""

from __future__ import annotations

import asyncio
import inspect
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, ClassVar, TypeAlias

import pytest

from ..backends.base import (
    ActiveRun,
    Backend,
    BaseBackend,
    ClaimInput,
    ClaimOutcome,
    FinalStatus,
    RunClaim,
    RunRecord,
    RunStore,
    StoredResult,
)
from ..wallclock import now_ms

AnyBackend: TypeAlias = Backend | BaseBackend
#: What ``make_backend`` returns: builds a new backend on the shared store, sync or async.
BackendFactory: TypeAlias = Callable[[], AnyBackend | Awaitable[AnyBackend]]

_HOUR_MS = 3_600_000
_KEEP_MS = 600_000
#: Lease tests claim slots this far in the past: a store whose clock lags the test's a
#: little must not answer ``early``.
_PAST_MS = 60_000


def count_winners(results: Iterable[bool | ClaimOutcome]) -> int:
    """How many claims won: ``True`` from ``claim()``, or ``won`` from ``runs.claim()``."""
    return sum(
        1 for r in results if (r is True) or (isinstance(r, ClaimOutcome) and r.kind == "won")
    )


def assert_one_winner_each(winners_per_round: Sequence[int], what: str = "race") -> None:
    """Fail, naming the bad rounds, unless every round of a race had exactly one winner."""
    bad = [(i, n) for i, n in enumerate(winners_per_round) if n != 1]
    if bad:
        shown = ", ".join(f"round {i}: {n} winners" for i, n in bad[:10])
        raise AssertionError(
            f"{what}: {len(bad)} of {len(winners_per_round)} rounds did not have exactly one "
            f"winner ({shown})"
        )


def unique_job(label: str) -> str:
    """A job name no other test run uses: ``contract-<label>-<uuid hex>``."""
    return f"contract-{label}-{uuid.uuid4().hex}"


async def _build(factory: BackendFactory) -> AnyBackend:
    made = factory()
    backend: AnyBackend = await made if inspect.isawaitable(made) else made
    await backend.init()
    return backend


def _runs_of(backend: AnyBackend) -> RunStore | None:
    return getattr(backend, "runs", None)



def _past_ms() -> int:
    """A slot a minute ago, on a whole second (see ``_PAST_MS``)."""
    return (now_ms() - _PAST_MS) // 1000 * 1000


class _Backends:
    """The backends one test built; all of them are closed when the test ends."""

    def __init__(self, factory: BackendFactory) -> None:
        self._factory = factory
        self._built: list[AnyBackend] = []

    async def new(self) -> AnyBackend:
        backend = await _build(self._factory)
        self._built.append(backend)
        return backend

    async def close_all(self) -> None:
        seen: set[int] = set()
        for backend in reversed(self._built):
            if id(backend) not in seen:
                seen.add(id(backend))
                await backend.close()


Scenario: TypeAlias = Callable[[_Backends], Awaitable[None]]


class ContractBase:
    """Tuning, plumbing and assertions that every part of the contract suite shares.

    See the package docstring for the how-to and the tuning attributes.
    """

    race_claimers: ClassVar[int] = 50
    race_rounds: ClassVar[int] = 1000
    race_clients: ClassVar[int | None] = None
    race_threads: ClassVar[bool] = False
    race_many_jobs: ClassVar[int] = 20
    race_many_rounds: ClassVar[int] = 20
    race_shared_rounds: ClassVar[int] = 200
    process_factory: ClassVar[str | None] = None
    process_claimers: ClassVar[int] = 4
    process_rounds: ClassVar[int] = 20
    supports_leases: ClassVar[bool | None] = None
    supports_claim_many: ClassVar[bool | None] = None
    lease_ms: ClassVar[int] = 400
    wait_timeout: ClassVar[float] = 15.0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Leave out the tests that cannot apply to the subclass's backend."""
        super().__init_subclass__(**kwargs)
        left_out: set[str] = set()
        if cls.supports_leases is False:
            left_out |= {n for n in dir(cls) if n.startswith("test_lease_")}
            left_out |= {
                "test_race_run_claim",
                "test_race_run_claim_many",
                "test_race_losers_see_running",
                "test_race_shared_backend_run_claim",
            }
        if cls.supports_claim_many is False:
            left_out |= {"test_race_claim_many", "test_race_run_claim_many"}
        if cls.process_factory is None:
            left_out.add("test_race_in_processes")
        for name in left_out:
            setattr(cls, name, None)

    @pytest.fixture
    def make_backend(self) -> BackendFactory:
        raise NotImplementedError(
            f"{type(self).__name__}: define a make_backend fixture that returns a zero-argument "
            "factory building a new backend instance on the shared store"
        )

    # -- plumbing ----------------------------------------------------------------------

    def run(self, make_backend: BackendFactory, scenario: Scenario) -> None:
        """Run ``scenario`` in a new event loop and close every backend it built."""

        async def main() -> None:
            backends = _Backends(make_backend)
            try:
                await scenario(backends)
            finally:
                await backends.close_all()

        asyncio.run(main())

    async def leases(self, backends: _Backends) -> tuple[AnyBackend, RunStore]:
        """A new backend and its RunStore; skips the test on a backend without leases."""
        if self.supports_leases is False:
            pytest.skip("supports_leases = False")
        backend = await backends.new()
        runs = _runs_of(backend)
        if runs is None:
            pytest.skip(f"{type(backend).__name__} has no RunStore (runs is None)")
        return backend, runs

    @staticmethod
    async def claim_won(backend: AnyBackend, input: ClaimInput) -> bool:
        """Claim as the engine does: a won claim is passed to ``record_claim`` if offered."""
        won = await backend.claim(input)
        record_claim = getattr(backend, "record_claim", None)
        if won and record_claim is not None:
            await record_claim(input)
        return won

    @staticmethod
    def claim_input(job: str, slot: int, token: str, instance: str, **kw: Any) -> ClaimInput:
        return ClaimInput(job=job, slot=slot, token=token, instance_id=instance, **kw)

    @staticmethod
    def run_claim(job: str, slot: int, token: str, instance: str, **kw: Any) -> RunClaim:
        kw.setdefault("keep_ms", _KEEP_MS)
        return RunClaim(job=job, slot=slot, token=token, instance_id=instance, **kw)

    @staticmethod
    def result(
        slot: int,
        by: str,
        started_at: int,
        *,
        attempt: int = 1,
        status: FinalStatus = "success",
        duration_ms: int = 250,
        error: str | None = None,
        manual: bool = False,
    ) -> StoredResult:
        return StoredResult(
            slot=slot,
            by=by,
            attempt=attempt,
            status=status,
            started_at=started_at,
            finished_at=started_at + duration_ms,
            duration_ms=duration_ms,
            error=error,
            manual=manual,
            reason="manual" if manual else "scheduled",
        )

    async def wait_lapsed(self, runs: RunStore, job: str, slot: int) -> None:
        """Wait, by the store's own clock, until the lease of (job, slot) is not alive."""
        deadline = time.monotonic() + self.wait_timeout
        while True:
            active = {a.slot: a for a in await runs.active(job)}
            if slot in active and not active[slot].alive:
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{job} slot {slot}: lease still alive (or gone) after {self.wait_timeout}s: "
                    f"{active.get(slot)!r}"
                )
            await asyncio.sleep(0.05)

    @staticmethod
    def find(records: Sequence[RunRecord], **fields: Any) -> RunRecord:
        """The one record whose fields match, with a readable failure."""
        hits = [r for r in records if all(getattr(r, k) == v for k, v in fields.items())]
        assert len(hits) == 1, f"expected one record with {fields}, got {hits} in {records}"
        return hits[0]


def _active(slot: int, attempt: int, alive: bool) -> ActiveRun:
    return ActiveRun(slot=slot, attempt=attempt, alive=alive)
