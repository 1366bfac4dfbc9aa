"""The ledger and pauses of the ``lease`` strategy (``LedgerStore``): scripts and calls.

Every key is under the job's hash tag (``job_key(job)``), so each script runs on the one
node that holds the job, and the claims of ``RUN_CLAIM`` read the same keys: the pause it
checks and the marks it writes are decided in the claim's own script. The formats are
in the docstring of ``scripts.py``; times are the server's ``TIME``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..base import PauseState, SlotMark
from .scripts import LEDGER_FORMAT, Script, _script

if TYPE_CHECKING:
    from .core import RedisProtocolBackend

__all__ = ["JOB_SINCE", "MARK", "MARKS", "PAUSE", "PAUSED", "RESUME", "LedgerCalls"]

# mark_skipped() and mark_missed(): each (first, last, count) unless a mark reaches into
# it, then prune; how many were written. KEYS: marks, mark index.
# ARGV: by, fate, reason, history_size, history_ttl_ms|'', then first, last, count ...
MARK = _script(
    "mark",
    r"""
local now = now_ms()
local written = 0
for i = 6, #ARGV - 2, 3 do
  written = written + mark_write(KEYS[1], KEYS[2], tonumber(ARGV[i]), tonumber(ARGV[i + 1]),
                                 tonumber(ARGV[i + 2]), ARGV[2], ARGV[3], ARGV[1], now,
                                 tonumber(ARGV[4]), ARGV[5])
end
return written
""",
    marks=True,
)

# marks(): the marks that reach into since..until, newest first, at most ``limit``. The
# candidates (first slot <= until, newest first) that end at or after ``since`` come
# first: marks never overlap, so their last slots fall as their first slots do.
# KEYS: marks, mark index. ARGV: since|'', until|'', limit. Returns their JSON.
MARKS = _script(
    "marks",
    r"""
local top = '+inf'
if ARGV[2] ~= '' then top = ARGV[2] end
local since = tonumber(ARGV[1])  -- nil when empty: no lower bound
local out = {}
for _, s in ipairs(redis.call('ZREVRANGEBYSCORE', KEYS[2], top, '-inf', 'LIMIT', 0,
                              tonumber(ARGV[3]))) do
  local raw = redis.call('HGET', KEYS[1], s)
  if raw then
    if since and tonumber(cjson.decode(raw).last) < since then break end
    table.insert(out, raw)
  end
end
return out
""",
)

# The pause in force of KEYS[1], by the server's clock: {note, by, at, until} or nil.
_IN_FORCE = r"""
local function in_force(key)
  local p = redis.call('HMGET', key, 'note', 'by', 'at', 'until')
  if not p[3] then return nil end
  if p[4] ~= '' and tonumber(p[4]) <= now_ms() then return nil end
  return {p[1], p[2], p[3], p[4]}
end
"""

# pause(): the pause replaces any earlier one. KEYS: pause. ARGV: note, by, until|''.
# Returns its ``at`` (now). The hash expires at ``until`` (the scripts check it anyway).
PAUSE = _script(
    "pause",
    f"local LEDGER_FORMAT = {LEDGER_FORMAT}\n"
    + r"""
local now = now_ms()
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'v', LEDGER_FORMAT, 'note', ARGV[1], 'by', ARGV[2], 'at', now,
           'until', ARGV[3])
if ARGV[3] ~= '' then redis.call('PEXPIREAT', KEYS[1], ARGV[3]) end
return now
""",
)

# resume(): remove the pause; the one that was in force (nil: none). KEYS: pause.
RESUME = _script(
    "resume",
    _IN_FORCE
    + r"""
local was = in_force(KEYS[1])
redis.call('DEL', KEYS[1])
return was
""",
)

# pauses(), one job per call (jobs live on different cluster nodes). KEYS: pause.
PAUSED = _script("paused", _IN_FORCE + "return in_force(KEYS[1])\n")

# job_since(), one job per call: since when the job has had this fingerprint; a new or
# changed one is recorded as now. KEYS: since. ARGV: fingerprint.
JOB_SINCE = _script(
    "job_since",
    f"local LEDGER_FORMAT = {LEDGER_FORMAT}\n"
    + r"""
