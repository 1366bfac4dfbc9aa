"""The public contract suite on the running Redis server, once per strategy.

Every class writes under a key prefix of its own, removed at the end (runs that never
finished would otherwise stay: they never expire, by design). The strategies without
leases set ``supports_leases = False``, so the suite leaves the lease-rule tests out.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from django_anarchon.backends.redis import RedisBackend
from django_anarchon.testing import BackendContract, BackendFactory

from .redis_support import PROCESS_PREFIX, delete_prefix, redis_url

pytestmark = pytest.mark.redis


@pytest.fixture(scope="module")
def redis_prefix() -> Iterator[tuple[str, str]]:
    url = redis_url()
    prefix = f"anarchon-test-{uuid.uuid4().hex[:12]}"
    yield url, prefix
    delete_prefix(url, prefix)
    delete_prefix(url, PROCESS_PREFIX)


#: 50 x 1,000 by default; ANARCHON_RACE_ROUNDS overrides it (scripts/test: 50 on its
#: second interpreter).
RACE_ROUNDS = int(os.environ.get("ANARCHON_RACE_ROUNDS", "1000"))


class RedisContract(BackendContract):
    strategy: Any = "lease"

    @pytest.fixture
    def make_backend(self, redis_prefix: tuple[str, str]) -> BackendFactory:
        url, prefix = redis_prefix
        return lambda: RedisBackend(url=url, strategy=self.strategy, key_prefix=prefix)


class TestRedisLease(RedisContract):
    strategy = "lease"
    race_claimers = 50
    race_rounds = RACE_ROUNDS
    process_factory = "tests.redis_support:process_lease_backend"


class TestRedisStreamId(RedisContract):
    supports_leases = False
    strategy = {"name": "stream-id", "maxlen": 1000}
    race_claimers = 50
    race_rounds = RACE_ROUNDS


class TestRedisScript(RedisContract):
    supports_leases = False
    strategy = {"name": "script", "window": "10m"}
    race_claimers = 50
    race_rounds = RACE_ROUNDS
