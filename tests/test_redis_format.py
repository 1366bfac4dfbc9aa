"""Run hashes across releases: this release (format 2) reads and ends format-1 hashes, and
the previous release's own scripts, kept below verbatim, still work on the hashes this
one writes, as they must while both share a server during a rolling deploy.

The previous release's RUN_CLAIM and FINISH take the same KEYS and ARGV as this
release's, so the test sends them with this release's arguments."""

from __future__ import annotations

import asyncio
import time

import pytest

from django_anarchon.backends.base import ClaimOutcome, OverlapPolicy, RunClaim
from django_anarchon.backends.redis import RedisProtocolBackend, RedisRunStore
from django_anarchon.backends.redis.core import _outcome
from django_anarchon.backends.redis.scripts import Script

from .redis_lease_support import (  # noqa: F401  (fixtures)
    Make,
    claim,
    lease_backends,
    run,
    run_hash,
    server_ms,
    valkey_server,
)

pytestmark = pytest.mark.redis


async def wait_lapsed(backend: RedisProtocolBackend, job: str, slot: int) -> None:
    """Wait (on the store's clock) until the run's stored lease has lapsed."""
    deadline = time.monotonic() + 5
    while int((await run_hash(backend, job, slot))["lease_until"]) >= await server_ms(backend):
        if time.monotonic() > deadline:
            raise AssertionError(f"the lease of {job} {slot} never lapsed")
        await asyncio.sleep(0.02)


async def previous_claim(runs: RedisRunStore, c: RunClaim) -> ClaimOutcome:
    """runs.claim() as the previous release decides it."""
    _, keys, args = runs._claim_call(c)
    return _outcome(await runs._backend.eval(PREVIOUS_RUN_CLAIM, keys, args))


async def previous_finish(
    runs: RedisRunStore, job: str, slot: int, token: str, status: str
) -> bool:
    base = runs._backend.job_key(job)
    keys = [f"{base}:r:{slot}", f"{base}:active"]
    done = await runs._backend.eval(PREVIOUS_FINISH, keys, [token, status, slot, 86_400_000, 10_000])
    return int(done) == 1


async def write_v1_run(
    backend: RedisProtocolBackend, job: str, slot: int, *, state: str, lease_until: int,
    status: str = "", finished_at: int | str = "", attempt: int = 1,
) -> str:
    """A run hash exactly as the previous release wrote it: format 1, no max_attempts."""
    base = backend.job_key(job)
    key = f"{base}:r:{slot}"
    await backend.client().hset(key, mapping={
        "v": 1, "attempt": attempt, "token": "old", "owner": "OLD", "lease_until": lease_until,
        "state": state, "status": status, "reason": "scheduled", "started_at": slot,
        "finished_at": finished_at, "keep_ms": 60_000,
    })
    if state == "running":
        await backend.client().zadd(f"{base}:active", {str(slot): slot})
    return key


# -- this release on format-1 hashes ------------------------------------------------------


@pytest.mark.parametrize("overlap", ["skip", "allow"])
def test_a_format_1_run_is_never_swept(
    make: Make, overlap: OverlapPolicy
) -> None:
    """Its max_attempts is unknown: a backup of the previous release may still take it."""

    async def body(backend: RedisProtocolBackend, runs: RedisRunStore) -> None:
        job = "app.v1-sweep"
        now = await server_ms(backend)
        await write_v1_run(backend, job, now - 5_000, state="running", lease_until=now - 1_000)
        nxt = claim(job, now - 1, "n", overlap=overlap)
        assert await runs.claim(nxt) == ClaimOutcome.won(1)
        assert (await run_hash(backend, job, now - 5_000))["state"] == "running"
        assert {a.slot: a.alive for a in await runs.active(job)} == {
            now - 5_000: False, now - 1: True
        }
        # The lease table still ends it when a backup with no attempts left comes.
        backup = claim(job, now - 5_000, "b", mode="takeover", reason="takeover")
        assert await runs.claim(backup) == ClaimOutcome.done()
        ended = await run_hash(backend, job, now - 5_000)
        assert (ended["state"], ended["status"]) == ("finished", "interrupted")
        ttl = int(await backend.client().pttl(f"{backend.job_key(job)}:r:{now - 5_000}"))
        assert 50_000 < ttl <= 60_000

    run(make, body)


