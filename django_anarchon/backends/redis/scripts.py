"""The Lua scripts of the Redis and Valkey backends: every decision is one script call.

Times come from the server's ``TIME``. Every key a script touches belongs to one job and
carries the job's hash tag, so a script runs on a single Redis Cluster node. Keys read
without being declared (the other runs of a job: the overlap rule reads them, the sweep
ends them) share that tag: the cluster allows it because they hash to the same slot.

Stored formats (``v`` in every record; a later release keeps reading the older ones):

* ``<p>:{<job>}:r:<slot>``  hash, one run of the lease strategy, format 2: ``v attempt
  token owner lease_until state status reason started_at finished_at keep_ms
  max_attempts``. Format 1 (the previous release) has all of them except
  ``max_attempts``, and both releases read and write each other's hashes: each writes
  its own ``v`` when it starts an attempt, so ``v`` says which release started the
  current one. Never expires while running; once finished it expires at
  ``max(finished_at, slot) + max(keep_ms or DEFAULT, MIN)`` (``PEXPIREAT``, never moved
  earlier). ``keep_ms`` and ``max_attempts`` only grow.
  A run that a later slot's ``cancel_other`` claim fenced is ``finished`` with status
  ``cancelled`` (this release on): the previous release reads it as finished and done,
  never retries it and refuses its old token, as this one does.
* ``<p>:{<job>}:active``    sorted set of the slots whose run is running.
* ``<p>:{<job>}:b``         hash, format 1: the job's buffered slots (overlap
  ``buffer_one``/``buffer_all``), field slot, value the store instant it is held until
  (each waiting claimer's claim pushes it on). The key expires with its newest hold; the
  previous release never reads it.
* ``<p>:{<job>}:c:<slot>``  string, the claim of one slot (``claim()``: lease and script
  strategies): the winner's token, expiring after the dedupe window.
* ``<p>:{<job>}:s``         stream of the stream-id and idmp strategies.
* ``<p>:{<job>}:hc``/``hr`` hashes of won claims and stored results (JSON, format 1),
  field ``<slot:015>:<attempt:05>:<manual 0|1>:<instance>``; ``hs``/``he`` sorted sets
  of those fields by start and end time (pruning, newest first); ``hm`` hash of manual
  slots to the token that recorded them.
* ``<p>:{<job>}:m``         hash, the job's ledger marks (format 1): field the mark's first
  slot, value JSON ``v slot fate reason at by last count``; ``mi`` sorted set of those
  first slots, scored by the slot. Marks never overlap. Written by the claim that
  answers ``late``, ``overlap`` or ``paused`` and by ``mark_skipped``/``mark_missed``.
* ``<p>:{<job>}:p``         hash, the job's pause (format 1): ``v note by at until``
  (``until`` empty: until resumed); expires at ``until``.
* ``<p>:{<job>}:since``     hash, format 1: ``v fingerprint since`` (``job_since``).

The previous release never reads the ledger's keys (``m``, ``mi``, ``p``, ``since``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from ..base import PAUSABLE_REASONS

__all__ = [
    "ACTIVE",
    "CLAIM_KEY",
    "FINISH",
    "FINISH_RESULT",
    "FINISH_RESULT_MANY",
    "HEARTBEAT",
    "HISTORY",
    "IDMP_CLAIM",
    "LEDGER_FORMAT",
    "MANUAL",
    "NOW",
    "RELEASE",
    "RUN_CLAIM",
    "RUN_CLAIM_MANY",
    "RUN_FORMAT",
    "RUN_PEEK",
    "SAVE_RESULT",
    "STREAM_CLAIM",
    "STREAM_PASSED",
    "Script",
]


@dataclass(frozen=True)
class Script:
    """A Lua script and its SHA1, for EVALSHA with an EVAL fallback."""

    name: str
    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode()).hexdigest())


#: The format this release writes run hashes in (``v``): 2 added ``max_attempts``.
RUN_FORMAT = 2
#: The format of the ledger's records: marks (JSON), the pause and since hashes.
LEDGER_FORMAT = 1

# Helpers shared by every script. ``hist_*`` functions take the job's five history keys as
# one table H: hc, hr, hs, he, hm (``hist_at(h)``: KEYS[h]..KEYS[h+4]).
_PRELUDE = f"local RUN_FORMAT = {RUN_FORMAT}\n" + r"""
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function record_field(slot, attempt, manual, by)
  return string.format('%015d:%05d:%d:%s', slot, attempt, manual, by)
end

local function hist_at(h)
  return {KEYS[h], KEYS[h + 1], KEYS[h + 2], KEYS[h + 3], KEYS[h + 4]}
end