local known = redis.call('HMGET', KEYS[1], 'fingerprint', 'since')
if known[1] == ARGV[1] and tonumber(known[2] or '') then return tonumber(known[2]) end
local now = now_ms()
redis.call('HSET', KEYS[1], 'v', LEDGER_FORMAT, 'fingerprint', ARGV[1], 'since', now)
return now
""",
)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _opt(value: int | None) -> str:
    return "" if value is None else str(int(value))


def _mark(raw: Any) -> SlotMark:
    data = json.loads(_text(raw))
    return SlotMark(
        slot=int(data["slot"]),
        fate=data["fate"],
        reason=str(data["reason"]),
        at=int(data["at"]),
        by=str(data["by"]),
        last=int(data["last"]),
        count=int(data.get("count", 1)),
    )


def _pause(job: str, reply: Any) -> PauseState | None:
    if not reply:
        return None
    note, by, at, until = (_text(v) for v in reply)
    return PauseState(job=job, note=note, by=by, at=int(at), until=int(until) if until else None)


class LedgerCalls:
    """The ``LedgerStore`` methods of ``RedisRunStore``: each is one script per job."""

    _backend: RedisProtocolBackend

    def _marks_keys(self, job: str) -> list[str]:
        base = self._backend.job_key(job)
        return [f"{base}:m", f"{base}:mi"]

    async def marks(
        self, job: str, since: int | None, until: int | None, limit: int
    ) -> list[SlotMark]:
        if limit <= 0:
            return []
        rows = await self._backend.eval(
            MARKS, self._marks_keys(job), [_opt(since), _opt(until), int(limit)]
        )
        return [_mark(raw) for raw in rows]

    async def mark_skipped(
        self, job: str, slot: int, reason: str, instance_id: str,
        history_size: int, history_ttl_ms: int | None,
    ) -> bool:
        written = await self._write(
            job, "skipped", reason, [(slot, slot, 1)], instance_id, history_size, history_ttl_ms
        )
        return written == 1

    async def mark_missed(
        self, job: str, ranges: Sequence[tuple[int, int, int]], instance_id: str,
        history_size: int, history_ttl_ms: int | None,
    ) -> int:
        return await self._write(
            job, "missed", "missed", ranges, instance_id, history_size, history_ttl_ms
        )

    async def _write(
        self, job: str, fate: str, reason: str, ranges: Sequence[tuple[int, int, int]],
        instance_id: str, history_size: int, history_ttl_ms: int | None,
    ) -> int:
        args: list[Any] = [instance_id, fate, reason, int(history_size), _opt(history_ttl_ms)]
        for slot, last, count in ranges:
            if last < slot or count < 1:
                raise ValueError(
                    f"job {job!r}: a mark needs slot <= last and count >= 1, "
                    f"got (slot, last, count) = {(slot, last, count)!r}"
                )
            args += [int(slot), int(last), int(count)]
        if not ranges:
            return 0
        return int(await self._backend.eval(MARK, self._marks_keys(job), args))

    def _pause_key(self, job: str) -> str:
        return f"{self._backend.job_key(job)}:p"

    async def pause(self, job: str, note: str, by: str, until: int | None) -> PauseState:
        at = await self._backend.eval(PAUSE, [self._pause_key(job)], [note, by, _opt(until)])
        return PauseState(job=job, note=note, by=by, at=int(at), until=until)

    async def resume(self, job: str) -> PauseState | None:
        return _pause(job, await self._backend.eval(RESUME, [self._pause_key(job)], []))

    async def pauses(self, jobs: Sequence[str]) -> dict[str, PauseState]:
        calls: list[tuple[Script, Sequence[str], Sequence[Any]]] = [
            (PAUSED, [self._pause_key(job)], []) for job in jobs
        ]
        replies = await self._backend.eval_many(calls)
        found = {job: _pause(job, reply) for job, reply in zip(jobs, replies, strict=True)}
        return {job: state for job, state in found.items() if state is not None}

    async def job_since(self, jobs: Sequence[tuple[str, str]]) -> list[int]:
        calls: list[tuple[Script, Sequence[str], Sequence[Any]]] = [
            (JOB_SINCE, [f"{self._backend.job_key(job)}:since"], [fingerprint])
            for job, fingerprint in jobs
        ]
        return [int(reply) for reply in await self._backend.eval_many(calls)]