def test_a_format_1_run_is_taken_over_and_finished(make: Make) -> None:
    async def body(backend: RedisProtocolBackend, runs: RedisRunStore) -> None:
        job = "app.v1-takeover"
        now = await server_ms(backend)
        slot = now - 5_000
        await write_v1_run(backend, job, slot, state="running", lease_until=now - 1_000)
        takeover = claim(job, slot, "b", mode="takeover", reason="takeover", max_attempts=2)
        assert await runs.claim(takeover) == ClaimOutcome.won(2)
        stored = await run_hash(backend, job, slot)
        assert (stored["v"], stored["max_attempts"], stored["token"]) == ("2", "2", "b")
        assert await runs.finish(job, slot, "b", "success")
        assert await runs.finish(job, slot, "b", "success")
        # A format-1 runner's own finish on its format-1 hash.
        await write_v1_run(backend, job, now - 4_000, state="running", lease_until=now + 30_000)
        assert await runs.finish(job, now - 4_000, "old", "success")
        assert not await runs.finish(job, now - 4_000, "other", "success")

    run(make, body)


def test_a_format_1_finished_run_gets_the_new_retention(
    make: Make,
) -> None:
    """The previous release expired a run at finished_at + keep; the first claim that sees
    it moves the expiry to max(finished_at, slot) + keep (never earlier)."""

    async def body(backend: RedisProtocolBackend, runs: RedisRunStore) -> None:
        job = "app.v1-retain"
        now = await server_ms(backend)
        slot = now + 30_000  # the run "finished" 30 s before its slot by the store's clock
        key = await write_v1_run(backend, job, slot, state="finished", lease_until=now,
                                 status="success", finished_at=now)
        await backend.client().pexpireat(key, now + 60_000)
        assert await runs.claim(claim(job, slot, "late")) == ClaimOutcome.done()
        assert 85_000 < int(await backend.client().pttl(key)) <= 90_000

    run(make, body)


# -- the previous release on this release's hashes ---------------------------------------


def test_the_previous_release_works_on_format_2_runs(
    make: Make,
) -> None:
    async def body(backend: RedisProtocolBackend, runs: RedisRunStore) -> None:
        job = "app.mixed"
        s1 = await server_ms(backend) - 5_000
        # This release wins; the previous one sees it running, then finishes it for us.
        assert await runs.claim(claim(job, s1, "a")) == ClaimOutcome.won(1)
        assert await previous_claim(runs, claim(job, s1, "p")) == ClaimOutcome.running(1)
        assert await previous_finish(runs, job, s1, "a", "success")
        assert await runs.claim(claim(job, s1, "b")) == ClaimOutcome.done()
        assert await previous_claim(runs, claim(job, s1, "p")) == ClaimOutcome.done()

        # The previous release takes over a run of ours with more attempts than we knew of:
        # its attempt is format 1 again, so this release never sweeps it.
        s2 = s1 + 1_000
        assert await runs.claim(claim(job, s2, "a", lease_ms=100)) == ClaimOutcome.won(1)
        await wait_lapsed(backend, job, s2)
        taken = claim(job, s2, "p", mode="takeover", reason="takeover", max_attempts=3,
                      lease_ms=100)
        assert await previous_claim(runs, taken) == ClaimOutcome.won(2)
        assert (await run_hash(backend, job, s2))["v"] == "1"
        await wait_lapsed(backend, job, s2)
        s3 = s1 + 2_000
        assert await runs.claim(claim(job, s3, "n", overlap="allow")) == ClaimOutcome.won(1)
        assert (await run_hash(backend, job, s2))["state"] == "running"
        again = claim(job, s2, "q", mode="takeover", reason="takeover", max_attempts=3)
        assert await previous_claim(runs, again) == ClaimOutcome.won(3)
        assert await previous_finish(runs, job, s2, "q", "failed")

        # A run this release swept reads as done to the previous release.
        s4 = s1 + 3_000
        assert await runs.claim(claim(job, s4, "a", lease_ms=100, overlap="allow")) == (
            ClaimOutcome.won(1)
        )
        await wait_lapsed(backend, job, s4)
        s5 = s1 + 4_000
        assert await runs.claim(claim(job, s5, "n", overlap="allow")) == ClaimOutcome.won(1)
        assert (await run_hash(backend, job, s4))["state"] == "finished"
        assert await previous_claim(runs, claim(job, s4, "p", mode="takeover")) == (
            ClaimOutcome.done()
        )

    run(make, body)