local function hist_drop(H, f)
  redis.call('HDEL', H[1], f)
  redis.call('HDEL', H[2], f)
  redis.call('ZREM', H[3], f)
  redis.call('ZREM', H[4], f)
  if string.sub(f, 23, 23) == '1' then
    redis.call('HDEL', H[5], tostring(tonumber(string.sub(f, 1, 15))))
  end
end

-- Keep the newest ``size`` records and none that ended more than ``ttl`` ms ago.
local function hist_prune(H, size, ttl, now)
  if size >= 0 then
    for _, f in ipairs(redis.call('ZREVRANGE', H[3], size, -1)) do
      hist_drop(H, f)
    end
  end
  if ttl ~= '' then
    local ttl_ms = tonumber(ttl)
    for _, f in ipairs(redis.call('ZRANGEBYSCORE', H[4], '-inf', '(' .. (now - ttl_ms))) do
      hist_drop(H, f)
    end
    -- Nothing written later than now can outlive now + ttl: let Redis drop idle jobs.
    for i = 1, 5 do
      redis.call('PEXPIRE', H[i], ttl_ms + 1000)
    end
  else
    for i = 1, 5 do
      redis.call('PERSIST', H[i])
    end
  end
end

-- A finished run is kept until max(finished_at, slot) + its keep (default and floor given):
-- counted from the slot too, so a run that finished "before" its slot by this clock is
-- still remembered while a late claimer of the slot may come. Never moved earlier.
local function retain(key, slot, finished_at, keep, default_keep, min_keep, now)
  local at = math.max(finished_at, slot)
             + math.max(tonumber(keep or '') or default_keep, min_keep)
  local ttl = redis.call('PTTL', key)
  if ttl < 0 or now + ttl < at then
    redis.call('PEXPIREAT', key, at)
  end
end

local function hist_claim(H, slot, by, at, attempt, manual, reason, token)
  local f = record_field(slot, attempt, manual, by)
  local rec = {v = 1, slot = slot, by = by, at = at, attempt = attempt,
               manual = manual == 1, reason = reason}
  redis.call('HSET', H[1], f, cjson.encode(rec))
  redis.call('ZADD', H[3], at, f)
  redis.call('ZADD', H[4], at, f)
  if manual == 1 then
    redis.call('HSET', H[5], tostring(slot), token)
  end
end

-- Whether history holds an attempt of ``slot`` that is not a manual run: a record field
-- that starts with the slot and says manual 0. ``hs`` holds every field of ``hc`` and
-- ``hr``, whichever release wrote it, so the scan is never wrong about older records.
local function hist_ran(H, slot)
  local pattern = string.format('%015d', slot) .. ':?????:0:*'
  local cursor = '0'
  repeat
    local page = redis.call('ZSCAN', H[3], cursor, 'MATCH', pattern, 'COUNT', 1000)
    if #page[2] > 0 then return true end
    cursor = page[1]
  until cursor == '0'
  return false
end
"""


# The ledger's marks (scripts that write them add this to the prelude): hash ``m`` maps a
# mark's first slot to its JSON, sorted set ``mi`` holds the first slots scored by slot.
# Marks never overlap (each is written only where none reaches into its slots), so they
# are in the same order by first and by last slot: the one mark that may reach into
# first..last is the one with the greatest first slot <= last, and the marks that ended
# before a cutoff are the oldest ones.
_MARKS = f"local LEDGER_FORMAT = {LEDGER_FORMAT}\n" + r"""
local function mark_last(m, s)
  local raw = redis.call('HGET', m, s)
  if not raw then return nil end
  return tonumber(cjson.decode(raw).last)
end

local function mark_drop(m, mi, s)
  redis.call('HDEL', m, s)
  redis.call('ZREM', mi, s)
end

-- Whether a mark of the job reaches into first..last.
local function mark_covers(m, mi, first, last)
  while true do
    local near = redis.call('ZREVRANGEBYSCORE', mi, last, '-inf', 'LIMIT', 0, 1)
    if #near == 0 then return false end
    local near_last = mark_last(m, near[1])
    if near_last then return near_last >= first end
    redis.call('ZREM', mi, near[1])  -- an index entry without its mark: drop it, look again
  end
end

-- Keep the newest ``size`` marks by slot, none whose last slot is older than ``ttl``.
local function mark_prune(m, mi, size, ttl, now)
  local n = redis.call('ZCARD', mi)
  local over = n - math.max(size, 0)
  if over > 0 then
    for _, s in ipairs(redis.call('ZRANGE', mi, 0, over - 1)) do redis.call('HDEL', m, s) end
    redis.call('ZREMRANGEBYRANK', mi, 0, over - 1)
  end
  if ttl == '' then
    redis.call('PERSIST', m)
    redis.call('PERSIST', mi)
    return
  end
  local ttl_ms = tonumber(ttl)
  local cutoff = now - ttl_ms
  for _, s in ipairs(redis.call('ZRANGEBYSCORE', mi, '-inf', '(' .. cutoff)) do
    local last = mark_last(m, s)
    if last and last >= cutoff then break end
    mark_drop(m, mi, s)
  end
  -- Nothing kept outlives its last slot + ttl: let Redis drop the marks of an idle job.
  local newest = redis.call('ZREVRANGE', mi, 0, 0)
  if #newest > 0 then
    local at = math.max(now, mark_last(m, newest[1]) or now) + ttl_ms + 1000
    redis.call('PEXPIREAT', m, at)
    redis.call('PEXPIREAT', mi, at)
  end
