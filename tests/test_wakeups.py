"""Wake-ups: a hand-over and a "Run now" start within a second, on the store's push channel.

Two schedulers in one process, each on its own backend object (its own connections),
against the real PostgreSQL and Redis servers. Heartbeat and poll intervals are 10 s or
more, so only a wake-up can explain a start within a second. Every wait is a condition
with a deadline.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.test import override_settings

from django_anarchon.backends.base import BaseBackend, Wakeup
from django_anarchon.backends.memory import MemoryBackend
from django_anarchon.engine import JobContext, Scheduler
from django_anarchon.models import RunRequest
from django_anarchon.run_requests import file_request, pickup_loop

from .broker_support import delete_nats_streams, nats_url
from .redis_support import ValkeyServer, delete_prefix, redis_url, valkey_server
from .test_engine_support import wait_for

pytestmark = pytest.mark.usefixtures("database_access")

#: What "at once" means here, against heartbeats and polls of 10 s.
BOUND_S = 1.0
SLOW = {"lease": "60s", "heartbeat": "10s"}
_names = itertools.count()


@dataclass
class Store:
    """How to build backends on one store, and how to cut their listening connections."""

    name: str
    make: Callable[[], BaseBackend]
    settings: dict[str, Any]
    kill_listeners: Callable[[], int]
    #: The database alias for the run requests' table.
    requests_alias: str = "sqlite"


def _pg_kill(alias: str) -> Callable[[], int]:
    from django.db import connections

    from django_anarchon.backends.database.listen import APPLICATION_NAME

    def kill() -> int:
        with connections[alias].cursor() as cursor:
            cursor.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND application_name = %s",
                [APPLICATION_NAME],
            )
            killed: int = cursor.fetchone()[0]
        connections[alias].close()
        return killed

    return kill


def _redis_kill(url: str, prefix: str) -> Callable[[], int]:
    import redis

    def kill() -> int:
        client = redis.Redis.from_url(url)
        try:
            mine = [c for c in client.client_list(_type="pubsub") if c.get("name") == f"{prefix}:wake"]
            for c in mine:
                client.execute_command("CLIENT", "KILL", "ID", c["id"])
            return len(mine)
        finally:
            client.close()

    return kill


def _store(request: pytest.FixtureRequest, name: str) -> Iterator[Store]:
    if name == "postgres":
        from django_anarchon.backends.database import DatabaseBackend

        alias = request.getfixturevalue("postgres_database")
        pg: dict[str, Any] = {"using": alias}
        yield Store(
            "postgres", lambda: DatabaseBackend(**pg),
            {"BACKEND": "django_anarchon.backends.database.DatabaseBackend", "OPTIONS": pg},
            _pg_kill(alias), alias,
        )
        return
    request.getfixturevalue("sqlite_database")
    token = secrets.token_hex(4)
    if name == "nats":
        from django_anarchon.backends.nats import NatsBackend

        url = nats_url()
        nats: dict[str, Any] = {"url": url, "stream_prefix": f"WAKE_{token}",
                                "subject_prefix": f"wake-{token}"}
        try:
            yield Store(
                "nats", lambda: NatsBackend(**nats),  # type: ignore[arg-type]
                {"BACKEND": "django_anarchon.backends.nats.NatsBackend", "OPTIONS": nats},
                lambda: 0,
            )
        finally:
            asyncio.run(delete_nats_streams(url, f"WAKE_{token}"))
        return
    from django_anarchon.backends.redis import RedisBackend
    from django_anarchon.backends.valkey import ValkeyBackend

    if name == "valkey":
        url, cls = request.getfixturevalue("valkey").url, ValkeyBackend
    else:
        url, cls = redis_url(), RedisBackend
    prefix = f"wake-{token}"
    options = {"url": url, "key_prefix": prefix}
    try:
        yield Store(
            name, lambda: cls(**options),
            {"BACKEND": f"{cls.__module__}.{cls.__qualname__}", "OPTIONS": options},
            _redis_kill(url, prefix),
        )
    finally:
        delete_prefix(url, prefix)


@pytest.fixture(scope="module")
def valkey() -> Iterator[ValkeyServer]:
    with valkey_server() as server:
        yield server


_LEASE_STORES = [
    pytest.param("postgres", marks=pytest.mark.postgres),
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("valkey", marks=pytest.mark.redis),
]


@pytest.fixture(params=_LEASE_STORES)
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    """A store with leases and a push channel."""
    yield from _store(request, request.param)


@pytest.fixture(params=[*_LEASE_STORES, pytest.param("nats", marks=pytest.mark.nats)])
def request_store(request: pytest.FixtureRequest) -> Iterator[Store]:
    """A store with a push channel for run requests (NATS has no leases to release)."""
    yield from _store(request, request.param)


class _RequestsOn:
    """A router that sends the app's tables (the run requests) to one alias."""

    def __init__(self, alias: str) -> None:
        self.alias = alias

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return self.alias if model._meta.app_label == "django_anarchon" else None

    db_for_write = db_for_read


