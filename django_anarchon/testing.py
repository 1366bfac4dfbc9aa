"""The backend contract suite: how to prove that a backend runs each slot exactly once.

Writing a backend
=================
A backend is a class with the async methods of ``django_anarchon.backends.base.Backend``;
``BaseBackend`` is a convenient base (``OPTIONS`` from settings reach its constructor as
keyword arguments). What each method owes the engine:

``claim(input)``
    ``True`` for exactly one instance per (``input.job``, ``input.slot``), decided in ONE
    atomic step on the store (insert with a unique key, put-if-absent, a server-side
    script or transaction). Checking first and writing second, in two calls, lets two
    instances win. Store ``input.token`` with the claim: the same token again must answer
    ``True`` (clients retry after a dropped connection), any other token ``False``.
``dedupe_window_ms``
    How long the store remembers a claim; ``math.inf`` if forever. The engine refuses a
    job whose ``jitter + max_late`` is not shorter. Override ``check_job`` to refuse
    other jobs your store cannot run safely (raise ``ConfigurationError``).
``record_manual_run(input)``
    Record a ``run_now()`` run as running, never deduplicated. If the slot already has
    a manual run, store it under a free slot and return that slot (else ``None``).
``save_result(job, result, history_size, history_ttl_ms)``, ``history(job, limit)``
    Keep attempts (pruned in the store to ``history_size`` per job and to
    ``history_ttl_ms``) and return them newest first from every instance. Build the
    records with ``build_history`` so new fields reach you without changes. If ``claim()``
    does not itself leave a history record, also offer ``record_claim(input)``: the
    engine calls it after a won claim.
``init()``, ``prepare_job(job, history_size)``, ``close()``
    Connect (idempotently), set up per-job structures, and close only what you opened.
``claim_many(inputs)`` (optional)
    Decide many claims in one round trip; the engine uses it for claims due together.

A store that can keep leases also offers ``backend.runs``, a ``RunStore`` following the
lease rules of the specification (section 5), every method atomic and timed by the
STORE's clock so that instances with skewed clocks agree. A runner whose token was
replaced must be refused by ``heartbeat``, ``finish`` and ``release``: that is the fencing.

Errors you raise reach the user unchanged. What you store is versioned by you: during a
rolling deploy two releases share one store.

Testing it
==========
Subclass ``BackendContract`` in a test module and give it a ``make_backend`` fixture that
returns a zero-argument factory. Each call of the factory must build a NEW backend
instance (a new client or connection) that talks to the SAME store; the factory may be
a plain function or an ``async`` one, and must not return a client bound to another
event loop::

    import pytest
    from django_anarchon.testing import BackendContract
    from myproject.backends import KeyValueBackend

    class TestKeyValueBackend(BackendContract):
        race_claimers = 50     # concurrent claimers of one slot (built-ins: at least 50)
        race_rounds = 1000     # rounds, each on a new slot (built-ins: at least 1,000)

        @pytest.fixture
        def make_backend(self):
            return lambda: KeyValueBackend(url="kv://127.0.0.1:7000")

A store kept in one process may return the same instance every time (``MemoryBackend``
does); ``close()`` is then called once.

The suite checks:

* the race: ``race_claimers`` claimers of one slot, ``race_rounds`` times, exactly one
  winner each time, through ``claim()`` and, on lease stores, through ``runs.claim()``
  (whose losers must hear ``running(1)``); the same for ``claim_many`` when offered,
  over ``race_many_jobs`` jobs due at once for ``race_many_rounds`` rounds;
* repeat safety: the same token wins again, another token loses; jobs and slots are
  independent; an unknown job has no history;
* history: a claim plus ``save_result()`` comes back as one record with the right job,
  slot, instance, attempt, status, error, duration and times; newest first across
  instances; pruned by ``history_size`` and ``history_ttl``; manual runs appear with
  ``manual=True`` and reason ``manual``, and two of one slot both appear;
* every lease rule, only when ``backend.runs`` is not ``None``: won, running, the same
  claim again, done after success, retries while attempts remain (keeping the claim's
  reason), done when used up, none for a takeover of an unknown run, late, overlap
  (``skip`` and ``allow``; a lapsed lease does not block), takeover after a lapse (attempt
  2 with reason ``takeover``, attempt 1 ``interrupted`` with an error), a lapse with the
  attempts used up (done, ``interrupted``), fencing of stale tokens, renewal of a lapsed
  lease nobody took, ``release`` handing over at once, ``active()``, ``keep_ms``.

How the suite behaves, so that it can run against a shared real server:

* Every test uses job names made unique with a UUID (only ``[a-z0-9-]``), so runs
  never collide with other test runs or with real data on the same server.
* Every test runs in its own event loop (``asyncio.run``), builds its backends inside
  that loop, and closes every backend it built before the loop ends; a client bound
  to one loop is never used from another. Tests are plain functions: no pytest-asyncio
  configuration is needed.
* Lease timing never assumes the test's clock equals the store's: leases are short
  (``lease_ms``, 400 ms) and the suite waits on ``runs.active()`` with a deadline
  (``wait_timeout``) instead of sleeping a fixed time. Slots are near the test's clock;
  "late" and the history ttl use an hour of margin.

Tuning, as class attributes:

``race_claimers``, ``race_rounds``
    The race's size. A remote store pays a round trip per claim, so keep the product
    affordable; the built-in backends run at least 50 x 1,000.
``race_clients``
    How many backend instances the claimers are spread over (default: one each).
``race_many_jobs``, ``race_many_rounds``
    The size of the ``claim_many`` races (20 x 20).
``race_threads``
    ``True`` runs each claimer in its own thread, with its own backend instance and
    event loop, a barrier starting every round. Use it when concurrent coroutines on
    one loop are not concurrent on the store, for example a backend that calls a
    blocking client through ``sync_to_async(thread_sensitive=True)``, which funnels
    every call through one thread.
``process_factory``, ``process_claimers`` (4), ``process_rounds`` (20)
    A ``"package.module:callable"`` path that builds a backend in a fresh, ``spawn``ed
    process. When set, the race also runs across OS processes. The callable must do
    everything the process needs (``django.setup()`` with the same test database, for
    a backend that uses Django)::

        def kv_factory():
            return KeyValueBackend(url="kv://127.0.0.1:7000")

        class TestKeyValueBackend(BackendContract):
            process_factory = "tests.test_kv:kv_factory"
``supports_leases``
    ``None`` (default) detects a ``RunStore`` from ``backend.runs`` and skips the lease
    tests without one; ``False`` leaves them out of the class altogether.
``supports_claim_many``
    ``None`` (default) detects ``claim_many``; ``False`` leaves its races out.

Tests that cannot apply are not collected: the lease tests with ``supports_leases =
False``, the ``claim_many`` races with ``supports_claim_many = False``, and the race
across OS processes without a ``process_factory``.
``lease_ms``, ``wait_timeout``
    The short lease of the timing tests, and how long to wait for it to lapse (seconds).

A database backend needs database access in its tests, and its threads must see
committed rows: mark the subclass ``pytestmark = pytest.mark.django_db(transaction=True)``.

The helpers are public for tests of your own: ``count_winners`` (how many answers won),
``assert_one_winner_each`` (fails naming the bad rounds), ``race_in_threads`` and
``race_in_processes`` (winners of each round), ``unique_job``.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import multiprocessing
import queue as queue_module
import threading
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, ClassVar, TypeAlias

import pytest

from .backends.base import (
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
    ms_to_datetime,
)

__all__ = [
    "AnyBackend",
    "BackendContract",
    "BackendFactory",
    "assert_one_winner_each",
    "count_winners",
    "race_in_processes",
    "race_in_threads",
    "unique_job",
]

AnyBackend: TypeAlias = Backend | BaseBackend
#: What ``make_backend`` returns: builds a new backend on the shared store, sync or async.
BackendFactory: TypeAlias = Callable[[], AnyBackend | Awaitable[AnyBackend]]

_HOUR_MS = 3_600_000
_KEEP_MS = 600_000


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


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


async def _build(factory: BackendFactory) -> AnyBackend:
    made = factory()
    backend: AnyBackend = await made if inspect.isawaitable(made) else made
    await backend.init()
    return backend


def _runs_of(backend: AnyBackend) -> RunStore | None:
    return getattr(backend, "runs", None)


Contest: TypeAlias = tuple[str, int]
"""One (job, slot) that every claimer of a race claims: exactly one may win it."""


def _race_claim(job: str, slot: int, claimer: int, prefix: str) -> RunClaim:
    """One claimer's claim of one slot (also a plain ``ClaimInput``)."""
    return RunClaim(
        job=job,
        slot=slot,
        token=f"{prefix}-{claimer}-{slot}",
        instance_id=f"claimer-{claimer}",
        overlap="allow",
        keep_ms=_KEEP_MS,
    )