end

-- Write a mark unless one reaches into its slots, then prune; 1 if written.
local function mark_write(m, mi, first, last, count, fate, reason, by, now, size, ttl)
  if mark_covers(m, mi, first, last) then return 0 end
  local s = string.format('%d', first)
  local rec = {v = LEDGER_FORMAT, slot = first, fate = fate, reason = reason, at = now,
               by = by, last = last, count = count}
  redis.call('HSET', m, s, cjson.encode(rec))
  redis.call('ZADD', mi, first, s)
  mark_prune(m, mi, size, ttl, now)
  return 1
end
"""


def _script(name: str, body: str, *, marks: bool = False) -> Script:
    return Script(name, _PRELUDE + (_MARKS if marks else "") + body)


# claim() of the lease and script strategies: one key per slot, set only if absent.
# KEYS: claim key, hc, hr, hs, he, hm.
# ARGV: slot, token, instance, window_ms, history_size, history_ttl_ms|''.
CLAIM_KEY = _script(
    "claim_key",
    r"""
local holder = redis.call('GET', KEYS[1])
if holder then
  if holder == ARGV[2] then return 1 end
  return 0
end
local now = now_ms()
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[4])
hist_claim(hist_at(2), tonumber(ARGV[1]), ARGV[3], now, 1, 0, 'scheduled', ARGV[2])
hist_prune(hist_at(2), tonumber(ARGV[5]), ARGV[6], now)
return 1
""",
)

#: What STREAM_CLAIM answers (besides 1 won and 0 taken) for a slot nobody holds and
#: nobody can claim any more: a later slot's entry came first.
STREAM_PASSED = 2
#: A negative answer of STREAM_CLAIM: the slot is this many ms ahead of the server's
#: clock. A claimer whose clock runs ahead would otherwise add a later slot before the
#: others claimed the earlier ones, which then could never be claimed.

# claim() of the stream-id strategy: XADD with the explicit ID <slot>-1. The server
# refuses an ID equal to or smaller than the stream's last one, even after trimming.
# A refused slot whose entry is absent was either trimmed away or never added (a later
# slot was added first). Trimming removes entries from the head only, and this backend
# never XDELs, so an absent ID above the first entry kept was never added, nor is any
# absent ID when no entry has ever left the stream (XINFO's entries-added = length,
# Redis 7.0+ and Valkey): those answer STREAM_PASSED. Otherwise the script cannot tell,
# and answers 0.
# KEYS: stream, hc, hr, hs, he, hm.
# ARGV: slot, token, instance, maxlen, history_size, history_ttl_ms|''.
STREAM_CLAIM = _script(
    "stream_claim",
    r"""
local wait = tonumber(ARGV[1]) - now_ms()
if wait > 0 then return -wait end  -- STREAM_EARLY: XADD in slot order, never ahead of it
local id = ARGV[1] .. '-1'
local res = redis.pcall('XADD', KEYS[1], 'MAXLEN', '~', ARGV[4], id,
                        'token', ARGV[2], 'by', ARGV[3])
if type(res) == 'table' and res.err then
  if not string.find(res.err, 'equal or smaller', 1, true) then
    return redis.error_reply(res.err)
  end
  local entry = redis.call('XRANGE', KEYS[1], id, id)
  if #entry == 0 then
    local info = redis.call('XINFO', 'STREAM', KEYS[1])
    local at = {}
    for i = 1, #info - 1, 2 do at[info[i]] = info[i + 1] end
    local function above(other)
      local ms, seq = string.match(other, '^(%d+)-(%d+)$')
      local mine = tonumber(ARGV[1])
      return mine > tonumber(ms) or (mine == tonumber(ms) and 1 > tonumber(seq))
    end
    -- Never added: above any entry deleted by XDEL (Redis 7.0+, Valkey), and above the
    -- first entry kept or, when no entry ever left the stream (7.0+), anywhere.
    if at['max-deleted-entry-id'] and not above(at['max-deleted-entry-id']) then return 0 end
    local first = at['first-entry']
    if (first and above(first[1]))
       or (at['entries-added'] and tonumber(at['entries-added']) == tonumber(at['length'])) then
      return 2  -- STREAM_PASSED
    end
    return 0
  end
  local fields = entry[1][2]
  for i = 1, #fields, 2 do
    if fields[i] == 'token' then
      if fields[i + 1] == ARGV[2] then return 1 end
      return 0
    end
  end
  return 0
