"""DatabaseBackend beyond the contract: round trips, the server's clock, pruning, hygiene.

The store's synchronous methods are called in the test's own thread here, so that
``CaptureQueriesContext`` sees every statement on that thread's connection.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connections
from django.test.utils import override_settings

from django_anarchon.backends.base import ClaimInput, ClaimOutcome, RunClaim, RunEnd, StoredResult
from django_anarchon.backends.database import DatabaseBackend
from django_anarchon.backends.database.store import Store
from django_anarchon.models import JobLock, Run, RunAttempt

pytestmark = pytest.mark.usefixtures("database_access")

ALIASES = [
    pytest.param("postgres_database", marks=pytest.mark.postgres, id="postgres"),
    pytest.param("mysql_database", marks=pytest.mark.mysql, id="mysql"),
    pytest.param("sqlite_database", id="sqlite"),
]


@pytest.fixture(params=ALIASES)
def alias(request: pytest.FixtureRequest) -> str:
    name: str = request.getfixturevalue(request.param)
    return name


def _job(label: str) -> str:
    return f"dbtest-{label}-{uuid.uuid4().hex}"


def _claim(job: str, slot: int, token: str, instance: str = "A", **kw: Any) -> RunClaim:
    kw.setdefault("keep_ms", 600_000)
    return RunClaim(job=job, slot=slot, token=token, instance_id=instance, **kw)


class Trips:
    """Statements a block sent, and how many transactions they ran in."""

    def __init__(self, alias: str) -> None:
        self.connection = connections[alias]
        self.statements: list[tuple[str, bool]] = []

    def __call__(self, execute: Callable[..., Any], sql: str, params: Any, many: bool,
                 context: dict[str, Any]) -> Any:
        self.statements.append((sql, self.connection.get_autocommit()))
        return execute(sql, params, many, context)

    @property
    def transactions(self) -> int:
        count, inside = 0, False
        for _, autocommit in self.statements:
            if not autocommit and not inside:
                count += 1
            inside = not autocommit
        return count

    @property
    def round_trips(self) -> int:
        """Statements, plus BEGIN and COMMIT for each transaction."""
        return len(self.statements) + 2 * self.transactions


def count(alias: str, fn: Callable[[], Any]) -> tuple[Any, Trips]:
    trips = Trips(alias)
    with connections[alias].execute_wrapper(trips):
        result = fn()
    return result, trips


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


# -- migrations ------------------------------------------------------------------------


def test_migrations_match_the_models() -> None:
    call_command("makemigrations", "django_anarchon", check=True, dry_run=True, verbosity=0)


# -- round trips -----------------------------------------------------------------------


@pytest.mark.postgres
def test_postgres_fast_path_round_trips(postgres_database: str) -> None:
    """PostgreSQL: a new run, a loser, a repeat, and claim() are one statement each."""
    store = Store(postgres_database)
    job, slot = _job("trips"), _now_ms()
    store.prepare_job(job)
    assert store._use_functions()  # checked once, before counting

    outcome, trips = count(postgres_database, lambda: store.run_claim(_claim(job, slot, "a")))
    assert outcome == ClaimOutcome.won(1)
    assert (len(trips.statements), trips.transactions, trips.round_trips) == (1, 0, 1)

    outcome, trips = count(postgres_database, lambda: store.run_claim(_claim(job, slot, "b")))
    assert outcome == ClaimOutcome.running(1)
    assert trips.round_trips == 1

    outcome, trips = count(postgres_database, lambda: store.run_claim(_claim(job, slot, "a")))
    assert outcome == ClaimOutcome.won(1)
    assert trips.round_trips == 1

    plain = ClaimInput(job=job, slot=slot + 1, token="p", instance_id="A")
    won, trips = count(postgres_database, lambda: store.claim(plain))
    assert won is True and trips.round_trips == 1
    lost = ClaimInput(job=job, slot=slot + 1, token="q", instance_id="B")
    won, trips = count(postgres_database, lambda: store.claim(lost))
    assert won is False and trips.round_trips == 1

    # The lock path: a takeover after the lease was released.
    assert store.release(job, slot, "a")
    takeover = _claim(job, slot, "c", "C", mode="takeover", max_attempts=2)
    outcome, trips = count(postgres_database, lambda: store.run_claim(takeover))
    assert outcome == ClaimOutcome.won(2)
    assert trips.transactions == 1 and trips.round_trips <= 8, trips.statements


@pytest.mark.postgres
def test_postgres_first_claims_on_many_threads_wait_for_the_functions_check(
    postgres_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One backend's connection threads claim at once before it knows which functions
    the database has. The first marked the check done, then asked; the others claimed
    meanwhile with level 0, through ``anarchon_run_claim_many_v3``, which writes a run
    before it locks its job, and met this release's claims in deadlocks (seen in the
    race tests on a loaded machine). Every claim goes through the newest function now."""
    from django_anarchon.backends.database import postgres

    sent: list[str] = []
    real_rows, real_level = postgres._rows, postgres.functions_level

    def rows(connection: Any, sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
        sent.append(sql)
        return real_rows(connection, sql, params)

    def slow_level(connection: Any) -> int:
        time.sleep(0.2)  # the check's round trip, long enough for the others to arrive
        return real_level(connection)

    monkeypatch.setattr(postgres, "_rows", rows)
    monkeypatch.setattr(postgres, "functions_level", slow_level)
    store = Store(postgres_database)
    slot = _now_ms() - 1_000
    jobs = [_job(f"first{i}") for i in range(6)]
    gate = threading.Barrier(len(jobs))
    outcomes: list[Any] = []

    def claim(job: str) -> None:
        gate.wait()
        try:
            outcomes.append(store.run_claim_many([_claim(job, slot, "t"), _claim(job, slot + 1, "u")]))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=claim, args=(job,)) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(outcomes) == len(jobs)
    assert len(sent) == len(jobs) and all("anarchon_run_claim_many_v6" in sql for sql in sent), sent


