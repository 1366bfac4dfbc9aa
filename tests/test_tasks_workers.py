"""The beat for django.tasks with real processes: anarchon workers, django-tasks-db's worker.

Two ``anarchon_worker`` processes share a PostgreSQL database with django-tasks-db's
``db_worker``, which runs every task the job enqueues; the task writes an ``Execution``
row (note ``task ...``) each time it runs, so "each slot's task runs once" is counted by
the task itself. The first attempt 1 to reach a pause point (tests/dbworkerapp/jobs.py)
blocks, the test kills that worker with SIGKILL, and the other takes the run over.

* One transaction (runs and task queue on one alias): a kill before or after the enqueue
  rolls the enqueue back with the rest, and the backup's enqueue is the only one.
* Two aliases (runs through ``runs``, tasks on ``default``: the same database, but no shared
  transaction): a kill after the claim, before the beat started, leaves nothing, and the
  backup enqueues the only task; a kill after the enqueue leaves the task, which the backup finds and does
  not enqueue again; a kill between the marker and the enqueue leaves a slot that nobody
  can prove unenqueued, recorded failed and never enqueued (at most once).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.test_database_workers import ROOT, Database, Workers, pg_db, wait_for

pytest.importorskip("django_tasks_db")

pytestmark = [pytest.mark.slow, pytest.mark.workers, pytest.mark.postgres]

__all__ = ["pg_db"]  # the fixture, imported


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    w = Workers(tmp_path)
    yield w
    w.kill_all()


@pytest.fixture
def task_worker(tmp_path: Path) -> Iterator[Callable[[Database], subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(db: Database) -> subprocess.Popen[bytes]:
        log = (tmp_path / "db_worker.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "django", "db_worker", "--interval", "0.1",
             "--no-startup-delay", "--worker-id", "taskworker"],
            cwd=ROOT, env=db.env, stdout=log, stderr=subprocess.STDOUT,
        )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def _tasks(db: Database) -> list[tuple[int, int, str, str]]:
    """(slot, attempt, status, id) of every task row django-tasks-db holds."""
    rows = db.query("SELECT args_kwargs, status, id FROM django_tasks_database_dbtaskresult")
    out = []
    for args_kwargs, status, task_id in rows:
        kwargs = (json.loads(args_kwargs) if isinstance(args_kwargs, str) else args_kwargs)["kwargs"]
        out.append((kwargs["slot"], kwargs["attempt"], status, str(task_id)))
    return out


def _task_runs(db: Database) -> Counter[int]:
    return Counter(slot for job, slot, _, _, note in db.executions() if note.startswith("task"))


def _scenario(
    pg_db: Callable[..., Database], workers: Workers, task_worker: Any, tmp_path: Path,
    pause: str, runs_alias: str = "default",
) -> tuple[Database, int]:
    """Start it all, kill the worker that paused at ``pause``; return the db and its slot."""
    db = pg_db("tasks", "2s")
    db.env.update(ANARCHON_DBW_PAUSE=pause, ANARCHON_DBW_PAUSE_DIR=str(tmp_path),
                  ANARCHON_DBW_RUNS_ALIAS=runs_alias)
    task_worker(db)
    for instance in ("W1", "W2"):
        workers.start(db, instance)
    workers.wait_started()
    return db, workers.kill_the_paused(tmp_path, "beat")



def _finish(db: Database, workers: Workers, slot: int, later: int = 2) -> None:
    """Let ``later`` more slots run, every task row finish, then stop the workers."""
    wait_for(lambda: len([s for s in _task_runs(db) if s > slot]) >= later, 60,
             f"{later} later slots' tasks to run")
    wait_for(lambda: all(status == "SUCCESSFUL" for *_, status, _ in _tasks(db)), 30,
             "every task to finish")
    workers.stop_all()


def _assert_each_slot_once(db: Database) -> None:
    per_slot = Counter(slot for slot, *_ in _tasks(db))
    assert per_slot and max(per_slot.values()) == 1, per_slot
    assert _task_runs(db) == per_slot  # the worker ran each enqueued task once, and only those
    records = {s: (a, t) for s, a, t in db.query(
        "SELECT slot, attempt, task_id FROM django_anarchon_enqueuedtask WHERE state = 'enqueued'"
    )}
    assert {slot: task_id for slot, _, _, task_id in _tasks(db)} == {
        s: t for s, (_, t) in records.items()
    }


@pytest.mark.parametrize("pause", ["enqueue", "enqueued"])
def test_one_transaction_kill_rolls_back_and_the_backup_enqueues_once(
    pg_db: Callable[..., Database], workers: Workers, task_worker: Any, tmp_path: Path,
    pause: str,
) -> None:
    """Killed before or after its enqueue, inside the transaction: nothing of it commits."""
    db, slot = _scenario(pg_db, workers, task_worker, tmp_path, pause)
    wait_for(lambda: _task_runs(db)[slot] >= 1, 60, "the backup's task of the killed slot to run")
    _finish(db, workers, slot)
    _assert_each_slot_once(db)
    (task,) = [t for t in _tasks(db) if t[0] == slot]
    assert task[1] == 2, "the killed attempt 1's enqueue must have been rolled back"
    attempts = [a for a in db.attempts() if a[1] == slot]
    assert sorted((a[3], a[4], a[5]) for a in attempts) == [
        (1, "scheduled", "interrupted"), (2, "takeover", "success")
    ], attempts


def test_two_aliases_kill_after_the_claim_the_backup_enqueues_once(
    pg_db: Callable[..., Database], workers: Workers, task_worker: Any, tmp_path: Path,
) -> None:
    """Won, killed before the beat wrote anything: the backup's enqueue is the only one."""
    db, slot = _scenario(pg_db, workers, task_worker, tmp_path, "claimed", runs_alias="runs")
    wait_for(lambda: _task_runs(db)[slot] >= 1, 60, "the backup's task of the killed slot to run")
    _finish(db, workers, slot)
    _assert_each_slot_once(db)
    (task,) = [t for t in _tasks(db) if t[0] == slot]
    assert task[1] == 2, "the backup's attempt 2 enqueued it"
    attempts = [a for a in db.attempts() if a[1] == slot]
    assert sorted((a[3], a[4], a[5]) for a in attempts) == [
        (1, "scheduled", "interrupted"), (2, "takeover", "success")
    ], attempts