end
local now = now_ms()
hist_claim(hist_at(2), tonumber(ARGV[1]), ARGV[3], now, 1, 0, 'scheduled', ARGV[2])
hist_prune(hist_at(2), tonumber(ARGV[5]), ARGV[6], now)
return 1
""",
)

# claim() of the idmp strategy (Redis 8.6+): XADD ... IDMP <job> <slot> * answers the
# original entry's ID for a duplicate; the token in that entry tells who won.
# KEYS: stream, hc, hr, hs, he, hm.
# ARGV: slot, token, instance, producer (job), history_size, history_ttl_ms|'', maxlen.
IDMP_CLAIM = _script(
    "idmp_claim",
    r"""
local id = redis.call('XADD', KEYS[1], 'IDMP', ARGV[4], ARGV[1], 'MAXLEN', '~', ARGV[7], '*',
                      'token', ARGV[2], 'by', ARGV[3])
local entry = redis.call('XRANGE', KEYS[1], id, id)
if #entry == 0 then return 0 end
local fields = entry[1][2]
local holder = nil
for i = 1, #fields, 2 do
  if fields[i] == 'token' then holder = fields[i + 1] end
end
if holder ~= ARGV[2] then return 0 end
local f = record_field(tonumber(ARGV[1]), 1, 0, ARGV[3])
if redis.call('HEXISTS', KEYS[2], f) == 0 and redis.call('HEXISTS', KEYS[3], f) == 0 then
  local now = now_ms()
  hist_claim(hist_at(2), tonumber(ARGV[1]), ARGV[3], now, 1, 0, 'scheduled', ARGV[2])
  hist_prune(hist_at(2), tonumber(ARGV[5]), ARGV[6], now)
end
return 1
""",
)

# record_manual_run(): the first slot from ARGV[1] on without a manual record; the same
# token again finds its own record (a retried call records nothing twice).
# KEYS: hc, hr, hs, he, hm. ARGV: slot, token, instance, history_size, history_ttl_ms|''.
MANUAL = _script(
    "manual",
    r"""
local slot = tonumber(ARGV[1])
for i = 0, 100000 do
  local s = slot + i
  local holder = redis.call('HGET', KEYS[5], tostring(s))
  if not holder then
    local now = now_ms()
    hist_claim(hist_at(1), s, ARGV[3], now, 1, 1, 'manual', ARGV[2])
    hist_prune(hist_at(1), tonumber(ARGV[4]), ARGV[5], now)
    return s
  end
  if holder == ARGV[2] then return s end
end
return redis.error_reply('no free manual slot')
""",
)

# Writes one stored result into the history keys H, then prunes them.
_SAVE_FN = r"""
local function save_record(H, field, record, started_at, finished_at, size, ttl)
  redis.call('HSET', H[2], field, record)
  redis.call('ZADD', H[3], started_at, field)
  redis.call('ZADD', H[4], finished_at, field)
  hist_prune(H, tonumber(size), ttl, now_ms())
end
"""

# save_result(). KEYS: hc, hr, hs, he, hm.
# ARGV: field, result JSON, started_at, finished_at, history_size, history_ttl_ms|''.
SAVE_RESULT = _script(
    "save_result",
    _SAVE_FN
    + r"""
save_record(hist_at(1), ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6])
return 1
""",
)

# history(): the newest ``limit`` records, claims and results side by side.
# KEYS: hc, hr, hs. ARGV: limit.
HISTORY = _script(
    "history",
    r"""