class Starts:
    """Every start of every scheduler, with the loop time it happened at."""

    def __init__(self, *schedulers: Scheduler) -> None:
        self.items: list[tuple[str, int, str, float]] = []
        for s in schedulers:
            s.on("start", self._add)

    def _add(self, event: Any) -> None:
        r = event.record
        self.items.append((r.instance_id, r.attempt, r.reason, time.monotonic()))

    def by(self, *, reason: str) -> list[tuple[str, int, str, float]]:
        return [item for item in self.items if item[2] == reason]


async def _long(ctx: JobContext) -> None:
    await ctx.signal.sleep(120)  # until the stop aborts it


def _pair(store: Store, job: str, name: str = "default") -> tuple[Scheduler, Scheduler]:
    when = datetime.now(UTC) + timedelta(milliseconds=300)
    pair = []
    for instance in ("A", "B"):
        s = Scheduler(store.make(), name=name, instance_id=instance, **SLOW)  # type: ignore[arg-type]
        s.at(job, when, _long, max_attempts=2)
        pair.append(s)
    return pair[0], pair[1]


async def _listening(*schedulers: Scheduler) -> None:
    """Until each listener has connected (it says so with a ``resync`` hint)."""
    await wait_for(lambda: all(s.wakes.count > 0 for s in schedulers), 10, "the listeners")


async def _running_and_watched(
    a: Scheduler, b: Scheduler, starts: Starts, job: str, listening: bool = True
) -> tuple[Scheduler, Scheduler]:
    """Once one of them runs the job and the other watches it: (runner, backup)."""
    if listening:
        await _listening(a, b)
    await wait_for(lambda: len(starts.items) == 1, 10, "the first run")
    runner, backup = (a, b) if starts.items[0][0] == "A" else (b, a)
    await wait_for(lambda: any(j == job for j, _ in backup._claims.watching), 10, "the watch")
    return runner, backup


async def _handover_latency(runner: Scheduler, starts: Starts) -> float:
    began = time.monotonic()
    await runner.stop("5s")
    await wait_for(lambda: starts.by(reason="takeover"), 5, "the takeover")
    return starts.by(reason="takeover")[0][3] - began


async def _close(*schedulers: Scheduler) -> None:
    for s in schedulers:
        await s.stop("2s")
        await s.backend.close()


async def test_a_released_run_is_taken_over_within_a_second(store: Store) -> None:
    job = f"wake.handover.{next(_names)}"
    a, b = _pair(store, job)
    starts = Starts(a, b)
    await a.start()
    await b.start()
    try:
        runner, backup = await _running_and_watched(a, b, starts, job)
        latency = await _handover_latency(runner, starts)
        assert latency < BOUND_S, f"{store.name}: takeover {latency:.3f}s after the stop"
        (taken,) = starts.by(reason="takeover")
        assert taken[0] == backup.instance_id and taken[1] == 2
    finally:
        await _close(a, b)


async def test_repeated_and_forged_hints_never_run_a_slot_twice(store: Store) -> None:
    job = f"wake.dup.{next(_names)}"
    a, b = _pair(store, job)
    starts = Starts(a, b)
    lost: list[Any] = []
    for s in (a, b):
        s.on("lost", lost.append)
    await a.start()
    await b.start()
    try:
        runner, backup = await _running_and_watched(a, b, starts, job)
        # Forged: nothing was released, so the backup's look finds the lease alive.
        seen = backup.wakes.count
        for _ in range(3):
            await backup.backend.wake(Wakeup("released", job=job))
        await wait_for(lambda: backup.wakes.count >= seen + 3, 5, "the forged hints")
        await wait_for(lambda: len(backup._claims.watching) == 1, 5, "the watch going on")
        latency = await _handover_latency(runner, starts)
        assert latency < BOUND_S
        # Repeated: the released hint again, after the backup took the run over.
        seen = backup.wakes.count
        for _ in range(3):
            await runner.backend.wake(Wakeup("released", job=job))
        await wait_for(lambda: backup.wakes.count >= seen + 3, 5, "the repeated hints")
        await backup.stop("5s")
        assert [(i[1], i[2]) for i in starts.items] == [(1, "scheduled"), (2, "takeover")]
        assert not lost
        history = await backup.ahistory(job, 10)
        assert sorted(r.attempt for r in history) == [1, 2], history
    finally:
        await _close(a, b)


