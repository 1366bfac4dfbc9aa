"""Real ``anarchon_worker`` processes sharing one database: exactly once and takeovers.

Connections cut and a server restarted under workers are the fault suite's (tests/faults),
on a private PostgreSQL cluster, so that the shared server stays up for other tests.

Each test gets a database of its own (a fresh PostgreSQL database, or a SQLite file),
migrated by a ``python -m django migrate --run-syncdb`` subprocess, and dropped at the
end. The workers run the jobs of tests/dbworkerapp/jobs.py; their handlers write an
``Execution`` row themselves, so every run is counted twice: in history, and by the
handler.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import databases
from tests.support import reachable, unavailable

pytestmark = [pytest.mark.slow, pytest.mark.workers]

ROOT = Path(__file__).resolve().parent.parent


def wait_for(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Database:
    """A database of one test: the environment for subprocesses, and plain SQL reads."""

    def __init__(self, alias: str, env: dict[str, str], query: Callable[[str], list[Any]]):
        self.alias = alias
        self.env = env
        self.query = query

    def executions(self) -> list[tuple[str, int, str, int, str]]:
        return [tuple(r) for r in self.query(
            "SELECT job, slot, instance_id, attempt, note FROM dbworkerapp_execution"
        )]

    def attempts(self) -> list[tuple[str, int, str, int, str, str]]:
        return [tuple(r) for r in self.query(
            "SELECT job, slot, instance_id, attempt, reason, status "
            "FROM django_anarchon_runattempt"
        )]


def _migrate(env: dict[str, str]) -> None:
    subprocess.run(
        [sys.executable, "-m", "django", "migrate", "--run-syncdb", "-v", "0"],
        cwd=ROOT, env=env, check=True, timeout=120,
    )


def _base_env(alias: str, scenario: str, lease: str, spool: Path) -> dict[str, str]:
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.db_worker_settings",
        "PYTHONPATH": str(ROOT),
        "ANARCHON_DBW_ALIAS": alias,
        "ANARCHON_DBW_SCENARIO": scenario,
        "ANARCHON_DBW_LEASE": lease,
        "ANARCHON_DBW_SPOOL": str(spool),
    }


def _pg_admin() -> dict[str, Any]:
    db = databases()["postgres"]
    if not reachable(db["HOST"], int(db["PORT"])):
        unavailable(f"no PostgreSQL server at {db['HOST']}:{db['PORT']}")
    return dict(host=db["HOST"], port=int(db["PORT"]), user=db["USER"],
                password=db["PASSWORD"] or None, connect_timeout=5)


@pytest.fixture
def pg_db(tmp_path: Path) -> Iterator[Callable[[str, str], Database]]:
    import psycopg

    admin = _pg_admin()
    created: list[str] = []

    def make(scenario: str, lease: str = "3s") -> Database:
        name = f"anarchon_workers_{os.getpid()}_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(dbname="postgres", autocommit=True, **admin) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        created.append(name)
        env = {**_base_env("postgres", scenario, lease, tmp_path / "spool"), "ANARCHON_PG_NAME": name}
        _migrate(env)

        def query(sql: str) -> list[Any]:
            with psycopg.connect(dbname=name, autocommit=True, **admin) as conn:
                return conn.execute(sql).fetchall()

        return Database("postgres", env, query)

    yield make
    for name in created:
        with psycopg.connect(dbname="postgres", autocommit=True, **admin) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def sqlite_db(tmp_path: Path) -> Callable[[str, str], Database]:
    def make(scenario: str, lease: str = "3s") -> Database:
        path = tmp_path / "workers.sqlite3"
        env = {**_base_env("sqlite", scenario, lease, tmp_path / "spool"), "ANARCHON_SQLITE_NAME": str(path)}
        _migrate(env)

        def query(sql: str) -> list[Any]:
            with sqlite3.connect(path, timeout=20) as conn:
                return conn.execute(sql).fetchall()

        return Database("sqlite", env, query)

    return make


class Workers:
    """``anarchon_worker`` subprocesses, killed at the end of the test if still running."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: dict[str, Path] = {}

    def start(self, db: Database, instance: str, grace: str = "5s") -> None:
        log = self.tmp_path / f"{instance}.log"
        self.logs[instance] = log
        with log.open("wb") as out:
            self.procs[instance] = subprocess.Popen(
                [sys.executable, "-m", "django", "anarchon_worker", "--instance-id", instance,
                 "--grace", grace],
                cwd=ROOT, env=db.env, stdout=out, stderr=subprocess.STDOUT,
            )

    def output(self, instance: str) -> str:
        return self.logs[instance].read_text(errors="replace")

    def wait_started(self, timeout: float = 60) -> None:
        for instance in self.procs:
            wait_for(lambda i=instance: f"instance {i}" in self.output(i)  # type: ignore[misc]
                     or self.procs[i].poll() is not None, timeout, f"worker {instance} to start")
            assert self.procs[instance].poll() is None, self.output(instance)

    def signal(self, instance: str, sig: int) -> None:
        self.procs[instance].send_signal(sig)

    def kill_the_paused(self, pause_dir: Path, job: str) -> int:
        """SIGKILL the worker that paused at a pause point of tests/dbworkerapp/jobs.py.

        Returns the slot it paused in.
        """
        paused = pause_dir / "paused"
        wait_for(lambda: paused.exists() and paused.read_text().count(" ") == 2, 60,
                 "a worker to pause")
        pid, paused_job, slot = paused.read_text().split()
        victims = [i for i, p in self.procs.items() if p.pid == int(pid)]
        assert victims and paused_job == job, paused.read_text()
        self.signal(victims[0], signal.SIGKILL)
        self.procs[victims[0]].wait(10)
        return int(slot)

    def stop_all(self, timeout: float = 30) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for instance, proc in self.procs.items():
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                raise AssertionError(f"{instance} did not stop:\n{self.output(instance)}") from None

    def kill_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    w = Workers(tmp_path)
    yield w
    w.kill_all()


