"""engine/heap.py: what anarchon_worker does to its heap once its schedulers have started."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from django_anarchon.backends.memory import MemoryBackend
from django_anarchon.engine import JobContext, Scheduler
from django_anarchon.engine.heap import (
    QUIET_AHEAD_MS,
    QUIET_LEAST_YOUNG,
    QUIET_MOST_NEW,
    YOUNG_THRESHOLD,
    collect_when_quiet,
    quiet,
    settle,
)

from .test_engine_support import stop_all, wait_for


@pytest.fixture
def restored_gc() -> Iterator[None]:
    threshold = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


@pytest.mark.usefixtures("restored_gc")
def test_settle_freezes_what_lives_and_collects_the_young_less_often() -> None:
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    kept = [{"long": "lived"} for _ in range(100)]
    settle()
    assert gc.get_freeze_count() >= len(kept)
    assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)


@pytest.mark.usefixtures("restored_gc")
def test_settle_leaves_a_larger_threshold_and_a_disabled_collector_alone() -> None:
    gc.set_threshold(YOUNG_THRESHOLD * 2, 20, 30)
    settle()
    assert gc.get_threshold() == (YOUNG_THRESHOLD * 2, 20, 30)
    gc.set_threshold(0, 10, 10)
    settle()
    assert gc.get_threshold()[0] == 0


def test_quiet_is_a_lull_with_enough_to_collect_and_no_timer_near() -> None:
    now = 1_000_000
    far = now + QUIET_AHEAD_MS
    assert quiet(QUIET_LEAST_YOUNG, 0, far, now)
    assert quiet(QUIET_LEAST_YOUNG, -QUIET_MOST_NEW, None, now)  # frees count as activity too
    assert not quiet(QUIET_LEAST_YOUNG - 1, 0, None, now)  # too little to be worth it
    assert not quiet(50_000, QUIET_MOST_NEW + 1, None, now)  # still allocating: a burst
    assert not quiet(50_000, -QUIET_MOST_NEW - 1, None, now)
    assert not quiet(50_000, 0, far - 1, now)  # a slot soon: the collection would delay it


class _Collections:
    """The collector's collections while it is installed (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "stop":
            self.seen.append(info)

    def big(self) -> bool:
        return any(info["collected"] >= QUIET_LEAST_YOUNG for info in self.seen)


def _garbage() -> None:
    """What a burst leaves behind: objects in reference cycles, which only a collection
    frees, more than a quiet collection waits for."""
    for _ in range(2 * QUIET_LEAST_YOUNG):
        cycle: list[Any] = []
        cycle.append(cycle)


@contextlib.asynccontextmanager
async def _quiet_collector(
    every: str, old_threshold: int = 10
) -> AsyncIterator[tuple[_Collections, list[int]]]:
    """A scheduler with one job ``every`` so often and the quiet collector beside it, with
    the automatic collections out of the way: the collections seen, and the runs' slots."""
    seen, runs = _Collections(), []

    def ran(ctx: JobContext) -> None:
        runs.append(ctx.slot)

    scheduler = Scheduler(MemoryBackend(), instance_id="A", spool=None)
    scheduler.every(f"heap-{uuid.uuid4().hex[:8]}", every, ran)
    await scheduler.start()
    gc.collect()
    gc.set_threshold(100 * YOUNG_THRESHOLD, 10, old_threshold)  # only the quiet collector
    gc.callbacks.append(seen)
    task = asyncio.create_task(collect_when_quiet([scheduler]))
    try:
        yield seen, runs
    finally:
        task.cancel()
        gc.callbacks.remove(seen)
        await stop_all(scheduler)


@pytest.mark.usefixtures("restored_gc")
async def test_collect_when_quiet_collects_what_a_burst_left_once_it_is_over() -> None:
    async with _quiet_collector("1h") as (seen, _):
        _garbage()
        await wait_for(seen.big, 5, "a quiet collection of the garbage")


@pytest.mark.usefixtures("restored_gc")
async def test_collect_when_quiet_waits_while_a_slot_is_near() -> None:
    async with _quiet_collector("100ms") as (seen, runs):  # a slot always within 100 ms
        _garbage()
        start = len(runs)
        await wait_for(lambda: len(runs) >= start + 8, 5, "eight slots (eight looks)")
        assert not seen.big(), seen.seen


@pytest.mark.usefixtures("restored_gc")
async def test_collect_when_quiet_collects_the_oldest_generation_by_pythons_rule() -> None:
    """Garbage that lived through two collections (a burst's objects that were still in
    use then) is freed only by a full collection: the quiet collector makes one once the
    middle generation has been collected ``threshold[2]`` times (here 0)."""
    async with _quiet_collector("1h", old_threshold=0) as (seen, _):
        kept: list[list[Any]] = []
        for _ in range(QUIET_LEAST_YOUNG):
            cycle: list[Any] = []
            cycle.append(cycle)
            kept.append(cycle)
        gc.collect(1)  # alive through it: now in the oldest generation
        kept.clear()
        _garbage()  # young garbage, for a quiet collection to be worth it
        await wait_for(
            lambda: any(i["generation"] == 2 and i["collected"] > 2 * QUIET_LEAST_YOUNG
                        for i in seen.seen),
            5, "a full quiet collection",
        )
