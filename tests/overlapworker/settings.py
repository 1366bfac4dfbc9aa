"""Settings of the anarchon_worker subprocesses in tests/test_overlap_workers.py (Redis lease).

The test passes the server and a key prefix of its own in the environment.
"""

import os

from tests.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "tests.overlapworker"]  # noqa: F405
ANARCHON = {
    "default": {
        "BACKEND": "django_anarchon.backends.redis.RedisBackend",
        "OPTIONS": {
            "url": os.environ.get("ANARCHON_REDIS_URL", "redis://127.0.0.1:6379/0"),
            "strategy": "lease",
            "key_prefix": os.environ.get("ANARCHON_REDIS_PREFIX", "anarchon-test-overlap"),
        },  # type: ignore[dict-item]
        "LEASE": "3s",  # heartbeat every second: the bound of a cancel on another instance
    },
}