async def _claim_once(backend: AnyBackend, claim: RunClaim, use_runs: bool) -> bool:
    if not use_runs:
        return await backend.claim(claim)
    runs = _runs_of(backend)
    assert runs is not None, f"{backend!r} has no RunStore (runs is None)"
    return (await runs.claim(claim)).kind == "won"


async def _claim_round(
    backend: AnyBackend,
    contests: Sequence[Contest],
    claimer: int,
    prefix: str,
    use_runs: bool,
    use_many: bool,
) -> list[bool]:
    """One claimer's claims of a round: each contest alone, or all in one ``claim_many``."""
    claims = [_race_claim(job, slot, claimer, prefix) for job, slot in contests]
    if use_many:
        owner: Any = _runs_of(backend) if use_runs else backend
        answers = list(await owner.claim_many(claims))
        assert len(answers) == len(claims), f"claim_many: {len(claims)} claims, {answers!r}"
        return [count_winners([a]) == 1 for a in answers]
    if len(claims) == 1:
        return [await _claim_once(backend, claims[0], use_runs)]
    return list(await asyncio.gather(*(_claim_once(backend, c, use_runs) for c in claims)))


def _jobs_of(rounds: Sequence[Sequence[Contest]]) -> list[str]:
    return sorted({job for contests in rounds for job, _ in contests})


def race_in_threads(
    factory: BackendFactory,
    job: str,
    slots: Sequence[int],
    *,
    claimers: int,
    use_runs: bool = False,
    use_many: bool = False,
    timeout: float = 120.0,
) -> list[int]:
    """Race ``claimers`` threads for each slot in turn; return the winners of each round.

    Every thread builds its own backend with ``factory`` inside its own event loop, and
    closes it at the end. A barrier starts each round in all threads at once. With
    ``use_runs`` the claims go to ``runs.claim()``; with ``use_many``, to ``claim_many``.
    """
    rounds = [[(job, slot)] for slot in slots]
    return _threaded_race(factory, rounds, claimers, use_runs, use_many, timeout)


