"""The slot ledger, pauses and backfill through the scheduler, on the memory store,
PostgreSQL and Redis (``backend_pair``: two backend objects on one store).

Each ledger test walks the schedule from the first to the last slot it looks at and
checks that every slot has exactly one entry: ran, skipped with why, or missed.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from django_anarchon import ConfigurationError
from django_anarchon.backends.base import (
    ClaimOutcome,
    RunClaim,
    RunRecord,
    SlotMark,
    ms_to_datetime,
)
from django_anarchon.backends.memory import MemoryBackend, MemoryRunStore
from django_anarchon.engine import JobContext, Scheduler
from django_anarchon.engine import ledger as ledger_module
from django_anarchon.engine.ledger import LedgerEntry, merge

from .test_catch_up import backend_pair, store_pair  # noqa: F401  (fixtures)
from .test_engine_support import (
    Calls,
    ClaimOnlyMemoryBackend,
    Events,
    real_ms,
    stop_all,
    wait_for,
)


def _job(label: str) -> str:
    return f"ledger-{label}-{uuid.uuid4().hex[:8]}"


def _recorder(calls: Calls, seconds: float = 0.0) -> Any:
    def handler(ctx: JobContext) -> None:
        calls.add(slot=ctx.slot, reason=ctx.reason, by=ctx.instance_id, at=real_ms())
        time.sleep(seconds)

    return handler


def _fates_by_slot(s: Scheduler, name: str, entries: list[LedgerEntry]) -> dict[int, str]:
    """Each slot between the oldest and newest entry with its one fate (fails on two)."""
    job = s.get_job(name)
    low, high = min(e.slot for e in entries), max(e.last_slot for e in entries)
    fates: dict[int, list[str]] = {}
    for entry in entries:
        slot = entry.slot
        for _ in range(entry.count):
            fates.setdefault(slot, []).append(f"{entry.fate}:{entry.reason}")
            nxt = job.schedule.next_after(slot)
            assert nxt is not None
            slot = nxt
    walked = []
    slot = low
    while slot <= high:
        walked.append(slot)
        nxt = job.schedule.next_after(slot)
        assert nxt is not None
        slot = nxt
    missing = [ms_to_datetime(x).isoformat() for x in walked if x not in fates]
    assert not missing, f"slots without an entry: {missing}"
    twice = {x: f for x, f in fates.items() if len(f) != 1}
    assert not twice, f"slots with two entries: {twice}"
    return {x: f[0] for x, f in fates.items()}


# -- the ledger through a scheduler --------------------------------------------------------


async def test_slots_that_ran_or_were_skipped_have_one_entry_each(
    store_pair: tuple[Any, Any],  # noqa: F811
) -> None:
    backend, _ = store_pair
    calls = Calls()
    name = _job("overlap")
    s = Scheduler(backend, instance_id="A", lease="2s")
    # Each run takes 1.3 s: the next slot finds it running (skipped), the one after runs.
    s.every(name, "1s", _recorder(calls, 1.3), max_late="300ms")
    await s.start()
    try:
        await wait_for(lambda: len(calls.items) >= 3, 15, "three runs")
    finally:
        await stop_all(s)
    entries = await s.aledger(name)
    fates = _fates_by_slot(s, name, entries)
    ran = {c["slot"] for c in calls.items}
    assert {slot for slot, fate in fates.items() if fate.startswith("ran")} == ran, fates
    skipped = {fate for fate in fates.values() if fate.startswith("skipped")}
    # A loop held up past max_late (a loaded machine) adds late and missed slots, each
    # with its one entry still.
    late = any(fate.startswith("missed") for fate in fates.values())
    assert "skipped:overlap" in skipped, fates
    assert skipped <= ({"skipped:overlap", "skipped:late"} if late else {"skipped:overlap"}), fates
    runs = [e for e in entries if e.fate == "ran"]
    assert all(e.status == "success" and len(e.attempts) == 1 for e in runs), runs
    assert all(e.reason == "scheduled" and e.by == "A" for e in runs), runs


async def test_slots_a_held_up_loop_never_claimed_are_marked_missed_by_its_stop(
    store_pair: tuple[Any, Any],  # noqa: F811
) -> None:
    """The loop held up for longer than ``max_late`` (a CI machine, a laptop asleep, or an
    async handler that blocks): the slots it passed over are in the ledger once it stops,
    not just in a log line."""
    backend, _ = store_pair
    calls = Calls()
    name = _job("held-up")
    s = Scheduler(backend, instance_id="A", lease="2s")

    async def blocks_the_loop_once(ctx: JobContext) -> None:
        calls.add(slot=ctx.slot, at=real_ms())
        if len(calls.items) == 1:
            time.sleep(1.2)  # noqa: ASYNC251 - on purpose: no timer fires meanwhile

    s.every(name, "200ms", blocks_the_loop_once, max_late="100ms")
    await s.start()
    try:
        await wait_for(lambda: len(calls.items) >= 4, 15, "runs after the hold-up")
    finally:
        await stop_all(s)
    entries = await s.aledger(name)
    fates = _fates_by_slot(s, name, entries)
    ran = {c["slot"] for c in calls.items}
    assert {slot for slot, fate in fates.items() if fate.startswith("ran")} == ran, fates
    missed = [slot for slot, fate in fates.items() if fate.startswith("missed")]
    assert len(missed) >= 3, fates  # 1.2 s of 200 ms slots, less the one claimed late


async def test_a_pause_holds_every_instance_at_once_and_resume_lets_them_go(
    store_pair: tuple[Any, Any],  # noqa: F811
) -> None:
    one, two = store_pair
    calls = Calls()
    name = _job("pause")
    schedulers = [Scheduler(b, instance_id=i, lease="2s") for b, i in ((one, "A"), (two, "B"))]
    for s in schedulers:
        s.every(name, "200ms", _recorder(calls), max_late="150ms")
        await s.start()
    try:
        await wait_for(lambda: len(calls.items) >= 2, 10, "runs before the pause")
        state = await schedulers[1].apause(name, note="deploy", until="1h", by="ops")
        assert (state.note, state.by) == ("deploy", "ops")
        # ``until`` is counted from the store's now as this worker sees it; ``at`` is the
        # store's own instant of the write: a round trip apart at most.
        assert state.until is not None and abs(state.until - state.at - 3_600_000) < 1_000
        assert set(await schedulers[0].apauses()) == {name}
        await asyncio.sleep(1.5)  # seven slots fall due while paused
        paused_calls = [c for c in calls.items if c["slot"] > state.at]
        assert not paused_calls, f"slots after the pause ran: {paused_calls}"
        resumed = await schedulers[0].aresume(name)
        assert resumed is not None and resumed.note == "deploy"
        assert await schedulers[1].apauses() == {}
        back = real_ms()
        await wait_for(lambda: any(c["slot"] > back for c in calls.items), 10, "a run after")
    finally:
        await stop_all(*schedulers)
    entries = await schedulers[0].aledger(name)
    paused = [e for e in entries if e.reason == "paused"]
    assert len(paused) >= 5, entries
    assert all(state.at < e.slot < back + 200 for e in paused), paused
    fates = _fates_by_slot(schedulers[0], name, [e for e in entries if e.slot > state.at])
    assert "skipped:paused" in fates.values()


async def test_slots_nobody_claimed_are_found_missed_by_the_first_instance_back(
    store_pair: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch,  # noqa: F811
) -> None:
    monkeypatch.setattr(ledger_module, "FIRST_LOOK_DELAY_S", 0.1)
    one, two = store_pair
    calls = Calls()
    name = _job("missed")
    first = Scheduler(one, instance_id="A", lease="1s")
    first.every(name, "1s", _recorder(calls), max_late="200ms")
    await first.start()
    try:
        await wait_for(lambda: len(calls.items) >= 2, 10, "two runs")
    finally:
        await stop_all(first)
    await asyncio.sleep(3.5)  # nobody is up for three slots or so
    second = Scheduler(two, instance_id="B", lease="1s")
    second.every(name, "1s", _recorder(calls), max_late="200ms")
    missed: list[Any] = []
    second.on("missed", missed.append)
    await second.start()
    try:
        await wait_for(lambda: missed, 15, "the missed slots")
        await wait_for(lambda: any(c["by"] == "B" for c in calls.items), 10, "B runs")
        # The second look, once the start's slots are out of reach, covers them too.
        deadline = time.monotonic() + 15
        while True:
            try:
                _fates_by_slot(second, name, await second.aledger(name))
                break
            except AssertionError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
    finally:
        await stop_all(second)
    entries = await second.aledger(name)
    gaps = [e for e in entries if e.fate == "missed"]
    assert 1 <= len(gaps) <= 2 and sum(g.count for g in gaps) >= 3, entries
    assert gaps[0].by == "B" and gaps[0].reason == "missed"
    fates = _fates_by_slot(second, name, entries)
    # (A claim slowed by a loaded machine may be skipped late, and says so.)
    assert {"ran:scheduled", "missed:missed"} <= set(fates.values()) <= {
        "ran:scheduled", "missed:missed", "skipped:late"
    }, fates
    # A second look finds nothing more to write.
    jobs = second.registered_jobs()
    assert await second.ledgers.look_back(jobs, await second.ledgers.since(jobs)) == 0


async def test_a_worker_ahead_marks_nothing_that_ran_or_is_still_to_come(skew: Any) -> None:
    """5 s ahead of the store: the look back judges "long enough ago" by the store's clock."""
    skew(5_000)
    backend = MemoryBackend(clock=real_ms)
    calls = Calls()
    s = Scheduler(backend, instance_id="ahead", lease="1s")
    s.every("ahead.report", "1s", _recorder(calls), max_late="200ms")
    await s.start()
    try:
        since = await s.ledgers.since(s.registered_jobs())
        await wait_for(lambda: len(calls.items) >= 3, 10, "three runs")
        assert await s.ledgers.look_back(s.registered_jobs(), since) == 0
    finally:
        await stop_all(s)
    marks = await backend.runs.marks("ahead.report", None, None, 100)
    assert marks == [], marks


