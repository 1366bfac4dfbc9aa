"""The backend's connection threads under load: a lease's calls are not queued behind claims.

Every ORM call of a ``DatabaseBackend`` waits for one of its few threads. Behind a burst
of claims (a restart's catch-up, many watchers, a slow database), a heartbeat taken in
turn arrives after the whole burst, possibly after its lease lapsed: a live runner is then
taken over. Heartbeat, finish and release go ahead of queued work.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from django_anarchon.backends.base import RunClaim
from django_anarchon.backends.database import DatabaseBackend

pytestmark = pytest.mark.usefixtures("database_access")

ALIASES = [
    pytest.param("postgres_database", marks=pytest.mark.postgres, id="postgres"),
    pytest.param("mysql_database", marks=pytest.mark.mysql, id="mysql"),
    pytest.param("sqlite_database", id="sqlite"),
]
BURST = 200


@pytest.mark.parametrize("fixture", ALIASES)
def test_lease_calls_go_ahead_of_queued_claims(
    fixture: str, request: pytest.FixtureRequest
) -> None:
    alias: str = request.getfixturevalue(fixture)

    async def main() -> None:
        backend = DatabaseBackend(using=alias, max_connections=4)
        try:
            await backend.init()
            prefix = uuid.uuid4().hex
            slot = await backend._call(lambda: backend.store().now_ms()) - 1_000
            job = f"threads-{prefix}"
            mine = RunClaim(job=job, slot=slot, token="a", instance_id="A")
            assert (await backend.runs.claim(mine)).kind == "won"
            done: list[int] = []

            async def claim(i: int) -> None:
                other = RunClaim(job=f"threads-{prefix}-{i}", slot=slot, token="t",
                                 instance_id="B")
                await backend.runs.claim(other)
                done.append(i)

            burst = [asyncio.create_task(claim(i)) for i in range(BURST)]
            await asyncio.sleep(0)  # every claim is in the threads' queue now
            started = time.perf_counter()
            assert await backend.runs.heartbeat(job, slot, "a", 30_000) is True
            beat_ms, beat_after = (time.perf_counter() - started) * 1000, len(done)
            assert await backend.runs.finish(job, slot, "a", "success") is True
            finish_after = len(done)
            await asyncio.gather(*burst)
            burst_ms = (time.perf_counter() - started) * 1000
            print(
                f"\n{alias}: heartbeat after {beat_after} of {BURST} queued claims "
                f"({beat_ms:.0f} ms; the burst took {burst_ms:.0f} ms)"
            )
            # Only claims already in a thread (4) may finish first, and a few more while
            # the answer travels back to this loop; in turn it would be all of them.
            assert beat_after < BURST // 4, (beat_after, beat_ms)
            assert finish_after < BURST // 2, finish_after
        finally:
            await backend.close()

    asyncio.run(main())
