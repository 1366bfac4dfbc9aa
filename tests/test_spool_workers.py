"""Real ``anarchon_worker`` processes whose store goes down before a stop (issue 15).

A private PostgreSQL cluster or redis-server (tests/faults/servers.py) runs under worker
A, which runs a job every second with ``--spool``. The server is shut down, A gets
SIGTERM: it must exit within its grace plus the stop's bound, leaving what it owed the
store in the spool. With the server back, worker B (same spool directory) replays it,
and the history shows A's attempts with their real times.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from django_anarchon.backends.base import ms_to_datetime
from django_anarchon.engine.owed import STOP_BOUND_MS
from django_anarchon.spool import Spool
from tests.faults.servers import PostgresStore, RedisStore, Store, reap, spawn
from tests.support import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.workers]

ROOT = Path(__file__).resolve().parent.parent
GRACE_S = 2


@pytest.fixture(params=["postgres", "redis-lease"])
def store(request: pytest.FixtureRequest) -> Iterator[tuple[str, Store]]:
    server: Store = PostgresStore() if request.param == "postgres" else RedisStore()
    try:
        yield request.param, server
    finally:
        server.close()


def _env(backend: str, server: Store, out: Path) -> dict[str, str]:
    return {
        **os.environ, **server.env(),
        "PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "tests.faults.settings",
        "FAULTS_BACKEND": backend, "FAULTS_LEASE_STORE": "1", "FAULTS_LEASE": "3s",
        "FAULTS_TAG": "spool", "FAULTS_OUT": str(out),
        "FAULTS_JOBS": json.dumps([{"name": "work", "every_ms": 500, "run_ms": 200}]),
    }


def _worker(env: dict[str, str], instance: str, spool: Path, log: Path) -> subprocess.Popen[bytes]:
    return spawn(
        [sys.executable, "-m", "django", "anarchon_worker", "--instance-id", instance,
         "--grace", f"{GRACE_S}s", "--spool", str(spool)],
        log, env=env, cwd=ROOT,
    )


def _starts(out: Path, instance: str) -> list[dict[str, Any]]:
    path = out / f"{instance}.jsonl"
    if not path.exists():
        return []
    return [line for line in map(json.loads, path.read_text().splitlines())
            if line["event"] == "start"]


def _down(server: Store) -> None:
    assert server.proc is not None
    reap(server.proc)  # SIGKILL: redis-server keeps its AOF, PostgreSQL recovers at start
    server.proc = None


def test_a_worker_stopped_with_its_store_down_exits_in_time_and_a_later_one_replays(
    store: tuple[str, Store], tmp_path: Path
) -> None:
    backend, server = store
    out, spool_dir = tmp_path / "handlers", tmp_path / "spool"
    out.mkdir()
    env = _env(backend, server, out)
    if server.migrate:
        subprocess.run([sys.executable, "-m", "django", "migrate", "django_anarchon", "-v", "0"],
                       env=env, cwd=ROOT, check=True, timeout=180)
    a = _worker(env, "A", spool_dir, tmp_path / "A.log")
    try:
        wait_for(lambda: len(_starts(out, "A")) >= 3, 60, "worker A's runs")
        _down(server)
        time.sleep(0.5)  # runs end meanwhile: their records cannot reach the store
        began = time.monotonic()
        a.send_signal(signal.SIGTERM)
        rc = a.wait(60)
        took = time.monotonic() - began
    finally:
        reap(a)
    log_a = (tmp_path / "A.log").read_text(errors="replace")
    bound = GRACE_S + STOP_BOUND_MS / 1000 + 3  # + cancelling, closing the store, exiting
    assert rc == 0, log_a[-3000:]
    assert took <= bound, f"SIGTERM to exit took {took:.1f}s (bound {bound}s):\n{log_a[-3000:]}"
    files = list(spool_dir.glob("*.jsonl"))
    assert len(files) == 1, (list(spool_dir.iterdir()), log_a[-3000:])
    spooled = Spool._read(files[0]).entries
    assert spooled, log_a[-3000:]
    assert "spooled" in log_a
    assert f"  spool {spool_dir}" in log_a  # the banner
    started = {(s["slot"], s["attempt"]) for s in _starts(out, "A")}
    assert {(e.result.slot, e.result.attempt) for e in spooled} <= started

    server._start()  # type: ignore[attr-defined]
    b = _worker(env, "B", spool_dir, tmp_path / "B.log")
    try:
        wait_for(lambda: not list(spool_dir.glob("*~*~*.jsonl*")), 60, "B to replay the spool")
        b.send_signal(signal.SIGTERM)
        assert b.wait(30) == 0
    finally:
        reap(b)
    log_b = (tmp_path / "B.log").read_text(errors="replace")
    assert "replayed" in log_b, log_b[-3000:]
    assert not list(spool_dir.glob("*.kept.jsonl")), log_b[-3000:]
    history = json.loads(subprocess.run(
        [sys.executable, "-m", "django", "anarchon_history", "work", "--json", "--limit", "1000"],
        env=env, cwd=ROOT, check=True, capture_output=True, text=True, timeout=60,
    ).stdout)
    by_run = {(r["slot"], r["attempt"]): r for r in history}
    for entry in spooled:
        r = entry.result
        record = by_run.get((r.slot, r.attempt))
        assert record is not None, (entry, history[:5])
        assert (record["instance_id"], record["status"]) == ("A", r.status), record
        # Its real times: when A's handler ran, not when B replayed it.
        assert record["started_at"] == ms_to_datetime(r.started_at).isoformat(), (record, entry)
        assert record["duration_ms"] == r.duration_ms, (record, entry)