def test_merge_splits_a_missed_range_around_a_later_run() -> None:
    s = Scheduler(MemoryBackend())
    s.every("j", "1s", _recorder(Calls()))
    job = s.get_job("j")
    base = 1_800_000_000_000
    mark = SlotMark(base, "missed", "missed", base + 10_000, "B", base + 4000, 5)
    run = RunRecord(
        job="j", slot=base + 2000, scheduled_at=ms_to_datetime(base + 2000), instance_id="C",
        manual=False, attempt=1, reason="backfill", status="success",
        started_at=ms_to_datetime(base + 20_000),
    )
    entries = merge(job, [run], [mark])
    assert [(e.slot, e.fate, e.last_slot, e.count) for e in entries] == [
        (base + 3000, "missed", base + 4000, 2),
        (base + 2000, "ran", base + 2000, 1),
        (base, "missed", base + 1000, 2),
    ], entries
    assert entries[1].reason == "backfill"
    # A skip of a slot that ran is not shown: the run is its fate.
    skip = SlotMark(base + 2000, "skipped", "overlap", base, "A", base + 2000)
    assert [e.fate for e in merge(job, [run], [skip])] == ["ran"]
    # Read from a ``since`` after the run: the range is still split by it, so the slot
    # that ran is not counted missed (and the part before ``since`` is left out).
    entries = merge(job, [run], [mark], since=base + 3000)
    assert [(e.slot, e.fate, e.count) for e in entries] == [(base + 3000, "missed", 2)], entries