@pytest.mark.postgres
def test_postgres_a_claim_of_a_run_that_is_done_is_one_statement(postgres_database: str) -> None:
    """Migration 0009: the instances that lose a burst of instant runs ask after the winners
    finished; the function answers them (v3 sent each to the lock path's transaction)."""
    store = Store(postgres_database)
    job, slot = _job("done"), _now_ms() - 1000
    store.prepare_job(job)
    assert store._use_functions() and store._v4()  # checked once, before counting
    assert store.run_claim(_claim(job, slot, "a", max_attempts=2)) == ClaimOutcome.won(1)
    assert store.finish(job, slot, "a", "success")
    outcome, trips = count(postgres_database, lambda: store.run_claim(_claim(job, slot, "b")))
    assert outcome == ClaimOutcome.done() and trips.round_trips == 1, trips.statements
    many, trips = count(postgres_database, lambda: store.run_claim_many(
        [_claim(job, slot, "c"), _claim(job, slot + 1, "d")]
    ))
    assert many == [ClaimOutcome.done(), ClaimOutcome.won(1)], many
    assert trips.round_trips == 1, trips.statements
    # What only the lock path decides still goes there: a failed run's retry.
    assert store.finish(job, slot + 1, "d", "failed")
    retry = _claim(job, slot + 1, "e", max_attempts=2)
    outcome, trips = count(postgres_database, lambda: store.run_claim(retry))
    assert outcome == ClaimOutcome.won(2) and trips.transactions == 1, trips.statements


