"""What many test modules share: waiting on conditions, missing servers, worker processes.

* ``unavailable(reason)``: a server the tests need is missing: fail under CI, skip
  (loudly) elsewhere.
* ``wait_for(condition, timeout, what)``: poll until true, never sleep-and-hope.
* ``fresh_registry(anarchon)``: an empty job registry (and ``ANARCHON`` settings) for a
  block, the process-global one restored afterwards.
* ``WorkerGroup``: real ``anarchon_worker`` subprocesses with a log file each.
* ``run_workers_and_count(...)``: the multi-process exactly-once scenario on any store
  whose test jobs append "job slot" to ``$ANARCHON_TEST_OUT/<instance>.txt``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def unavailable(reason: str) -> None:
    """Fail under CI, skip elsewhere: a server the tests need is missing."""
    if IN_CI:
        pytest.fail(f"CI: {reason}", pytrace=False)
    pytest.skip(f"SKIPPED, NOT TESTED: {reason}")


@contextmanager
def fresh_registry(anarchon: dict[str, Any] | None = None) -> Iterator[None]:
    """An empty job registry for the block, under ``ANARCHON = anarchon`` when given.

    The process-global registry and the admin's history cache are restored (emptied)
    afterwards, so that the jobs a test module registers never leak into another."""
    from django.test import override_settings

    from django_anarchon.admin import history_cache
    from django_anarchon.registry import registry

    saved = (registry._functions, registry._classes, registry._names)
    registry._functions, registry._classes, registry._names = {}, {}, {}
    history_cache.forget()
    try:
        if anarchon is None:
            yield
        else:
            with override_settings(ANARCHON=anarchon):
                yield
    finally:
        registry._functions, registry._classes, registry._names = saved
        history_cache.forget()


def reachable(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def wait_for(condition: Callable[[], Any], timeout: float, what: str, poll: float = 0.05) -> Any:
    """Poll ``condition()`` until it is truthy and return it; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(poll)


class WorkerGroup:
    """``manage.py anarchon_worker`` subprocesses sharing one environment."""

    def __init__(self, log_dir: Path, env: dict[str, str]) -> None:
        self.log_dir = log_dir
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), **env}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def log(self, instance: str) -> Path:
        return self.log_dir / f"{instance}.log"

    def start(self, instance: str, *args: str, grace: str = "5s") -> None:
        with self.log(instance).open("w") as sink:
            self.procs[instance] = subprocess.Popen(
                [sys.executable, "-m", "django", "anarchon_worker",
                 "--instance-id", instance, "--grace", grace, *args],
                cwd=ROOT, env=self.env, stdout=sink, stderr=subprocess.STDOUT,
            )

    def output(self, instance: str) -> str:
        return self.log(instance).read_text()

    def wait_started(self, timeout: float = 60) -> None:
        """Every worker printed its banner; one that exited early fails with its log."""

        def all_up() -> bool:
            for instance, proc in self.procs.items():
                if proc.poll() is not None:
                    raise AssertionError(f"worker {instance} exited early:\n{self.output(instance)}")
            return all("Press Ctrl+C" in self.output(i) for i in self.procs)

        wait_for(all_up, timeout, f"{len(self.procs)} workers printing their banner")

    def stop_all(self, timeout: float = 30) -> None:
        """SIGTERM every worker; each must exit 0 after its graceful stop."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for instance, proc in self.procs.items():
            assert proc.wait(timeout) == 0, self.output(instance)

    def kill_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


@contextmanager
def worker_group(log_dir: Path, env: dict[str, str]) -> Iterator[WorkerGroup]:
    group = WorkerGroup(log_dir, env)
    try:
        yield group
    finally:
        group.kill_all()


def run_workers_and_count(
    out: Path,
    env: dict[str, str],
    jobs: list[str],
    *,
    workers: int = 4,
    gap_ms: int = 200,
    run_seconds: float = 8.0,
) -> None:
    """Run ``workers`` workers for ``run_seconds``; every (job, slot) ran once, none missing.

    The workers' jobs append "job slot" to ``out/<instance>.txt`` when a run starts.
    While every worker was up, each slot of each job in ``jobs`` (every ``gap_ms``) must
    have run, with a margin at both ends; and no slot may have run twice.
    """
    with worker_group(out, {**env, "ANARCHON_TEST_OUT": str(out)}) as group:
        for i in range(workers):
            group.start(f"W{i}")
        group.wait_started()
        all_up_at = now_ms()
        until = all_up_at + int(run_seconds * 1000)

        def ran_until() -> bool:
            return any(
                int(line.split()[1]) >= until
                for path in out.glob("W*.txt")
                for line in path.read_text().splitlines()
            )

        wait_for(ran_until, run_seconds * 4, f"a run of a slot at or after {until}")
        stop_at = now_ms()
        group.stop_all()

    runs: Counter[tuple[str, int]] = Counter()
    by_worker: Counter[str] = Counter()
    for path in out.glob("W*.txt"):
        for line in path.read_text().splitlines():
            job, slot = line.split()
            runs[(job, int(slot))] += 1
            by_worker[path.stem] += 1
    twice = [key for key, count in runs.items() if count != 1]
    assert not twice, f"run more than once: {twice[:10]}"
    first = (all_up_at // gap_ms + 2) * gap_ms
    last = (stop_at // gap_ms - 3) * gap_ms
    expected = {(job, s) for job in jobs for s in range(first, last + 1, gap_ms)}
    missing = sorted(expected - set(runs))
    assert not missing, f"{len(missing)} slots never ran, e.g. {missing[:5]}"
    assert len(expected) >= len(jobs) * 30, len(expected)
    assert len(by_worker) >= 2, f"one worker won everything: {by_worker}"