def _threaded_race(
    factory: BackendFactory,
    rounds: Sequence[Sequence[Contest]],
    claimers: int,
    use_runs: bool,
    use_many: bool,
    timeout: float,
) -> list[int]:
    """Winners of every contest, round after round, with one thread per claimer."""
    barrier = threading.Barrier(claimers, timeout=timeout)
    prefix = uuid.uuid4().hex
    won: list[list[list[bool]]] = [[[] for _ in range(claimers)] for _ in rounds]
    errors: list[str] = []

    async def claimer(index: int) -> None:
        backend = await _build(factory)
        try:
            for job in _jobs_of(rounds):
                await backend.prepare_job(job, 100)
            await asyncio.to_thread(barrier.wait)
            for round_no, contests in enumerate(rounds):
                if round_no:
                    barrier.wait()
                won[round_no][index] = await _claim_round(
                    backend, contests, index, prefix, use_runs, use_many
                )
            if use_runs:
                mine = [
                    (job, slot)
                    for r, contests in enumerate(rounds)
                    for (job, slot), w in zip(contests, won[r][index], strict=True)
                    if w
                ]
                await _finish_won(backend, mine, index, prefix)
        finally:
            await backend.close()

    def body(index: int) -> None:
        try:
            asyncio.run(claimer(index))
        except BaseException:
            errors.append(traceback.format_exc())
            barrier.abort()

    threads = [
        threading.Thread(target=body, args=(i,), name=f"anarchon-claimer-{i}", daemon=True)
        for i in range(claimers)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    if any(t.is_alive() for t in threads):
        raise AssertionError(f"race_in_threads: claimers still running after {timeout}s")
    if errors:
        raise AssertionError(f"race_in_threads: a claimer failed:\n{errors[0]}")
    return [
        sum(won[r][i][c] for i in range(claimers))
        for r, contests in enumerate(rounds)
        for c in range(len(contests))
    ]


async def _gathered_race(
    clients: Sequence[AnyBackend],
    rounds: Sequence[Sequence[Contest]],
    claimers: int,
    use_runs: bool,
    use_many: bool,
) -> list[int]:
    """Winners of every contest, with the claimers as coroutines over ``clients``."""
    for client in clients:
        for job in _jobs_of(rounds):
            await client.prepare_job(job, 100)
    prefix = uuid.uuid4().hex
    winners: list[int] = []
    won_by: dict[int, list[Contest]] = {}
    for contests in rounds:
        answers = await asyncio.gather(
            *(
                _claim_round(clients[i % len(clients)], contests, i, prefix, use_runs, use_many)
                for i in range(claimers)
            )
        )
        winners.extend(sum(a[c] for a in answers) for c in range(len(contests)))
        for i, answer in enumerate(answers):
            won_by.setdefault(i, []).extend(c for c, w in zip(contests, answer, strict=True) if w)
    if use_runs:
        for i, mine in won_by.items():
            await _finish_won(clients[i % len(clients)], mine, i, prefix)
    return winners


async def _finish_won(
    backend: AnyBackend, contests: Sequence[Contest], claimer: int, prefix: str
) -> None:
    """Finish the runs a claimer won, so that the store may forget them after keep_ms.

    Only the winner's token may finish a run, so this doubles as a check of the winners.
    """
    runs = _runs_of(backend)
    assert runs is not None
    for start in range(0, len(contests), 100):
        chunk = contests[start : start + 100]
        done = await asyncio.gather(
            *(
                runs.finish(job, slot, _race_claim(job, slot, claimer, prefix).token, "success")
                for job, slot in chunk
            )
        )
        refused = [c for c, ok in zip(chunk, done, strict=True) if not ok]
        assert not refused, f"claimer-{claimer} won but could not finish {refused[:5]}"


def _import_factory(path: str) -> BackendFactory:
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    factory: BackendFactory = getattr(importlib.import_module(module_name), attr)
    return factory


def _process_claimer(
    factory_path: str,
    job: str,
    slots: list[int],
    index: int,
    use_runs: bool,
    prefix: str,
    barrier: Any,
    results: Any,
    timeout: float,
) -> None:
    """The body of one claimer process (module level, so that ``spawn`` can import it)."""

    async def main() -> list[bool]:
        backend = await _build(_import_factory(factory_path))
        try:
            await backend.prepare_job(job, 100)
            won = []
            for slot in slots:
                await asyncio.to_thread(barrier.wait, timeout)
                won.append(
                    await _claim_once(backend, _race_claim(job, slot, index, prefix), use_runs)
                )
            return won
        finally:
            await backend.close()

    try:
        results.put((index, asyncio.run(main()), None))
    except BaseException:
        barrier.abort()
        results.put((index, None, traceback.format_exc()))


def race_in_processes(
    factory_path: str,
    *,
    claimers: int = 4,
    rounds: int = 1,
    use_runs: bool = False,
    job: str | None = None,
    timeout: float = 120.0,
) -> list[int]:
    """Race ``claimers`` OS processes for ``rounds`` slots; return the winners of each round.

    Each process (``spawn``ed, so nothing is inherited) imports ``factory_path``
    (``"package.module:callable"``), builds its backend, and claims the same slots as the
    others, a barrier starting each round everywhere at once.
    """
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(claimers)
    results = ctx.Queue()
    job = job or unique_job("processes")
    base = _now_ms() // 1000 * 1000
    slots = [base + i for i in range(rounds)]
    prefix = uuid.uuid4().hex
    procs = [
        ctx.Process(
            target=_process_claimer,
            args=(factory_path, job, slots, i, use_runs, prefix, barrier, results, timeout),
            daemon=True,
        )
        for i in range(claimers)
    ]
    for p in procs:
        p.start()
    won: dict[int, list[bool]] = {}
    errors: list[str] = []
    deadline = time.monotonic() + timeout
    try:
        while len(won) + len(errors) < claimers:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"race_in_processes: no answer from claimers after {timeout}s")
            try:
                index, answer, error = results.get(timeout=min(left, 1.0))
            except queue_module.Empty:
                continue
            if error is not None:
                errors.append(error)
            else:
                won[index] = answer
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.terminate()
                p.join(5)
    if errors:
        raise AssertionError(f"race_in_processes: a claimer process failed:\n{errors[0]}")
    return [sum(won[i][r] for i in range(claimers)) for r in range(rounds)]


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


