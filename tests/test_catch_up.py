"""``catch_up_mode``: "latest", "all" (bounded by ``catch_up_limit``) and "none".

Every store here starts empty, so every slot of the window was missed: nobody ran it.
The memory store runs on the true clock while the worker's clock is skewed (as in
tests/test_engine_claims.py); PostgreSQL and Redis keep their own clocks.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from django_anarchon import ConfigurationError
from django_anarchon.backends.memory import MemoryBackend
from django_anarchon.engine import JobContext, Scheduler

from .test_engine_support import Calls, ClaimOnlyMemoryBackend, real_ms, stop_all, wait_for

#: Every test here runs on the shared test databases: a job name of its own keeps their
#: history apart from the other modules' (tests/test_job_names.py has a "report" too).
REPORT = "catch-up.report"


def _recorder(calls: Calls) -> Any:
    def handler(ctx: JobContext) -> None:
        calls.add(by=ctx.instance_id, slot=ctx.slot, reason=ctx.reason, start=real_ms())
        time.sleep(0.02)  # long enough for two catch-up runs at once to show as overlapping
        calls.add(end_of=ctx.slot, at=real_ms())

    return handler


async def _clear_of_a_slot() -> None:
    """Wait until 300 ms past a whole second: a 1 s slot is then past ``max_late`` (100 ms)."""
    await asyncio.sleep(((300 - real_ms() % 1000) % 1000) / 1000)


def _catch_ups(calls: Calls) -> list[dict[str, Any]]:
    return [c for c in calls.items if c.get("reason") == "catch-up"]


@pytest.fixture(params=["memory", "redis", "postgres"])
def backend_pair(request: pytest.FixtureRequest) -> Iterator[tuple[Any, Any]]:
    """Two backend objects on one store (two connections, for the real servers)."""
    if request.param == "memory":
        shared = MemoryBackend()
        yield shared, shared
    elif request.param == "redis":
        from django_anarchon.backends.redis import RedisBackend

        from .redis_support import delete_prefix, redis_url

        url, prefix = redis_url(), f"catchup-{uuid.uuid4().hex[:8]}"
        try:
            yield (RedisBackend(url=url, strategy="lease", key_prefix=prefix),
                   RedisBackend(url=url, strategy="lease", key_prefix=prefix))
        finally:
            delete_prefix(url, prefix)
    else:
        from django_anarchon.backends.database import DatabaseBackend

        alias = request.getfixturevalue("postgres_database")
        request.getfixturevalue("database_access")
        yield DatabaseBackend(using=alias), DatabaseBackend(using=alias)


@pytest.fixture
async def store_pair(backend_pair: tuple[Any, Any]) -> AsyncIterator[tuple[Any, Any]]:
    """``backend_pair``, closed on the test's loop: a database backend's connection
    threads would outlive the test otherwise (and count as another test's threads)."""
    yield backend_pair
    for backend in set(backend_pair):
        await backend.close()


async def test_all_runs_the_newest_missed_slots_once_oldest_first_across_instances(
    store_pair: tuple[Any, Any],
) -> None:
    """Two instances start together: each of the 4 newest missed slots runs once, in order."""
    calls = Calls()
    schedulers = []
    for name, backend in zip("AB", store_pair, strict=True):
        s = Scheduler(backend, instance_id=name)
        s.every(REPORT, "1s", _recorder(calls), max_late="100ms", catch_up="30s",
                catch_up_mode="all", catch_up_limit=4)
        schedulers.append(s)
    await _clear_of_a_slot()
    started = real_ms()
    for s in schedulers:
        await s.start()
    try:
        await wait_for(lambda: len(_catch_ups(calls)) >= 4
                       and len([c for c in calls.items if "end_of" in c]) >= 4, 15,
                       "four catch-up runs")
        await wait_for(lambda: not any(s.jobs()[0].running_here for s in schedulers), 5,
                       "the runs to end")
    finally:
        await stop_all(*schedulers)
    caught = _catch_ups(calls)
    slots = [c["slot"] for c in caught]
    assert len(slots) == len(set(slots)) == 4, caught
    newest = started // 1000 * 1000  # past max_late at start: the newest missed slot
    assert sorted(slots) == list(range(newest - 3_000, newest + 1_000, 1_000)), (slots, newest)
    # Oldest first, one at a time: each starts after the previous one ended.
    by_start = sorted(caught, key=lambda c: c["start"])
    assert [c["slot"] for c in by_start] == sorted(slots)
    ends = {c["end_of"]: c["at"] for c in calls.items if "end_of" in c}
    for before, after in itertools.pairwise(by_start):
        assert after["start"] >= ends[before["slot"]], (before, after)


@pytest.mark.parametrize("overlap", ["cancel_other", "buffer_one"])
async def test_catch_up_slots_neither_cancel_nor_buffer_one_another(overlap: str) -> None:
    """Two instances walk the same missed slots: with ``cancel_other`` the second's claim
    of the next slot would cancel the first's run, were catch-up claims not waiting."""
    backend = MemoryBackend()
    calls = Calls()
    schedulers = []
    for name in "AB":
        s = Scheduler(backend, instance_id=name)
        s.every(REPORT, "1s", _recorder(calls), max_late="100ms", catch_up="30s",
                catch_up_mode="all", catch_up_limit=3, overlap=overlap)
        schedulers.append(s)
    await _clear_of_a_slot()
    for s in schedulers:
        await s.start()
    try:
        await wait_for(lambda: len([c for c in calls.items if "end_of" in c]) >= 3, 10,
                       "three catch-up runs to end")
        await wait_for(lambda: not any(s.jobs()[0].running_here for s in schedulers), 5,
                       "the runs to end")
        history = await schedulers[0].ahistory(REPORT, limit=100)
    finally:
        await stop_all(*schedulers)
    caught = [r for r in history if r.reason == "catch-up"]
    assert len(caught) == 3 and {r.status for r in caught} == {"success"}, caught


async def test_all_reaches_the_store_windows_far_end_from_a_worker_ahead(skew: Any) -> None:
    """5 s ahead, a window counted on the worker's clock would miss its oldest 5 s."""
    skew(5_000)
    backend = MemoryBackend(clock=real_ms)
    calls = Calls()
    s = Scheduler(backend, instance_id="ahead")
    s.every(REPORT, "1s", _recorder(calls), max_late="100ms", catch_up="10s",
            catch_up_mode="all", catch_up_limit=100, overlap="allow")
    started = real_ms()
    await s.start()
    try:
        await wait_for(lambda: any(c["slot"] <= started - 8_000 for c in _catch_ups(calls)), 10,
                       "a catch-up run of a slot 8 s back by the store's clock")
    finally:
        await stop_all(s)
    for call in _catch_ups(calls):
        assert call["slot"] >= started - 10_000, "a slot outside the store's window ran"
        assert call["start"] >= call["slot"], "a slot started before it was due"


async def test_all_never_reaches_past_the_store_window_from_a_worker_behind(skew: Any) -> None:
    """8 s behind, the worker would count the window 8 s too far back; the store refuses."""
    skew(-8_000)
    backend = MemoryBackend(clock=real_ms)
    calls = Calls()
    s = Scheduler(backend, instance_id="behind")
    s.every(REPORT, "1s", _recorder(calls), max_late="100ms", catch_up="10s",
            catch_up_mode="all", catch_up_limit=100)
    started = real_ms()
    await s.start()
    try:
        await wait_for(lambda: len(_catch_ups(calls)) >= 1, 10, "a catch-up run")
        await wait_for(lambda: not s.jobs()[0].running_here, 5, "the runs to end")
    finally:
        await stop_all(s)
    slots = sorted(c["slot"] for c in _catch_ups(calls))
    assert slots and min(slots) >= started - 10_000, slots


async def test_none_catches_nothing_up_even_with_a_window() -> None:
    calls = Calls()
    s = Scheduler(MemoryBackend(), instance_id="A")
    s.every(REPORT, "1s", _recorder(calls), max_late="100ms", catch_up="30s",
            catch_up_mode="none")
    await s.start()
    try:
        await wait_for(lambda: any(c.get("reason") == "scheduled" for c in calls.items), 5,
                       "a scheduled run")
    finally:
        await stop_all(s)
    assert not _catch_ups(calls)


async def test_latest_still_runs_only_the_newest_missed_slot() -> None:
    calls = Calls()
    s = Scheduler(MemoryBackend(), instance_id="A")
    s.every(REPORT, "1s", _recorder(calls), max_late="100ms", catch_up="30s")
    await _clear_of_a_slot()
    started = real_ms()
    await s.start()
    try:
        await wait_for(lambda: bool(_catch_ups(calls)), 5, "the catch-up run")
        await wait_for(lambda: any(c.get("reason") == "scheduled" for c in calls.items), 5,
                       "a scheduled run")
    finally:
        await stop_all(s)
    (caught,) = _catch_ups(calls)
    assert caught["slot"] == started // 1000 * 1000, caught


def test_a_one_off_in_the_past_with_mode_none_is_expired() -> None:
    s = Scheduler(MemoryBackend())
    job = s.at("launch", "2020-01-01T00:00:00Z", lambda: None, catch_up="36500d",
               catch_up_mode="none")
    assert job.is_expired()
    other = s.at("launch2", "2020-01-01T00:00:00Z", lambda: None, catch_up="36500d")
    assert not other.is_expired()


@pytest.mark.parametrize(
    ("options", "option", "message"),
    [
        ({"catch_up": "1h", "catch_up_mode": "every"}, "catch_up_mode", "'latest', 'all' or 'none'"),
        ({"catch_up_mode": "all"}, "catch_up_mode", "needs a catch_up window"),
        ({"catch_up": "1h", "catch_up_limit": 5}, "catch_up_limit", "only with catch_up_mode='all'"),
        ({"catch_up": "1h", "catch_up_mode": "all", "catch_up_limit": 0}, "catch_up_limit",
         "at least 1"),
        ({"catch_up": "1h", "catch_up_mode": "all", "catch_up_limit": 1001}, "catch_up_limit",
         "at most 1,000"),
        ({"catch_up": "1h", "catch_up_mode": "all", "catch_up_limit": "5"}, "catch_up_limit",
         "whole number"),
    ],
)
def test_bad_catch_up_options_name_the_job_option_and_value(
    options: dict[str, Any], option: str, message: str
) -> None:
    s = Scheduler(MemoryBackend())
    with pytest.raises(ConfigurationError) as info:
        s.every(REPORT, "1s", lambda: None, **options)
    text = str(info.value)
    assert "report" in text and option in text and message in text, text


def test_catch_up_limit_is_refused_on_a_one_off() -> None:
    s = Scheduler(MemoryBackend())
    with pytest.raises(ConfigurationError, match="catch_up_limit"):
        s.at("launch", "2030-01-01T00:00:00Z", lambda: None, catch_up_limit=3)


def test_a_store_without_leases_refuses_catch_up_mode() -> None:
    s = Scheduler(ClaimOnlyMemoryBackend())
    with pytest.raises(ConfigurationError) as info:
        s.every(REPORT, "1s", lambda: None, catch_up_mode="none")
    assert "catch_up_mode" in str(info.value) and "leases" in str(info.value)