def test_two_aliases_kill_after_enqueue_the_backup_finds_the_task(
    pg_db: Callable[..., Database], workers: Workers, task_worker: Any, tmp_path: Path,
) -> None:
    """Record first, look first: the dead attempt's task is found by its (job, slot)."""
    db, slot = _scenario(pg_db, workers, task_worker, tmp_path, "enqueued", runs_alias="runs")
    wait_for(lambda: [a for a in db.attempts() if a[1] == slot and a[5] != "running"], 60,
             "the backup to end the killed slot's run")
    _finish(db, workers, slot)
    _assert_each_slot_once(db)
    (task,) = [t for t in _tasks(db) if t[0] == slot]
    assert task[1] == 1, "the task is the killed attempt's, found, not enqueued again"
    attempts = [a for a in db.attempts() if a[1] == slot]
    assert sorted((a[3], a[4], a[5]) for a in attempts) == [
        (1, "scheduled", "interrupted"), (2, "takeover", "success")
    ], attempts


def test_two_aliases_kill_before_enqueue_is_at_most_once(
    pg_db: Callable[..., Database], workers: Workers, task_worker: Any, tmp_path: Path,
) -> None:
    """Marker written, killed before the enqueue: the backups cannot tell, and never enqueue."""
    db, slot = _scenario(pg_db, workers, task_worker, tmp_path, "enqueue", runs_alias="runs")
    wait_for(lambda: [a for a in db.attempts() if a[1] == slot and a[3] == 3], 60,
             "the backups to use up the killed slot's attempts")
    _finish(db, workers, slot)
    _assert_each_slot_once(db)
    assert slot not in _task_runs(db)
    attempts = {a[3]: a for a in db.attempts() if a[1] == slot}
    assert sorted(attempts) == [1, 2, 3], attempts
    assert attempts[1][5] == "interrupted" and attempts[2][5] == attempts[3][5] == "failed"
    (error,) = db.query(
        f"SELECT error FROM django_anarchon_runattempt WHERE slot = {slot} AND attempt = 3"
    )[0]
    assert "not enqueued again" in error and "attempt 1" in error, error
