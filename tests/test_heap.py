"""engine/heap.py: what anarchon_worker does to its heap once its schedulers have started."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from django_anarchon.engine.heap import YOUNG_THRESHOLD, settle


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
    gc.set_threshold(50_000, 20, 30)
    settle()
    assert gc.get_threshold() == (50_000, 20, 30)
    gc.set_threshold(0, 10, 10)
    settle()
    assert gc.get_threshold()[0] == 0