def test_the_previous_release_reads_a_cancelled_run_as_done(
    make: Make,
) -> None:
    """overlap cancel_other: the fenced run's old token is refused by the previous
    release's finish too, and its claims neither retry nor take the run over."""

    async def body(backend: RedisProtocolBackend, runs: RedisRunStore) -> None:
        job = "app.cancelled"
        s1 = await server_ms(backend) - 5_000
        first = claim(job, s1, "a", overlap="cancel_other", max_attempts=3)
        assert await runs.claim(first) == ClaimOutcome.won(1)
        second = claim(job, s1 + 1_000, "b", overlap="cancel_other", max_attempts=3)
        assert await runs.claim(second) == ClaimOutcome.won(1, cancelled=s1)
        assert (await run_hash(backend, job, s1))["status"] == "cancelled"
        assert await previous_finish(runs, job, s1, "a", "success") is False
        assert await previous_finish(runs, job, s1, "a", "interrupted") is False
        retry = claim(job, s1, "p", max_attempts=3)
        assert await previous_claim(runs, retry) == ClaimOutcome.done()
        takeover = claim(job, s1, "q", mode="takeover", reason="takeover", max_attempts=3)
        assert await previous_claim(runs, takeover) == ClaimOutcome.done()

    run(make, body)


# -- the ledger's keys (marks, pause) beside the previous release ---------------------------


def test_the_previous_release_works_beside_the_ledger_keys(
    make: Make,
) -> None:
    """It never reads ``m``, ``mi``, ``p``: it runs a paused job's slots and marks nothing
    (the documented cost of a deploy), and this release's rules hold on the same keys."""

    async def body(backend: RedisProtocolBackend, runs: RedisRunStore) -> None:
        job = "app.ledger-mixed"
        s1 = await server_ms(backend) - 60_000
        assert (await runs.claim(claim(job, s1, "a", max_late_ms=1000))).kind == "late"
        await runs.pause(job, "deploy", "ops", None)
        assert await runs.claim(claim(job, s1 + 1_000, "b")) == ClaimOutcome.paused()
        marks = [(m.slot, m.reason) for m in await runs.marks(job, None, None, 10)]
        assert marks == [(s1 + 1_000, "paused"), (s1, "late")]
        # The previous release: late without a mark, and a paused job's new slot won.
        assert (await previous_claim(runs, claim(job, s1 + 2_000, "p", max_late_ms=1000))).kind == (
            "late"
        )
        assert await previous_claim(runs, claim(job, s1 + 3_000, "p")) == ClaimOutcome.won(1)
        assert await previous_finish(runs, job, s1 + 3_000, "p", "success")
        assert [(m.slot, m.reason) for m in await runs.marks(job, None, None, 10)] == marks
        # This release on the slot the previous one ran: done; on a new slot: paused.
        assert await runs.claim(claim(job, s1 + 3_000, "c")) == ClaimOutcome.done()
        assert await runs.claim(claim(job, s1 + 4_000, "c")) == ClaimOutcome.paused()
        assert await runs.resume(job) is not None
        assert await runs.claim(claim(job, s1 + 5_000, "d")) == ClaimOutcome.won(1)

    run(make, body)


