"""Absurd values are refused where they are given, and the documented maxima work.

Each refused value used to pass registration and ``manage.py check`` and break later:
``every(10**20)`` killed the worker and ``anarchon_jobs`` ("year 1918504 is out of
range"), a ``max_late`` or ``LEASE`` of 1e17 s failed every claim ("bigint out of
range"), ``history_size=10**20`` every save, a 300-character instance id every claim on
PostgreSQL and MariaDB, a NUL in a job name the start on PostgreSQL, ``timezone=""``
silently meant the default zone. The maxima themselves run on the real stores.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from django.test import override_settings

from django_anarchon import at, cron, every
from django_anarchon.backends.base import BaseBackend
from django_anarchon.backends.memory import MemoryBackend
from django_anarchon.checks import run_all
from django_anarchon.durations import MAX_DURATION_MS, parse_duration
from django_anarchon.engine import JobContext, Scheduler
from django_anarchon.exceptions import ConfigurationError
from django_anarchon.jobs import (
    MAX_ATTEMPTS,
    MAX_HISTORY_SIZE,
    MAX_INSTANCE_ID_LENGTH,
    check_instance_id,
)
from django_anarchon.registry import registry

CENTURY = "36525d"  # the longest duration taken


@pytest.fixture
def alias() -> Iterator[str]:
    """A scheduler alias of the test's own, so declared jobs never leak into others."""
    name = f"limits-{uuid.uuid4().hex[:8]}"
    yield name
    registry.forget(name)


def handler(ctx: Any) -> None:
    """A job body."""


def refused(call: Any, *args: Any, **kwargs: Any) -> ConfigurationError:
    with pytest.raises(ConfigurationError) as info:
        call(*args, **kwargs)
    return info.value


# -- durations ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value", [10**20, 1e17, "100000000w", "36526d", timedelta.max, timedelta(days=36_525, seconds=1)]
)
def test_a_duration_longer_than_a_century_is_refused(value: object) -> None:
    error = refused(parse_duration, value, job="j", option="max_late")
    assert (error.job, error.option, error.value) == ("j", "max_late", value)
    assert "100 years" in str(error)


def test_a_century_is_the_longest_duration_taken() -> None:
    assert parse_duration(CENTURY) == MAX_DURATION_MS == parse_duration(timedelta(days=36_525))


@pytest.mark.parametrize("interval", [10**20, "100000000w", 1e17])
def test_every_refuses_an_interval_past_the_limit(alias: str, interval: object) -> None:
    error = refused(every(interval, name="tick", scheduler=alias), handler)
    assert (error.job, error.option, error.value) == ("tick", "interval", interval)
    error = refused(Scheduler(MemoryBackend()).every, "tick", interval, handler)
    assert (error.job, error.option, error.value) == ("tick", "interval", interval)


@pytest.mark.parametrize("option", ["max_late", "jitter", "catch_up", "timeout", "history_ttl",
                                    "offset"])
def test_job_durations_past_the_limit_are_refused(alias: str, option: str) -> None:
    error = refused(every("1m", name="tick", scheduler=alias, **{option: 1e17}), handler)
    assert (error.job, error.option, error.value) == ("tick", option, 1e17)


@pytest.mark.parametrize(("option", "maximum"), [("history_size", MAX_HISTORY_SIZE),
                                                 ("max_attempts", MAX_ATTEMPTS)])
def test_sizes_past_their_maximum_are_refused(alias: str, option: str, maximum: int) -> None:
    for value in (10**20, maximum + 1):
        error = refused(every("1m", name="tick", scheduler=alias, **{option: value}), handler)
        assert (error.job, error.option, error.value) == ("tick", option, value)
        assert f"at most {maximum:,}" in str(error)
    every("1m", name=f"tick-{option}", scheduler=alias, **{option: maximum})(handler)