local fields = redis.call('ZREVRANGE', KEYS[3], 0, tonumber(ARGV[1]) - 1)
if #fields == 0 then return {{}, {}} end
return {redis.call('HMGET', KEYS[1], unpack(fields)), redis.call('HMGET', KEYS[2], unpack(fields))}
""",
)

# runs.claim(): the lease rules, in the order of the table in SPEC section 5, with the
# sweep of SPEC section 9. Writes run hashes in format 2 (see the module docstring).
# The overlap policies: skip, allow, buffer_one/buffer_all (the buffer hash, KEYS[8]; a
# buffered slot is never late; oldest first), cancel_other (every other running run is
# fenced, finished 'cancelled', its attempt recorded interrupted here).
# The ledger (LedgerStore): a new run of a paused job (KEYS[11]) is answered 'paused' for
# the reasons in PAUSABLE_REASONS; a backfill of a slot that history shows ran is 'done';
# 'late' (but a catch-up's), 'overlap' and 'paused' write a skipped mark (KEYS[9], [10]).
# KEYS: run, active, hc, hr, hs, he, hm, buffer, marks, mark index, pause. (The previous
# release's script takes the first eight and never reads the others.)
# ARGV: 1 slot, 2 token, 3 instance, 4 mode, 5 reason, 6 lease_ms, 7 overlap,
#       8 max_attempts, 9 max_late_ms|'', 10 keep_ms|'', 11 history_size,
#       12 history_ttl_ms|'', 13 run key prefix (the key of a slot without the slot),
#       14 default keep_ms, 15 minimum keep_ms, 16 buffer_limit, 17 cancel reason,
#       18 buffer hold ms, 19 longest buffered wait ms.
# Returns {kind, number} ({'won', attempt, cancelled slot}, {'buffered', slot, wait_ms}).
_PAUSABLE = "{" + ", ".join(f"['{r}'] = true" for r in PAUSABLE_REASONS) + "}"
# One claim: K and A are RUN_CLAIM's KEYS and ARGV.
_CLAIM_FN = (
    f"local PAUSABLE = {_PAUSABLE}\n"
    + r"""
