"""The ``lease`` strategy on a three-node Redis Cluster started by the tests on loopback
ports: every key of a job carries the job's hash tag, so each script runs on one node."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from django_anarchon.backends.base import ClaimInput, ClaimOutcome, RunClaim
from django_anarchon.backends.redis import RedisBackend
from django_anarchon.testing import BackendContract, BackendFactory

from .redis_support import RedisClusterNodes

pytestmark = pytest.mark.redis


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisClusterNodes]:
    nodes = RedisClusterNodes()
    yield nodes
    nodes.stop()


class TestRedisClusterLease(BackendContract):
    race_claimers = 50
    race_rounds = 200
    # A cluster client cannot pipeline scripts, so claim_many is one call per claim: keep
    # that race small (the single-slot races carry the weight).
    race_many_jobs = 10
    race_many_rounds = 8

    @pytest.fixture
    def make_backend(self, cluster: RedisClusterNodes) -> BackendFactory:
        return lambda: RedisBackend(host="127.0.0.1", port=cluster.ports[0], cluster=True)


def test_jobs_spread_over_the_nodes(cluster: RedisClusterNodes) -> None:
    """Different jobs land on different nodes, and each still decides in one script."""

    async def main() -> set[str]:
        backend = RedisBackend(host="127.0.0.1", port=cluster.ports[1], cluster=True)
        await backend.init()
        assert backend.runs is not None
        client = backend.client()
        nodes = set()
        for i in range(30):
            job = f"app.job{i}"
            assert await backend.claim(ClaimInput(job, 1000, "t", "A"))
            outcome = await backend.runs.claim(RunClaim(job, 2000, "r", "A"))
            assert outcome == ClaimOutcome.won(1)
            node = client.get_node_from_key(f"{backend.job_key(job)}:r:2000")
            nodes.add(f"{node.host}:{node.port}")
        assert backend.describe().startswith(f"redis cluster 127.0.0.1:{cluster.ports[1]} ")
        await backend.close()
        return nodes

    assert len(asyncio.run(main())) == 3
