"""``anarchon_worker --metrics-port`` and ``--health-port`` as real subprocesses.

The metrics are scraped over HTTP and parsed with ``prometheus_client.parser``; the
probes are asked over HTTP too. ``/readyz`` follows a private Redis server that the test
kills and starts again on the same port.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management.base import CommandError

from django_anarchon.management.commands._probes import check_port

from .faults.servers import RedisStore
from .support import ROOT, WorkerGroup, wait_for, worker_group
from .test_database_workers import sqlite_db  # noqa: F401  (a fixture)

pytestmark = pytest.mark.workers


def get(port: int, path: str) -> tuple[int, str] | None:
    """``(status, body)`` of a GET on loopback, or ``None`` if nothing listens."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read().decode()
    except (ConnectionError, OSError):
        return None
    finally:
        conn.close()


def banner_port(output: str, what: str) -> int:
    found = re.search(rf"  {what} http://0\.0\.0\.0:(\d+)/", output)
    assert found is not None, output
    return int(found[1])


@pytest.fixture
def group(tmp_path: Path) -> Iterator[WorkerGroup]:
    env = {"DJANGO_SETTINGS_MODULE": "tests.worker_settings",
           "ANARCHON_TEST_OUT": str(tmp_path / "out.txt")}
    with worker_group(tmp_path, env) as workers:
        yield workers


def samples(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    answer = get(port, "/metrics")
    assert answer is not None and answer[0] == 200, answer
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(answer[1])
        for sample in family.samples
    }


def test_metrics_and_probes_of_a_memory_worker(group: WorkerGroup) -> None:
    from django_anarchon.contrib.prometheus import METRIC_NAMES

    group.start("W1", "--metrics-port", "0", "--health-port", "0", grace="2s")
    group.wait_started()
    out = group.output("W1")
    metrics, health = banner_port(out, "metrics"), banner_port(out, "health")
    tick_ok = ("anarchon_runs_total",
               frozenset({("scheduler", "default"), ("job", "tick"), ("status", "success")}))
    long_overlap = ("anarchon_skips_total",
                    frozenset({("scheduler", "default"), ("job", "long"), ("reason", "overlap")}))
    wait_for(lambda: (now := samples(metrics)).get(tick_ok, 0) >= 2 and now.get(long_overlap, 0) >= 1,
             30, "two successful ticks and an overlap skip of the long job scraped")
    scraped = samples(metrics)
    names = {name for name, _ in scraped}
    for name, kind in METRIC_NAMES.items():
        expected = f"{name}_count" if kind == "histogram" else name
        if name in ("anarchon_takeovers_total", "anarchon_lost_leases_total",
                    "anarchon_cancels_total", "anarchon_store_errors_total",
                    "anarchon_slots_missed_total"):
            continue  # nothing taken over, lost, cancelled, failed or missed: no series yet
        assert expected in names, (name, sorted(names))
    tick = frozenset({("scheduler", "default"), ("job", "tick")})
    assert scraped[("anarchon_run_start_lateness_seconds_count", tick)] >= 2
    assert scraped[("anarchon_last_success_timestamp_seconds", tick)] > 0
    assert scraped[("anarchon_job_interval_seconds", tick)] == pytest.approx(0.3)
    assert scraped[("anarchon_job_paused", tick)] == 0  # read from the store at start
    # The long job runs until the stop: one running run, and its later slots are overlaps.
    long = frozenset({("scheduler", "default"), ("job", "long")})
    assert scraped[("anarchon_running_runs", long)] == 1
    assert get(health, "/livez") == (200, "ok\n")
    assert get(health, "/readyz") == (200, "ok\n")
    assert get(health, "/nope") is not None and get(health, "/nope")[0] == 404  # type: ignore[index]

    proc = group.procs["W1"]
    proc.send_signal(signal.SIGTERM)
    # While the grace runs the worker is not alive any more; then nothing listens.
    wait_for(lambda: get(health, "/livez") in ((503, "the worker is stopping\n"), None), 10,
             "/livez to answer 503 after the stop")
    assert proc.wait(30) == 0, group.output("W1")
    assert get(health, "/livez") is None


def _taken_port() -> tuple[socket.socket, int]:
    sock = socket.socket()
    sock.bind(("0.0.0.0", 0))
    sock.listen()
    return sock, sock.getsockname()[1]


def _run_worker(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "django", "anarchon_worker", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT),
             "DJANGO_SETTINGS_MODULE": "tests.worker_settings", **(env or {})},
    )


@pytest.mark.parametrize("option", ["--metrics-port", "--health-port"])
def test_a_taken_port_is_one_line_and_exit_1(option: str) -> None:
    sock, port = _taken_port()
    with sock:
        result = _run_worker(option, str(port))
    assert result.returncode == 1, result
    lines = [line for line in result.stderr.splitlines() if line.startswith("CommandError")]
    assert lines == [f"CommandError: {option} {port}: cannot listen on 0.0.0.0:{port}: "
                     "Address already in use"], result.stderr
    assert "Traceback" not in result.stderr
    assert "Press Ctrl+C" not in result.stdout


