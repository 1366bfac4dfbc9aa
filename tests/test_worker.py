"""``manage.py anarchon_worker`` as a real subprocess: banner, run log lines, signals, probe."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class WorkerProcess:
    def __init__(self, tmp_path: Path, *args: str) -> None:
        self.out = tmp_path / "out.txt"
        self.log = tmp_path / "worker.log"
        self.health = tmp_path / "health"
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.worker_settings",
            "ANARCHON_TEST_OUT": str(self.out),
            "PYTHONPATH": str(ROOT),
        }
        self.log_file = self.log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "django", "anarchon_worker", "--instance-id", "W1",
             "--health-file", str(self.health), *args],
            cwd=ROOT, env=env, stdout=self.log_file, stderr=subprocess.STDOUT,
        )

    def lines(self) -> list[str]:
        return self.out.read_text().splitlines() if self.out.exists() else []

    def output(self) -> str:
        return self.log.read_text()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.log_file.close()


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    started: list[WorkerProcess] = []

    def start(*args: str) -> WorkerProcess:
        process = WorkerProcess(tmp_path, *args)
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()


def test_banner_run_lines_and_graceful_stop(worker: Callable[..., WorkerProcess]) -> None:
    w = worker("--grace", "5s")
    wait_for(lambda: sum(line.startswith("tick") for line in w.lines()) >= 3, 30, "three ticks")
    wait_for(lambda: any(line.startswith("long-start") for line in w.lines()), 30, "the long job")
    wait_for(lambda: "run ended: job=tick" in w.output(), 10, "a run-ended log line")
    out = w.output()
    assert "scheduler 'default', backend memory" in out and "instance W1" in out
    assert "tick" in out and "every 300ms" in out and "next run" in out
    assert "run started: job=tick" in out
    assert "instance=W1 attempt=1 status=success" in out
    wait_for(w.health.exists, 10, "the health file")

    w.proc.send_signal(signal.SIGTERM)
    assert w.proc.wait(30) == 0
    # The long job saw the stop through its signal, and was recorded interrupted.
    assert "long-end stop" in w.lines()
    assert "status=interrupted" in w.output()


def test_second_signal_stops_at_once(worker: Callable[..., WorkerProcess]) -> None:
    w = worker("--grace", "60s")
    wait_for(lambda: "run started: job=long" in w.output(), 30, "the long job")
    # A handler that ignores its signal would hold a graceful stop for the whole grace.
    w.proc.send_signal(signal.SIGINT)
    wait_for(lambda: "stopping" in w.output(), 10, "the graceful stop")
    w.proc.send_signal(signal.SIGINT)
    assert w.proc.wait(20) in (0, 1)
    assert "received SIGINT" in w.output()


def test_unknown_scheduler_is_a_clear_error(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "django", "anarchon_worker", "--scheduler", "nope"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.worker_settings", "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode != 0
    assert "unknown scheduler 'nope'" in result.stderr
