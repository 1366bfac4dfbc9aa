"""``manage.py anarchon_worker`` as a real subprocess: banner, run log lines, signals, probe."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .support import ROOT, WorkerGroup, wait_for, worker_group

SETTINGS = "tests.worker_settings"
ISO = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{6})?\+00:00"


@pytest.fixture
def group(tmp_path: Path) -> Iterator[WorkerGroup]:
    env = {"DJANGO_SETTINGS_MODULE": SETTINGS, "ANARCHON_TEST_OUT": str(tmp_path / "out.txt")}
    with worker_group(tmp_path, env) as workers:
        yield workers


def lines(group: WorkerGroup) -> list[str]:
    out = Path(group.env["ANARCHON_TEST_OUT"])
    return out.read_text().splitlines() if out.exists() else []


def test_banner_run_lines_and_graceful_stop(group: WorkerGroup, tmp_path: Path) -> None:
    health = tmp_path / "health"
    group.start("W1", "--health-file", str(health))
    wait_for(lambda: sum(line.startswith("tick") for line in lines(group)) >= 3, 30, "three ticks")
    wait_for(lambda: any(line.startswith("long-start") for line in lines(group)), 30, "the long job")
    wait_for(lambda: "run ended: job=tick" in group.output("W1"), 10, "a run-ended log line")
    out = group.output("W1")
    assert "scheduler 'default', backend memory" in out and "instance W1" in out
    assert "  spool off" in out  # the memory store keeps nothing for a later process
    assert "tick" in out and "every 300ms" in out and "next run" in out
    assert "run started: job=tick" in out
    assert "instance=W1 attempt=1 status=success" in out
    wait_for(health.exists, 10, "the health file")

    group.stop_all()  # SIGTERM, exit status 0
    # The long job saw the stop through its signal, and was recorded interrupted.
    assert "long-end stop" in lines(group)
    out = group.output("W1")
    assert "status=interrupted" in out
    # The grace names the runs it waits for, with their slots as the run lines show them.
    waiting = re.search(r"scheduler default: waiting up to 5s for \d+ run\(s\) to end: (.*)", out)
    assert waiting is not None, out
    assert re.search(rf"\blong@{ISO}", waiting[1]), waiting[0]


def test_second_signal_stops_at_once(group: WorkerGroup) -> None:
    group.start("W1", grace="60s")
    wait_for(lambda: "run started: job=stubborn" in group.output("W1"), 30, "the stubborn job")
    # The stubborn handler ignores its signal: a graceful stop would wait the whole grace.
    proc = group.procs["W1"]
    proc.send_signal(signal.SIGINT)
    wait_for(lambda: "stopping" in group.output("W1"), 10, "the graceful stop")
    proc.send_signal(signal.SIGINT)
    assert proc.wait(20) == 0
    assert group.output("W1").count("received SIGINT") == 2


def worker(*args: str, settings: str = SETTINGS) -> subprocess.CompletedProcess[str]:
    """Run a worker that is expected to refuse to start."""
    return subprocess.run(
        [sys.executable, "-m", "django", "anarchon_worker", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": settings, "PYTHONPATH": str(ROOT)},
    )


def test_unknown_scheduler_is_a_clear_error() -> None:
    result = worker("--scheduler", "nope")
    assert result.returncode != 0
    assert "unknown scheduler 'nope'" in result.stderr


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/no/such/dir/h", "--health-file '/no/such/dir/h': the directory '/no/such/dir' "
                           "does not exist"),
        ("{tmp}", "--health-file '{tmp}' is a directory, not a file"),
        ("", "--health-file '' is a directory, not a file"),
    ],
)
def test_a_health_file_that_cannot_be_written_is_refused_at_start(
    path: str, message: str, tmp_path: Path
) -> None:
    result = worker("--health-file", path.format(tmp=tmp_path))
    assert result.returncode == 1
    assert result.stderr.strip() == f"CommandError: {message.format(tmp=tmp_path)}"
    assert "Press Ctrl+C" not in result.stdout


@pytest.mark.parametrize(
    ("instance_id", "message"),
    [
        ("", "option '--instance-id' = '': expected a non-empty string"),
        (" ", "option '--instance-id' = ' ': expected a non-empty string"),
        ("w" * 256, "at most 255 characters (got 256)"),
    ],
    ids=["empty", "blank", "too-long"],
)
def test_a_bad_instance_id_is_refused(instance_id: str, message: str) -> None:
    result = worker("--instance-id", instance_id)
    assert result.returncode == 1
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert message in result.stderr
    assert "Press Ctrl+C" not in result.stdout


def test_an_empty_spool_directory_is_refused() -> None:
    result = worker("--spool", "")
    assert result.returncode == 1
    assert result.stderr.strip() == "CommandError: --spool: expected a directory", result.stderr


def test_a_scheduler_without_jobs_is_warned_about(tmp_path: Path) -> None:
    env = {"DJANGO_SETTINGS_MODULE": "tests.nojobs_worker_settings"}
    with worker_group(tmp_path, env) as workers:
        workers.start("W1", "--scheduler", "empty", "--scheduler", "default")
        wait_for(lambda: "Press Ctrl+C" in workers.output("W1"), 30, "the banner")
        warnings = [line for line in workers.output("W1").splitlines() if "has no jobs" in line]
        assert len(warnings) == 1, workers.output("W1")
        assert warnings[0].endswith(
            "WARNING django_anarchon: scheduler 'empty' has no jobs: define them in a jobs.py "
            "module of an installed app, or import their module from one"
        )


def test_a_handler_that_swallows_cancellation_does_not_keep_the_worker(tmp_path: Path) -> None:
    env = {
        "DJANGO_SETTINGS_MODULE": "tests.swallow_worker_settings",
        "ANARCHON_TEST_OUT": str(tmp_path / "out.txt"),
    }
    with worker_group(tmp_path, env) as workers:
        workers.start("W1", grace="1s")
        wait_for(lambda: "run started: job=swallow" in workers.output("W1"), 30, "the swallow job")
        proc = workers.procs["W1"]
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        # grace (1 s) + the cancelled handler's second + the leftover tasks' bound (2 s),
        # with room for a loaded machine.
        assert proc.wait(15) == 0, workers.output("W1")
        took = time.monotonic() - sent
        out = workers.output("W1")
        assert "stopped" in out and "ignored cancellation" in out, out
        assert "swallow-cancelled" in Path(env["ANARCHON_TEST_OUT"]).read_text()
        assert took < 10, took


def test_a_health_file_that_stops_being_writable_is_logged_and_touched_again(
    group: WorkerGroup, tmp_path: Path
) -> None:
    """Its directory removed, the probe logs once and keeps trying; recreated, it is touched."""
    folder = tmp_path / "probe"
    folder.mkdir()
    health = folder / "alive"
    group.start("W1", "--health-file", str(health))
    wait_for(health.exists, 30, "the health file")
    health.unlink()
    folder.rmdir()
    wait_for(lambda: "cannot touch the health file" in group.output("W1"), 15, "the warning")
    folder.mkdir()
    wait_for(health.exists, 15, "the health file, touched again")
    assert group.output("W1").count("cannot touch the health file") == 1
