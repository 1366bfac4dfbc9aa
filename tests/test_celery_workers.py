"""The beat for Celery with real processes: two anarchon workers and a Celery worker.

Two ``anarchon_worker`` processes share a PostgreSQL database (the database backend) and
send the job's Celery task (tests/celeryworker) to a real Celery worker on Redis or
RabbitMQ, which appends a line to the witness file each time the task runs. The first
attempt 1 to reach a pause point around the enqueue (tests/dbworkerapp/jobs.py) blocks,
the test kills that worker with SIGKILL, and the other takes the run over.

A broker is not a Django database, so the beat records first and looks first
(enqueue/run.py): killed after the claim, before the marker, the backup sends the only
task; killed after ``apply_async``, the backup finds the task by its id and does
not send it again; killed between its marker and ``apply_async``, the backup cannot prove
it was not sent and never sends it (at most once).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from django_anarchon.enqueue.celery import CeleryTarget, task_id_for
from tests.test_celery import _queue_empty, celery_env, start_worker
from tests.test_database_workers import Database, Workers, pg_db, wait_for

from .celery_support import CeleryEnv

pytest.importorskip("celery")  # the [celery] extra (in [dev])

pytestmark = [pytest.mark.slow, pytest.mark.workers, pytest.mark.postgres]

__all__ = ["celery_env", "pg_db", "start_worker"]  # the fixtures, imported


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    w = Workers(tmp_path)
    yield w
    w.kill_all()


def _scenario(
    pg_db: Callable[..., Database], workers: Workers, celery_env: CeleryEnv,
    start_worker: Any, tmp_path: Path, pause: str, **env: str,
) -> tuple[Database, int]:
    """Start it all, kill the worker that paused at ``pause``; return the db and its slot."""
    db = pg_db("celery", "2s")
    db.env.update(
        DJANGO_SETTINGS_MODULE="tests.celery_worker_settings",
        ANARCHON_DBW_PAUSE=pause, ANARCHON_DBW_PAUSE_DIR=str(tmp_path),
        ANARCHON_CELERY_BROKER=celery_env.broker, ANARCHON_CELERY_BACKEND=celery_env.backend,
        ANARCHON_CELERY_QUEUE=celery_env.queue, ANARCHON_CELERY_WITNESS=str(celery_env.witness),
        **env,
    )
    start_worker()
    for instance in ("W1", "W2"):
        workers.start(db, instance)
    workers.wait_started()
    return db, workers.kill_the_paused(tmp_path, "beat")


def _runs(env: CeleryEnv) -> Counter[int]:
    """How many times the task ran for each slot, by the witness."""
    return Counter(e["slot"] for e in env.executions() if e["job"] == "beat")


def _enqueued(db: Database) -> dict[int, str]:
    return {int(s): str(t) for s, t in db.query(
        "SELECT slot, task_id FROM django_anarchon_enqueuedtask WHERE state = 'enqueued'"
    )}


def _finish(db: Database, workers: Workers, env: CeleryEnv, slot: int, later: int = 2) -> None:
    """Let ``later`` more slots' tasks run, stop the workers, let every sent task end."""
    wait_for(lambda: len([s for s in _runs(env) if s > slot]) >= later, 60,
             f"{later} later slots' tasks to run")
    workers.stop_all()
    target = CeleryTarget(env.task("record"))

    def settled() -> bool:
        results = [target.task.AsyncResult(i).ready() for i in _enqueued(db).values()]
        return all(results) and _queue_empty(target) and not any(
            target.at_a_worker(i) for i in _enqueued(db).values())

    wait_for(settled, 60, "every sent task to end")


def _assert_each_slot_once(db: Database, env: CeleryEnv) -> None:
    runs, enqueued = _runs(env), _enqueued(db)
    assert runs and max(runs.values()) == 1, runs
    assert set(runs) == set(enqueued), (runs, enqueued)  # what ran is what the beat sent
    assert all(enqueued[s] == task_id_for("beat", s) for s in enqueued), enqueued
    assert {e["id"] for e in env.executions()} == set(enqueued.values())


