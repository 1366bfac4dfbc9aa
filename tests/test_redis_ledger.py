"""The ledger of the ``lease`` strategy as stored on Redis and Valkey: where its keys are,
what they hold, when they expire, and the backfill ran-check over a large history (the
rules themselves are the contract suite's, ``django_anarchon.testing.ledger``)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from django_anarchon.backends.base import ClaimOutcome
from django_anarchon.backends.redis import RedisProtocolBackend, RedisRunStore

from .redis_lease_support import Make, claim, lease_backends, run, server_ms, text, valkey_server  # noqa: F401  (fixtures)

pytestmark = pytest.mark.redis


@pytest.mark.parametrize("job", ["app.ledger-keys", "app.{braced}"])
def test_the_ledger_keys_are_the_jobs_own(
    make: Make, job: str
) -> None:
    """Every key is under ``job_key(job)`` (one cluster slot), in the documented formats."""

    async def body(backend: RedisProtocolBackend, runs: RedisRunStore) -> None:
        client = backend.client()
        base = backend.job_key(job)
        now = await server_ms(backend)
        assert (await runs.claim(claim(job, now - 60_000, "a", max_late_ms=1000))).kind == "late"
        await runs.pause(job, "why", "ops", now + 60_000)
        (since_ms,) = await runs.job_since([(job, "every 1m")])
        keys = sorted([text(k) async for k in client.scan_iter(match=f"{backend.key_prefix}:*")])
        assert keys == sorted(f"{base}:{k}" for k in ("m", "mi", "p", "since")), keys
        mark = json.loads(text(await client.hget(f"{base}:m", str(now - 60_000))))
        assert now <= mark.pop("at") <= since_ms, mark
        assert mark == {
            "v": 1, "slot": now - 60_000, "fate": "skipped", "reason": "late", "by": "A",
            "last": now - 60_000, "count": 1,
        }
        assert await client.zscore(f"{base}:mi", str(now - 60_000)) == now - 60_000
        pause = {text(k): text(v) for k, v in (await client.hgetall(f"{base}:p")).items()}
        assert (pause["v"], pause["note"], pause["by"], pause["until"]) == (
            "1", "why", "ops", str(now + 60_000)
        )
        since = {text(k): text(v) for k, v in (await client.hgetall(f"{base}:since")).items()}
        assert (since["v"], since["fingerprint"], since["since"]) == (
            "1", "every 1m", str(since_ms)
        )

    run(make, body)


def test_the_marks_expire_with_the_ttl_and_the_pause_at_its_until(
    make: Make,
) -> None:
    async def body(backend: RedisProtocolBackend, runs: RedisRunStore) -> None:
        client = backend.client()
        job = "app.ledger-expiry"
        base = backend.job_key(job)
        now = await server_ms(backend)
        assert await runs.mark_skipped(job, now - 5_000, "late", "I", 100, None)
        assert await client.pttl(f"{base}:m") == -1
        assert await client.pttl(f"{base}:mi") == -1
        # With a ttl: the newest mark's last slot + ttl (+ a second).
        assert await runs.mark_missed(job, [(now - 4_000, now - 2_000, 3)], "I", 100, 60_000) == 1
        for key in (f"{base}:m", f"{base}:mi"):
            assert 55_000 < int(await client.pttl(key)) <= 61_000, key
        # A pause with an until: its hash goes by itself, and resume finds nothing.
        await runs.pause(job, "", "ops", now + 60_000)
        assert 55_000 < int(await client.pttl(f"{base}:p")) <= 60_000
        until = await server_ms(backend) + 300
        await runs.pause(job, "", "ops", until)
        deadline = time.monotonic() + 10
        while await client.exists(f"{base}:p"):
            assert time.monotonic() < deadline, "the pause hash never expired"
            await asyncio.sleep(0.05)
        assert await runs.resume(job) is None

    run(make, body)


def test_a_backfill_scans_a_large_history(make: Make) -> None:
    """The ran-check pages through the whole of ``hs`` (thousands of records, so several
    ZSCAN pages), and counts neither manual records nor other slots."""

    async def body(backend: RedisProtocolBackend, runs: RedisRunStore) -> None:
        client = backend.client()
        job = "app.ledger-big"
        hs = f"{backend.job_key(job)}:hs"
        now = await server_ms(backend)
        ran, manual, never = now - 600_000, now - 500_000, now - 400_000
        fields = {f"{now - 10_000_000 + i:015d}:00001:0:instance-{i}": i for i in range(5000)}
        fields[f"{manual:015d}:00001:1:someone"] = 5000
        fields[f"{ran:015d}:00002:0:someone"] = 2500  # in the middle by score
        await client.zadd(hs, fields)
        assert await runs.claim(claim(job, ran, "a", reason="backfill")) == ClaimOutcome.done()
        assert await runs.claim(claim(job, manual, "a", reason="backfill")) == ClaimOutcome.won(1)
        assert await runs.claim(claim(job, never, "a", reason="backfill", overlap="allow")) == (
            ClaimOutcome.won(1)
        )

    run(make, body)


def test_bad_mark_ranges_are_refused_by_name(make: Make) -> None:
    async def body(backend: RedisProtocolBackend, runs: RedisRunStore) -> None:
        with pytest.raises(ValueError, match=r"job 'app.bad'.*\(2000, 1000, 2\)"):
            await runs.mark_missed("app.bad", [(2000, 1000, 2)], "I", 100, None)
        assert await runs.mark_missed("app.bad", [], "I", 100, None) == 0
        assert await runs.marks("app.bad", None, None, 10) == []

    run(make, body)