local function claim_run(K, A)
  local H = {K[3], K[4], K[5], K[6], K[7]}
  local run = K[1]
  local slot = tonumber(A[1])
  local token = A[2]
  local inst = A[3]
  local lease_ms = tonumber(A[6])
  local max_attempts = tonumber(A[8])
  local default_keep = tonumber(A[14])
  local min_keep = tonumber(A[15])
  local now = now_ms()

  -- A skip of a new run, in the ledger: the slot alone, unless a mark already covers it.
  local function skip(why)
    mark_write(K[9], K[10], slot, slot, 1, 'skipped', why, inst, now,
               tonumber(A[11]), A[12])
  end

  local function start(attempt, reason, stored_max)
    redis.call('HSET', run, 'v', RUN_FORMAT, 'attempt', attempt, 'token', token, 'owner', inst,
               'lease_until', now + lease_ms, 'state', 'running', 'status', '',
               'reason', reason, 'started_at', now, 'finished_at', '',
               'max_attempts', math.max(stored_max or 0, max_attempts))
    redis.call('PERSIST', run)
    redis.call('ZADD', K[2], slot, A[1])
    hist_claim(H, slot, inst, now, attempt, 0, reason, token)
    hist_prune(H, tonumber(A[11]), A[12], now)
  end

  -- The superseded attempt shows as interrupted, unless its runner saved a result.
  local function interrupt(s, owner, attempt, started_at, reason, err)
    local f = record_field(s, attempt, 0, owner)
    if redis.call('HEXISTS', K[4], f) == 1 then return end
    local rec = {v = 1, slot = s, by = owner, attempt = attempt, status = 'interrupted',
                 started_at = started_at, finished_at = now,
                 duration_ms = math.max(now - started_at, 0), error = err,
                 manual = false, reason = reason}
    redis.call('HSET', K[4], f, cjson.encode(rec))
    redis.call('ZADD', K[5], started_at, f)
    redis.call('ZADD', K[6], now, f)
  end

  -- A run whose lease lapsed with its attempts used up: the store ends it.
  local function give_up(key, s, member, owner, attempt, started_at, reason, keep)
    interrupt(s, owner, attempt, started_at, reason, 'lease lapsed; attempts used up')
    redis.call('HSET', key, 'state', 'finished', 'status', 'interrupted', 'finished_at', now)
    redis.call('ZREM', K[2], member)
    retain(key, s, now, keep, default_keep, min_keep, now)
  end

  local st = redis.call('HMGET', run, 'state', 'token', 'owner', 'attempt', 'lease_until',
                        'status', 'reason', 'started_at', 'finished_at', 'keep_ms',
                        'max_attempts')
  if st[1] then
    local attempt = tonumber(st[4])
    local keep = st[10]
    if A[10] ~= '' and (tonumber(keep or '') == nil or tonumber(A[10]) > tonumber(keep)) then
      keep = A[10]
      redis.call('HSET', run, 'keep_ms', keep)
    end
    local stored_max = tonumber(st[11] or '')
    if stored_max == nil or max_attempts > stored_max then
      stored_max = max_attempts
      redis.call('HSET', run, 'max_attempts', stored_max)
    end
    if st[1] == 'running' then
      if st[2] == token then
        redis.call('HSET', run, 'lease_until', now + lease_ms)
        return {'won', attempt}
      end
      if tonumber(st[5]) > now then return {'running', attempt} end
      if attempt < max_attempts then
        interrupt(slot, st[3], attempt, tonumber(st[8]), st[7],
                  'lease lapsed; taken over by ' .. inst)
        start(attempt + 1, 'takeover', stored_max)
        return {'won', attempt + 1}
      end
      give_up(run, slot, A[1], st[3], attempt, tonumber(st[8]), st[7], keep)
      return {'done', 0}
    end
    if st[9] and st[9] ~= '' then
      retain(run, slot, tonumber(st[9]), keep, default_keep, min_keep, now)
    end
    if (st[6] == 'failed' or st[6] == 'interrupted') and attempt < max_attempts then
      start(attempt + 1, A[5], stored_max)
      return {'won', attempt + 1}
    end
    return {'done', 0}
  end
  if A[4] == 'takeover' then return {'none', 0} end
  if A[4] == 'new' and now < slot then return {'early', slot - now} end
  if PAUSABLE[A[5]] then
    local pause = redis.call('HMGET', K[11], 'at', 'until')
    if pause[1] and (pause[2] == '' or tonumber(pause[2]) > now) then
      skip('paused')
      redis.call('HDEL', K[8], A[1])  -- a buffered slot of it waits no more
      return {'paused', 0}
    end
  end
  if A[5] == 'backfill' and hist_ran(H, slot) then return {'done', 0} end
  local policy = A[7]
  local buffering = policy == 'buffer_one' or policy == 'buffer_all'
  local count, head, queued = 0, nil, false
  if buffering then
    local held = redis.call('HGETALL', K[8])
    for i = 1, #held, 2 do
      local s = tonumber(held[i])
      if tonumber(held[i + 1]) <= now then
        redis.call('HDEL', K[8], held[i])  -- its waiters all went away
      else
        count = count + 1
        if head == nil or s < head then head = s end
        if s == slot then queued = true end
      end
    end
  end
  -- A buffered slot waited for its turn: that wait never makes it late.
  if not queued and A[9] ~= '' and now > slot + tonumber(A[9]) then
    if A[5] ~= 'catch-up' then skip('late') end  -- nothing to catch up is not a skip
    return {'late', now - slot}
  end
  -- A new run: sweep the job's other runs, then the overlap rule. A run is swept only when
  -- this release started its attempt (v 2), so its max_attempts is the claims' largest.
  local busy, busy_until = nil, nil
  for _, member in ipairs(redis.call('ZRANGE', K[2], 0, -1)) do
    local key = A[13] .. member
    local r = redis.call('HMGET', key, 'state', 'owner', 'attempt', 'lease_until', 'reason',
                         'started_at', 'keep_ms', 'max_attempts', 'v')
    if r[1] ~= 'running' then
      redis.call('ZREM', K[2], member)
    elseif (tonumber(r[4]) or 0) > now then
      if member ~= A[1] then busy, busy_until = tonumber(member), tonumber(r[4]) end
    elseif (tonumber(r[9] or '') or 1) >= 2 and tonumber(r[8] or '')
           and tonumber(r[3]) >= tonumber(r[8]) then
      give_up(key, tonumber(member), member, r[2], tonumber(r[3]), tonumber(r[6]), r[5], r[7])
    end
  end
  if policy == 'skip' and busy then
    skip('overlap')
    return {'overlap', busy}
  end
  local cancelled = nil
  if buffering then
    if busy or (head and head ~= slot) then
      local blocker = busy or head
      local left = lease_ms
      if busy then left = busy_until - now end
      local room = 1
      if policy == 'buffer_all' then room = tonumber(A[16]) end
      if queued or count < room then
        local hold = tonumber(A[18])
        redis.call('HSET', K[8], A[1], now + hold)
        redis.call('PEXPIRE', K[8], hold)  -- the newest hold is the longest
        local wait = math.max(1, math.min(left, math.max(math.floor(lease_ms / 3), 1),
                                          tonumber(A[19])))
        return {'buffered', blocker, wait}
      end
      skip('overlap')  -- the buffer is full
      return {'overlap', blocker}
    end
    if queued then redis.call('HDEL', K[8], A[1]) end  -- its turn: it starts below
  elseif policy == 'cancel_other' then
    for _, member in ipairs(redis.call('ZRANGE', K[2], 0, -1)) do
      local key = A[13] .. member
      local r = redis.call('HMGET', key, 'state', 'owner', 'attempt', 'reason', 'started_at',
                           'keep_ms')
      if member ~= A[1] and r[1] == 'running' then
        -- Fenced: its token holds nothing any more, and its attempt is recorded here.
        interrupt(tonumber(member), r[2], tonumber(r[3]), tonumber(r[5]), r[4], A[17])
        redis.call('HSET', key, 'state', 'finished', 'status', 'cancelled', 'finished_at', now)
        redis.call('ZREM', K[2], member)
        retain(key, tonumber(member), now, r[6], default_keep, min_keep, now)
        cancelled = tonumber(member)
      end
    end
  end
  if A[10] ~= '' then redis.call('HSET', run, 'keep_ms', A[10]) end
  start(1, A[5], nil)
  return {'won', 1, cancelled}
