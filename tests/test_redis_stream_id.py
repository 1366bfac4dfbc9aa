"""The stream-id strategy's one blind spot, made loud: a slot whose claim reaches the
server after a later slot's XADD can never be added (XADD takes only larger IDs), so
nobody runs it. Every claimer gets False, and the backend logs a WARNING naming the job
and the slot, on Redis (6379) and on a Valkey server the tests start."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from django_anarchon.backends.base import ClaimInput
from django_anarchon.backends.redis import RedisBackend, RedisProtocolBackend
from django_anarchon.backends.valkey import ValkeyBackend

from .redis_support import ValkeyServer, delete_prefix, redis_url

pytestmark = pytest.mark.redis

Factory = Callable[[int], RedisProtocolBackend]


@pytest.fixture(scope="module")
def valkey() -> Iterator[ValkeyServer]:
    server = ValkeyServer()
    yield server
    server.stop()


@pytest.fixture(params=["redis", "valkey"])
def make(request: pytest.FixtureRequest) -> Iterator[Factory]:
    """stream-id backends with a given maxlen, under a key prefix of this test's own."""
    prefix = f"anarchon-test-{uuid.uuid4().hex[:12]}"
    if request.param == "redis":
        url = redis_url()
        yield lambda maxlen: RedisBackend(
            url=url, key_prefix=prefix, strategy={"name": "stream-id", "maxlen": maxlen}
        )
        delete_prefix(url, prefix)
    else:
        server: ValkeyServer = request.getfixturevalue("valkey")
        yield lambda maxlen: ValkeyBackend(
            url=server.url, key_prefix=prefix, strategy={"name": "stream-id", "maxlen": maxlen}
        )
        delete_prefix(server.url, prefix)


def lost_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records
        if r.name == "django_anarchon" and r.levelno == logging.WARNING and "is lost" in r.getMessage()
    ]


def test_a_slot_passed_by_a_later_one_is_refused_loudly(
    make: Factory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="django_anarchon")
    backend = make(1000)
    job = "app.passed"

    async def main() -> None:
        assert await backend.claim(ClaimInput(job, 5000, "t5", "A"))
        assert lost_warnings(caplog) == []
        # Slot 6000's claim is delayed (a store outage, a slow instance); 7000 goes first.
        assert await backend.claim(ClaimInput(job, 7000, "t7", "B"))
        assert not await backend.claim(ClaimInput(job, 6000, "t6", "A"))
        assert not await backend.claim(ClaimInput(job, 6000, "other", "B"))
        assert not await backend.claim(ClaimInput(job, 6000, "again", "C"))
        assert await backend.claim(ClaimInput(job, 7000, "t7", "B"))  # its own token again
        # Older than any entry, but nothing was ever trimmed: also never claimed.
        assert not await backend.claim(ClaimInput(job, 4000, "t4", "A"))
        # Taken slots stay quiet.
        assert not await backend.claim(ClaimInput(job, 5000, "x", "B"))
        await backend.close()

    asyncio.run(main())
    warnings = lost_warnings(caplog)
    assert len(warnings) == 4, warnings
    assert all("'app.passed'" in w for w in warnings)
    assert [w.split()[2] for w in warnings] == [
        "1970-01-01T00:00:06+00:00", "1970-01-01T00:00:06+00:00", "1970-01-01T00:00:06+00:00",
        "1970-01-01T00:00:04+00:00",
    ]
    assert "'lease' or 'script' strategy" in warnings[0]


def test_a_trimmed_slot_is_refused_quietly(
    make: Factory, caplog: pytest.LogCaptureFixture
) -> None:
    """Below the largest trimmed ID the script cannot tell "trimmed" from "never added":
    it answers taken, without a warning that might be false."""
    caplog.set_level(logging.WARNING, logger="django_anarchon")
    backend = make(1)
    job = "app.trimmed"

    async def main() -> None:
        assert await backend.claim(ClaimInput(job, 5000, "t5", "A"))
        for i in range(300):  # enough for approximate trimming to drop whole nodes
            assert await backend.claim(ClaimInput(job, 7000 + i, f"x{i}", "C"))
        assert not await backend.claim(ClaimInput(job, 5000, "t5", "A"))
        assert not await backend.claim(ClaimInput(job, 6000, "t6", "A"))
        await backend.close()

    asyncio.run(main())
    assert lost_warnings(caplog) == []


