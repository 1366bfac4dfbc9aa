"""The ``idmp`` strategy (Redis 8.6+ idempotent XADD) against the server named by
``ANARCHON_REDIS_IDMP_URL``. No such server can be installed here, so these are the only
Redis tests allowed to skip, in CI too; the refusal on an older server is tested in
test_redis_backend.py against the running 7.0 server, always."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from django_anarchon.backends.base import ClaimInput
from django_anarchon.backends.redis import RedisBackend
from django_anarchon.testing import BackendContract, BackendFactory

from .redis_support import delete_prefix

pytestmark = pytest.mark.redis

IDMP_URL = os.environ.get("ANARCHON_REDIS_IDMP_URL", "")


@pytest.fixture(scope="module")
def idmp_server() -> Iterator[tuple[str, str]]:
    if not IDMP_URL:
        pytest.skip("ANARCHON_REDIS_IDMP_URL is not set: no Redis 8.6+ to test idmp against")
    prefix = f"anarchon-test-{uuid.uuid4().hex[:12]}"
    yield IDMP_URL, prefix
    delete_prefix(IDMP_URL, prefix)


class TestRedisIdmp(BackendContract):
    supports_leases = False
    race_claimers = 50
    race_rounds = 1000

    @pytest.fixture
    def make_backend(self, idmp_server: tuple[str, str]) -> BackendFactory:
        url, prefix = idmp_server
        strategy = {"name": "idmp", "duration_sec": 600, "max_size": 10_000}
        return lambda: RedisBackend(url=url, strategy=strategy, key_prefix=prefix)


def _idmp_config(url: str, key: str) -> tuple[int, int]:
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        info: Any = client.xinfo_stream(key)
    finally:
        client.close()
    return int(info["idmp-duration"]), int(info["idmp-maxsize"])


def test_prepare_job_sets_the_stream_config_only_when_it_changes(
    idmp_server: tuple[str, str],
) -> None:
    url, prefix = idmp_server
    job = f"app.idmp-{uuid.uuid4().hex[:8]}"

    def backend(duration: int, size: int) -> RedisBackend:
        return RedisBackend(
            url=url, key_prefix=prefix,
            strategy={"name": "idmp", "duration_sec": duration, "max_size": size},
        )

    async def main() -> None:
        first = backend(120, 50)
        await first.init()
        await first.prepare_job(job, 10)
        assert _idmp_config(url, f"{first.job_key(job)}:s") == (120, 50)
        assert await first.claim(ClaimInput(job, 1000, "a", "A"))
        # Another instance with the same settings keeps what the server remembers.
        same = backend(120, 50)
        await same.prepare_job(job, 10)
        assert await same.claim(ClaimInput(job, 1000, "a", "A"))
        assert not await same.claim(ClaimInput(job, 1000, "b", "B"))
        # A changed setting is applied (and clears the server's memory of claims).
        changed = backend(300, 50)
        await changed.prepare_job(job, 10)
        assert _idmp_config(url, f"{first.job_key(job)}:s") == (300, 50)
        for b in (first, same, changed):
            await b.close()

    asyncio.run(main())
