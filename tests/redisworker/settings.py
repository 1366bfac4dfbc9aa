"""Settings of the anarchon_worker subprocesses in tests/test_redis_worker.py (Redis backend).

The test passes the server, the strategy and a key prefix of its own in the environment.
"""

import os

from tests.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "tests.redisworker"]  # noqa: F405
ANARCHON = {
    "default": {
        "BACKEND": "django_anarchon.backends.redis.RedisBackend",
        "OPTIONS": {
            "url": os.environ.get("ANARCHON_REDIS_URL", "redis://127.0.0.1:6379/0"),
            "strategy": os.environ.get("ANARCHON_REDIS_STRATEGY", "lease"),
            "key_prefix": os.environ.get("ANARCHON_REDIS_PREFIX", "anarchon-test-worker"),
        },  # type: ignore[dict-item]
        "LEASE": "5s",
    },
}