async def test_the_listener_comes_back_after_its_connection_is_killed(store: Store) -> None:
    job = f"wake.kill.{next(_names)}"
    a, b = _pair(store, job)
    starts = Starts(a, b)
    await a.start()
    await b.start()
    try:
        runner, backup = await _running_and_watched(a, b, starts, job)
        resyncs = backup.wakes.count
        killed = await asyncio.to_thread(store.kill_listeners)
        assert killed == 2, f"expected both listeners, killed {killed}"
        # Each listener reconnects and says so with a "resync" hint.
        await wait_for(lambda: backup.wakes.count > resyncs, 10, "the reconnection")
        latency = await _handover_latency(runner, starts)
        assert latency < BOUND_S, f"{store.name}: takeover {latency:.3f}s after reconnecting"
    finally:
        await _close(a, b)


async def test_a_run_request_starts_within_a_second(request_store: Store) -> None:
    store = request_store
    alias, job = f"wake-{next(_names)}", "wake.request"
    ran: list[float] = []

    def handler(ctx: JobContext) -> None:
        ran.append(time.monotonic())

    def ran_requests() -> int:
        """Requests filed for ``alias``, or -1 while one has not started yet."""
        requests = RunRequest.objects.filter(scheduler=alias)
        return -1 if requests.filter(slot__isnull=True).exists() else requests.count()

    workers = [Scheduler(store.make(), name=alias, instance_id=i, **SLOW) for i in ("A", "B")]  # type: ignore[arg-type]
    for w in workers:
        w.every(job, "1d", handler)
    with override_settings(
        ANARCHON={alias: store.settings}, DATABASE_ROUTERS=[_RequestsOn(store.requests_alias)]
    ):
        for w in workers:
            await w.start()
        await _listening(*workers)
        pickers = [asyncio.create_task(pickup_loop([w], poll_s=10)) for w in workers]
        try:
            # The first request may be found by a worker's first poll; after it, both wait 10 s.
            await asyncio.to_thread(file_request, alias, job, requested_by="test")
            await wait_for(lambda: len(ran) == 1, 10, "the first request")
            deadline = time.monotonic() + 5
            while await asyncio.to_thread(ran_requests) != 1:  # the ORM, off the loop
                assert time.monotonic() < deadline, "the first request's slot"
                await asyncio.sleep(0.02)
            for n in (2, 3):
                began = time.monotonic()
                # As a web request would: another thread, no event loop of its own.
                await asyncio.to_thread(file_request, alias, job, requested_by="test")
                await wait_for(lambda n=n: len(ran) == n, 5, f"request {n}")
                assert ran[-1] - began < BOUND_S, f"{store.name}: {ran[-1] - began:.3f}s"
            # Repeated hints: the workers look again and find nothing to run.
            seen = [w.wakes.count for w in workers]
            for _ in range(3):
                await workers[0].backend.wake(Wakeup("run-request", job=job, scheduler=alias))
            await wait_for(
                lambda: all(w.wakes.count >= c + 3 for w, c in zip(workers, seen, strict=True)),
                5, "the repeated hints",
            )
            # One more request after them: it runs once, and nothing else did.
            await asyncio.to_thread(file_request, alias, job, requested_by="test")
            await wait_for(lambda: len(ran) == 4, 5, "request 4")
            for w in workers:
                await w.stop("5s")
            history = await workers[0].ahistory(job, 10)
            assert len(ran) == 4 and len(history) == 4, history
            assert await asyncio.to_thread(ran_requests) == 4
        finally:
            for t in pickers:
                t.cancel()
            await asyncio.gather(*pickers, return_exceptions=True)
            await _close(*workers)


async def test_memory_wakes_in_process() -> None:
    backend = MemoryBackend()
    store = Store("memory", lambda: backend, {}, lambda: 0)
    job = f"wake.memory.{next(_names)}"
    a, b = _pair(store, job)
    starts = Starts(a, b)
    await a.start()
    await b.start()
    try:
        runner, _ = await _running_and_watched(a, b, starts, job, listening=False)
        assert await _handover_latency(runner, starts) < BOUND_S
    finally:
        await _close(a, b)


async def test_stores_without_a_push_channel_have_no_wakeups(sqlite_database: str) -> None:
    """MariaDB and SQLite, Redis Cluster: the polls alone, and a hint sent is a no-op."""
    from django_anarchon.backends.database import DatabaseBackend
    from django_anarchon.backends.redis import RedisBackend

    backend = DatabaseBackend(using=sqlite_database)
    assert backend.wakeups() is None
    await backend.wake(Wakeup("released", job="x"))
    await backend.close()
    cluster = RedisBackend(url="redis://127.0.0.1:1/0", cluster=True)
    assert cluster.wakeups() is None
    await cluster.wake(Wakeup("released", job="x"))  # no connection is even tried


def test_hints_from_the_wire_are_checked() -> None:
    hint = Wakeup("run-request", job="j", scheduler="s")
    assert Wakeup.from_json(hint.to_json()) == hint
    for junk in ("", "null", "[]", '{"kind": "resync"}', '{"kind": "released", "job": 1}',
                 b"\xff", '{"kind": "drop-tables"}'):
        assert Wakeup.from_json(junk) is None, junk