end
"""
)
RUN_CLAIM = _script("run_claim", _CLAIM_FN + "return claim_run(KEYS, ARGV)\n", marks=True)

#: The keys of a job that a claim reads besides its run's, after the job's key prefix:
#: RUN_CLAIM's KEYS[2] to KEYS[11].
CLAIM_KEY_SUFFIXES = (":active", ":hc", ":hr", ":hs", ":he", ":hm", ":b", ":m", ":mi", ":p")
#: RUN_CLAIM_MANY: the fields of an option set, and of a claim.
CLAIM_SET_FIELDS, CLAIM_FIELDS = 13, 7

# runs.claim_many() where one node holds every job: a batch's claims in one script call,
# decided one after the other as RUN_CLAIM decides each. Claims of jobs with the same
# options share an option set, and the keys come from each job's key prefix: 7 arguments
# a claim instead of 30 (the client's packing of them was the most of a burst's time).
# ARGV: the number of option sets; each set's 13 fields (instance, then RUN_CLAIM's ARGV 6
# to 12, 14 to 16, 18 and 19); then per claim: the job's key prefix, slot, token, mode,
# reason, cancel reason and its set's number (from 1). No KEYS: every key is the job's,
# named from its prefix, as RUN_CLAIM's KEYS are.
# Answers one word per claim, space-separated in one string: its reply's parts joined by
# ':' (``won:1``, ``won:1:<cancelled slot>``, ``buffered:<slot>:<wait_ms>``, ``done:0``).
RUN_CLAIM_MANY = _script(
    "run_claim_many",
    _CLAIM_FN
    + "local SUFFIXES = {" + ", ".join(f"'{x}'" for x in CLAIM_KEY_SUFFIXES) + "}\n"
    + f"local SET_FIELDS, CLAIM_FIELDS = {CLAIM_SET_FIELDS}, {CLAIM_FIELDS}\n"
    + r"""
local sets, at = {}, 2
for i = 1, tonumber(ARGV[1]) do
  sets[i] = {unpack(ARGV, at, at + SET_FIELDS - 1)}
  at = at + SET_FIELDS
end
local out = {}
while at <= #ARGV do
  local base, slot = ARGV[at], ARGV[at + 1]
  local o = sets[tonumber(ARGV[at + 6])]
  local K = {base .. ':r:' .. slot}
  for i, suffix in ipairs(SUFFIXES) do K[i + 1] = base .. suffix end
  local A = {slot, ARGV[at + 2], o[1], ARGV[at + 3], ARGV[at + 4], o[2], o[3], o[4], o[5],
             o[6], o[7], o[8], base .. ':r:', o[9], o[10], o[11], ARGV[at + 5], o[12], o[13]}
  local reply = claim_run(K, A)
  local word = reply[1] .. ':' .. string.format('%d', reply[2])
  if reply[3] then word = word .. ':' .. string.format('%d', reply[3]) end
  out[#out + 1] = word
  at = at + CLAIM_FIELDS
end
return table.concat(out, ' ')
""",
    marks=True,
)

# runs.peek_many(): for each run, what RUN_CLAIM would answer a new claim of it where that
# claim would change nothing (another instance's run with a live lease, or one done and
# kept), else that the claim itself must decide. It reads the same fields, and asks what
# RUN_CLAIM writes first (a larger keep or max_attempts) before any answer.
# KEYS: the runs. ARGV: per run, its claim's token, max_attempts and keep_ms ('' for none).
# Answers one word per run, space-separated in one string (read in one go, where an array
# of arrays costs the client a line read per element): 'r<attempt>' running, 'd' done,
# '-' the claim decides.
RUN_PEEK = _script(
    "run_peek",
    r"""
local now = now_ms()
local out = {}
for i, run in ipairs(KEYS) do
  local token, max_attempts, keep = ARGV[3 * i - 2], tonumber(ARGV[3 * i - 1]), ARGV[3 * i]
  local st = redis.call('HMGET', run, 'state', 'token', 'attempt', 'lease_until', 'status',
                        'keep_ms', 'max_attempts')
  local stored_max, stored_keep = tonumber(st[7] or ''), tonumber(st[6] or '')
  local answer = '-'
  if st[1] and stored_max and stored_max >= max_attempts
     and (keep == '' or (stored_keep and tonumber(keep) <= stored_keep)) then
    local attempt = tonumber(st[3])
    if st[1] == 'running' then
      if st[2] ~= token and tonumber(st[4]) > now then answer = 'r' .. attempt end
    elseif not ((st[5] == 'failed' or st[5] == 'interrupted') and attempt < max_attempts)
           and redis.call('PTTL', run) >= 0 then  -- kept: RUN_CLAIM's retain would not move it
      answer = 'd'
    end
  end
  out[i] = answer
end
return table.concat(out, ' ')
""",
)

# runs.heartbeat(). KEYS: run. ARGV: token, lease_ms.
HEARTBEAT = _script(
    "heartbeat",
    r"""
local st = redis.call('HMGET', KEYS[1], 'state', 'token')
if st[1] ~= 'running' or st[2] ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'lease_until', now_ms() + tonumber(ARGV[2]))
return 1
""",
)

# runs.finish(): repeat-safe (the same token and status on a run already finished so
# answers 1 again: the first call's reply may have been lost).
_FINISH_FN = r"""
local function finish_run(run, active, token, status, slot, default_keep, min_keep)
  local st = redis.call('HMGET', run, 'state', 'token', 'keep_ms', 'status')
  if st[2] ~= token then return 0 end
  if st[1] == 'finished' and (st[4] == status or st[4] == 'interrupted') then
    -- a repeat, or the runner's late word on a run the store ended (no attempt was left)
    redis.call('HSET', run, 'status', status)
    return 1
  end
  if st[1] ~= 'running' then return 0 end
  local now = now_ms()
  redis.call('HSET', run, 'state', 'finished', 'status', status, 'finished_at', now)
  redis.call('ZREM', active, slot)
  retain(run, tonumber(slot), now, st[3], tonumber(default_keep), tonumber(min_keep), now)
  return 1