class BackendContract:
    """The contract every backend must pass; subclass it with a ``make_backend`` fixture.

    See the module docstring for the how-to and the tuning attributes.
    """

    race_claimers: ClassVar[int] = 50
    race_rounds: ClassVar[int] = 1000
    race_clients: ClassVar[int | None] = None
    race_threads: ClassVar[bool] = False
    race_many_jobs: ClassVar[int] = 20
    race_many_rounds: ClassVar[int] = 20
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
            left_out |= {"test_race_run_claim", "test_race_run_claim_many", "test_race_losers_see_running"}
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

    # -- the race ----------------------------------------------------------------------

    def race(
        self,
        make_backend: BackendFactory,
        rounds: Sequence[Sequence[Contest]],
        *,
        use_runs: bool = False,
        use_many: bool = False,
    ) -> list[int]:
        """Run a race the way this class is tuned to; return the winners of each contest."""
        claimers = self.race_claimers

        async def capable(backends: _Backends) -> None:
            backend, runs = await backends.new(), None
            if use_runs:
                backend, runs = await self.leases(backends)
            owner = runs if use_runs else backend
            if use_many and not callable(getattr(owner, "claim_many", None)):
                pytest.skip(f"{type(owner).__name__} has no claim_many()")

        self.run(make_backend, capable)
        if self.race_threads:
            return _threaded_race(make_backend, rounds, claimers, use_runs, use_many, 600.0)
        winners: list[int] = []

        async def scenario(backends: _Backends) -> None:
            clients = [await backends.new() for _ in range(self.race_clients or claimers)]
            winners.extend(await _gathered_race(clients, rounds, claimers, use_runs, use_many))

        self.run(make_backend, scenario)
        return winners

    def _single_slot_race(self, make_backend: BackendFactory, use_runs: bool) -> None:
        job = unique_job("race-runs" if use_runs else "race")
        base = _now_ms() // 1000 * 1000
        rounds = [[(job, base + i)] for i in range(self.race_rounds)]
        winners = self.race(make_backend, rounds, use_runs=use_runs)
        how = "threads" if self.race_threads else "claimers"
        assert_one_winner_each(winners, f"{job}: {self.race_claimers} {how}")

    def _batch_race(self, make_backend: BackendFactory, use_runs: bool) -> None:
        """Claims of many jobs due at the same instant, decided together by ``claim_many``."""
        jobs = [unique_job(f"many{i}") for i in range(self.race_many_jobs)]
        base = _now_ms() // 1000 * 1000
        rounds = [[(job, base + r) for job in jobs] for r in range(self.race_many_rounds)]
        winners = self.race(make_backend, rounds, use_runs=use_runs, use_many=True)
        assert_one_winner_each(winners, f"claim_many over {len(jobs)} jobs")

    def test_race_claim(self, make_backend: BackendFactory) -> None:
        self._single_slot_race(make_backend, use_runs=False)

    def test_race_run_claim(self, make_backend: BackendFactory) -> None:
        self._single_slot_race(make_backend, use_runs=True)

    def test_race_claim_many(self, make_backend: BackendFactory) -> None:
        self._batch_race(make_backend, use_runs=False)

    def test_race_run_claim_many(self, make_backend: BackendFactory) -> None:
        self._batch_race(make_backend, use_runs=True)

    def test_race_in_processes(self) -> None:
        assert self.process_factory is not None
        winners = race_in_processes(
            self.process_factory, claimers=self.process_claimers, rounds=self.process_rounds
        )
        assert_one_winner_each(winners, f"{self.process_claimers} processes")

    def test_race_losers_see_running(self, make_backend: BackendFactory) -> None:
        """In a lease race the losers are told ``running(1)``, never another kind."""

        async def scenario(backends: _Backends) -> None:
            stores = [(await self.leases(backends))[1] for _ in range(min(self.race_claimers, 10))]
            job, slot = unique_job("losers"), _now_ms()
            answers = await asyncio.gather(
                *(
                    s.claim(self.run_claim(job, slot, f"t{i}", f"I{i}"))
                    for i, s in enumerate(stores)
                )
            )
            kinds = sorted(a.kind for a in answers)
            assert kinds == ["running"] * (len(stores) - 1) + ["won"], answers
            assert all(a.attempt == 1 for a in answers), answers

        self.run(make_backend, scenario)

    # -- claim() -----------------------------------------------------------------------

    def test_repeat_safety(self, make_backend: BackendFactory) -> None:
        async def scenario(backends: _Backends) -> None:
            a, b = await backends.new(), await backends.new()
            job, slot = unique_job("repeat"), _now_ms()
            await a.prepare_job(job, 100)
            await b.prepare_job(job, 100)
            assert await a.claim(self.claim_input(job, slot, "tok-a", "A")) is True
            assert await a.claim(self.claim_input(job, slot, "tok-a", "A")) is True
            assert await b.claim(self.claim_input(job, slot, "tok-b", "B")) is False
            assert await b.claim(self.claim_input(job, slot, "tok-a", "A")) is True
            assert await a.claim(self.claim_input(job, slot, "tok-b", "B")) is False

        self.run(make_backend, scenario)

    def test_claims_are_independent(self, make_backend: BackendFactory) -> None:
        async def scenario(backends: _Backends) -> None:
            backend = await backends.new()
            one, two, slot = unique_job("one"), unique_job("two"), _now_ms()
            await backend.prepare_job(one, 100)
            await backend.prepare_job(two, 100)
            assert await backend.claim(self.claim_input(one, slot, "t1", "A")) is True
            assert await backend.claim(self.claim_input(two, slot, "t2", "B")) is True
            assert await backend.claim(self.claim_input(one, slot + 1, "t3", "B")) is True
            assert await backend.claim(self.claim_input(one, slot, "t4", "B")) is False

        self.run(make_backend, scenario)

    # -- history -----------------------------------------------------------------------

    def test_unknown_job_history_is_empty(self, make_backend: BackendFactory) -> None:
        async def scenario(backends: _Backends) -> None:
            backend = await backends.new()
            assert await backend.history(unique_job("unknown"), 10) == []

        self.run(make_backend, scenario)

    def test_history_record(self, make_backend: BackendFactory) -> None:
        async def scenario(backends: _Backends) -> None:
            a, b = await backends.new(), await backends.new()
            job, slot = unique_job("history"), _now_ms() // 1000 * 1000
            for backend in (a, b):
                await backend.prepare_job(job, 10)
            assert await self.claim_won(a, self.claim_input(job, slot, "t", "A", history_size=10))
            running = self.find(await b.history(job, 10), slot=slot)
            assert (running.instance_id, running.status, running.attempt) == ("A", "running", 1)
            assert running.finished_at is None

            started = slot + 20
            result = self.result(slot, "A", started, status="failed", error="boom", duration_ms=321)
            await a.save_result(job, result, 10)
            records = await b.history(job, 10)
            assert len(records) == 1, records
            record = records[0]
            assert record.job == job
            assert record.slot == slot
            assert record.scheduled_at == ms_to_datetime(slot)
            assert record.instance_id == "A"
            assert record.manual is False
            assert record.attempt == 1
            assert record.reason == "scheduled"
            assert record.status == "failed"
            assert record.error == "boom"
            assert record.duration_ms == 321
            assert record.started_at == ms_to_datetime(started)
            assert record.finished_at == ms_to_datetime(started + 321)

        self.run(make_backend, scenario)

    def test_history_newest_first_across_instances(self, make_backend: BackendFactory) -> None:
        async def scenario(backends: _Backends) -> None:
            a, b = await backends.new(), await backends.new()
            job, base = unique_job("order"), _now_ms() // 1000 * 1000
            for backend in (a, b):
                await backend.prepare_job(job, 10)
            for i in range(4):
                backend, name = (a, "A") if i % 2 == 0 else (b, "B")
                slot = base + i * 1000
                assert await self.claim_won(backend, self.claim_input(job, slot, f"t{i}", name))
                await backend.save_result(job, self.result(slot, name, slot + 5), 10)
            for reader in (a, b):
                records = await reader.history(job, 10)
                assert [r.slot for r in records] == [base + i * 1000 for i in (3, 2, 1, 0)]
                assert [r.instance_id for r in records] == ["B", "A", "B", "A"]
                assert [r.slot for r in await reader.history(job, 2)] == [base + 3000, base + 2000]

        self.run(make_backend, scenario)

    def test_history_size_prunes(self, make_backend: BackendFactory) -> None:
        async def scenario(backends: _Backends) -> None:
            backend = await backends.new()
            job, base = unique_job("size"), _now_ms() // 1000 * 1000
            await backend.prepare_job(job, 3)
            for i in range(6):
                slot = base + i * 1000
                claim = self.claim_input(job, slot, f"t{i}", "A", history_size=3)
                assert await self.claim_won(backend, claim)
                await backend.save_result(job, self.result(slot, "A", slot + 5), 3)
            records = await backend.history(job, 100)
            assert [r.slot for r in records] == [base + 5000, base + 4000, base + 3000]

        self.run(make_backend, scenario)

    def test_history_ttl_prunes(self, make_backend: BackendFactory) -> None:
        """A record that ended two hours ago goes with a one-hour ttl; a fresh one stays."""

        async def scenario(backends: _Backends) -> None:
            backend = await backends.new()
            job, now, ttl = unique_job("ttl"), _now_ms() // 1000 * 1000, _HOUR_MS
            await backend.prepare_job(job, 10)
            old = now - 2 * _HOUR_MS
            claim = self.claim_input(job, old, "old", "A", history_ttl_ms=ttl)
            assert await self.claim_won(backend, claim)
            await backend.save_result(job, self.result(old, "A", old + 5), 10, ttl)
            claim = self.claim_input(job, now, "new", "A", history_ttl_ms=ttl)
            assert await self.claim_won(backend, claim)
            await backend.save_result(job, self.result(now, "A", now + 5), 10, ttl)
            assert [r.slot for r in await backend.history(job, 10)] == [now]

        self.run(make_backend, scenario)

    def test_manual_runs_are_never_deduplicated(self, make_backend: BackendFactory) -> None:
        async def scenario(backends: _Backends) -> None:
            backend = await backends.new()
            job, slot = unique_job("manual"), _now_ms()
            await backend.prepare_job(job, 10)
            used = []
            for token in ("m1", "m2"):
                moved = await backend.record_manual_run(self.claim_input(job, slot, token, "A"))
                used.append(slot if moved is None else moved)
            records = await backend.history(job, 10)
            assert len(records) == 2, records
            assert all(r.manual and r.reason == "manual" for r in records), records
            assert all(r.status == "running" for r in records), records
            for i, used_slot in enumerate(used):
                result = self.result(used_slot, "A", used_slot + 1 + i, manual=True)
                await backend.save_result(job, result, 10)
            records = await backend.history(job, 10)
            assert len(records) == 2, records
            for r in records:
                assert (r.manual, r.reason, r.status, r.instance_id) == (
                    True,
                    "manual",
                    "success",
                    "A",
                )
            assert sorted(r.slot for r in records) == sorted(used)

        self.run(make_backend, scenario)

    # -- lease rules -------------------------------------------------------------------

    def test_lease_won_running_and_repeat(self, make_backend: BackendFactory) -> None:
        async def scenario(backends: _Backends) -> None:
            backend, runs = await self.leases(backends)
            _, other = await self.leases(backends)
            job, slot = unique_job("won"), _now_ms()
            assert await runs.claim(self.run_claim(job, slot, "a", "A")) == ClaimOutcome.won(1)
            assert await other.claim(self.run_claim(job, slot, "b", "B")) == ClaimOutcome.running(1)
            assert await other.claim(self.run_claim(job, slot, "a", "A")) == ClaimOutcome.won(1)
            takeover = self.run_claim(job, slot, "c", "C", mode="takeover", max_attempts=3)
            assert await runs.claim(takeover) == ClaimOutcome.running(1)
            assert await runs.active(job) == [_active(slot, 1, True)]
            record = self.find(await backend.history(job, 10), slot=slot)
            assert (record.instance_id, record.attempt, record.status) == ("A", 1, "running")
            assert (record.reason, record.manual) == ("scheduled", False)

        self.run(make_backend, scenario)

    def test_lease_done_after_success(self, make_backend: BackendFactory) -> None:
        async def scenario(backends: _Backends) -> None:
            _, runs = await self.leases(backends)
            job, slot = unique_job("done"), _now_ms()
            assert (
                await runs.claim(self.run_claim(job, slot, "a", "A", max_attempts=3))
            ).kind == "won"
            assert await runs.finish(job, slot, "a", "success") is True
            for token, instance in (("b", "B"), ("a", "A")):
                again = self.run_claim(job, slot, token, instance, max_attempts=3)
                assert await runs.claim(again) == ClaimOutcome.done()
            assert await runs.active(job) == []

        self.run(make_backend, scenario)

    def test_lease_retry_while_attempts_remain(self, make_backend: BackendFactory) -> None:
        async def scenario(backends: _Backends) -> None:
            backend, runs = await self.leases(backends)
            job, slot = unique_job("retry"), _now_ms()
            statuses: list[FinalStatus] = ["failed", "interrupted", "failed"]
            for attempt, status in enumerate(statuses, start=1):
                token, instance = f"t{attempt}", f"I{attempt}"
                claim = self.run_claim(job, slot, token, instance, max_attempts=3)
                assert await runs.claim(claim) == ClaimOutcome.won(attempt)
                assert await runs.active(job) == [_active(slot, attempt, True)]
                assert await runs.finish(job, slot, token, status) is True
                await backend.save_result(
                    job, self.result(slot, instance, _now_ms(), attempt=attempt, status=status), 10
                )
            last = self.run_claim(job, slot, "t4", "I4", max_attempts=3)
            assert await runs.claim(last) == ClaimOutcome.done()
            records = await backend.history(job, 10)
            assert [(r.attempt, r.instance_id, r.status) for r in records] == [
                (3, "I3", "failed"),
                (2, "I2", "interrupted"),
                (1, "I1", "failed"),
            ]

        self.run(make_backend, scenario)

    def test_lease_retry_keeps_the_claim_reason(self, make_backend: BackendFactory) -> None:
        async def scenario(backends: _Backends) -> None:
            backend, runs = await self.leases(backends)
            job, slot = unique_job("reason"), _now_ms()
            first = self.run_claim(job, slot, "a", "A", max_attempts=2, reason="catch-up")
            assert await runs.claim(first) == ClaimOutcome.won(1)
            assert await runs.finish(job, slot, "a", "failed")
            retry = self.run_claim(job, slot, "b", "B", max_attempts=2)
            assert await runs.claim(retry) == ClaimOutcome.won(2)
            records = await backend.history(job, 10)
            assert self.find(records, attempt=1).reason == "catch-up"
            second = self.find(records, attempt=2)
            assert (second.reason, second.instance_id, second.status) == (
                "scheduled",
                "B",
                "running",
            )

        self.run(make_backend, scenario)

    def test_lease_done_when_attempts_used_up(self, make_backend: BackendFactory) -> None:
        async def scenario(backends: _Backends) -> None:
            _, runs = await self.leases(backends)
            job, slot = unique_job("usedup"), _now_ms()
            assert await runs.claim(self.run_claim(job, slot, "a", "A")) == ClaimOutcome.won(1)
            assert await runs.finish(job, slot, "a", "failed")
            assert await runs.claim(self.run_claim(job, slot, "b", "B")) == ClaimOutcome.done()
            takeover = self.run_claim(job, slot, "c", "C", mode="takeover")
            assert await runs.claim(takeover) == ClaimOutcome.done()

        self.run(make_backend, scenario)

    def test_lease_none_for_takeover_of_unknown_run(self, make_backend: BackendFactory) -> None:
        async def scenario(backends: _Backends) -> None:
            _, runs = await self.leases(backends)
            job, slot = unique_job("none"), _now_ms()
            takeover = self.run_claim(job, slot, "a", "A", mode="takeover", max_attempts=3)
            assert await runs.claim(takeover) == ClaimOutcome.none()
            assert await runs.active(job) == []
            assert await runs.claim(self.run_claim(job, slot, "b", "B")) == ClaimOutcome.won(1)

        self.run(make_backend, scenario)

    def test_lease_late(self, make_backend: BackendFactory) -> None:
        """Late by the store's clock: an hour of margin absorbs any clock skew."""

        async def scenario(backends: _Backends) -> None:
            _, runs = await self.leases(backends)
            job, now = unique_job("late"), _now_ms()
            slot = now - _HOUR_MS
            outcome = await runs.claim(self.run_claim(job, slot, "a", "A", max_late_ms=60_000))
            assert outcome.kind == "late", outcome
            assert outcome.late_ms is not None and outcome.late_ms > 60_000, outcome
            assert abs(outcome.late_ms - _HOUR_MS) < _HOUR_MS // 2, outcome
            assert await runs.active(job) == []
            in_time = self.run_claim(job, now, "b", "B", max_late_ms=_HOUR_MS)
            assert await runs.claim(in_time) == ClaimOutcome.won(1)

        self.run(make_backend, scenario)

    def test_lease_overlap_skip_and_allow(self, make_backend: BackendFactory) -> None:
        async def scenario(backends: _Backends) -> None:
            _, runs = await self.leases(backends)
            job, base = unique_job("overlap"), _now_ms() // 1000 * 1000
            first, second, third = base, base + 1000, base + 2000
            assert await runs.claim(self.run_claim(job, first, "a", "A")) == ClaimOutcome.won(1)
            skip = self.run_claim(job, second, "b", "B", overlap="skip")
            assert await runs.claim(skip) == ClaimOutcome.overlap(first)
            assert await runs.active(job) == [_active(first, 1, True)]
            allow = self.run_claim(job, second, "c", "C", overlap="allow")
            assert await runs.claim(allow) == ClaimOutcome.won(1)
            assert await runs.finish(job, first, "a", "success")
            assert await runs.finish(job, second, "c", "success")
            assert await runs.claim(self.run_claim(job, third, "d", "D")) == ClaimOutcome.won(1)

        self.run(make_backend, scenario)

    def test_lease_lapsed_lease_does_not_block(self, make_backend: BackendFactory) -> None:
        async def scenario(backends: _Backends) -> None:
            _, runs = await self.leases(backends)
            job, base = unique_job("lapsedoverlap"), _now_ms() // 1000 * 1000
            assert await runs.claim(self.run_claim(job, base, "a", "A")) == ClaimOutcome.won(1)
            assert await runs.release(job, base, "a") is True
            nxt = self.run_claim(job, base + 1000, "b", "B", overlap="skip")
            assert await runs.claim(nxt) == ClaimOutcome.won(1)

        self.run(make_backend, scenario)

    def test_lease_takeover_after_lapse(self, make_backend: BackendFactory) -> None:
        async def scenario(backends: _Backends) -> None:
            backend, runs = await self.leases(backends)
            _, backup = await self.leases(backends)
            job, slot, lease = unique_job("takeover"), _now_ms(), self.lease_ms
            first = self.run_claim(job, slot, "a", "A", lease_ms=lease, max_attempts=2)
            assert await runs.claim(first) == ClaimOutcome.won(1)
            await self.wait_lapsed(runs, job, slot)
            takeover = self.run_claim(job, slot, "b", "B", mode="takeover", max_attempts=2)
            assert await backup.claim(takeover) == ClaimOutcome.won(2)
            assert await runs.active(job) == [_active(slot, 2, True)]

            # Fencing: the stale runner is refused everywhere.
            assert await runs.heartbeat(job, slot, "a", 30_000) is False
            assert await runs.release(job, slot, "a") is False
            assert await runs.finish(job, slot, "a", "success") is False
            again = self.run_claim(job, slot, "a", "A", max_attempts=2)
            assert await runs.claim(again) == ClaimOutcome.running(2)
            assert await backup.heartbeat(job, slot, "b", 30_000) is True

            records = await backend.history(job, 10)
            second = self.find(records, attempt=2)
            assert (second.instance_id, second.reason, second.status) == (
                "B",
                "takeover",
                "running",
            )
            first_rec = self.find(records, attempt=1)
            assert (first_rec.instance_id, first_rec.status) == ("A", "interrupted")
            assert first_rec.error, first_rec

            assert await backup.finish(job, slot, "b", "success") is True
            assert await runs.claim(self.run_claim(job, slot, "c", "C", max_attempts=2)) == (
                ClaimOutcome.done()
            )

        self.run(make_backend, scenario)

    def test_lease_lapsed_with_attempts_used_up(self, make_backend: BackendFactory) -> None:
        async def scenario(backends: _Backends) -> None:
            backend, runs = await self.leases(backends)
            job, slot = unique_job("lapsedone"), _now_ms()
            first = self.run_claim(job, slot, "a", "A", lease_ms=self.lease_ms)
            assert await runs.claim(first) == ClaimOutcome.won(1)
            await self.wait_lapsed(runs, job, slot)
            takeover = self.run_claim(job, slot, "b", "B", mode="takeover")
            assert await runs.claim(takeover) == ClaimOutcome.done()
            assert await runs.active(job) == []
            assert await runs.claim(self.run_claim(job, slot, "c", "C")) == ClaimOutcome.done()
            assert await runs.heartbeat(job, slot, "a", 30_000) is False
            record = self.find(await backend.history(job, 10), slot=slot)
            assert (record.attempt, record.instance_id, record.status) == (1, "A", "interrupted")

        self.run(make_backend, scenario)

    def test_lease_heartbeat_renews_a_lapsed_lease(self, make_backend: BackendFactory) -> None:
        async def scenario(backends: _Backends) -> None:
            _, runs = await self.leases(backends)
            job, slot = unique_job("renew"), _now_ms()
            claim = self.run_claim(job, slot, "a", "A", lease_ms=self.lease_ms, max_attempts=2)
            assert await runs.claim(claim) == ClaimOutcome.won(1)
            await self.wait_lapsed(runs, job, slot)
            assert await runs.heartbeat(job, slot, "a", 30_000) is True
            assert await runs.active(job) == [_active(slot, 1, True)]
            takeover = self.run_claim(job, slot, "b", "B", mode="takeover", max_attempts=2)
            assert await runs.claim(takeover) == ClaimOutcome.running(1)

        self.run(make_backend, scenario)

    def test_lease_release_hands_over_at_once(self, make_backend: BackendFactory) -> None:
        async def scenario(backends: _Backends) -> None:
            backend, runs = await self.leases(backends)
            job, slot = unique_job("release"), _now_ms()
            claim = self.run_claim(job, slot, "a", "A", lease_ms=600_000, max_attempts=2)
            assert await runs.claim(claim) == ClaimOutcome.won(1)
            assert await runs.release(job, slot, "x") is False
            assert await runs.active(job) == [_active(slot, 1, True)]
            assert await runs.release(job, slot, "a") is True
            assert await runs.active(job) == [_active(slot, 1, False)]
            takeover = self.run_claim(job, slot, "b", "B", mode="takeover", max_attempts=2)
            assert await runs.claim(takeover) == ClaimOutcome.won(2)
            assert await runs.finish(job, slot, "a", "interrupted") is False
            record = self.find(await backend.history(job, 10), attempt=2)
            assert (record.instance_id, record.reason) == ("B", "takeover")

        self.run(make_backend, scenario)

    def test_lease_token_fencing(self, make_backend: BackendFactory) -> None:
        async def scenario(backends: _Backends) -> None:
            _, runs = await self.leases(backends)
            job, slot = unique_job("fencing"), _now_ms()
            assert await runs.claim(self.run_claim(job, slot, "a", "A")) == ClaimOutcome.won(1)
            assert await runs.heartbeat(job, slot, "x", 30_000) is False
            assert await runs.finish(job, slot, "x", "success") is False
            assert await runs.release(job, slot, "x") is False
            assert await runs.active(job) == [_active(slot, 1, True)]
            assert await runs.heartbeat(job, slot + 1, "a", 30_000) is False
            assert await runs.finish(job, slot + 1, "a", "success") is False
            assert await runs.heartbeat(job, slot, "a", 30_000) is True
            assert await runs.finish(job, slot, "a", "success") is True
            assert await runs.heartbeat(job, slot, "a", 30_000) is False
            assert await runs.release(job, slot, "a") is False
            assert await runs.active(job) == []

        self.run(make_backend, scenario)

    def test_lease_active_lists_running_runs(self, make_backend: BackendFactory) -> None:
        async def scenario(backends: _Backends) -> None:
            _, runs = await self.leases(backends)
            job, base = unique_job("active"), _now_ms() // 1000 * 1000
            assert await runs.active(job) == []
            for i, token in enumerate(("a", "b", "c")):
                claim = self.run_claim(job, base + i * 1000, token, "A", overlap="allow")
                assert await runs.claim(claim) == ClaimOutcome.won(1)
            assert await runs.release(job, base + 1000, "b")
            assert await runs.finish(job, base + 2000, "c", "success")
            active = sorted(await runs.active(job), key=lambda a: a.slot)
            assert active == [_active(base, 1, True), _active(base + 1000, 1, False)]

        self.run(make_backend, scenario)

    def test_lease_keep_ms_remembers_finished_run(self, make_backend: BackendFactory) -> None:
        async def scenario(backends: _Backends) -> None:
            _, runs = await self.leases(backends)
            job, slot = unique_job("keep"), _now_ms()
            claim = self.run_claim(job, slot, "a", "A", keep_ms=60_000)
            assert await runs.claim(claim) == ClaimOutcome.won(1)
            assert await runs.finish(job, slot, "a", "success")
            again = self.run_claim(job, slot, "b", "B", keep_ms=60_000)
            assert await runs.claim(again) == ClaimOutcome.done()

        self.run(make_backend, scenario)

    def test_lease_runs_of_jobs_are_independent(self, make_backend: BackendFactory) -> None:
        async def scenario(backends: _Backends) -> None:
            _, runs = await self.leases(backends)
            one, two, slot = unique_job("r1"), unique_job("r2"), _now_ms()
            assert await runs.claim(self.run_claim(one, slot, "a", "A")) == ClaimOutcome.won(1)
            assert await runs.claim(self.run_claim(two, slot, "b", "B")) == ClaimOutcome.won(1)
            assert await runs.active(two) == [_active(slot, 1, True)]
            assert await runs.finish(two, slot, "b", "success")
            assert await runs.active(one) == [_active(slot, 1, True)]

        self.run(make_backend, scenario)


def _active(slot: int, attempt: int, alive: bool) -> ActiveRun:
    return ActiveRun(slot=slot, attempt=attempt, alive=alive)