def _due(jobs: int, since: int, until: int) -> set[tuple[str, int]]:
    first = (since // 200 + 1) * 200
    return {(f"tick-{i:02d}", slot) for i in range(jobs) for slot in range(first, until, 200)}


def _not_run(db: Database, due: set[tuple[str, int]]) -> list[tuple[str, int]]:
    return sorted(due - {(job, slot) for job, slot, *_ in db.executions()})


def assert_exactly_once(db: Database, due: set[tuple[str, int]]) -> None:
    """Every slot in ``due`` ran once; nothing ever ran twice; history agrees with handlers."""
    executions = Counter((job, slot) for job, slot, *_ in db.executions())
    twice = [key for key, n in executions.items() if n > 1]
    assert not twice, f"ran more than once: {twice[:10]}"
    attempts = db.attempts()
    per_run = Counter((job, slot) for job, slot, *_ in attempts)
    assert not [k for k, n in per_run.items() if n > 1], "a run with several attempts"
    succeeded = {(job, slot) for job, slot, _, _, _, status in attempts if status == "success"}
    only_handlers = sorted(set(executions) - succeeded)
    recorded = {(job, slot): (instance, status) for job, slot, instance, _, _, status in attempts}
    assert succeeded == set(executions), (
        f"history and handlers disagree: only in history {sorted(succeeded - set(executions))[:5]}"
        f", only in handlers {[(k, recorded.get(k)) for k in only_handlers[:5]]}"
    )
    missing = _not_run(db, due)
    assert not missing, f"{len(missing)} of {len(due)} due slots never ran: {missing[:10]}"


def _many(db: Database, workers: Workers, count: int, seconds: float, jobs: int = 20) -> None:
    db.env["ANARCHON_DBW_JOBS"] = str(jobs)
    for i in range(count):
        # A grace long enough for the runs already claimed: on loaded cores (CI, after the
        # contract races) the workers ran 16 s behind, and a 5 s grace left 66 of them
        # interrupted and their records spooled, so history could not agree with handlers.
        workers.start(db, f"W{i + 1}", grace="20s")
    workers.wait_started()
    since = now_ms() + 1_000  # every worker is up and has its timers armed
    time.sleep(seconds)
    due = _due(jobs, since, now_ms() - 1_000)
    # On two loaded cores the workers may run seconds behind: a stop must not send the
    # claims still queued (it claims nothing new), so the slots it checks run first.
    try:
        wait_for(lambda: not _not_run(db, due), 60, "every slot due before the stop to run")
    except AssertionError:
        missing = _not_run(db, due)
        unrun = set(missing)
        raise AssertionError(
            f"{len(missing)} of {len(due)} due slots never ran, 60 s after: {missing[:10]}; "
            f"the history has {[a for a in db.attempts() if (a[0], a[1]) in unrun][:10]}"
            + "".join(f"\n--- {i}\n{workers.output(i)[-3000:]}" for i in workers.procs)
        ) from None
    workers.stop_all(timeout=60)
    assert_exactly_once(db, due)
    assert len(due) >= jobs * int(seconds * 5 * 0.5)


@pytest.mark.postgres
def test_four_workers_on_postgres_run_every_slot_once(
    pg_db: Callable[..., Database], workers: Workers
) -> None:
    """4 workers, 10 jobs every 200 ms, 10 s: every due slot exactly once.

    50 runs a second: with 20 jobs (100 a second) the workers and the server saturated a
    slow 2-core machine, and runs claimed more than a lease before their start were
    interrupted unstarted, as they must be."""
    _many(pg_db("many"), workers, 4, 10, jobs=10)


def test_three_workers_on_sqlite_run_every_slot_once(
    sqlite_db: Callable[..., Database], workers: Workers
) -> None:
    """3 processes on one SQLite file (WAL, IMMEDIATE, busy timeout): the same exactly once.

    6 jobs, not 20: SQLite has one writer, and 100 runs a second from three processes on
    two loaded cores is more than it takes (the records back up into the spool).
    """
    _many(sqlite_db("many"), workers, 3, 6, jobs=6)


def _long_runner(db: Database) -> tuple[int, str]:
    """Wait for the long job's first attempt to start; return its slot and instance."""
    rows = wait_for(
        lambda: [r for r in db.executions() if r[0] == "long" and r[4] == "start"],
        60, "the long job to start",
    )
    _, slot, instance, attempt, _ = rows[0]
    assert attempt == 1
    return slot, instance


def _attempt(db: Database, slot: int, attempt: int) -> tuple[Any, ...] | None:
    rows = [r for r in db.attempts() if r[0] == "long" and r[1] == slot and r[3] == attempt]
    return rows[0] if rows else None


@pytest.mark.postgres
def test_kill_9_of_the_runner_is_taken_over(
    pg_db: Callable[..., Database], workers: Workers
) -> None:
    """The runner dies without a word: a backup runs attempt 2 within lease + heartbeat."""
    lease_s = 2.0
    db = pg_db("long", lease="2s")
    workers.start(db, "A")
    workers.start(db, "B")
    workers.wait_started()
    slot, runner = _long_runner(db)
    backup = "B" if runner == "A" else "A"
    workers.signal(runner, signal.SIGKILL)
    killed = time.monotonic()
    second = wait_for(lambda: _attempt(db, slot, 2), 30, "attempt 2")
    took = time.monotonic() - killed
    assert second[2:] == (backup, 2, "takeover", "running")
    assert took <= lease_s + lease_s / 3 + 2.0, f"takeover after {took:.1f}s"
    first = _attempt(db, slot, 1)
    assert first is not None and first[2] == runner and first[5] == "interrupted"
    starts = [r for r in db.executions() if r[1] == slot and r[4] == "start"]
    assert [(r[2], r[3]) for r in starts] == [(runner, 1), (backup, 2)]


@pytest.mark.postgres
def test_sigterm_of_the_runner_hands_over_at_once(
    pg_db: Callable[..., Database], workers: Workers
) -> None:
    """SIGTERM: the run is recorded interrupted, its lease released, a backup takes it now."""
    lease_s = 9.0
    db = pg_db("long", lease="9s")
    workers.start(db, "A", grace="2s")
    workers.start(db, "B", grace="2s")
    workers.wait_started()
    slot, runner = _long_runner(db)
    backup = "B" if runner == "A" else "A"
    workers.signal(runner, signal.SIGTERM)
    stopped = time.monotonic()
    second = wait_for(lambda: _attempt(db, slot, 2), 30, "attempt 2")
    took = time.monotonic() - stopped
    assert second[2:] == (backup, 2, "takeover", "running")
    # Released, not lapsed: the backup's next look (every lease/3) finds it free.
    assert took < lease_s, f"took {took:.1f}s: the lease was not released"
    first = _attempt(db, slot, 1)
    assert first is not None and first[2] == runner and first[5] == "interrupted"
    assert workers.procs[runner].wait(15) == 0
    ends = [r for r in db.executions() if r[1] == slot and r[2] == runner and r[4] != "start"]
    assert ends and ends[0][4] == "end stop"


@pytest.mark.postgres
def test_two_workers_catch_up_every_missed_slot_once_oldest_first(
    pg_db: Callable[..., Database], workers: Workers
) -> None:
    """``catch_up_mode="all"``, limit 3: two workers starting together on a store that never
    ran the job run its 3 newest missed slots once each, one after the other."""
    db = pg_db("catchup")
    # Start just after a 10 s slot: both workers then arm the same next slot.
    time.sleep(((500 - now_ms() % 10_000) % 10_000) / 1000)
    boundary = now_ms() // 10_000 * 10_000
    workers.start(db, "A")
    workers.start(db, "B")
    workers.wait_started()
    rows = wait_for(
        lambda: (r := [e for e in db.executions() if e[4] == "catch-up"]) and len(r) >= 3 and r,
        30, "three catch-up runs",
    )
    workers.stop_all()
    rows = [e for e in db.executions() if e[4] == "catch-up"]
    slots = sorted(slot for _, slot, *_ in rows)
    assert slots == [boundary - 20_000, boundary - 10_000, boundary], rows
    order = [slot for (slot,) in db.query(
        "SELECT slot FROM dbworkerapp_execution WHERE note = 'catch-up' ORDER BY at, id"
    )]
    assert order == slots, "not run oldest first"
    assert {(job, slot, status) for job, slot, _, _, reason, status in db.attempts()
            if reason == "catch-up"} == {("report", s, "success") for s in slots}
