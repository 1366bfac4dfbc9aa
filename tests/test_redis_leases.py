"""The lease rules of SPEC section 9 in the ``lease`` strategy, on Redis (6379) and on a
Valkey server the tests start: early claims, retention from the slot, keep and
max_attempts that only grow, the sweep of a crashed runner whose attempts are used up,
and a repeat-safe finish.

Time is moved by editing the stored run (``HSET finished_at``, ``RENAME`` to a later
slot), never by sleeping; a lease is left to lapse by waiting on ``active()``."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from typing import Any

import pytest

from django_anarchon.backends.base import (
    MIN_KEEP_MS,
    ClaimOutcome,
    FinalStatus,
    OverlapPolicy,
    RunEnd,
    StoredResult,
)
from django_anarchon.backends.redis import RedisProtocolBackend, RedisRunStore
from django_anarchon.backends.redis.scripts import RUN_FORMAT

from .redis_lease_support import (  # noqa: F401  (fixtures)
    Make,
    claim,
    lease_backends,
    run,
    run_hash,
    server_ms,
    text,
    valkey_server,
)

pytestmark = pytest.mark.redis


async def pttl(backend: RedisProtocolBackend, job: str, slot: int) -> int:
    return int(await backend.client().pttl(f"{backend.job_key(job)}:r:{slot}"))


async def lapsed(runs: RedisRunStore, job: str, slot: int) -> None:
    """Wait (5 s at most) until the run's lease has lapsed by the store's clock."""
    deadline = time.monotonic() + 5
    while True:
        active = {a.slot: a for a in await runs.active(job)}
        if slot in active and not active[slot].alive:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"the lease of {job} {slot} never lapsed: {active}")
        await asyncio.sleep(0.02)


# -- early --------------------------------------------------------------------------------


def test_a_claim_before_its_slot_is_early_and_writes_nothing(
    make: Make,
) -> None:
    async def body(backend: RedisProtocolBackend, runs: RedisRunStore) -> None:
        job = "app.early"
        slot = await server_ms(backend) + 5_000
        outcome = await runs.claim(claim(job, slot, "a", max_late_ms=1_000, overlap="allow"))
        assert outcome.kind == "early"
        assert outcome.wait_ms is not None and 4_000 < outcome.wait_ms <= 5_000
        again = await runs.claim_many([claim(job, slot, "b"), claim(job, slot + 1, "c")])
        assert [o.kind for o in again] == ["early", "early"]
        assert await runs.claim(claim(job, slot, "d", mode="takeover")) == ClaimOutcome.none()
        assert await backend.client().keys(f"{backend.job_key(job)}:*") == []
        assert await runs.active(job) == []
        # The slot reached (by the store's clock): the claim wins.
        past = await server_ms(backend) - 1
        assert await runs.claim(claim(job, past, "e")) == ClaimOutcome.won(1)

    run(make, body)


# -- retention ----------------------------------------------------------------------------


def test_keep_ms_only_grows(make: Make) -> None:
    """A claimer with a smaller keep (a rolling deploy that lowered max_late) never
    shortens how long the run is remembered; a larger one lengthens it."""

    async def body(backend: RedisProtocolBackend, runs: RedisRunStore) -> None:
        job = "app.keep"
        slot = await server_ms(backend) - 100
        assert await runs.claim(claim(job, slot, "a", keep_ms=120_000)) == ClaimOutcome.won(1)
        assert await runs.claim(claim(job, slot, "b", keep_ms=20_000)) == ClaimOutcome.running(1)
        assert (await run_hash(backend, job, slot))["keep_ms"] == "120000"
        assert await runs.finish(job, slot, "a", "success")
        assert 100_000 < await pttl(backend, job, slot) <= 120_000
        assert await runs.claim(claim(job, slot, "c", keep_ms=20_000)) == ClaimOutcome.done()
        assert (await run_hash(backend, job, slot))["keep_ms"] == "120000"
        assert 100_000 < await pttl(backend, job, slot) <= 120_000
        assert await runs.claim(claim(job, slot, "d", keep_ms=300_000)) == ClaimOutcome.done()
        assert (await run_hash(backend, job, slot))["keep_ms"] == "300000"
        assert 280_000 < await pttl(backend, job, slot) <= 300_000

    run(make, body)


def test_retention_counts_from_the_slot_when_the_run_finished_before_it(
    make: Make,
) -> None:
    """A run whose finish is earlier than its slot by the store's clock (the clock stepped
    back, or a failover to a server whose clock is behind) is kept until slot + keep.

    The finish path: the run is moved to a slot 30 s ahead (RENAME), then finished.
    The claim path: a loser's claim of a finished run whose finished_at lies before its
    slot puts the expiry at slot + keep."""

    async def body(backend: RedisProtocolBackend, runs: RedisRunStore) -> None:
        job, client, base = "app.retain", backend.client(), backend.job_key("app.retain")
        now = await server_ms(backend)
        assert await runs.claim(claim(job, now - 10, "a")) == ClaimOutcome.won(1)
        ahead = now + 30_000
        await client.rename(f"{base}:r:{now - 10}", f"{base}:r:{ahead}")
        await client.zrem(f"{base}:active", str(now - 10))
        await client.zadd(f"{base}:active", {str(ahead): ahead})
        assert await runs.finish(job, ahead, "a", "success")
        assert 85_000 < await pttl(backend, job, ahead) <= 90_000  # slot + 60 s, not now + 60 s

        slot = await server_ms(backend) - 10
        assert await runs.claim(claim(job, slot, "b")) == ClaimOutcome.won(1)
        assert await runs.finish(job, slot, "b", "success")
        await client.hset(f"{base}:r:{slot}", "finished_at", slot - 30_000)
        await client.persist(f"{base}:r:{slot}")
        assert await runs.claim(claim(job, slot, "c")) == ClaimOutcome.done()
        assert 55_000 < await pttl(backend, job, slot) <= 60_000  # slot + 60 s, not finish + 60 s

    run(make, body)


def test_the_floor_keeps_a_failed_run_for_its_retry(
    make: Make,
) -> None:
    async def body(backend: RedisProtocolBackend, runs: RedisRunStore) -> None:
        job = "app.floor"
        slot = await server_ms(backend) - 10
        first = claim(job, slot, "a", keep_ms=1, max_attempts=2)
        assert await runs.claim(first) == ClaimOutcome.won(1)
        assert await runs.finish(job, slot, "a", "failed")
        assert MIN_KEEP_MS - 2_000 < await pttl(backend, job, slot) <= MIN_KEEP_MS
        retry = claim(job, slot, "b", keep_ms=1, max_attempts=2)
        assert await runs.claim(retry) == ClaimOutcome.won(2)

    run(make, body)


# -- the sweep ----------------------------------------------------------------------------


@pytest.mark.parametrize("overlap", ["skip", "allow"])
def test_the_next_slot_sweeps_a_crashed_run_with_its_attempts_used_up(
    make: Make, overlap: OverlapPolicy
) -> None:
    async def body(backend: RedisProtocolBackend, runs: RedisRunStore) -> None:
        job = f"app.sweep-{overlap}"
        s1 = await server_ms(backend) - 1_000
        crashed = claim(job, s1, "a", lease_ms=100, overlap=overlap, history_size=10)
        assert await runs.claim(crashed) == ClaimOutcome.won(1)
        await lapsed(runs, job, s1)
        s2 = await server_ms(backend) - 1
        nxt = claim(job, s2, "b", overlap=overlap, history_size=10)
        assert await runs.claim(nxt) == ClaimOutcome.won(1)
        assert [a.slot for a in await runs.active(job)] == [s2]
        stored = await run_hash(backend, job, s1)
        assert (stored["state"], stored["status"]) == ("finished", "interrupted")
        assert 0 < await pttl(backend, job, s1) <= 60_000
        records = {(r.slot, r.attempt): r for r in await backend.history(job, 10)}
        swept = records[(s1, 1)]
        assert (swept.status, swept.error) == ("interrupted", "lease lapsed; attempts used up")
        assert swept.instance_id == "A"
        assert records[(s2, 1)].status == "running"
        # The crashed runner, should it come back, is refused; a backup finds it done.
        assert not await runs.heartbeat(job, s1, "a", 1_000)
        # Nobody else could run it: its own runner's late finish still counts.
        assert await runs.finish(job, s1, "a", "success")
        assert not await runs.finish(job, s1, "b", "success")
        assert await runs.claim(claim(job, s1, "c", mode="takeover")) == ClaimOutcome.done()

    run(make, body)


def test_a_saved_result_is_not_overwritten_by_the_sweep(
    make: Make,
) -> None:
    async def body(backend: RedisProtocolBackend, runs: RedisRunStore) -> None:
        job = "app.sweep-saved"
        s1 = await server_ms(backend) - 1_000
        assert await runs.claim(claim(job, s1, "a", lease_ms=100)) == ClaimOutcome.won(1)
        result = StoredResult(s1, "A", 1, "success", s1, s1 + 5, 5, None)
        await backend.save_result(job, result, 10)  # saved, then died before finish()
        await lapsed(runs, job, s1)
        s2 = await server_ms(backend) - 1
        assert await runs.claim(claim(job, s2, "b")) == ClaimOutcome.won(1)
        assert (await run_hash(backend, job, s1))["state"] == "finished"
        records = {(r.slot, r.attempt): r for r in await backend.history(job, 10)}
        assert records[(s1, 1)].status == "success"

    run(make, body)


def test_a_lapsed_run_with_attempts_left_is_not_swept(
    make: Make,
) -> None:
    """Attempts left (by the largest max_attempts any claim of the run carried): a backup
    may still take it over, so a new slot leaves it running."""

    async def body(backend: RedisProtocolBackend, runs: RedisRunStore) -> None:
        job = "app.no-sweep"
        s1 = await server_ms(backend) - 1_000
        assert await runs.claim(claim(job, s1, "a", lease_ms=100)) == ClaimOutcome.won(1)
        # A backup configured with more attempts raises the stored max_attempts.
        backup = claim(job, s1, "b", max_attempts=3)
        assert await runs.claim(backup) == ClaimOutcome.running(1)
        assert (await run_hash(backend, job, s1))["max_attempts"] == "3"
        await lapsed(runs, job, s1)
        s2 = await server_ms(backend) - 1
        assert await runs.claim(claim(job, s2, "c", overlap="allow")) == ClaimOutcome.won(1)
        assert {a.slot for a in await runs.active(job)} == {s1, s2}
        assert (await run_hash(backend, job, s1))["state"] == "running"
        takeover = claim(job, s1, "b", mode="takeover", reason="takeover", max_attempts=3)
        assert await runs.claim(takeover) == ClaimOutcome.won(2)

    run(make, body)


# -- finish -------------------------------------------------------------------------------


def test_finish_is_repeat_safe(make: Make) -> None:
    """The first finish reached the store and its reply was lost: the retry is True."""

    async def body(backend: RedisProtocolBackend, runs: RedisRunStore) -> None:
        job = "app.finish"
        slot = await server_ms(backend) - 10
        assert await runs.claim(claim(job, slot, "a", max_attempts=2)) == ClaimOutcome.won(1)
        assert await runs.finish(job, slot, "a", "failed")
        expiry = await pttl(backend, job, slot)
        finished_at = (await run_hash(backend, job, slot))["finished_at"]
        assert await runs.finish(job, slot, "a", "failed")
        assert (await run_hash(backend, job, slot))["finished_at"] == finished_at
        assert await pttl(backend, job, slot) <= expiry
        assert not await runs.finish(job, slot, "a", "success")
        assert not await runs.finish(job, slot, "x", "failed")
        # After the retry took the run, the first attempt's token is refused.
        assert await runs.claim(claim(job, slot, "b", max_attempts=2)) == ClaimOutcome.won(2)
        assert not await runs.finish(job, slot, "a", "failed")
        assert await runs.finish(job, slot, "b", "success")
        assert await runs.finish(job, slot, "b", "success")

    run(make, body)


def test_new_runs_are_written_in_the_current_format(
    make: Make,
) -> None:
    async def body(backend: RedisProtocolBackend, runs: RedisRunStore) -> None:
        job = "app.format"
        slot = await server_ms(backend) - 10
        assert await runs.claim(claim(job, slot, "a", max_attempts=2)) == ClaimOutcome.won(1)
        stored = await run_hash(backend, job, slot)
        assert (stored["v"], stored["max_attempts"], stored["keep_ms"]) == (
            str(RUN_FORMAT), "2", "60000"
        )

    run(make, body)


# -- one script for a batch ------------------------------------------------------------------


def test_a_batch_is_answered_as_its_claims_one_at_a_time(make: Make) -> None:
    """``claim_many`` sends a batch in one script call (RUN_CLAIM_MANY): every kind of
    answer, claims of one job in one batch, and what they write are as ``claim()``'s."""

    async def body(backend: RedisProtocolBackend, runs: RedisRunStore) -> None:
        now = await server_ms(backend)
        s = now - 1_000
        Step = tuple[str, int, str, dict[str, Any]]

        async def both(steps: list[Step]) -> list[tuple[ClaimOutcome, ClaimOutcome]]:
            one = [await runs.claim(claim(f"one.{j}", slot, t, **kw)) for j, slot, t, kw in steps]
            many = await runs.claim_many(
                [claim(f"many.{j}", slot, t, **kw) for j, slot, t, kw in steps]
            )
            return list(zip(one, many, strict=True))

        def timeless(o: ClaimOutcome) -> ClaimOutcome:
            """The answer without what depends on when the store read its clock."""
            return replace(o, late_ms=None, wait_ms=None)

        for prefix in ("one", "many"):
            await runs.pause(f"{prefix}.paused", "test", "t", None)
        first = await both([
            ("run", s, "a", {}),
            ("run", s, "b", {}),  # the same job's slot again, in the same batch
            ("run", s, "a", {}),  # its winner's token again: a renewal
            ("cancel", s, "a", {"overlap": "cancel_other"}),
            ("buffer", s, "a", {"overlap": "buffer_one"}),
            ("skip", s, "a", {}),
            ("retry", s, "a", {"max_attempts": 2}),
            ("late", now - 600_000, "a", {"max_late_ms": 1_000}),
            ("early", now + 60_000, "a", {}),
            ("takeover", s, "a", {"mode": "takeover"}),
            ("paused", s, "a", {}),
        ])
        assert [timeless(many) for _, many in first] == [
            ClaimOutcome.won(1), ClaimOutcome.running(1), ClaimOutcome.won(1),
            ClaimOutcome.won(1), ClaimOutcome.won(1), ClaimOutcome.won(1), ClaimOutcome.won(1),
            timeless(ClaimOutcome.late(1)), timeless(ClaimOutcome.early(1)),
            ClaimOutcome.none(), ClaimOutcome.paused(),
        ]
        late_ms, early_ms = first[7][1].late_ms, first[8][1].wait_ms
        assert late_ms is not None and 599_000 <= late_ms < 660_000
        assert early_ms is not None and 1 <= early_ms <= 60_000
        for prefix in ("one", "many"):
            assert await runs.finish(f"{prefix}.run", s, "a", "success")
            assert await runs.finish(f"{prefix}.retry", s, "a", "failed")
        second = await both([
            ("cancel", s + 1, "b", {"overlap": "cancel_other"}),
            ("buffer", s + 1, "b", {"overlap": "buffer_one"}),
            ("skip", s + 1, "b", {}),
            ("run", s, "c", {}),
            ("retry", s, "c", {"max_attempts": 2}),
        ])
        assert [timeless(many) for _, many in second] == [
            ClaimOutcome.won(1, cancelled=s), timeless(ClaimOutcome.buffered(s, 1)),
            ClaimOutcome.overlap(s), ClaimOutcome.done(), ClaimOutcome.won(2),
        ]
        for one, many in first + second:
            assert timeless(one) == timeless(many)
        # What the two ways wrote is the same too: the runs, history and the ledger's marks.
        for job in ("run", "cancel", "buffer", "skip", "retry", "late", "paused"):
            assert await stored(backend, f"one.{job}") == await stored(backend, f"many.{job}")

    run(make, body)


