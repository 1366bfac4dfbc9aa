"""Four ``anarchon_worker`` processes on one Redis: ten jobs every 200 ms, each slot run once.

Each worker appends "job slot" to a file of its own when a run starts; after the workers
stop, every (job, slot) must appear exactly once across the files, and while all four
were up no slot of any job may be missing.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from .redis_support import delete_prefix, redis_url
from .support import run_workers_and_count

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.workers]

JOBS = 10


@pytest.mark.parametrize("strategy", ["lease", "stream-id"])
def test_four_workers_run_each_slot_once(tmp_path: Path, strategy: str) -> None:
    url = redis_url()
    prefix = f"anarchon-test-worker-{uuid.uuid4().hex[:10]}"
    env = {
        "DJANGO_SETTINGS_MODULE": "tests.redisworker.settings",
        "ANARCHON_REDIS_URL": url,
        "ANARCHON_REDIS_STRATEGY": strategy,
        "ANARCHON_REDIS_PREFIX": prefix,
    }
    try:
        run_workers_and_count(tmp_path, env, [f"redis-count-{n}" for n in range(JOBS)])
    finally:
        delete_prefix(url, prefix)
