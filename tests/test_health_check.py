"""django_anarchon.contrib.health_check against real stores, through django-health-check.

The database backend on SQLite and PostgreSQL (this run's own databases, see conftest),
and a Redis URL where nothing listens for the unreachable store.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.test import RequestFactory, override_settings
from health_check.views import HealthCheckView

from django_anarchon.contrib.health_check import Jobs, Store
from django_anarchon.exceptions import ConfigurationError
from django_anarchon.handler import schedulers

from .redis_support import free_port

pytestmark = pytest.mark.usefixtures("database_access")


@pytest.fixture(params=["sqlite_database", "postgres_database"])
def database(request: pytest.FixtureRequest) -> Iterator[str]:
    alias: str = request.getfixturevalue(request.param)
    config = {"default": {"BACKEND": "django_anarchon.backends.database.DatabaseBackend",
                          "OPTIONS": {"using": alias}}}
    with override_settings(ANARCHON=config):
        yield alias


async def until(condition: Callable[[], Any], seconds: float, what: str) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        result = await condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {seconds}s waiting for {what}")
        await asyncio.sleep(0.05)


async def error_of(check: Any) -> str | None:
    result = await check.get_result()
    return None if result.error is None else str(result.error)


async def test_the_view_reports_a_reachable_store_and_jobs(database: str) -> None:
    view = HealthCheckView.as_view(checks=[
        "django_anarchon.contrib.health_check.Store",
        ("django_anarchon.contrib.health_check.Jobs", {"missed_slots": 3}),
    ])
    response = await view(RequestFactory().get("/ht/?format=json"))
    assert response.status_code == 200, response.content
    body = json.loads(response.content)
    assert set(body.values()) == {"OK"}, body
    assert len(body) == 2


async def test_an_unreachable_store_fails_without_its_url() -> None:
    url = f"redis://:s3cret-pw@127.0.0.1:{free_port()}/0"
    config = {"default": {"BACKEND": "django_anarchon.backends.redis.RedisBackend",
                          "OPTIONS": {"url": url}}}
    with override_settings(ANARCHON=config):
        error = await error_of(Store())
        view = HealthCheckView.as_view(checks=["django_anarchon.contrib.health_check.Store"])
        response = await view(RequestFactory().get("/ht/?format=text"))
    assert error is not None and error.startswith(
        "Unavailable: the store of scheduler 'default' failed: "
    ), error
    assert "s3cret" not in error and "redis://" not in error
    assert response.status_code == 500
    assert b"s3cret" not in response.content


async def test_dead_mans_switch(database: str) -> None:
    scheduler = schedulers["default"]
    ok, never = f"hc-ok-{uuid.uuid4().hex[:8]}", f"hc-never-{uuid.uuid4().hex[:8]}"
    scheduler.every(ok, "200ms", lambda ctx: None)
    scheduler.every(never, "200ms", lambda ctx: None)
    check = Jobs(missed_slots=2)
    # Neither has run: both are judged from this first check, so both are fine for now.
    assert await error_of(check) is None
    await scheduler.arun_now(ok)  # a success now
    assert await error_of(check) is None
    # Three slots later (more than missed_slots) both are overdue.
    async def both_overdue() -> str | None:
        error = await error_of(check)
        return error if error and ok in error and never in error else None

    error = await until(both_overdue, 5, "both jobs overdue")
    assert error.startswith("Unavailable: no success in the last 2 slots: "), error
    assert f"default:{ok}" in error and f"default:{never}" in error
    assert "default:testapp.hourly_cleanup" not in error  # hourly: not 3 slots behind yet
    await scheduler.arun_now(ok)
    error = await error_of(check)
    assert error is not None and f"default:{ok}" not in error and f"default:{never}" in error
    # The bound is the check's: with a large one, nothing is behind yet.
    assert await error_of(Jobs(missed_slots=1000)) is None


def test_the_setting_and_its_error() -> None:
    with (
        override_settings(ANARCHON_HEALTH_MISSED_SLOTS=0),
        pytest.raises(ConfigurationError, match="ANARCHON_HEALTH_MISSED_SLOTS"),
    ):
        asyncio.run(Jobs().run())
