"""Three ``anarchon_worker`` processes on one Redis (lease): buffer_one and cancel_other
decided across instances.

Each worker appends what its runs did to a file of its own (``tests/overlapworker``);
the verdict comes from those files and, for the cancel records, from the store's history
read after the workers stopped.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import defaultdict
from pathlib import Path

import pytest

from django_anarchon.backends.redis import RedisBackend

from .redis_support import delete_prefix, redis_url
from .support import now_ms, wait_for, worker_group

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.workers]

#: A run on another instance learns of its cancel at its next heartbeat (LEASE 3s: every
#: second); a buffered slot whose blocking run ended elsewhere is claimed again within a
#: third of the lease. Both with a margin for a loaded machine.
BOUND_MS = 1000 + 700


def _read(out: Path) -> dict[str, dict[int, list[tuple[str, list[str]]]]]:
    """job -> slot -> [(instance, words after the slot)], in file order."""
    seen: dict[str, dict[int, list[tuple[str, list[str]]]]] = defaultdict(lambda: defaultdict(list))
    for path in out.glob("W*.txt"):
        for line in path.read_text().splitlines():
            job, slot, *rest = line.split()
            seen[job][int(slot)].append((path.stem, rest))
    return seen


def test_buffer_one_and_cancel_other_across_worker_processes(tmp_path: Path) -> None:
    url = redis_url()
    prefix = f"anarchon-test-overlap-{uuid.uuid4().hex[:10]}"
    env = {
        "DJANGO_SETTINGS_MODULE": "tests.overlapworker.settings",
        "ANARCHON_REDIS_URL": url,
        "ANARCHON_REDIS_PREFIX": prefix,
        "ANARCHON_TEST_OUT": str(tmp_path),
    }
    try:
        with worker_group(tmp_path, env) as group:
            for i in range(3):
                group.start(f"W{i}")
            group.wait_started()
            all_up = now_ms()
            until = all_up + 10_000

            def long_runs_done() -> bool:
                # Two long runs whose buffered and skipped followers are past (the checks
                # below take a long slot only if the stop came 4 s after it at least).
                seen, now = _read(tmp_path)["overlap-buffer"], now_ms()
                past = [s for s in seen if s % 4000 == 0 and all_up + 1000 <= s <= now - 4000]
                return len(past) >= 2 and any(s >= until for s in seen)

            wait_for(long_runs_done, 40, "two long buffer_one runs and 10 s of slots")
            stop_at = now_ms()
            group.stop_all()
        seen = _read(tmp_path)

        buffer = seen["overlap-buffer"]
        starts = {s: [(i, w) for i, w in e if w[0] == "start"] for s, e in buffer.items()}
        assert all(len(v) == 1 for v in starts.values()), f"run twice: {starts}"
        ends = {s: int(w[1]) for s, e in buffer.items() for _, w in e if w[0] == "end"}
        checked = 0
        for slot in sorted(buffer):
            if slot % 4000 or slot < all_up + 1000 or slot + 3000 > stop_at - 1000:
                continue
            assert slot + 1000 in starts, f"buffered slot {slot + 1000} never ran: {sorted(buffer)}"
            began = int(starts[slot + 1000][0][1][1])
            assert began >= ends[slot], (slot, began, ends[slot])
            assert began - ends[slot] < BOUND_MS, (slot, began - ends[slot])
            assert slot + 2000 not in starts, f"slot {slot + 2000} ran beside a buffered one"
            checked += 1
        assert checked >= 2, (checked, sorted(buffer))
        # Every instance waited for the buffered slots, and one of them ran each.
        waits = [
            line
            for i in range(3)
            for line in group.output(f"W{i}").splitlines()
            if "run buffered: job=overlap-buffer" in line
        ]
        waiting = {line.split("slot=")[1].split()[0] for line in waits}
        assert waiting and len(waits) >= 2 * len(waiting), waits

        cancel = seen["overlap-cancel"]
        started = {
            s: int(w[1]) for s, e in cancel.items() for _, w in e if w[0] == "start"
        }
        assert sum(1 for e in cancel.values() for _, w in e if w[0] == "start") == len(started)
        ended = {s: w for s, e in cancel.items() for _, w in e if w[0] == "end"}
        cancelled = 0
        for slot in sorted(started):
            if slot + 1000 not in started or slot < all_up + 1000:
                continue
            assert slot in ended, f"slot {slot} never saw its cancel"
            at, aborted = int(ended[slot][1]), ended[slot][2]
            assert aborted == "1", (slot, ended[slot])
            assert at - started[slot + 1000] < BOUND_MS, (slot, at - started[slot + 1000])
            cancelled += 1
        assert cancelled >= 5, (cancelled, sorted(started))
        runner = {s: i for s, e in cancel.items() for i, w in e if w[0] == "start"}
        remote = [s for s in started if s + 1000 in runner and runner[s] != runner[s + 1000]]
        assert remote, f"no cancel crossed instances: {runner}"

        async def history() -> list:  # type: ignore[type-arg]
            backend = RedisBackend(url=url, key_prefix=prefix)
            try:
                return await backend.history("overlap-cancel", 100)
            finally:
                await backend.close()

        records = asyncio.run(history())
        by_slot: dict[int, list] = defaultdict(list)  # type: ignore[type-arg]
        for record in records:
            by_slot[record.slot].append(record)
        assert all(len(v) == 1 for v in by_slot.values()), by_slot
        for slot in started:
            if slot + 1000 in started and slot >= all_up + 1000:
                (record,) = by_slot[slot]
                assert record.status == "interrupted", record
                assert record.error and record.error.startswith("cancelled by slot"), record
                assert str(slot + 1000) in record.error, record
    finally:
        delete_prefix(url, prefix)
