"""MemoryBackend: the public contract suite, plus what only an in-process store can show.

The injectable clock lets these tests move the store's time without sleeping; the
threaded races show that one instance shared by many threads and event loops still
gives each slot to exactly one claimer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math

import pytest

from django_anarchon.backends.base import (
    MIN_KEEP_MS,
    ActiveRun,
    Backend,
    ClaimInput,
    ClaimOutcome,
    RunClaim,
    RunStore,
    StoredResult,
)
from django_anarchon.backends.memory import MemoryBackend, MemoryRunStore
from django_anarchon.testing import (
    BackendContract,
    BackendFactory,
    assert_one_winner_each,
    count_winners,
    race_in_processes,
    race_in_threads,
    unique_job,
)

T0 = 1_800_000_000_000  # a fixed store time, in epoch ms


def memory_factory() -> MemoryBackend:
    """Imported by ``race_in_processes``: every process gets a store of its own."""
    return MemoryBackend()


class FakeClock:
    def __init__(self, now: int = T0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


class TestMemoryBackendContract(BackendContract):
    race_claimers = 50
    race_rounds = 1000

    @pytest.fixture
    def make_backend(self) -> BackendFactory:
        shared = MemoryBackend()  # one store; "new instances" of it are the same object
        return lambda: shared


def test_the_suite_races_in_threads_when_asked() -> None:
    """``race_threads = True``: each claimer in a thread with its own event loop."""

    class InThreads(BackendContract):
        race_claimers = 50
        race_rounds = 200
        race_many_rounds = 10
        race_threads = True

    shared = MemoryBackend()
    suite = InThreads()
    suite.test_race_claim(lambda: shared)
    suite.test_race_run_claim(lambda: shared)
    suite.test_race_claim_many(lambda: shared)
    suite.test_race_run_claim_many(lambda: shared)


class RacyBackend(MemoryBackend):
    """Checks, then yields, then writes: the classic mistake the race must catch."""

    def __init__(self) -> None:
        super().__init__()
        self.taken: dict[tuple[str, int], str] = {}

    async def claim(self, input: ClaimInput) -> bool:
        holder = self.taken.get((input.job, input.slot))
        if holder is not None:
            return holder == input.token
        await asyncio.sleep(0.005)  # another claimer checks here too
        self.taken[(input.job, input.slot)] = input.token
        return True


def test_the_race_catches_a_check_then_write_backend() -> None:
    class Racy(BackendContract):
        race_claimers = 5
        race_rounds = 3

    shared = RacyBackend()
    with pytest.raises(AssertionError, match="did not have exactly one winner"):
        Racy().test_race_claim(lambda: shared)
    winners = race_in_threads(lambda: shared, unique_job("racy"), [T0, T0 + 1], claimers=5)
    with pytest.raises(AssertionError, match="did not have exactly one winner"):
        assert_one_winner_each(winners)


def test_is_a_backend_with_leases() -> None:
    backend = MemoryBackend()
    assert isinstance(backend, Backend)
    assert isinstance(backend.runs, MemoryRunStore)
    assert isinstance(backend.runs, RunStore)
    assert backend.name == "memory"
    assert backend.dedupe_window_ms == math.inf


def test_threads_share_one_instance_across_event_loops() -> None:
    shared = MemoryBackend(clock=lambda: T0 + 10_000)  # after every slot: none is early
    job = unique_job("threads")
    slots = [T0 + i for i in range(300)]
    for use_runs in (False, True):
        winners = race_in_threads(
            lambda: shared, job, slots, claimers=64, use_runs=use_runs, timeout=60
        )
        assert_one_winner_each(winners, f"threads, runs={use_runs}")


def test_process_helper_counts_every_winner() -> None:
    """Separate processes have separate memory stores, so every claimer wins: the helper
    must report that rather than hide it."""
    winners = race_in_processes(
        "tests.test_memory_backend:memory_factory", claimers=3, rounds=2, timeout=60
    )
    assert winners == [3, 3]


async def test_claim_many() -> None:
    backend = MemoryBackend(clock=lambda: T0 + 10)
    job = unique_job("many")
    answers = await backend.claim_many(
        [
            ClaimInput(job, T0, "a", "A"),
            ClaimInput(job, T0, "b", "B"),
            ClaimInput(job, T0 + 1, "c", "C"),
            ClaimInput(job, T0, "a", "A"),
        ]
    )
    assert answers == [True, False, True, True]
    outcomes = await backend.runs.claim_many(
        [RunClaim(job, T0, "a", "A"), RunClaim(job, T0, "b", "B"), RunClaim(job, T0 + 5, "c", "C")]
    )
    assert outcomes == [ClaimOutcome.won(1), ClaimOutcome.running(1), ClaimOutcome.overlap(T0)]
    assert count_winners(answers) == 3
    assert count_winners(outcomes) == 1


async def test_takeover_names_the_new_owner_in_the_old_attempt() -> None:
    clock = FakeClock()
    backend = MemoryBackend(clock=clock)
    job = unique_job("takeover")
    assert await backend.runs.claim(RunClaim(job, T0, "a", "A", lease_ms=1000, max_attempts=2))
    clock.now += 1000
    outcome = await backend.runs.claim(
        RunClaim(job, T0, "b", "B", mode="takeover", lease_ms=1000, max_attempts=2)
    )
    assert outcome == ClaimOutcome.won(2)
    first = next(r for r in await backend.history(job, 10) if r.attempt == 1)
    assert first.status == "interrupted"
    assert first.error == "lease lapsed; taken over by B"
    assert first.duration_ms == 1000


async def test_takeover_keeps_a_result_the_runner_saved() -> None:
    clock = FakeClock()
    backend = MemoryBackend(clock=clock)
    job = unique_job("saved")
    await backend.runs.claim(RunClaim(job, T0, "a", "A", lease_ms=1000, max_attempts=2))
    result = StoredResult(T0, "A", 1, "failed", T0, T0 + 10, 10, error="boom")
    await backend.save_result(job, result, 10)
    clock.now += 5000
    outcome = await backend.runs.claim(RunClaim(job, T0, "b", "B", mode="takeover", max_attempts=2))
    assert outcome == ClaimOutcome.won(2)
    first = next(r for r in await backend.history(job, 10) if r.attempt == 1)
    assert (first.status, first.error) == ("failed", "boom")


def test_a_result_s_dict_is_a_copy_of_its_fields_and_reads_back() -> None:
    result = StoredResult(T0, "A", 2, "failed", T0, T0 + 10, 10, error="boom", manual=True,
                          reason="takeover")
    data = result.to_dict()
    assert data == dataclasses.asdict(result)
    data["by"] = "B"
    assert result.by == "A"
    assert StoredResult.from_dict(result.to_dict()) == result


async def test_lease_expiry_follows_the_store_clock() -> None:
    clock = FakeClock()
    runs = MemoryBackend(clock=clock).runs
    job = unique_job("clock")
    await runs.claim(RunClaim(job, T0, "a", "A", lease_ms=1000))
    clock.now += 999
    assert await runs.active(job) == [ActiveRun(T0, 1, True)]
    clock.now += 1
    assert await runs.active(job) == [ActiveRun(T0, 1, False)]
    assert await runs.heartbeat(job, T0, "a", 1000)
    assert await runs.active(job) == [ActiveRun(T0, 1, True)]


async def test_finished_runs_are_forgotten_after_keep_ms_but_running_ones_never() -> None:
    clock = FakeClock()
    clock.now = T0 + 1
    runs = MemoryBackend(clock=clock).runs
    job = unique_job("keep")
    await runs.claim(RunClaim(job, T0, "a", "A", keep_ms=20_000, overlap="allow"))
    await runs.claim(RunClaim(job, T0 + 1, "b", "B", keep_ms=20_000, overlap="allow"))
    assert await runs.finish(job, T0, "a", "success")
    clock.now += 20_000
    assert await runs.claim(RunClaim(job, T0, "c", "C", keep_ms=20_000)) == ClaimOutcome.done()
    clock.now += 1
    again = RunClaim(job, T0, "d", "D", keep_ms=20_000, overlap="allow")
    assert await runs.claim(again) == ClaimOutcome.won(1)
    clock.now += 3_600_000
    assert await runs.heartbeat(job, T0 + 1, "b", 1000)  # never forgotten while running
    assert await runs.claim(RunClaim(job, T0 + 1, "e", "E")) == ClaimOutcome.running(1)


async def test_retention_counts_from_the_slot_when_the_run_finished_before_it() -> None:
    """Issue 9, item 1: the store's clock stepped back, so the run ended "before" its slot.

    A late claimer of the slot may still arrive until slot + keep_ms: the run must be
    remembered until then, not only until finished_at + keep_ms.
    """
    clock = FakeClock()
    clock.now = T0
    runs = MemoryBackend(clock=clock).runs
    job = unique_job("fromslot")
    assert await runs.claim(RunClaim(job, T0, "a", "A", keep_ms=20_000)) == ClaimOutcome.won(1)
    clock.now = T0 - 5_000  # the store's clock steps back 5 s
    assert await runs.finish(job, T0, "a", "success")
    clock.now = T0 + 16_000  # finished_at + keep_ms has passed; slot + keep_ms has not
    late = RunClaim(job, T0, "b", "B", keep_ms=20_000)
    assert await runs.claim(late) == ClaimOutcome.done()
    clock.now = T0 + 20_001
    assert await runs.claim(late) == ClaimOutcome.won(1)


async def test_keep_ms_never_shrinks_and_has_a_floor() -> None:
    """Issue 9, items 3 and 10: a smaller keep_ms never shortens it; 1 ms means the floor."""
    clock = FakeClock()
    clock.now = T0
    runs = MemoryBackend(clock=clock).runs
    job = unique_job("grow")
    assert (await runs.claim(RunClaim(job, T0, "a", "A", keep_ms=60_000))).kind == "won"
    assert await runs.finish(job, T0, "a", "success")
    shrink = RunClaim(job, T0, "b", "B", keep_ms=MIN_KEEP_MS)
    assert await runs.claim(shrink) == ClaimOutcome.done()
    clock.now = T0 + 59_000
    assert await runs.claim(shrink) == ClaimOutcome.done()
    tiny = RunClaim(job, T0 + 1, "c", "C", keep_ms=1, max_attempts=2, overlap="allow")
    clock.now = T0 + 60_000
    assert await runs.claim(tiny) == ClaimOutcome.won(1)
    assert await runs.finish(job, T0 + 1, "c", "failed")
    clock.now += MIN_KEEP_MS - 1
    retry = RunClaim(job, T0 + 1, "d", "D", keep_ms=1, max_attempts=2, overlap="allow")
    assert await runs.claim(retry) == ClaimOutcome.won(2)


async def test_early_claims_wait_for_the_store_clock() -> None:
    """Issue 9, item 5: a claim that reaches the store before its slot starts nothing."""
    clock = FakeClock()
    clock.now = T0 - 5_000
    runs = MemoryBackend(clock=clock).runs
    job = unique_job("earlyclock")
    assert await runs.claim(RunClaim(job, T0, "a", "A")) == ClaimOutcome.early(5_000)
    assert await runs.active(job) == []
    clock.now = T0
    assert await runs.claim(RunClaim(job, T0, "a", "A")) == ClaimOutcome.won(1)


async def test_release_lapses_now_and_late_uses_the_store_clock() -> None:
    clock = FakeClock()
    runs = MemoryBackend(clock=clock).runs
    job = unique_job("late")
    outcome = await runs.claim(RunClaim(job, T0 - 60_001, "a", "A", max_late_ms=60_000))
    assert outcome == ClaimOutcome.late(60_001)
    assert await runs.claim(RunClaim(job, T0 - 60_000, "a", "A", max_late_ms=60_000)) == (
        ClaimOutcome.won(1)
    )
    assert await runs.release(job, T0 - 60_000, "a")
    assert await runs.active(job) == [ActiveRun(T0 - 60_000, 1, False)]


async def test_manual_runs_move_to_a_free_slot() -> None:
    backend = MemoryBackend(clock=FakeClock())
    job = unique_job("manual")
    assert await backend.record_manual_run(ClaimInput(job, T0, "m1", "A")) is None
    assert await backend.record_manual_run(ClaimInput(job, T0, "m2", "A")) == T0 + 1
    assert await backend.record_manual_run(ClaimInput(job, T0, "m3", "B")) == T0 + 2
    # a manual run never takes the scheduled claim of its slot
    assert await backend.claim(ClaimInput(job, T0, "s", "A")) is True
    records = await backend.history(job, 10)
    assert sorted((r.slot, r.manual) for r in records) == [
        (T0, False),
        (T0, True),
        (T0 + 1, True),
        (T0 + 2, True),
    ]


async def test_history_ttl_uses_the_store_clock() -> None:
    clock = FakeClock()
    backend = MemoryBackend(clock=clock)
    job = unique_job("ttl")
    await backend.claim(ClaimInput(job, T0, "a", "A"))
    await backend.save_result(job, StoredResult(T0, "A", 1, "success", T0, T0 + 10, 10), 10, 1000)
    clock.now += 1010
    await backend.claim(ClaimInput(job, T0 + 1010, "b", "A"))
    result = StoredResult(T0 + 1010, "A", 1, "success", T0 + 1010, T0 + 1011, 1)
    await backend.save_result(job, result, 10, 1000)
    assert [r.slot for r in await backend.history(job, 10)] == [T0 + 1010, T0]
    clock.now += 1
    await backend.save_result(job, result, 10, 1000)
    assert [r.slot for r in await backend.history(job, 10)] == [T0 + 1010]