def test_a_batch_of_ends_finishes_and_records_as_each_end_alone(make: Make) -> None:
    """``finish_many`` sends its ends in one script call (FINISH_RESULT_MANY): what each
    end answers, and the runs and history they leave, are as one end at a time."""

    async def body(backend: RedisProtocolBackend, runs: RedisRunStore) -> None:
        s = await server_ms(backend) - 1_000

        def result(slot: int, status: FinalStatus, by: str = "A") -> StoredResult:
            return StoredResult(slot=slot, by=by, attempt=1, status=status, started_at=slot,
                                finished_at=slot + 5, duration_ms=5,
                                error="boom" if status == "failed" else None)

        ends: dict[str, list[RunEnd]] = {}
        for way in ("one", "many"):
            for job, slot, kw in ((f"{way}.ok", s, {}), (f"{way}.failed", s, {"max_attempts": 2}),
                                  (f"{way}.stale", s, {}), (f"{way}.two", s, {"overlap": "allow"}),
                                  (f"{way}.two", s + 1, {"overlap": "allow"})):
                assert await runs.claim(claim(job, slot, "a", **kw)) == ClaimOutcome.won(1)
            ends[way] = [
                RunEnd(f"{way}.ok", "a", "success", result(s, "success"), 10),
                RunEnd(f"{way}.failed", "a", "failed", result(s, "failed"), 10),
                RunEnd(f"{way}.stale", "b", "success", result(s, "success", "B"), 10),
                RunEnd(f"{way}.none", "a", "success", result(s, "success"), 10),
                RunEnd(f"{way}.two", "a", "success", result(s, "success"), 1, 60_000),
                RunEnd(f"{way}.two", "a", "failed", result(s + 1, "failed"), 1, 60_000),
            ]
        alone = [(await runs.finish_many([end]))[0] for end in ends["one"]]
        together = await runs.finish_many(ends["many"])
        assert together == alone == [True, True, False, False, True, True]
        for job in ("ok", "failed", "stale", "none", "two"):
            assert await stored(backend, f"one.{job}") == await stored(backend, f"many.{job}")
        # The failed run is retried, the successful one is done, on both.
        for way in ("one", "many"):
            again = claim(f"{way}.failed", s, "c", max_attempts=2)
            assert await runs.claim(again) == ClaimOutcome.won(2)
            assert await runs.claim(claim(f"{way}.ok", s, "c")) == ClaimOutcome.done()

    run(make, body)


async def stored(backend: RedisProtocolBackend, job: str) -> dict[str, Any]:
    """Every key of ``job`` and what it holds, without the fields that carry a time."""
    client = backend.client()
    base = backend.job_key(job)
    found: dict[str, Any] = {}
    for key in await client.keys(f"{base}:*"):
        name = text(key)[len(base):]
        kind = text(await client.type(key))
        if kind == "hash" and name == ":b":  # buffered slots, each held until a time
            found[name] = sorted(text(k) for k in await client.hkeys(key))
        elif kind == "hash":
            raw = {text(k): text(v) for k, v in (await client.hgetall(key)).items()}
            found[name] = {k: _timeless(v) for k, v in raw.items()
                           if k not in {"lease_until", "started_at", "finished_at", "at"}}
        elif kind == "zset":
            found[name] = sorted(text(m) for m in await client.zrange(key, 0, -1))
        else:
            found[name] = kind
    return found


def _timeless(value: str) -> Any:
    """A JSON record without its times (history, marks); other values as they are."""
    if not value.startswith("{"):
        return value
    record = json.loads(value)
    return {k: v for k, v in record.items()
            if k not in {"at", "started_at", "finished_at", "duration_ms"}}