async def test_the_look_waits_for_the_start_s_catch_up_of_all_slots(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``catch_up_mode="all"`` claims the missed slots one after another, for longer than
    the first look waits: those slots are caught up, never reported missed."""
    monkeypatch.setattr(ledger_module, "FIRST_LOOK_DELAY_S", 0.1)
    backend = MemoryBackend()
    name, calls = _job("catchup"), Calls()

    def instance(label: str) -> Scheduler:
        s = Scheduler(backend, instance_id=label, lease="1s")
        s.every(name, "1s", _recorder(calls, 0.4), max_late="200ms", catch_up="30s",
                catch_up_mode="all")
        return s

    first = instance("A")
    await first.start()
    try:
        await wait_for(lambda: len(calls.items) >= 1, 10, "a run")
    finally:
        await stop_all(first)
    gone = real_ms()
    await wait_for(lambda: real_ms() > gone + 3_500, 10, "three slots with nobody up")
    second = instance("B")
    missed: list[Any] = []
    second.on("missed", missed.append)
    await second.start()
    try:
        await wait_for(lambda: len([c for c in calls.items if c["reason"] == "catch-up"]) >= 3,
                       15, "the catch-up of three slots or more")
        await wait_for(lambda: not second.claim_flows.catching_up
                       and not second.ledgers.deferred, 15, "the held look")
    finally:
        await stop_all(second)
    ran = {c["slot"] for c in calls.items}
    wrong = [e for e in missed if e.slot in ran]
    assert not wrong, (wrong, sorted(ran))
    # From when the store first saw the job (A's start; A caught up an older slot, and
    # the slots before that start are nobody's to mark), every slot has one fate.
    known = calls.items[0]["at"]
    fates = _fates_by_slot(
        second, name, [e for e in await second.aledger(name) if e.slot > known]
    )
    assert "ran:catch-up" in fates.values(), fates
    assert not [slot for slot, fate in fates.items() if fate == "missed:missed" and slot in ran]


async def test_a_look_counts_only_the_missed_ranges_it_wrote() -> None:
    """Another instance marked one of the two ranges first: one range is this instance's,
    and one ``missed`` event (what the log and the metric count) is emitted."""
    backend = MemoryBackend()
    s = Scheduler(backend, instance_id="late")
    s.every("j", "1s", _recorder(Calls()))
    events = Events(s, names=("missed",))
    store = backend.runs
    base = 1_800_000_000_000
    first, second = (base, base + 2000, 3), (base + 10_000, base + 11_000, 2)
    assert await store.mark_missed("j", [first], "early", 100, None) == 1
    assert await s.ledgers._mark(store, s.get_job("j"), [first, second]) == 1
    assert [e.slot for e in events.named("missed")] == [second[0]]
    await backend.close()


# -- refusals --------------------------------------------------------------------------------


async def test_pause_and_backfill_are_refused_where_they_cannot_work() -> None:
    claim_only = Scheduler(ClaimOnlyMemoryBackend())
    claim_only.every("j", "1m", _recorder(Calls()))
    with pytest.raises(ConfigurationError, match="needs a store with leases"):
        await claim_only.apause("j")
    assert await claim_only.apauses() == {}
    s = Scheduler(MemoryBackend())
    s.every("j", "1m", _recorder(Calls()))
    now = ms_to_datetime(real_ms())
    with pytest.raises(ConfigurationError, match=r"'until'.*not in the future"):
        await s.apause("j", until=now - timedelta(minutes=1))
    with pytest.raises(ConfigurationError, match="'until'"):
        await s.apause("j", until="soon")
    with pytest.raises(ConfigurationError, match="give the datetime a time zone"):
        await s.apause("j", until=now.replace(tzinfo=None) + timedelta(hours=1))
    with pytest.raises(ConfigurationError, match="the range ends in the future"):
        await s.abackfill("j", now - timedelta(hours=1), now + timedelta(hours=1))
    with pytest.raises(ConfigurationError, match="before it starts"):
        await s.abackfill("j", now - timedelta(hours=1), now - timedelta(hours=2))
    with pytest.raises(ConfigurationError, match=r"'max'.*more than max=10"):
        await s.abackfill("j", now - timedelta(hours=1), now, max=10)
    with pytest.raises(ConfigurationError, match="'overlap'"):
        await s.abackfill("j", now - timedelta(hours=1), now, overlap="cancel_other")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="'max'"):
        await s.abackfill("j", now - timedelta(hours=1), now, max=0)
    with pytest.raises(ConfigurationError, match=r"'requested_by'.*at most 150"):
        await s.abackfill("j", now - timedelta(hours=1), now, requested_by="x" * 151)
    await s.apause("j")
    with pytest.raises(ConfigurationError, match="is paused"):
        await s.abackfill("j", now - timedelta(hours=1), now)


async def test_a_backfill_older_than_what_history_tells_is_refused() -> None:
    """A full history has dropped older runs, and history_ttl drops old ones: a slot
    before that bound may have run, so a range that reaches there is refused."""
    backend = MemoryBackend()
    s = Scheduler(backend)
    s.every("full", "1m", _recorder(Calls()), history_size=2)
    s.every("ttl", "1m", _recorder(Calls()), history_ttl="10m")
    now = real_ms()
    end = now - now % 60_000 - 60_000
    for slot in (end - 120_000, end - 60_000, end):
        claim = RunClaim("full", slot, f"t{slot}", "old", history_size=2)
        assert (await backend.runs.claim(claim)).kind == "won"
        assert await backend.runs.finish("full", slot, f"t{slot}", "success")
    with pytest.raises(ConfigurationError, match=r"'from'.*history tells which slots ran only"):
        await s.abackfill("full", ms_to_datetime(end - 300_000), ms_to_datetime(end))
    # (The runs started just now, long after their slots: any slot of the past may have
    # run before them and been dropped.)
    with pytest.raises(ConfigurationError, match=r"'from'.*history tells which slots ran only"):
        await s.abackfill("ttl", ms_to_datetime(end - 3_600_000), ms_to_datetime(end))
    plan = await s.abackfill("ttl", ms_to_datetime(end - 300_000), ms_to_datetime(end),
                             dry_run=True)
    assert len(plan.slots) == 6, plan
    await backend.close()


async def test_a_dry_run_lists_the_slots_that_never_ran() -> None:
    backend = MemoryBackend()
    s = Scheduler(backend)
    s.every("j", "1m", _recorder(Calls()))
    now = real_ms()
    end = now - now % 60_000
    start = end - 4 * 60_000
    # One slot of the range ran (history has it): the backfill leaves it out.
    assert (await backend.runs.claim(RunClaim("j", start + 60_000, "t", "old"))).kind == "won"
    plan = await s.abackfill("j", ms_to_datetime(start), ms_to_datetime(end), dry_run=True)
    assert plan.slots == (start, start + 120_000, start + 180_000, end), plan
    assert plan.already_ran == 1 and plan.request_id is None


# -- backfill requests on workers ------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
async def test_two_backfills_of_one_range_run_each_slot_once() -> None:
    from django_anarchon.backfill import claim_backfills, run_backfill
    from django_anarchon.models import BackfillRequest

    backend = MemoryBackend()
    calls = Calls()
    schedulers = [Scheduler(backend, instance_id=i, lease="2s") for i in ("A", "B")]
    for s in schedulers:
        s.every("bf.report", "1m", _recorder(calls, 0.05), max_late="1s")
    now = real_ms()
    end = now - now % 60_000 - 60_000
    start = end - 5 * 60_000
    plans = [
        await s.abackfill("bf.report", ms_to_datetime(start), ms_to_datetime(end),
                          requested_by=f"op-{s.instance_id}")
        for s in schedulers
    ]
    assert all(len(p.slots) == 6 and p.request_id is not None for p in plans), plans
    for s in schedulers:
        await s.start()
    try:
        won = [
            await sync_to_async(claim_backfills)("default", s.instance_id, ["bf.report"])
            for s in schedulers
        ]
        assert [len(w) for w in won] == [1, 1], won
        await asyncio.gather(*(run_backfill(s, w[0]) for s, w in zip(schedulers, won, strict=True)))
    finally:
        await stop_all(*schedulers)
    # A minute that begins while the test runs is the job's own scheduled slot: not ours.
    scheduled = [c["slot"] for c in calls.items if c["reason"] == "scheduled"]
    assert all(slot > end for slot in scheduled), scheduled
    slots = sorted(c["slot"] for c in calls.items if c["reason"] != "scheduled")
    assert slots == list(plans[0].slots), slots
    assert {c["reason"] for c in calls.items} <= {"backfill", "scheduled"}
    rows = await sync_to_async(list)(BackfillRequest.objects.values_list("done", "finished_at"))
    assert all(done == 6 and finished is not None for done, finished in rows), rows
    history = await schedulers[0].ahistory("bf.report", 100)
    backfilled = [r for r in history if r.reason != "scheduled"]
    assert sorted(r.slot for r in backfilled) == slots
    assert {r.reason for r in backfilled} == {"backfill"}


@pytest.mark.django_db(transaction=True)
async def test_a_backfill_whose_slot_runs_long_stays_with_its_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A slot that runs longer than ABANDONED_AFTER_S: its worker renews the claim, so no
    other worker takes the request and starts the next slot beside it."""
    from django_anarchon import backfill as backfill_module
    from django_anarchon.backfill import claim_backfills, run_backfill

    monkeypatch.setattr(backfill_module, "ABANDONED_AFTER_S", 1.0)
    monkeypatch.setattr(backfill_module, "RENEW_EVERY_S", 0.2)
    calls = Calls()
    s = Scheduler(MemoryBackend(), instance_id="A", lease="2s")
    s.every("bf.long", "1m", _recorder(calls, 2.5), max_late="1s", max_attempts=1)
    now = real_ms()
    end = now - now % 60_000 - 60_000
    plan = await s.abackfill("bf.long", ms_to_datetime(end - 60_000), ms_to_datetime(end),
                             overlap="allow")
    assert len(plan.slots) == 2, plan
    claim = sync_to_async(claim_backfills)
    await s.start()
    try:
        (request,) = await claim("default", "A", ["bf.long"])
        running = asyncio.create_task(run_backfill(s, request))
        # A minute that begins meanwhile is the job's own scheduled slot: not counted.
        def backfilled() -> list[dict[str, Any]]:
            return [c for c in calls.items if c["reason"] == "backfill"]

        await wait_for(lambda: len(backfilled()) == 1, 10, "the first slot to start")
        while not running.done():  # well past ABANDONED_AFTER_S, the request is A's
            assert await claim("default", "B", ["bf.long"]) == []
            await asyncio.sleep(0.2)
        await running
    finally:
        await stop_all(s)
    first, second = backfilled()
    assert second["at"] >= first["at"] + 2_500  # one at a time


class _OutageRunStore(MemoryRunStore):
    """The memory lease store, whose claims fail with ``ConnectionError`` while ``down``."""

    down = False

    async def claim(self, input: RunClaim) -> ClaimOutcome:
        if self.down:
            raise ConnectionError("store unreachable (test)")
        return await super().claim(input)

    async def mark_missed(self, *args: Any) -> int:
        if self.down:
            raise ConnectionError("store unreachable (test)")
        return await super().mark_missed(*args)


async def test_slots_whose_claims_got_no_answer_are_marked_missed_when_the_store_is_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ledger_module, "FIRST_LOOK_DELAY_S", 0.1)
    monkeypatch.setattr(ledger_module, "OWED_RETRY_S", 0.2)
    backend = MemoryBackend()
    runs = _OutageRunStore(backend._state)
    backend.runs = runs
    calls = Calls()
    s = Scheduler(backend, instance_id="A", lease="1s")
    s.every("outage.report", "500ms", _recorder(calls), max_late="300ms")
    await s.start()
    try:
        await wait_for(lambda: len(calls.items) >= 2, 10, "runs before the outage")
        runs.down = True
        down_at = real_ms()
        await wait_for(lambda: s.ledgers.owed, 10, "a slot owed to the store")
        await asyncio.sleep(1.0)  # two more slots fall due with the store away
        assert s.ledgers.owed, "nothing is paid while the store is away"
        runs.down = False
        up_at = real_ms()
        await wait_for(lambda: any(c["slot"] > up_at for c in calls.items), 10, "runs after")
        deadline = time.monotonic() + 10
        while True:  # the owed slots are paid within OWED_RETRY_S
            entries = await s.aledger("outage.report")
            missed_entries = [e for e in entries if e.fate == "missed"]
            if sum(e.count for e in missed_entries) >= 3 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
    finally:
        await stop_all(s)
    entries = await s.aledger("outage.report")
    fates = _fates_by_slot(s, "outage.report", entries)
    missed = sorted(slot for slot, fate in fates.items() if fate == "missed:missed")
    assert len(missed) >= 3, fates
    assert all(down_at - 500 <= slot <= up_at for slot in missed), (missed, down_at, up_at)


async def test_a_scheduler_that_is_not_running_counts_from_the_store_clock(skew: Any) -> None:
    """A command's scheduler never started: a pause's "10s" and a backfill's "future" are
    the store's, not those of a machine whose clock is 5 minutes ahead."""
    skew(300_000)
    s = Scheduler(MemoryBackend(clock=real_ms))
    s.every("j", "1m", _recorder(Calls()))
    state = await s.apause("j", until="10s")
    assert state.until is not None and abs(state.until - state.at - 10_000) < 1_000, state
    await s.aresume("j")
    # Two minutes ago on this machine is three minutes ahead of the store.
    end = ms_to_datetime(real_ms() + 180_000)
    with pytest.raises(ConfigurationError, match="the range ends in the future"):
        await s.abackfill("j", end - timedelta(minutes=5), end)
