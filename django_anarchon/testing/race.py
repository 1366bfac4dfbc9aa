"""The race: many concurrent claimers of one slot, exactly one winner, many times over.

Claimers race as coroutines over one backend each, over ONE shared backend object, as
threads with their own loops, and as OS processes; ``claim_many`` races decide many jobs
due at the same instant. The helpers are public for tests of your own.
"""

from __future__ import annotations

import asyncio
import importlib
import multiprocessing
import queue as queue_module
import threading
import time
import traceback
import uuid
from collections.abc import Sequence
from typing import Any, TypeAlias

import pytest

from ..backends.base import RunClaim
from ._base import (
    _KEEP_MS,
    AnyBackend,
    BackendFactory,
    ContractBase,
    _Backends,
    _build,
    _past_ms,
    _runs_of,
    assert_one_winner_each,
    count_winners,
    unique_job,
)

__all__ = ["RaceTests", "race_in_processes", "race_in_threads"]

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
    base = _past_ms()
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


class RaceTests(ContractBase):
    """Exactly one winner per slot, however the claimers reach the store."""

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
        base = _past_ms()
        rounds = [[(job, base + i)] for i in range(self.race_rounds)]
        winners = self.race(make_backend, rounds, use_runs=use_runs)
        how = "threads" if self.race_threads else "claimers"
        assert_one_winner_each(winners, f"{job}: {self.race_claimers} {how}")

    def _batch_race(self, make_backend: BackendFactory, use_runs: bool) -> None:
        """Claims of many jobs due at the same instant, decided together by ``claim_many``."""
        jobs = [unique_job(f"many{i}") for i in range(self.race_many_jobs)]
        base = _past_ms()
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
            job, slot = unique_job("losers"), _past_ms()
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

    def _shared_race(self, make_backend: BackendFactory, use_runs: bool) -> None:
        """Every claimer goes through ONE backend object: it must be safe for concurrent use."""
        job = unique_job("shared-runs" if use_runs else "shared")
        base = _past_ms()
        rounds = [[(job, base + i)] for i in range(self.race_shared_rounds)]
        winners: list[int] = []

        async def scenario(backends: _Backends) -> None:
            backend = await backends.new()
            if use_runs:
                backend = (await self.leases(backends))[0]
            winners.extend(
                await _gathered_race([backend], rounds, self.race_claimers, use_runs, False)
            )

        self.run(make_backend, scenario)
        assert_one_winner_each(winners, f"{job}: {self.race_claimers} claimers, one backend")

    def test_race_shared_backend(self, make_backend: BackendFactory) -> None:
        self._shared_race(make_backend, use_runs=False)

    def test_race_shared_backend_run_claim(self, make_backend: BackendFactory) -> None:
        self._shared_race(make_backend, use_runs=True)