@pytest.mark.parametrize(("key", "value"), [("LEASE", 1e17), ("LEASE", "100000000w"),
                                            ("HEARTBEAT", 1e17), ("INSTANCE_ID", "i" * 300),
                                            ("INSTANCE_ID", "a\x00b"), ("INSTANCE_ID", "   "),
                                            ("JOB_DEFAULTS", {"max_late": 1e17}),
                                            ("JOB_DEFAULTS", {"history_size": 10**20}),
                                            ("THREADS", 10**9)])
def test_settings_past_the_limits_are_e001(key: str, value: object) -> None:
    saved = registry._functions, registry._classes, registry._names, registry._errors
    registry._functions, registry._classes, registry._names, registry._errors = {}, {}, {}, []
    try:
        with override_settings(ANARCHON={"default": {
            "BACKEND": "django_anarchon.backends.memory.MemoryBackend", key: value,
        }}):
            messages = run_all()
    finally:
        registry._functions, registry._classes, registry._names, registry._errors = saved
    assert [m.id for m in messages] == ["anarchon.E001"], messages
    assert key in messages[0].msg


def test_the_scheduler_refuses_a_lease_past_the_limit() -> None:
    error = refused(Scheduler, MemoryBackend(), lease=1e17)
    assert (error.option, error.value) == ("lease", 1e17)


def test_the_scheduler_refuses_threads_past_the_limit() -> None:
    error = refused(Scheduler, MemoryBackend(), threads=10**9)
    assert (error.option, error.value) == ("threads", 10**9)
    assert "from 1 to 1,000" in str(error)


# -- instance ids and names -----------------------------------------------------------


@pytest.mark.parametrize("value", ["i" * 256, "i" * 300, "", "  ", "a\x00b", "\ud800", 5, None])
def test_check_instance_id_refuses_what_a_store_cannot_hold(value: object) -> None:
    error = refused(check_instance_id, value, option="--instance-id")
    assert (error.option, error.value) == ("--instance-id", value)
    assert "'--instance-id'" in str(error)


@pytest.mark.parametrize("value", ["i" * 300, "a\x00b", " "])
def test_the_scheduler_refuses_a_bad_instance_id(value: str) -> None:
    error = refused(Scheduler, MemoryBackend(), name="s", instance_id=value)
    assert (error.option, error.value) == ("instance_id", value)
    assert "scheduler 's'" in str(error)


def test_an_instance_id_of_255_characters_is_taken() -> None:
    assert check_instance_id("i" * MAX_INSTANCE_ID_LENGTH) == "i" * 255
    assert Scheduler(MemoryBackend(), instance_id="i" * 255).instance_id == "i" * 255


@pytest.mark.parametrize("name", ["a\x00b", "\x00", "bad\ud800"])
def test_a_name_a_store_cannot_hold_is_refused(alias: str, name: str) -> None:
    error = refused(every("1m", name=name, scheduler=alias), handler)
    assert (error.option, error.value) == ("name", name)
    error = refused(Scheduler(MemoryBackend()).every, name, "1m", handler)
    assert (error.option, error.value) == ("name", name)


# -- time zones, cron and one-off instants --------------------------------------------


def test_an_empty_timezone_is_refused_not_the_default(alias: str) -> None:
    error = refused(cron("0 8 * * *", timezone="", name="report", scheduler=alias), handler)
    assert (error.job, error.option, error.value) == ("report", "timezone", "")
    error = refused(Scheduler(MemoryBackend()).cron, "report", "0 8 * * *", handler, timezone="")
    assert (error.job, error.option, error.value) == ("report", "timezone", "")


def test_a_backwards_cron_range_is_refused(alias: str) -> None:
    error = refused(cron("1-0 * * * *", name="every-minute?", scheduler=alias), handler)
    assert (error.job, error.option, error.value) == ("every-minute?", "expression", "1-0 * * * *")
    assert "runs backwards" in str(error)


@pytest.mark.parametrize(
    "when",
    ["9999-12-31T23:59:59-14:00", "9000-01-01T00:00:00+00:00", "1969-12-31T23:59:59+00:00",
     datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=1))), datetime.max.replace(tzinfo=UTC)],
)
def test_an_instant_outside_the_range_is_refused(alias: str, when: object) -> None:
    error = refused(at(when, name="someday", scheduler=alias), handler)
    assert (error.job, error.option, error.value) == ("someday", "when", when)
    assert "between 1970-01-01 and 9000-01-01" in str(error)