end
"""

# KEYS: run, active. ARGV: token, status, slot, default keep, minimum keep.
FINISH = _script(
    "finish",
    _FINISH_FN
    + r"""
return finish_run(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5])
""",
)

# runs.finish_many(), one call per end: the finish and, if it acted, the history record,
# in one atomic step (a record never says "success" of a run another instance holds).
# KEYS: run, active, hc, hr, hs, he, hm. ARGV: FINISH's five, then SAVE_RESULT's six.
FINISH_RESULT = _script(
    "finish_result",
    _FINISH_FN
    + _SAVE_FN
    + r"""
if finish_run(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]) == 0 then
  return 0
end
save_record(hist_at(3), ARGV[6], ARGV[7], ARGV[8], ARGV[9], ARGV[10], ARGV[11])
return 1
""",
)

# runs.finish_many() where one node holds every job: FINISH_RESULT for each end, in one
# script call, each end's keys named from its job's key prefix as RUN_CLAIM_MANY's are.
# ARGV: default keep, minimum keep; then per end FINISH_RESULT_FIELDS: the job's key
# prefix, slot, token, status, then SAVE_RESULT's six. Answers one digit per end, as
# FINISH_RESULT would (1 acted, 0 not), in one string.
FINISH_RESULT_FIELDS = 10
FINISH_RESULT_MANY = _script(
    "finish_result_many",
    _FINISH_FN
    + _SAVE_FN
    + f"local FIELDS = {FINISH_RESULT_FIELDS}\n"
    + r"""
local out = {}
for at = 3, #ARGV, FIELDS do
  local base, slot = ARGV[at], ARGV[at + 1]
  local done = finish_run(base .. ':r:' .. slot, base .. ':active', ARGV[at + 2], ARGV[at + 3],
                          slot, ARGV[1], ARGV[2])
  if done == 1 then
    save_record({base .. ':hc', base .. ':hr', base .. ':hs', base .. ':he', base .. ':hm'},
                ARGV[at + 4], ARGV[at + 5], ARGV[at + 6], ARGV[at + 7], ARGV[at + 8],
                ARGV[at + 9])
  end
  out[#out + 1] = tostring(done)
end
return table.concat(out)
""",
)

# runs.release(): the lease lapses now; the run stays running for a backup to take.
# KEYS: run. ARGV: token.
RELEASE = _script(
    "release",
    r"""
local st = redis.call('HMGET', KEYS[1], 'state', 'token')
if st[1] ~= 'running' or st[2] ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'lease_until', now_ms() - 1)
return 1
""",
)

# runs.active(). KEYS: active. ARGV: run key prefix. Returns {slot, attempt, alive}...
#: The server's clock, on the node that holds the job's keys (KEYS[1] routes it there).
NOW = _script("now", "return now_ms()")

ACTIVE = _script(
    "active",
    r"""
local now = now_ms()
local out = {}
for _, member in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local st = redis.call('HMGET', ARGV[1] .. member, 'state', 'attempt', 'lease_until')
  if st[1] == 'running' then
    local alive = 0
    if tonumber(st[3]) > now then alive = 1 end
    table.insert(out, {tonumber(member), tonumber(st[2]), alive})
  elseif not st[1] then
    redis.call('ZREM', KEYS[1], member)
  end
end
return out
""",
)