def test_metrics_without_the_extra_is_one_line(tmp_path: Path) -> None:
    shadow = tmp_path / "prometheus_client"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("raise ImportError('not installed (test)')\n")
    result = _run_worker("--metrics-port", "0",
                         env={"PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"})
    assert result.returncode == 1, result
    assert ("CommandError: --metrics-port needs prometheus-client: "
            "pip install 'django-anarchon[prometheus]'") in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("value", ["abc", "70000", "-1"])
def test_a_bad_port_is_refused(value: str) -> None:
    with pytest.raises(CommandError) as caught:
        check_port(value, "--health-port")
    assert str(caught.value) == f"--health-port {value!r}: expected a TCP port number (0-65535)"


def test_readyz_follows_the_store(tmp_path: Path) -> None:
    redis = RedisStore()  # a private redis-server this test can kill and start again
    env = {"DJANGO_SETTINGS_MODULE": "tests.redisworker.settings",
           "ANARCHON_REDIS_URL": f"redis://127.0.0.1:{redis.port}/0",
           "ANARCHON_REDIS_STRATEGY": "lease", "ANARCHON_REDIS_PREFIX": "anarchon-readyz",
           "ANARCHON_TEST_OUT": str(tmp_path)}
    try:
        with worker_group(tmp_path, env) as group:
            group.start("R1", "--health-port", "0", grace="1s")
            group.wait_started()
            health = banner_port(group.output("R1"), "health")
            assert get(health, "/readyz") == (200, "ok\n")
            redis.kill()
            answer = wait_for(lambda: (a := get(health, "/readyz")) and a[0] == 503 and a, 15,
                              "/readyz 503 once the store is gone")
            assert answer[1].startswith("the store of scheduler 'default' "), answer
            assert answer[1].count("\n") == 1 and "redis://" not in answer[1], answer
            assert get(health, "/livez") == (200, "ok\n")  # restarting would not help
            redis.start()
            wait_for(lambda: get(health, "/readyz") == (200, "ok\n"), 30,
                     "/readyz 200 once the store is back")
            group.stop_all()
    finally:
        redis.close()


def test_a_pause_by_the_commands_shows_in_the_banner_and_the_metrics(
    sqlite_db: Any, tmp_path: Path,  # noqa: F811
) -> None:
    """anarchon_pause and anarchon_resume in processes of their own, a worker on the same
    database: its banner marks the job, ``anarchon_job_paused`` follows the store, the
    paused slots are counted as skips and the ledger shows them."""
    db = sqlite_db("many")
    env = {**db.env, "ANARCHON_DBW_JOBS": "2"}

    def manage(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "django", *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    assert manage("anarchon_pause", "tick-00", "--note", "deploy", "--by", "ops") == (
        "paused tick-00 (scheduler 'default') by ops until resumed: deploy\n")
    with worker_group(tmp_path, env) as group:
        group.start("P1", "--metrics-port", "0", grace="2s")
        group.wait_started()
        out = group.output("P1")
        (paused,) = [line for line in out.splitlines() if " tick-00 " in line]
        assert paused.endswith("  PAUSED by ops until resumed: deploy"), out
        (running,) = [line for line in out.splitlines() if " tick-01 " in line]
        assert "PAUSED" not in running, out
        metrics = banner_port(out, "metrics")

        def job(name: str, **more: str) -> frozenset[tuple[str, str]]:
            return frozenset({("scheduler", "default"), ("job", name), *more.items()})

        skips = ("anarchon_skips_total", job("tick-00", reason="paused"))
        wait_for(lambda: (now := samples(metrics)).get(skips, 0) >= 2
                 and now.get(("anarchon_job_paused", job("tick-00"))) == 1
                 and now.get(("anarchon_job_paused", job("tick-01"))) == 0,
                 30, "the paused gauge and two paused skips of tick-00")
        assert samples(metrics).get(("anarchon_runs_total", job("tick-00", status="success")),
                                    0) == 0
        assert manage("anarchon_resume", "tick-00").startswith("resumed tick-00 ")
        # The worker reads the pauses every 10 s.
        wait_for(lambda: samples(metrics).get(("anarchon_job_paused", job("tick-00"))) == 0
                 and samples(metrics).get(
                     ("anarchon_runs_total", job("tick-00", status="success")), 0) >= 1,
                 30, "tick-00 running again and its gauge at 0")
        group.stop_all()
    entries = json.loads(manage("anarchon_history", "tick-00", "--all-slots", "--json",
                                "--limit", "1000"))
    fates = {(e["fate"], e["reason"]) for e in entries}
    assert {("skipped", "paused"), ("ran", "scheduled")} <= fates, fates
