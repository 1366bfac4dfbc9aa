"""Four ``anarchon_worker`` processes on one Redis: ten jobs every 200 ms, each slot run once.

Each worker appends "job slot" to a file of its own when a run starts; after the workers
stop, every (job, slot) must appear exactly once across the files, and while all four
were up no slot of any job may be missing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from .redis_support import delete_prefix, redis_url

pytestmark = [pytest.mark.redis, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
WORKERS = 4
JOBS = 10
GAP_MS = 200
RUN_SECONDS = 8.0


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def wait_for(condition: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


@pytest.mark.parametrize("strategy", ["lease", "stream-id"])
def test_four_workers_run_each_slot_once(tmp_path: Path, strategy: str) -> None:
    url = redis_url()
    prefix = f"anarchon-test-worker-{uuid.uuid4().hex[:10]}"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.redisworker.settings",
        "PYTHONPATH": str(ROOT),
        "ANARCHON_TEST_OUT": str(tmp_path),
        "ANARCHON_REDIS_URL": url,
        "ANARCHON_REDIS_STRATEGY": strategy,
        "ANARCHON_REDIS_PREFIX": prefix,
    }
    logs = [tmp_path / f"worker{i}.log" for i in range(WORKERS)]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for i, log in enumerate(logs):
            with log.open("w") as out:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "django", "anarchon_worker",
                         "--instance-id", f"W{i}", "--grace", "5s"],
                        cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                    )
                )

        def all_up() -> bool:
            for proc, log in zip(procs, logs, strict=True):
                if proc.poll() is not None:
                    raise AssertionError(f"a worker exited early:\n{log.read_text()}")
            return all("Press Ctrl+C" in log.read_text() for log in logs)

        wait_for(all_up, 60, "four workers to print their banner")
        all_up_at = now_ms()
        until = all_up_at + int(RUN_SECONDS * 1000)

        def ran_until() -> bool:
            """Some worker has run a slot RUN_SECONDS after all four were up."""
            return any(
                int(line.split()[1]) >= until
                for path in tmp_path.glob("W*.txt")
                for line in path.read_text().splitlines()
            )

        wait_for(ran_until, RUN_SECONDS * 4, f"a run of a slot after {until}")
        stop_at = now_ms()
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc, log in zip(procs, logs, strict=True):
            assert proc.wait(30) == 0, log.read_text()
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        delete_prefix(url, prefix)

    runs: Counter[tuple[str, int]] = Counter()
    by_worker: Counter[str] = Counter()
    for path in tmp_path.glob("W*.txt"):
        for line in path.read_text().splitlines():
            job, slot = line.split()
            runs[(job, int(slot))] += 1
            by_worker[path.stem] += 1
    twice = [key for key, count in runs.items() if count != 1]
    assert not twice, f"run more than once: {twice[:10]}"
    # While all four workers were up, every slot of every job ran (a margin at each end).
    first = (all_up_at // GAP_MS + 2) * GAP_MS
    last = (stop_at // GAP_MS - 3) * GAP_MS
    expected = {(f"redis-count-{n}", s) for n in range(JOBS) for s in range(first, last + 1, GAP_MS)}
    missing = sorted(expected - set(runs))
    assert not missing, f"{len(missing)} slots never ran, e.g. {missing[:5]}"
    assert len(expected) >= JOBS * 30
    assert len(by_worker) >= 2, f"one worker won everything: {by_worker}"