@pytest.mark.postgres
def test_postgres_without_migration_0009_claims_through_v3_and_ends_through_the_orm(
    postgres_database: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """A database not migrated to 0009 yet (a rolling deploy): the functions before it."""
    from django_anarchon.backends.database import postgres

    monkeypatch.setattr(postgres, "_SIGNATURES_0009", ("anarchon_not_there_v9(text)",))
    store = Store(postgres_database)
    job, slot = _job("no0009"), _now_ms() - 1000
    store.prepare_job(job)
    assert store.run_claim(_claim(job, slot, "a")) == ClaimOutcome.won(1)
    assert "migration 0009's PostgreSQL functions are missing" in caplog.text
    end = RunEnd(job, "a", "success", StoredResult(slot, "A", 1, "success", slot, slot, 0), 10)
    answers, trips = count(postgres_database, lambda: store.finish_many([end]))
    assert answers == [True] and trips.transactions == 1, trips.statements
    assert not any("anarchon_finish_many" in sql for sql, _ in trips.statements)
    outcome, trips = count(postgres_database, lambda: store.run_claim(_claim(job, slot, "b")))
    assert outcome == ClaimOutcome.done()
    assert any("anarchon_run_claim_v3" in sql for sql, _ in trips.statements), trips.statements


def test_general_path_round_trips(alias: str) -> None:
    """The general path: bounded statements, one short transaction, whatever the history."""
    store = Store(alias, fast_path=False)
    job, slot = _job("general"), _now_ms()
    store.prepare_job(job)
    outcome, new = count(alias, lambda: store.run_claim(_claim(job, slot, "a")))
    assert outcome == ClaimOutcome.won(1)
    assert new.transactions == 1 and new.round_trips <= 12, new.statements
    outcome, loser = count(alias, lambda: store.run_claim(_claim(job, slot, "b")))
    assert outcome == ClaimOutcome.running(1)
    assert loser.round_trips == 1, loser.statements  # the lock-free peek
    assert store.finish(job, slot, "a", "success")
    outcome, late_loser = count(alias, lambda: store.run_claim(_claim(job, slot, "c")))
    assert outcome == ClaimOutcome.done()
    assert late_loser.round_trips == 1, late_loser.statements  # the peek, no lock path
    plain = ClaimInput(job=job, slot=slot + 1, token="p", instance_id="A")
    won, first = count(alias, lambda: store.claim(plain))
    # the winner's history row is an upsert, which Django wraps in a transaction
    assert won is True and first.transactions <= 1 and first.round_trips <= 7, first.statements
    lost = ClaimInput(job=job, slot=slot + 1, token="q", instance_id="B")
    won, second = count(alias, lambda: store.claim(lost))
    assert won is False and second.round_trips == 1


def test_finish_many_is_one_transaction_of_a_few_statements_per_end(alias: str) -> None:
    """20 runs' finishes and records: one transaction, where one by one they took 40."""
    store = Store(alias)
    slot = store.now_ms() - 5_000
    jobs = [_job(f"ends{i}") for i in range(20)]
    store.prepare_jobs(jobs)
    for i, job in enumerate(jobs):
        assert store.run_claim(_claim(job, slot, f"t{i}")) == ClaimOutcome.won(1)
    now = store.now_ms()
    ends = [
        RunEnd(job, f"t{i}", "success", StoredResult(slot, "A", 1, "success", now, now, 0), 10)
        for i, job in enumerate(jobs)
    ]
    assert store.finish_many([]) == []  # and the store has looked up what it may call
    answers, trips = count(alias, lambda: store.finish_many(ends))
    assert answers == [True] * 20
    if connections[alias].vendor == "postgresql":  # the function of migration 0009
        assert trips.round_trips == 1, trips.statements
    else:
        # Per end: the finish and the record's upsert; per job: the prune (2 statements).
        # (SQLite's BEGIN IMMEDIATE is a statement of its own.)
        assert trips.transactions == 1, trips.statements
        assert len(trips.statements) <= 4 * 20 + 1, trips.statements
    assert [r.status for job in jobs for r in store.history(job, 10)] == ["success"] * 20


@pytest.mark.postgres
def test_postgres_finish_many_function_leaves_what_the_orm_path_leaves(
    postgres_database: str,
) -> None:
    """The same ends through PostgreSQL's function and through the ORM (``fast_path=False``):
    the same answers, records, pruning by size and age, and forgotten runs."""
    alias = postgres_database

    def scenario(store: Store) -> tuple[Any, ...]:
        job, other = _job("parity"), _job("parity-other")
        now = store.now_ms()
        hour = 3_600_000
        slots = [now - 40_000 + i * 1000 for i in range(3)]
        for i, slot in enumerate(slots):
            claim = _claim(job, slot, f"t{i}", overlap="allow", max_attempts=2)
            assert store.run_claim(claim) == ClaimOutcome.won(1)
        assert store.run_claim(_claim(other, slots[0], "o")) == ClaimOutcome.won(1)
        # Rows the prune must remove: an attempt that ended past the ttl (its start the
        # newest, so that the size alone would keep it), a run past its keep.
        RunAttempt.objects.using(alias).create(
            job=job, slot=now - 3 * hour, scheduled_at=_dt(now - 3 * hour), instance_id="Z",
            attempt=1, reason="scheduled", status="success", started_at=_dt(now + hour),
            finished_at=_dt(now - 3 * hour), duration_ms=5,
        )
        Run.objects.using(alias).create(
            job=job, slot=now - 2 * hour, token="old", instance_id="Z", lease_until_ms=0,
            state="finished", status="success", reason="scheduled",
            started_at_ms=now - 2 * hour, finished_at_ms=now - 2 * hour, keep_ms=10_000,
        )

        def result(slot: int, by: str, status: str = "success", **kw: Any) -> StoredResult:
            return StoredResult(slot, by, 1, status, slot + 5, slot + 25, 20, **kw)

        ends = [
            RunEnd(job, "t0", "success", result(slots[0], "A"), 2, hour),
            RunEnd(job, "t1", "failed", result(slots[1], "A", "failed", error="boom"), 2, hour),
            RunEnd(job, "t2", "success", result(slots[2], "A", reason="catch-up"), 2, hour),
            RunEnd(job, "stale", "success", result(slots[2], "X"), 2, hour),
            RunEnd(other, "o", "interrupted", result(slots[0], "B", "interrupted"), 0),
        ]
        first = store.finish_many(ends)
        again = store.finish_many(ends)  # repeat-safe: the first reply may have been lost
        attempts = sorted(
            RunAttempt.objects.using(alias).filter(job__in=[job, other]).values_list(
                "slot", "instance_id", "attempt", "manual", "reason", "status",
                "started_at", "finished_at", "duration_ms", "error",
            )
        )
        runs = sorted(
            Run.objects.using(alias).filter(job__in=[job, other]).values_list(
                "slot", "state", "status", "token"
            )
        )
        base = slots[0]  # compare by offsets: each store has its own jobs and instants
        return (
            first, again,
            [(slot - base, *rest[:5], *[None if t is None else t - _dt(base) for t in rest[5:7]],
              *rest[7:]) for slot, *rest in attempts],
            [(slot - base, *rest) for slot, *rest in runs],
        )

    through_function = scenario(Store(alias))
    through_orm = scenario(Store(alias, fast_path=False))
    assert through_function == through_orm
    answers, _, attempts, runs = through_function
    assert answers == [True, True, True, False, True]
    # The first call: history_size=2 kept the two newest starts, then the ttl pruned the
    # one that ended long ago; the repeat wrote its three records again, and the size kept
    # two. history_size=0 kept none of the other job.
    assert [(a[0], a[5]) for a in attempts] == [(1000, "failed"), (2000, "success")]
    # The run past its keep is forgotten; the stale token finished nothing.
    assert [r[:4] for r in runs] == [(0, "finished", "interrupted", "o"), (0, "finished", "success", "t0"),
                                     (1000, "finished", "failed", "t1"),
                                     (2000, "finished", "success", "t2")]


def _dt(ms: int) -> Any:
    from django_anarchon.backends.base import ms_to_datetime

    return ms_to_datetime(ms)


# -- the server's clock ----------------------------------------------------------------


def test_leases_use_the_server_clock(alias: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker whose clock is a day ahead still gets leases and lateness from the server."""
    store = Store(alias)
    job = _job("clock")
    server_now = store.now_ms()
    assert abs(server_now - _now_ms()) < 5_000  # the same machine: sanity only
    day = 86_400_000
    real_time, real_time_ns = time.time, time.time_ns
    monkeypatch.setattr(time, "time", lambda: real_time() + day / 1000)
    monkeypatch.setattr(time, "time_ns", lambda: real_time_ns() + day * 1_000_000)

    slot = server_now - 10_000  # ten seconds late by the server, a day late by the worker
    claim = _claim(job, slot, "a", lease_ms=30_000, max_late_ms=60_000)
    assert store.run_claim(claim) == ClaimOutcome.won(1)
    lease_until = Run.objects.using(alias).get(job=job, slot=slot).lease_until_ms
    after = store.now_ms()
    assert server_now + 30_000 <= lease_until <= after + 30_000
    assert [a.alive for a in store.active(job)] == [True]

    late = store.run_claim(_claim(job, server_now - 120_000, "b", max_late_ms=60_000))
    assert late.kind == "late" and late.late_ms is not None
    assert 120_000 <= late.late_ms < 120_000 + 10_000

    assert store.heartbeat(job, slot, "a", 5_000)
    lease_until = Run.objects.using(alias).get(job=job, slot=slot).lease_until_ms
    assert lease_until <= store.now_ms() + 5_000
    assert store.release(job, slot, "a")
    assert [a.alive for a in store.active(job)] == [False]


# -- pruning ---------------------------------------------------------------------------


def _result(slot: int, started: int, by: str = "A") -> StoredResult:
    return StoredResult(slot=slot, by=by, attempt=1, status="success", started_at=started,
                        finished_at=started + 10, duration_ms=10)


def test_pruning_is_set_based(alias: str) -> None:
    """Keeping 5 of 300 records costs the same few statements as keeping 5 of 6."""
    store = Store(alias)
    job, base = _job("prune"), _now_ms() - 600_000
    rows = [
        RunAttempt(job=job, slot=base + i, scheduled_at=_dt(base + i), instance_id="A",
                   attempt=1, reason="scheduled", status="success", started_at=_dt(base + i))
        for i in range(300)
    ]
    RunAttempt.objects.using(alias).bulk_create(rows)
    slot = base + 1_000
    _, trips = count(alias, lambda: store.save_result(job, _result(slot, slot), 5, None))
    assert len(trips.statements) <= 6, trips.statements
    kept = list(RunAttempt.objects.using(alias).filter(job=job).values_list("slot", flat=True))
    assert sorted(kept) == [base + 296, base + 297, base + 298, base + 299, slot]

    old = base - 7_200_000
    store.save_result(job, _result(old, old), 100, 3_600_000)
    _, trips = count(alias, lambda: store.save_result(job, _result(slot, slot), 100, 3_600_000))
    assert len(trips.statements) <= 7, trips.statements
    kept = list(RunAttempt.objects.using(alias).filter(job=job).values_list("slot", flat=True))
    assert old not in kept and slot in kept


def test_finished_runs_are_forgotten_after_their_retention(alias: str) -> None:
    """Pruning forgets a run once ``now > max(finished_at, slot) + kept_ms(keep_ms)``.

    The row's ``finished_at_ms`` is moved instead of waiting (rows hold epoch ms).
    """
    store = Store(alias)
    job, now = _job("forget"), store.now_ms()
    slot = now - 30_000
    assert store.run_claim(_claim(job, slot, "a", keep_ms=1)).kind == "won"
    assert store.finish(job, slot, "a", "success")
    runs = Run.objects.using(alias).filter(job=job)
    runs.update(finished_at_ms=now - 5_000)  # inside the 10 s floor: kept
    store.save_result(job, _result(slot, slot), 10, None)
    assert runs.exists()
    runs.update(finished_at_ms=now - 11_000)  # past the floor: forgotten
    store.save_result(job, _result(slot, slot), 10, None)
    assert not runs.exists()


def _dt(ms: int) -> Any:
    from django_anarchon.backends.database.store import _db_datetime

    return _db_datetime(ms)


# -- connections -----------------------------------------------------------------------


def _pg_admin(alias: str) -> Any:
    """A connection of its own to the server of ``alias``, outside Django."""
    import psycopg

    db = connections[alias].settings_dict
    return psycopg.connect(host=db["HOST"], port=db["PORT"], user=db["USER"],
                           dbname="postgres", autocommit=True)


@pytest.fixture
def pg_terminate(postgres_database: str) -> Iterator[Callable[[], int]]:
    db = connections[postgres_database].settings_dict

    def terminate() -> int:
        with _pg_admin(postgres_database) as conn:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()", [db["NAME"]]
            ).fetchall()
        return len(rows)

    yield terminate


@pytest.mark.postgres
def test_terminated_connections_recover(postgres_database: str,
                                        pg_terminate: Callable[[], int]) -> None:
    """pg_terminate_backend under a live backend: its next calls reconnect by themselves."""

    async def main() -> None:
        backend = DatabaseBackend(using=postgres_database, max_connections=2)
        try:
            await backend.init()
            job, slot = _job("terminate"), _now_ms()
            assert (await backend.runs.claim(_claim(job, slot, "a"))).kind == "won"
            assert await asyncio.to_thread(pg_terminate) >= 1
            assert await backend.runs.heartbeat(job, slot, "a", 30_000) is True
            assert (await backend.runs.claim(_claim(job, slot + 1, "b"))).kind == "overlap"
            assert await backend.runs.finish(job, slot, "a", "success") is True
        finally:
            await backend.close()

    asyncio.run(main())


@pytest.mark.postgres
def test_conn_max_age_is_honoured(postgres_database: str) -> None:
    """CONN_MAX_AGE=0: every batch gets a fresh connection, as every request would."""
    db = connections[postgres_database].settings_dict
    backend = DatabaseBackend(using=postgres_database, max_connections=1)

    def pid() -> int:
        with connections[postgres_database].cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            value: int = cursor.fetchone()[0]
        return value

    async def pids() -> list[int]:
        try:
            return [await backend._call(pid) for _ in range(3)]
        finally:
            await backend.close()

    db["CONN_MAX_AGE"] = 0
    try:
        assert len(set(asyncio.run(pids()))) == 3
    finally:
        db["CONN_MAX_AGE"] = None
    assert len(set(asyncio.run(pids()))) == 1


def _handler_pids(alias: str, conn_max_age: int | None) -> tuple[list[int], bool]:
    """The backend pid each of 3 runs of a sync handler saw on one pool thread, and
    whether the last one's connection was closed once the scheduler stopped."""
    from django_anarchon.backends.memory import MemoryBackend
    from django_anarchon.engine import JobContext, Scheduler

    db = connections[alias].settings_dict
    seen: list[int] = []

    def handler(ctx: JobContext) -> None:
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            seen.append(cursor.fetchone()[0])

    def alive(pid: int) -> bool:
        with _pg_admin(alias) as conn:
            return bool(conn.execute(
                "SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid]
            ).fetchall())

    async def main() -> None:
        scheduler = Scheduler(MemoryBackend(), instance_id="A", threads=1)
        scheduler.every("pids", "1h", handler)
        await scheduler.start()
        try:
            for _ in range(3):
                assert (await scheduler.arun_now("pids")).status == "success"
        finally:
            await scheduler.stop()

    db["CONN_MAX_AGE"] = conn_max_age
    try:
        asyncio.run(main())
    finally:
        db["CONN_MAX_AGE"] = None
    deadline = time.monotonic() + 10
    while alive(seen[-1]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return seen, not alive(seen[-1])


@pytest.mark.postgres
def test_a_handler_keeps_its_threads_connection_as_conn_max_age_says(
    postgres_database: str,
) -> None:
    """Around a sync handler, as around a request: CONN_MAX_AGE=None keeps the pool
    thread's connection from run to run (it was closed after every run: a new
    connection each time), 0 gives each run its own; the thread closes it as it ends."""
    pids, closed = _handler_pids(postgres_database, None)
    assert len(pids) == 3 and len(set(pids)) == 1, pids
    assert closed, "the pool thread's connection is still open after stop()"
    pids, closed = _handler_pids(postgres_database, 0)
    assert len(set(pids)) == 3, pids
    assert closed


class _SendRunsTo:
    def __init__(self, alias: str) -> None:
        self.alias = alias

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return self.alias if model._meta.app_label == "django_anarchon" else None


def test_routers_and_using(sqlite_database: str) -> None:
    with override_settings(DATABASE_ROUTERS=[_SendRunsTo(sqlite_database)]):
        assert DatabaseBackend().using == sqlite_database
        assert DatabaseBackend(using="default").using == "default"
    assert DatabaseBackend().using == "default"


def test_many_loops_and_close(sqlite_database: str) -> None:
    """One backend used from one event loop after another; close() ends its own threads."""
    backend = DatabaseBackend(using=sqlite_database, max_connections=2)
    job = _job("loops")

    async def claim(slot: int) -> bool:
        return await backend.claim(ClaimInput(job=job, slot=slot, token="t", instance_id="A"))

    assert asyncio.run(claim(1)) and asyncio.run(claim(2))
    threads = [t for t in threading.enumerate() if t.name.startswith("anarchon-db")]
    assert threads
    asyncio.run(backend.close())
    assert not any(t.is_alive() for t in threads)
    assert asyncio.run(claim(1))  # usable again: new threads, new connections
    asyncio.run(backend.close())


def test_prepare_jobs_creates_every_lock_row_in_a_few_statements(alias: str) -> None:
    """10,000 jobs at start took 91 s, one round trip (or two) per job; now per batch."""
    store = Store(alias)
    jobs = [_job(f"prep{i}") for i in range(300)]
    store.prepare_job(jobs[0])  # one exists already
    _, trips = count(alias, lambda: store.prepare_jobs([*jobs, jobs[1]]))
    # One read, one INSERT (SQLite splits it at its limit of bound parameters): not 300.
    assert len(trips.statements) <= 3, trips.statements
    locks = JobLock.objects.using(alias).filter(job__in=jobs)
    assert sorted(locks.values_list("job", flat=True)) == sorted(jobs)
    _, again = count(alias, lambda: store.prepare_jobs(jobs))
    assert len(again.statements) == 1  # all there: nothing to insert


@pytest.mark.postgres
def test_postgres_claim_many_is_one_round_trip(postgres_database: str) -> None:
    """A batch of new runs of many jobs: one statement; the rest of a batch one by one."""
    store = Store(postgres_database)
    assert store._use_functions()  # checked once, before counting
    slot = store.now_ms() - 5_000  # so that slot + 1_000 has come too (no "early")
    jobs = [_job(f"many{i}") for i in range(20)]
    claims = [_claim(job, slot, f"t{i}", overlap="skip") for i, job in enumerate(jobs)]
    outcomes, trips = count(postgres_database, lambda: store.run_claim_many(claims))
    assert outcomes == [ClaimOutcome.won(1)] * 20
    assert trips.round_trips == 1, trips.statements

    assert store.release(jobs[0], slot, "t0")
    mixed = [
        _claim(jobs[1], slot, "other"),  # running
        _claim(jobs[0], slot, "x", mode="takeover", max_attempts=2),  # the lock path
        _claim(jobs[2], slot + 1_000, "y", overlap="skip"),  # overlap with slot
        _claim(jobs[3], slot, "t3"),  # the same token again
        _claim(jobs[4], slot - 7_200_000, "z", max_late_ms=60_000),  # late
    ]
    outcomes = store.run_claim_many(mixed)
    assert [o.kind for o in outcomes] == ["running", "won", "overlap", "won", "late"]
    assert outcomes[1] == ClaimOutcome.won(2)
    assert outcomes[2] == ClaimOutcome.overlap(slot)


def test_peek_many_reads_a_batch_in_one_statement_and_writes_nothing(alias: str) -> None:
    """Issue 10: a burst's backup claims were one claim each (a function call on
    PostgreSQL, the general path elsewhere); the look reads the whole batch at once."""
    store = Store(alias)
    slot = store.now_ms() - 1_000
    jobs = [_job(f"look{i}") for i in range(60)]
    store.prepare_jobs(jobs)
    for i, job in enumerate(jobs[:40]):
        assert store.run_claim(_claim(job, slot, f"w{i}")) == ClaimOutcome.won(1)
    for i, job in enumerate(jobs[20:40]):
        assert store.finish(job, slot, f"w{i + 20}", "success")
    backups = [_claim(job, slot, f"b{i}", "B") for i, job in enumerate(jobs)]
    backups.append(_claim(jobs[0], slot + 1, "b-next", "B"))  # another slot of a job read
    backups.append(_claim(jobs[1], slot, "w1"))  # the winner's own token: a renewal
    runs_before = sorted(Run.objects.using(alias).filter(job__in=jobs).values_list())
    attempts_before = RunAttempt.objects.using(alias).filter(job__in=jobs).count()
    answers, trips = count(alias, lambda: store.peek_many(backups))
    assert len(trips.statements) == 1 and trips.transactions == 0, trips.statements
    assert answers == (
        [ClaimOutcome.running(1)] * 20 + [ClaimOutcome.done()] * 20 + [None] * 20 + [None, None]
    )
    assert sorted(Run.objects.using(alias).filter(job__in=jobs).values_list()) == runs_before
    assert RunAttempt.objects.using(alias).filter(job__in=jobs).count() == attempts_before
    # What the look answered, the claims answer.
    claimed = [store.run_claim(c) for c in backups[:40]]
    assert claimed == answers[:40]
    assert store.peek_many([]) == []


async def test_backups_look_before_they_claim_and_every_slot_runs_once(alias: str) -> None:
    """Three instances (two through one backend object, one through its own connections)
    on ten jobs every 300 ms: the claims of the jobs another instance won last are looks,
    never also claimed; every slot runs once and none is lost, also once an instance has
    stopped and the others must win its slots."""
    from django_anarchon.engine import Scheduler

    from .test_engine_support import Calls, Recording, real_ms, stop_all, wait_for

    shared, own = DatabaseBackend(using=alias), DatabaseBackend(using=alias)
    recordings = [Recording(shared), Recording(own)]
    calls = Calls()
    prefix = _job("burst")
    schedulers = {i: Scheduler(b, instance_id=i) for i, b in (("A", shared), ("B", shared),
                                                              ("C", own))}
    for s in schedulers.values():
        for n in range(10):
            # "allow": a run whose end a loaded machine records late must not make the
            # next slot an overlap (skipped, and missing below).
            s.every(f"{prefix}-{n}", "300ms",
                    lambda ctx: calls.add(job=ctx.name, slot=ctx.slot, by=ctx.instance_id),
                    overlap="allow")
    try:
        for s in schedulers.values():
            await s.start()
        await wait_for(lambda: sum(len(r.looked) for r in recordings) >= 30
                       and len(calls) >= 10 * 4, 15,
                       "four slots of each job and thirty looks answered")
        await stop_all(schedulers[calls.items[-1]["by"]])  # one that runs slots
        gone = real_ms()
        await wait_for(
            lambda: len([c for c in calls.items if c["slot"] > gone + 300]) >= 10 * 2, 15,
            "two slots of each job after the leader stopped",
        )
    finally:
        await stop_all(*schedulers.values())
        await shared.close()
        await own.close()
    slots = Counter((c["job"], c["slot"]) for c in calls.items)
    assert max(slots.values()) == 1, [k for k, n in slots.items() if n > 1]
    for n in range(10):  # none lost, before the stop and after it (the stop's own aside)
        for part in (lambda slot: slot < gone - 300, lambda slot: slot > gone + 300):
            mine = sorted(slot for job, slot in slots if job == f"{prefix}-{n}" and part(slot))
            assert mine == list(range(mine[0], mine[0] + 300 * len(mine), 300)), (n, mine)
    looked = {(c.instance_id, c.job, c.slot, a.kind) for r in recordings for c, a in r.looked}
    claimed = {(c.instance_id, c.job, c.slot) for r in recordings for _, c, _ in r.sent}
    assert len(looked) >= 30, looked
    assert {kind for *_, kind in looked} <= {"running", "done"}, looked
    assert not {(by, job, slot) for by, job, slot, _ in looked} & claimed


def _batch_scenario(store: Store, label: str, slot: int) -> list[RunClaim]:
    """Every kind of claim a batch can hold, with the runs, marks and pauses they meet."""
    from django_anarchon.models import LedgerMark

    def job(name: str) -> str:
        return f"dbtest-{label}-{name}"

    names = ["new-skip", "new-allow", "busy", "busy-marked", "sweep", "paused", "late",
             "early", "twice", "running", "mine", "allow-busy", "done"]
    store.prepare_jobs([job(n) for n in names])
    for name in ("busy", "busy-marked", "allow-busy"):  # a live run of an earlier slot
        assert store.run_claim(_claim(job(name), slot - 1_000, "old", "X")).kind == "won"
    LedgerMark.objects.using(store.using).create(
        job=job("busy-marked"), slot=slot, last_slot=slot, fate="skipped", reason="overlap",
        at_ms=slot, instance_id="X",
    )
    lapsed = _claim(job("sweep"), slot - 1_000, "old", "X", lease_ms=1, max_attempts=1)
    assert store.run_claim(lapsed).kind == "won"
    store.ledger.pause(job("paused"), "note", "tester", None)
    for name in ("running", "mine", "done"):
        assert store.run_claim(_claim(job(name), slot, "held", "X")).kind == "won"
    assert store.finish(job("done"), slot, "held", "success")
    deadline = time.monotonic() + 5
    while store.active(job("sweep"))[0].alive:  # the server's clock, past a 1 ms lease
        assert time.monotonic() < deadline
        time.sleep(0.005)
    return [
        _claim(job("new-skip"), slot, "t1", overlap="skip"),
        _claim(job("new-allow"), slot, "t2", overlap="allow"),
        _claim(job("busy"), slot, "t3", overlap="skip"),
        _claim(job("busy-marked"), slot, "t4", overlap="skip"),
        _claim(job("sweep"), slot, "t5", overlap="skip"),
        _claim(job("paused"), slot, "t6", overlap="skip"),
        _claim(job("late"), slot - 60_000, "t7", overlap="skip", max_late_ms=10_000),
        _claim(job("early"), slot + 3_600_000, "t8", overlap="skip"),
        _claim(job("twice"), slot - 500, "t9", overlap="skip"),
        _claim(job("twice"), slot, "t10", overlap="skip"),
        _claim(job("running"), slot, "t11", overlap="skip"),
        _claim(job("mine"), slot, "held", "X", overlap="skip"),
        _claim(job("allow-busy"), slot, "t12", overlap="allow"),
        _claim(job("done"), slot, "t13", overlap="skip"),
    ]


def _what_is_stored(alias: str, label: str, slot: int) -> list[tuple[Any, ...]]:
    prefix = f"dbtest-{label}-"
    runs = Run.objects.using(alias).filter(job__startswith=prefix).values_list(
        "job", "slot", "attempt", "token", "instance_id", "state", "status", "reason",
        "keep_ms", "max_attempts",
    )
    attempts = RunAttempt.objects.using(alias).filter(job__startswith=prefix).values_list(
        "job", "slot", "instance_id", "attempt", "reason", "status", "error",
    )
    return sorted(
        ("run", row[0].removeprefix(prefix), row[1] - slot, *row[2:]) for row in runs
    ) + sorted(
        ("attempt", row[0].removeprefix(prefix), row[1] - slot, *row[2:]) for row in attempts
    )


@pytest.mark.postgres
def test_postgres_a_batch_decided_set_based_answers_and_stores_what_one_by_one_did(
    postgres_database: str,
) -> None:
    """Migrations 0010 and 0011: ``anarchon_run_claim_many_v5`` and ``_v6`` decide a
    batch's new runs together (one insert, one lock of their jobs, one read of their
    other runs, one insert of their history rows); on every kind of claim a batch holds,
    each answers what v4 did one claim at a time, and leaves the same runs and history
    rows. So does migration 0012's single ``anarchon_run_claim_v5``, sent each claim of
    the batch alone in the batch's order ((job, slot))."""
    from django_anarchon.backends.database import postgres

    store = Store(postgres_database)
    assert store._use_functions() and store._level == 12
    connection = connections[postgres_database]
    slot = store.now_ms() - 2_000
    label = uuid.uuid4().hex[:8]
    answers = {}
    for version, level in (("v4", 9), ("v5", 10), ("v6", 11)):
        claims = _batch_scenario(store, f"{label}{version}", slot)
        answers[version] = postgres.run_claim_many(connection, claims, level)
    claims = _batch_scenario(store, f"{label}single", slot)
    alone = {id(c): postgres.run_claim(connection, c, 12)
             for c in sorted(claims, key=lambda c: (c.job, c.slot))}
    answers["single"] = [alone[id(c)] for c in claims]

    def shape(outcome: ClaimOutcome | None) -> Any:  # early's wait is the server's now
        return outcome and (outcome.kind, outcome.attempt, outcome.slot)

    for version in ("v5", "v6", "single"):
        assert [shape(o) for o in answers[version]] == [shape(o) for o in answers["v4"]], (
            version
        )
    assert [shape(o) for o in answers["v6"]] == [
        ("won", 1, None), ("won", 1, None),
        None, ("overlap", None, slot - 1_000),  # an overlap that owes its mark: lock path
        ("won", 1, None), None,  # the sweep's winner; a paused job: the lock path
        None, ("early", None, None),  # late, owing its mark: the lock path
        ("won", 1, None), None,  # a job twice: one by one, the second an overlap owing a mark
        ("running", 1, None), ("won", 1, None), ("won", 1, None), ("done", None, None),
    ], answers
    for version in ("v5", "v6", "single"):
        assert _what_is_stored(postgres_database, f"{label}{version}", slot) == (
            _what_is_stored(postgres_database, f"{label}v4", slot)
        ), version


@pytest.mark.postgres
def test_postgres_locks_several_jobs_in_code_point_order_whatever_the_collation(
    postgres_database: str,
) -> None:
    """``anarchon_run_claim_many_v6`` locks a batch's jobs in the order the backend sent
    them (Python's, by code point); the ledger's lock of several jobs sorted them by the
    column's collation. On a database whose collation is not C the two orders differ,
    and two such transactions could wait on each other until the deadlock check. Here
    the column takes an ICU English collation (in a transaction, rolled back): the rows
    are still locked, and returned, in code point order."""
    from django.db import transaction

    store = Store(postgres_database)
    tag = uuid.uuid4().hex[:8]
    names = [f"b-{tag}", f"B-{tag}", f"a-{tag}", f"_-{tag}", f"A-{tag}"]
    for name in names:
        store.prepare_job(name)
    table = JobLock._meta.db_table
    with transaction.atomic(using=postgres_database):
        with connections[postgres_database].cursor() as cursor:
            cursor.execute(
                f'ALTER TABLE "{table}" ALTER COLUMN "job" TYPE varchar(255) COLLATE "en-US-x-icu"'
            )
            cursor.execute(f'SELECT "job" FROM "{table}" WHERE "job" = ANY(%s) ORDER BY "job"',
                           [names])
            assert [row[0] for row in cursor.fetchall()] != sorted(names)  # a real difference
        _, rows = store._lock_jobs(names)
        transaction.set_rollback(True, using=postgres_database)
    assert list(rows) == sorted(names)


@pytest.mark.postgres
def test_postgres_array_literals_read_back_as_the_values_sent(postgres_database: str) -> None:
    """The claim and finish functions' arrays go as one literal string each (psycopg's
    list dumper cost a worker a millisecond a batch): every value reads back as it was,
    whatever its quotes, backslashes, braces, commas, spaces, case or NULL."""
    from django_anarchon.backends.database import postgres

    texts = ['plain', 'a"b', 'back\\slash\\', '\\"', '{br,ace}', ' spaced ', '', 'NULL',
             'null', None, 'comma,', "'quoted'", 'tab\tnew\nline', 'ünïcødé ✓', '\\N']
    ints = [0, -1, 2**62, None, 1_796_625_610_000]
    bools = [True, False, None]
    with connections[postgres_database].cursor() as cursor:
        cursor.execute(
            "SELECT %s::text[], %s::bigint[], %s::integer[], %s::boolean[], %s::text[]",
            [postgres.texts(texts), postgres.ints(ints), postgres.ints([7, None]),
             postgres.bools(bools), postgres.texts([])],
        )
        row = cursor.fetchone()
    assert row == (texts, ints, [7, None], bools, [])


@pytest.mark.postgres
@pytest.mark.parametrize(("missing", "size", "called", "warning"), [
    ("_SIGNATURES_0010", 3, "anarchon_run_claim_many_v4",
     "migration 0010's PostgreSQL function is missing"),
    ("_SIGNATURES_0011", 3, "anarchon_run_claim_many_v5",
     "migration 0011's PostgreSQL functions are missing"),
    ("_SIGNATURES_0012", 1, "anarchon_run_claim_many_v6",
     "migration 0012's PostgreSQL function is missing"),
])
def test_postgres_without_the_latest_migration_claims_through_the_one_before(
    postgres_database: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    missing: str, size: int, called: str, warning: str,
) -> None:
    """A database not migrated to 0010, 0011 or 0012 yet (a rolling deploy): batches (and
    before 0012 a single claim, as a batch of one) through the function before, with a
    warning."""
    from django_anarchon.backends.database import postgres

    monkeypatch.setattr(postgres, missing, ("anarchon_not_there_v9(text)",))
    store = Store(postgres_database)
    slot = _now_ms() - 1000
    jobs = [_job(f"no{missing[-4:]}-{i}") for i in range(size)]
    claims = [_claim(job, slot, f"t{i}", overlap="skip") for i, job in enumerate(jobs)]
    outcomes, trips = count(
        postgres_database,
        lambda: store.run_claim_many(claims) if size > 1 else [store.run_claim(claims[0])],
    )
    assert outcomes == [ClaimOutcome.won(1)] * size
    assert warning in caplog.text
    assert any(called in sql for sql, _ in trips.statements), trips.statements


@pytest.mark.postgres
@pytest.mark.parametrize("how", ["batch", "single"])
def test_postgres_a_claim_takes_its_jobs_lock_before_it_writes_its_run(
    postgres_database: str, how: str
) -> None:
    """The lock path holds a job's lock, then writes its run (an overlap that owed its mark
    is decided again there). A batch through v5 (and a single claim through v4) wrote its
    runs, then locked their jobs: with the lock path's claim of the same run, each waited
    on the other until PostgreSQL's deadlock check (a second) aborted one, and under load
    slots went unrun (three instances on ten jobs every 300 ms met three such circles in
    seven seconds). From migration 0011 every claim takes its jobs' locks first: the lock
    path's insert does not wait, and the claim then meets that run."""
    import psycopg

    store = Store(postgres_database)
    assert store._use_functions() and store._level == 12
    job, other = _job("circle"), _job("circle")
    store.prepare_jobs([job, other])
    slot = store.now_ms() - 1_000
    claims = [_claim(job, slot, "batch", overlap="skip", max_attempts=1),
              _claim(other, slot, "batch-2", overlap="skip", max_attempts=1)]
    db = connections[postgres_database].settings_dict
    holder = psycopg.connect(host=db["HOST"], port=db["PORT"], user=db["USER"],
                             dbname=db["NAME"])
    result: dict[str, Any] = {}

    def claim() -> None:
        try:
            result["outcomes"] = (
                store.run_claim_many(claims) if how == "batch" else [store.run_claim(claims[0])]
            )
        except Exception as exc:  # reported below
            result["error"] = exc
        finally:
            connections[postgres_database].close()

    def waiting_on_holder() -> bool:
        with _pg_admin(postgres_database) as admin:
            row = admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                [holder.info.backend_pid],
            ).fetchone()
        return bool(row and row[0])

    thread = threading.Thread(target=claim)
    try:
        holder.execute("SELECT 1 FROM django_anarchon_joblock WHERE job = %s FOR UPDATE", [job])
        thread.start()
        deadline = time.monotonic() + 10
        while not waiting_on_holder():
            assert time.monotonic() < deadline, "the claim never waited on the job's lock"
            time.sleep(0.01)
        holder.execute("SET LOCAL lock_timeout = '500ms'")
        try:
            holder.execute(
                "INSERT INTO django_anarchon_run (job, slot, attempt, token, instance_id, "
                "lease_until_ms, state, status, reason, manual, started_at_ms, "
                "finished_at_ms, keep_ms, max_attempts) VALUES (%s, %s, 1, 'lock-path', 'B', "
                "%s, 'running', NULL, 'scheduled', false, %s, NULL, NULL, 1)",
                [job, slot, slot + 60_000, slot],
            )
        except psycopg.errors.LockNotAvailable:
            pytest.fail("the lock path's insert waited on the claim's run: a circle")
        holder.commit()
    finally:
        holder.rollback()
        holder.close()
        thread.join(30)
    assert "error" not in result, result
    expected = [ClaimOutcome.running(1), ClaimOutcome.won(1)]
    assert result["outcomes"] == expected[: len(result["outcomes"])], result
    tokens = Run.objects.using(postgres_database).filter(job=job, slot=slot).values_list(
        "token", flat=True
    )
    assert list(tokens) == ["lock-path"]


@pytest.mark.postgres
async def test_postgres_batches_race_through_separate_connections_and_one_backend_object(
    postgres_database: str,
) -> None:
    """Set-based batches (migration 0011's v6), raced: twelve claimers each send the same
    batch of 40 new runs (40 jobs, one slot) at once, six through backend objects of
    their own and six through one shared object (its four connection threads), 25 times
    over. Each run is won exactly once; every other claimer hears ``running(1)``."""
    shared = DatabaseBackend(using=postgres_database)
    own = [DatabaseBackend(using=postgres_database) for _ in range(6)]
    claimers = [*own, *[shared] * 6]
    slot = _now_ms() - 1_000
    try:
        for round_ in range(25):
            jobs = [_job(f"race{round_}-{i}") for i in range(40)]
            await shared.prepare_jobs([(job, 10) for job in jobs])
            batches = [
                [_claim(job, slot, f"t{c}-{job}", f"I{c}", overlap="skip") for job in jobs]
                for c in range(len(claimers))
            ]
            answers = await asyncio.gather(*(
                backend.runs.claim_many(batch)  # type: ignore[union-attr]
                for backend, batch in zip(claimers, batches, strict=True)
            ))
            for i, job in enumerate(jobs):
                kinds = sorted((a[i].kind, a[i].attempt) for a in answers)
                assert kinds == [("running", 1)] * 11 + [("won", 1)], (round_, job, kinds)
            stored = Run.objects.using(postgres_database).filter(job__in=jobs)
            assert await asyncio.to_thread(stored.count) == 40
    finally:
        for backend in {*claimers}:
            await backend.close()