def test_a_backfill_sees_the_history_the_previous_release_wrote(
    make: Make,
) -> None:
    """The ran-check reads history itself, so a slot the previous release ran (before the
    upgrade or during the deploy) is never run again once its run hash has expired."""

    async def body(backend: RedisProtocolBackend, runs: RedisRunStore) -> None:
        job = "app.ledger-backfill-v1"
        s1 = await server_ms(backend) - 60_000
        assert await previous_claim(runs, claim(job, s1, "p")) == ClaimOutcome.won(1)
        assert await previous_finish(runs, job, s1, "p", "success")
        await backend.client().delete(f"{backend.job_key(job)}:r:{s1}")  # as its expiry would
        assert await runs.claim(claim(job, s1, "a", reason="backfill")) == ClaimOutcome.done()
        assert await runs.claim(claim(job, s1 + 1_000, "a", reason="backfill")) == (
            ClaimOutcome.won(1)
        )

    run(make, body)


# The previous release's scripts (format 1), verbatim.
_PREVIOUS_PRELUDE = r"""
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function record_field(slot, attempt, manual, by)
  return string.format('%015d:%05d:%d:%s', slot, attempt, manual, by)
end

local function hist_drop(h, f)
  redis.call('HDEL', KEYS[h], f)
  redis.call('HDEL', KEYS[h + 1], f)
  redis.call('ZREM', KEYS[h + 2], f)
  redis.call('ZREM', KEYS[h + 3], f)
  if string.sub(f, 23, 23) == '1' then
    redis.call('HDEL', KEYS[h + 4], tostring(tonumber(string.sub(f, 1, 15))))
  end
end

-- Keep the newest ``size`` records and none that ended more than ``ttl`` ms ago.
local function hist_prune(h, size, ttl, now)
  if size >= 0 then
    for _, f in ipairs(redis.call('ZREVRANGE', KEYS[h + 2], size, -1)) do
      hist_drop(h, f)
    end
  end
  if ttl ~= '' then
    local ttl_ms = tonumber(ttl)
    for _, f in ipairs(redis.call('ZRANGEBYSCORE', KEYS[h + 3], '-inf', '(' .. (now - ttl_ms))) do
      hist_drop(h, f)
    end
    -- Nothing written later than now can outlive now + ttl: let Redis drop idle jobs.
    for i = h, h + 4 do
      redis.call('PEXPIRE', KEYS[i], ttl_ms + 1000)
    end
  else
    for i = h, h + 4 do
      redis.call('PERSIST', KEYS[i])
    end
  end
end

local function hist_claim(h, slot, by, at, attempt, manual, reason, token)
  local f = record_field(slot, attempt, manual, by)
  local rec = {v = 1, slot = slot, by = by, at = at, attempt = attempt,
               manual = manual == 1, reason = reason}
  redis.call('HSET', KEYS[h], f, cjson.encode(rec))
  redis.call('ZADD', KEYS[h + 2], at, f)
  redis.call('ZADD', KEYS[h + 3], at, f)
  if manual == 1 then
    redis.call('HSET', KEYS[h + 4], tostring(slot), token)
  end
end
"""