def test_a_claim_ahead_of_the_server_clock_waits_for_its_slot(make: Factory) -> None:
    """A claimer whose clock runs ahead must not add a later slot before the others claim
    the earlier ones (they could then never be added): it waits for the server's clock."""

    async def scenario() -> None:
        backend, other = make(1000), make(1000)
        try:
            job = "stream-ahead"
            await backend.init()
            await backend.prepare_job(job, 10)
            now = time.time_ns() // 1_000_000
            later, earlier = now + 1_500, now + 500
            claim_later = asyncio.ensure_future(
                backend.claim(ClaimInput(job, later, "ahead", "ahead"))
            )
            await asyncio.sleep(0.1)
            assert not claim_later.done()  # waiting for its slot, nothing added yet
            assert await other.claim(ClaimInput(job, earlier, "in-time", "B")) is True
            assert await claim_later is True
            assert time.time_ns() // 1_000_000 >= later
        finally:
            for b in (backend, other):
                await b.close()

    asyncio.run(scenario())


def test_a_failed_claim_keeps_its_place_before_the_next_slot(make: Factory) -> None:
    """Found by the fault runs: a claim of slot S failed as the server restarted, the next
    slot's first claim went out before S's retry, and S could never be added again."""

    async def scenario() -> None:
        backend = make(1000)
        try:
            job = "stream-order"
            await backend.init()
            await backend.prepare_job(job, 10)
            first = (time.time_ns() // 1_000_000) - 1_000
            real_eval = backend.eval
            cuts = {first}

            async def eval(script: Any, keys: Any, args: Any) -> Any:  # the connection drops
                if args and args[0] in cuts:
                    cuts.discard(args[0])
                    raise ConnectionError("connection reset by peer (test)")
                return await real_eval(script, keys, args)

            backend.eval = eval  # type: ignore[method-assign]
            with pytest.raises(ConnectionError):
                await backend.claim(ClaimInput(job, first, "a", "A"))
            later = asyncio.ensure_future(backend.claim(ClaimInput(job, first + 250, "b", "A")))
            await asyncio.sleep(0.3)
            assert not later.done()  # waits for the earlier slot's retry
            assert await backend.claim(ClaimInput(job, first, "a", "A")) is True  # the retry
            assert await later is True
        finally:
            await backend.close()

    asyncio.run(scenario())


def test_a_worker_ahead_claims_at_the_servers_slot_not_seconds_early(
    make: Factory, skew: Any
) -> None:
    """A fault run lost a slot so: a worker 5 s ahead sent each claim 5 s early; the
    server held each until its slot (``early``), each held a thread meanwhile, so the
    pool overflowed and the slots went out in batches, and a win inside a batch was acted
    on only once the batch's last slot was claimable, 1.8 s later: killed in between, it
    never ran. Its timers are now armed by the server's clock, as on a lease store."""
    from django_anarchon.engine import Scheduler

    from .test_engine_support import Calls, real_ms, stop_all, wait_for

    skew(5_000)
    sent: list[tuple[int, float]] = []
    calls = Calls()

    async def scenario() -> None:
        backend = make(1000)
        real_claim = backend.claim

        async def claim(input: ClaimInput) -> bool:
            sent.append((input.slot, real_ms()))
            return await real_claim(input)

        backend.claim = claim  # type: ignore[method-assign]
        ahead = Scheduler(backend, instance_id="ahead", threads=4)
        ahead.every("tick", "100ms", lambda ctx: calls.add(slot=ctx.slot, at=real_ms()))
        await ahead.start()
        try:
            await wait_for(lambda: len(calls) >= 20, 15, "twenty runs")
        finally:
            await stop_all(ahead)

    asyncio.run(scenario())
    assert all(at >= slot - 300 for slot, at in sent), [s for s in sent if s[1] < s[0] - 300][:5]
    for call in calls.items:
        assert call["slot"] <= call["at"] < call["slot"] + 1_000, call


def test_a_full_pool_claims_a_jobs_slots_in_slot_order(make: Factory) -> None:
    """The slots that wait for a thread go out oldest first, one claim each (stream-id has
    no batch claim: a batch is answered with its last claim). Before, a slot that fell due
    as a thread came free went out first, and the older one was lost ("is lost")."""
    from django_anarchon.engine import Scheduler

    from .test_engine_support import RARELY, queue_behind_a_full_pool, stop_all

    sent: list[int] = []
    won: list[int] = []

    async def scenario() -> None:
        backend = make(1000)
        real_claim = backend.claim

        async def claim(input: ClaimInput) -> bool:
            sent.append(input.slot)
            if await real_claim(input):
                won.append(input.slot)
                return True
            return False

        backend.claim = claim  # type: ignore[method-assign]
        scheduler = Scheduler(backend, instance_id="A", threads=1)
        scheduler.cron("tick", RARELY, lambda ctx: None)
        await scheduler.start()
        try:
            await queue_behind_a_full_pool(scheduler, sent)
        finally:
            await stop_all(scheduler)

    asyncio.run(scenario())
    assert sent == sorted(sent) and len(sent) == 4, sent
    assert won == sent, (won, sent)
    assert getattr(make(1000), "claim_many", None) is None
