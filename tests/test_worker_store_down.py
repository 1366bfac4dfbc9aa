"""A worker whose store is down at start waits for it, and a signal ends that wait at once.

Issue 9, item 7: ``init()`` was not retried, so ``anarchon_worker`` died with "the
database system is starting up" and a web process under AUTOSTART never scheduled again.
The store here is a PostgreSQL port with nothing listening (a real refused connection).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from .support import ROOT, wait_for


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_sigterm_ends_a_start_that_waits_for_the_store(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "tests.db_worker_settings",
        "ANARCHON_DBW_ALIAS": "postgres",
        "ANARCHON_DBW_SCENARIO": "many",
        "ANARCHON_PG_NAME": "anarchon_nowhere",
        "ANARCHON_PG_HOST": "127.0.0.1",
        "ANARCHON_PG_PORT": str(_closed_port()),
    }
    log = tmp_path / "worker.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "django", "anarchon_worker", "--instance-id", "W", "-v", "2"],
            cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT,
        )
    try:
        # Still alive and retrying after several failed tries: it did not die at start.
        tries = "init of the database backend failed"
        wait_for(lambda: log.read_text().count(tries) >= 3, 30, "three retries of init")
        assert proc.poll() is None, log.read_text()
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0, log.read_text()
        assert time.monotonic() - began < 3, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert "Press Ctrl+C" not in log.read_text()  # it never claimed to have started