PREVIOUS_RUN_CLAIM = Script(
    "previous_run_claim",
    _PREVIOUS_PRELUDE
    + r"""
local run = KEYS[1]
local slot = tonumber(ARGV[1])
local token = ARGV[2]
local inst = ARGV[3]
local lease_ms = tonumber(ARGV[6])
local max_attempts = tonumber(ARGV[8])
local now = now_ms()

local function start(attempt, reason)
  redis.call('HSET', run, 'v', 1, 'attempt', attempt, 'token', token, 'owner', inst,
             'lease_until', now + lease_ms, 'state', 'running', 'status', '',
             'reason', reason, 'started_at', now, 'finished_at', '')
  if ARGV[10] ~= '' then redis.call('HSET', run, 'keep_ms', ARGV[10]) end
  redis.call('PERSIST', run)
  redis.call('ZADD', KEYS[2], slot, ARGV[1])
  hist_claim(3, slot, inst, now, attempt, 0, reason, token)
  hist_prune(3, tonumber(ARGV[11]), ARGV[12], now)
end

-- The superseded attempt shows as interrupted, unless its runner saved a result.
local function interrupt(owner, attempt, started_at, reason, err)
  local f = record_field(slot, attempt, 0, owner)
  if redis.call('HEXISTS', KEYS[4], f) == 1 then return end
  local rec = {v = 1, slot = slot, by = owner, attempt = attempt, status = 'interrupted',
               started_at = started_at, finished_at = now,
               duration_ms = math.max(now - started_at, 0), error = err,
               manual = false, reason = reason}
  redis.call('HSET', KEYS[4], f, cjson.encode(rec))
  redis.call('ZADD', KEYS[5], started_at, f)
  redis.call('ZADD', KEYS[6], now, f)
end

local st = redis.call('HMGET', run, 'state', 'token', 'owner', 'attempt', 'lease_until',
                      'status', 'reason', 'started_at', 'finished_at', 'keep_ms')
if st[1] then
  local attempt = tonumber(st[4])
  if ARGV[10] ~= '' then
    redis.call('HSET', run, 'keep_ms', ARGV[10])
    if st[1] == 'finished' and st[9] ~= '' then
      local keep = math.max(tonumber(ARGV[10]), tonumber(ARGV[15]))
      redis.call('PEXPIREAT', run, tonumber(st[9]) + keep)
    end
  end
  if st[1] == 'running' then
    if st[2] == token then
      redis.call('HSET', run, 'lease_until', now + lease_ms)
      return {'won', attempt}
    end
    if tonumber(st[5]) > now then return {'running', attempt} end
    if attempt < max_attempts then
      interrupt(st[3], attempt, tonumber(st[8]), st[7], 'lease lapsed; taken over by ' .. inst)
      start(attempt + 1, 'takeover')
      return {'won', attempt + 1}
    end
    interrupt(st[3], attempt, tonumber(st[8]), st[7], 'lease lapsed; attempts used up')
    redis.call('HSET', run, 'state', 'finished', 'status', 'interrupted', 'finished_at', now)
    redis.call('ZREM', KEYS[2], ARGV[1])
    local keep = tonumber(st[10] or '') or tonumber(ARGV[14])
    redis.call('PEXPIRE', run, math.max(keep, tonumber(ARGV[15])))
    return {'done', 0}
  end
  if (st[6] == 'failed' or st[6] == 'interrupted') and attempt < max_attempts then
    start(attempt + 1, ARGV[5])
    return {'won', attempt + 1}
  end
  return {'done', 0}
end
if ARGV[4] == 'takeover' then return {'none', 0} end
if ARGV[9] ~= '' and now > slot + tonumber(ARGV[9]) then return {'late', now - slot} end
if ARGV[7] == 'skip' then
  local busy = nil
  for _, member in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
    local lease_until = redis.call('HGET', ARGV[13] .. member, 'lease_until')
    if not lease_until then
      redis.call('ZREM', KEYS[2], member)
    elseif tonumber(lease_until) > now then
      busy = tonumber(member)
    end
  end
  if busy then return {'overlap', busy} end
end
start(1, ARGV[5])
return {'won', 1}
""",
)

PREVIOUS_FINISH = Script(
    "previous_finish",
    _PREVIOUS_PRELUDE
    + r"""
local st = redis.call('HMGET', KEYS[1], 'state', 'token', 'keep_ms')
if st[1] ~= 'running' or st[2] ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'state', 'finished', 'status', ARGV[2], 'finished_at', now_ms())
redis.call('ZREM', KEYS[2], ARGV[3])
local keep = tonumber(st[3] or '') or tonumber(ARGV[4])
redis.call('PEXPIRE', KEYS[1], math.max(keep, tonumber(ARGV[5])))
return 1
""",
)
