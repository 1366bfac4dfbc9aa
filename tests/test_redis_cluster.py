"""The ``lease`` strategy on a three-node Redis Cluster started by the tests on loopback
ports: every key of a job carries the job's hash tag, so each script runs on one node."""

from __future__ import annotations

import asyncio
import time
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


def test_the_sweep_ends_a_crashed_run_on_its_node(cluster: RedisClusterNodes) -> None:
    """The sweep writes runs of the job that the script was not given as keys: they share
    the job's hash tag, so the node that runs the script holds them."""

    async def main() -> None:
        backend = RedisBackend(host="127.0.0.1", port=cluster.ports[0], cluster=True)
        assert backend.runs is not None
        runs = backend.runs
        sec, usec = await backend.client().time()
        now = int(sec) * 1000 + int(usec) // 1000
        try:
            for i in range(6):  # jobs on every node
                job = f"app.sweep{i}"
                assert await runs.claim(RunClaim(job, now - 5_000, "a", "A", lease_ms=50)) == (
                    ClaimOutcome.won(1)
                )
            deadline = time.monotonic() + 5
            for i in range(6):
                while any(a.alive for a in await runs.active(f"app.sweep{i}")):
                    assert time.monotonic() < deadline, "the leases never lapsed"
                    await asyncio.sleep(0.02)
            for i in range(6):
                job = f"app.sweep{i}"
                assert await runs.claim(RunClaim(job, now - 1, "b", "B")) == ClaimOutcome.won(1)
                assert [a.slot for a in await runs.active(job)] == [now - 1]
                assert await runs.finish(job, now - 5_000, "a", "success")  # its own late word
                records = await backend.history(job, 5)
                assert [(r.slot, r.status) for r in records if r.slot == now - 5_000] == [
                    (now - 5_000, "interrupted")
                ]
        finally:
            await backend.close()

    asyncio.run(main())