def test_killed_after_the_claim_the_backup_sends_once(
    pg_db: Callable[..., Database], workers: Workers, celery_env: CeleryEnv,
    start_worker: Any, tmp_path: Path,
) -> None:
    """Won, killed before the beat wrote its marker: the backup sends the only task."""
    db, slot = _scenario(pg_db, workers, celery_env, start_worker, tmp_path, "claimed")
    wait_for(lambda: _runs(celery_env)[slot] >= 1, 60, "the backup's task of the killed slot")
    _finish(db, workers, celery_env, slot)
    _assert_each_slot_once(db, celery_env)
    (run,) = [e for e in celery_env.executions() if e["slot"] == slot]
    assert run["rest"]["attempt"] == 2, "the backup's attempt 2 sent it"
    attempts = [a for a in db.attempts() if a[1] == slot]
    assert sorted((a[3], a[4], a[5]) for a in attempts) == [
        (1, "scheduled", "interrupted"), (2, "takeover", "success")
    ], attempts


def test_killed_after_apply_async_the_backup_finds_the_task(
    pg_db: Callable[..., Database], workers: Workers, celery_env: CeleryEnv,
    start_worker: Any, tmp_path: Path,
) -> None:
    db, slot = _scenario(pg_db, workers, celery_env, start_worker, tmp_path, "enqueued")
    wait_for(lambda: [a for a in db.attempts() if a[1] == slot and a[5] != "running"], 60,
             "the backup to end the killed slot's run")
    _finish(db, workers, celery_env, slot)
    _assert_each_slot_once(db, celery_env)
    (run,) = [e for e in celery_env.executions() if e["slot"] == slot]
    assert run["rest"]["attempt"] == 1, "the task is the killed attempt's, found, not sent again"
    attempts = [a for a in db.attempts() if a[1] == slot]
    assert sorted((a[3], a[4], a[5]) for a in attempts) == [
        (1, "scheduled", "interrupted"), (2, "takeover", "success")
    ], attempts


def test_killed_before_apply_async_is_at_most_once(
    pg_db: Callable[..., Database], workers: Workers, celery_env: CeleryEnv,
    start_worker: Any, tmp_path: Path,
) -> None:
    """Marker written, killed before ``apply_async``: the backups cannot tell, never send."""
    db, slot = _scenario(pg_db, workers, celery_env, start_worker, tmp_path, "enqueue")
    wait_for(lambda: [a for a in db.attempts() if a[1] == slot and a[3] == 3], 60,
             "the backups to use up the killed slot's attempts")
    _finish(db, workers, celery_env, slot)
    _assert_each_slot_once(db, celery_env)
    assert slot not in _runs(celery_env)
    attempts = {a[3]: a for a in db.attempts() if a[1] == slot}
    assert sorted(attempts) == [1, 2, 3], attempts
    assert attempts[1][5] == "interrupted" and attempts[2][5] == attempts[3][5] == "failed"


def test_killed_before_apply_async_an_idempotent_task_is_sent_again_and_runs_once(
    pg_db: Callable[..., Database], workers: Workers, celery_env: CeleryEnv,
    start_worker: Any, tmp_path: Path,
) -> None:
    """``idempotent=True``: the backup cannot tell either, so it sends with the same id."""
    db, slot = _scenario(pg_db, workers, celery_env, start_worker, tmp_path, "enqueue",
                         ANARCHON_CELERY_IDEMPOTENT="1")
    wait_for(lambda: _runs(celery_env)[slot] >= 1, 60, "the backup's task of the killed slot")
    _finish(db, workers, celery_env, slot)
    _assert_each_slot_once(db, celery_env)
    assert not [e for e in celery_env.executions() if e["duplicate"]]
    attempts = [a for a in db.attempts() if a[1] == slot]
    assert sorted((a[3], a[4], a[5]) for a in attempts) == [
        (1, "scheduled", "interrupted"), (2, "takeover", "success")
    ], attempts