def test_the_last_instant_in_range_is_taken(alias: str) -> None:
    at("8999-12-31T23:59:59.999+00:00", name="far", scheduler=alias)(handler)
    assert Scheduler(MemoryBackend()).at("far", "8999-12-31T23:59:59Z", handler) is not None


# -- the maxima, on the real stores ---------------------------------------------------


def _database(request: pytest.FixtureRequest, fixture: str) -> Iterator[BaseBackend]:
    from django_anarchon.backends.database import DatabaseBackend

    request.getfixturevalue("database_access")
    yield DatabaseBackend(using=request.getfixturevalue(fixture))


def _redis() -> Iterator[BaseBackend]:
    from django_anarchon.backends.redis import RedisBackend

    from .redis_support import delete_prefix, redis_url

    url, prefix = redis_url(), f"anarchon-limits-{uuid.uuid4().hex[:12]}"
    try:
        yield RedisBackend(url=url, strategy="lease", key_prefix=prefix)
    finally:
        delete_prefix(url, prefix)


@pytest.fixture(params=[
    "memory",
    pytest.param("postgres", marks=pytest.mark.postgres),
    pytest.param("mysql", marks=pytest.mark.mysql),
    "sqlite",
    pytest.param("redis", marks=pytest.mark.redis),
])
def lease_backend(request: pytest.FixtureRequest) -> Iterator[BaseBackend]:
    kind: str = request.param
    if kind == "memory":
        yield MemoryBackend()
    elif kind == "redis":
        yield from _redis()
    else:
        yield from _database(request, f"{kind}_database")


async def test_every_maximum_runs_on_the_store(lease_backend: BaseBackend) -> None:
    """A century-long lease, interval, catch-up and retention, the largest sizes, a 255-character
    instance id: the catch-up claim (slot 0, kept for two centuries), a manual run, history and
    the next-run time all work."""
    scheduler = Scheduler(lease_backend, instance_id="i" * MAX_INSTANCE_ID_LENGTH, lease=CENTURY,
                          heartbeat="1s")
    ran: list[tuple[int, str]] = []
    first_ran = asyncio.Event()

    async def century(ctx: JobContext) -> None:
        ran.append((ctx.slot, ctx.reason))
        first_ran.set()

    name = f"century-{uuid.uuid4().hex[:8]}"
    # A store that forgets claims (Redis: after a day) takes no max_late as long as that.
    windowed = math.isfinite(getattr(lease_backend, "dedupe_window_ms", math.inf))
    scheduler.every(name, CENTURY, century, max_late="1h" if windowed else CENTURY,
                    catch_up=CENTURY,
                    history_size=MAX_HISTORY_SIZE, history_ttl=CENTURY, timeout=CENTURY,
                    max_attempts=MAX_ATTEMPTS)
    await scheduler.start()
    try:
        await asyncio.wait_for(first_ran.wait(), 30)
        deadline = time.monotonic() + 30
        # The newest century slot, 1970-01-01: within max_late, or else within catch_up.
        assert ran == [(0, "catch-up" if windowed else "scheduled")]
        while time.monotonic() < deadline:
            history = await scheduler.ahistory(name)
            if history and history[0].status != "running":
                break
            await asyncio.sleep(0.05)
        manual = await scheduler.arun_now(name)
        assert (manual.status, manual.instance_id) == ("success", "i" * 255)
        history = await scheduler.ahistory(name)
        assert sorted((r.slot == 0, r.status) for r in history) == [
            (False, "success"), (True, "success")
        ]
        (info,) = [j for j in scheduler.jobs() if j.name == name]
        assert info.next_run_at == datetime(2070, 1, 1, tzinfo=UTC)  # 0 + 36,525 days
    finally:
        await scheduler.stop()
        await lease_backend.close()
