"""The overlap policies through the engine, on the memory store: buffer_one, buffer_all,
cancel_other (the store's rules have their own tests in the contract suite)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from django_anarchon import signals
from django_anarchon.backends.memory import MemoryBackend
from django_anarchon.engine import JobContext, Scheduler
from django_anarchon.exceptions import ConfigurationError

from .test_engine_support import Calls, ClaimOnlyMemoryBackend, Events, now_ms, wait_for

EVENTS = ("start", "success", "interrupted", "skip", "buffer", "cancel", "lost")


async def test_buffer_one_runs_one_waiting_slot_right_after_the_run() -> None:
    """The first run outlasts several slots: one of them waits in the store and runs at
    once when the run ends (here, on this instance), even past its max_late; the others
    are skipped as overlap."""
    s = Scheduler(MemoryBackend(), instance_id="A")
    events = Events(s, names=EVENTS)
    calls = Calls()

    async def slow(ctx: JobContext) -> None:
        calls.add(slot=ctx.slot, start=now_ms())
        if len(calls) == 1:
            await asyncio.sleep(0.9)
        calls.add(slot=ctx.slot, end=now_ms())

    s.every("slow", "200ms", slow, overlap="buffer_one", max_late="300ms")
    await s.start()
    try:
        await wait_for(lambda: len(calls.where()) >= 4, 5, "the first run and the buffered one")
    finally:
        await s.stop()
    starts = [c for c in calls.items if "start" in c]
    first, second = starts[0], starts[1]
    first_end = next(c["end"] for c in calls.items if c.get("slot") == first["slot"] and "end" in c)
    buffered = events.named("buffer")
    assert [e.slot for e in buffered] == [second["slot"]], buffered
    assert second["start"] >= first_end
    assert second["start"] - first_end < 150, "the buffered slot waited for a poll"
    assert second["start"] - second["slot"] > 300, "it waited past its max_late"
    skipped = {e.slot for e in events.named("skip", reason="overlap")}
    assert skipped and second["slot"] not in skipped
    assert not skipped & {c["slot"] for c in starts}
    assert len({c["slot"] for c in starts}) == len(starts), "a slot ran twice"


async def test_buffer_all_runs_every_waiting_slot_in_order_one_at_a_time() -> None:
    s = Scheduler(MemoryBackend(), instance_id="A")
    events = Events(s, names=EVENTS)
    calls = Calls()
    first_done = threading.Event()

    async def slow(ctx: JobContext) -> None:
        calls.add(slot=ctx.slot, start=now_ms())
        if not first_done.is_set():
            await asyncio.sleep(1.0)
            first_done.set()
        else:
            await asyncio.sleep(0.05)
        calls.add(slot=ctx.slot, end=now_ms())

    s.every("slow", "200ms", slow, overlap="buffer_all", buffer_limit=2)
    await s.start()
    try:
        await wait_for(lambda: len(calls) >= 6, 6, "the first run and two buffered runs")
    finally:
        await s.stop()
    runs = [c for c in calls.items if "start" in c][:3]
    ends = {c["slot"]: c["end"] for c in calls.items if "end" in c}
    assert [r["slot"] for r in runs] == sorted(r["slot"] for r in runs)
    buffered = [e.slot for e in events.named("buffer")]
    assert buffered[:2] == [runs[1]["slot"], runs[2]["slot"]], (buffered, runs)
    # One at a time: each starts after the one before it ended.
    assert runs[1]["start"] >= ends[runs[0]["slot"]]
    assert runs[2]["start"] >= ends[runs[1]["slot"]]
    assert events.named("skip", reason="overlap"), "slots past the bound are skipped"


async def test_cancel_other_aborts_the_running_attempt_here_and_runs() -> None:
    backend = MemoryBackend()
    s = Scheduler(backend, instance_id="A")
    events = Events(s, names=EVENTS)
    calls = Calls()
    received: list[str] = []

    def on_cancel(sender: object, **kwargs: object) -> None:
        received.append("cancel")

    signals.run_cancelled.connect(on_cancel)

    def long(ctx: JobContext) -> None:  # sync: its thread sees the abort, never cancelled
        calls.add(slot=ctx.slot, start=now_ms())
        aborted = ctx.signal.wait(5)
        calls.add(slot=ctx.slot, aborted=aborted, reason=ctx.signal.reason, at=now_ms())

    s.every("long", "300ms", long, overlap="cancel_other")
    try:
        await s.start()
        await wait_for(lambda: len(events.named("cancel")) >= 1, 5, "a cancel")
        await wait_for(lambda: len(calls.where(aborted=True)) >= 1, 5, "the abort")
    finally:
        await s.stop()
        signals.run_cancelled.disconnect(on_cancel)
    cancel = events.named("cancel")[0]
    first = calls.items[0]["slot"]
    assert cancel.slot == first and cancel.error and "cancelled by slot" in cancel.error
    assert received
    abort = calls.where(slot=first, aborted=True)[0]
    assert abort["reason"] == "cancelled"
    interrupted = events.named("interrupted", slot=first)
    assert interrupted and interrupted[0].reason == "cancelled"
    record = next(r for r in await s.ahistory("long", 20) if r.slot == first)
    assert record.status == "interrupted"
    # Written once, by the canceller, with its reason; the runner did not write over it.
    assert record.error is not None and record.error.startswith("cancelled by slot"), record
    assert "lease lost" not in record.error


async def test_cancel_other_on_another_instance_is_learnt_at_its_heartbeat() -> None:
    """Two instances on one store: whichever holds the first run learns the cancel at
    the latest at its next heartbeat, and its handler is aborted."""
    backend = MemoryBackend()
    a = Scheduler(backend, instance_id="A", lease="900ms")
    b = Scheduler(backend, instance_id="B", lease="900ms")
    calls = Calls()

    def long(ctx: JobContext) -> None:
        calls.add(slot=ctx.slot, instance=ctx.instance_id, start=now_ms())
        aborted = ctx.signal.wait(5)
        calls.add(slot=ctx.slot, aborted=aborted, at=now_ms())

    events = Events(a, b, names=EVENTS)
    for s in (a, b):
        s.every("long", "700ms", long, overlap="cancel_other")
    try:
        await asyncio.gather(a.start(), b.start())
        await wait_for(lambda: len(events.named("cancel")) >= 2, 8, "two cancels")
        await wait_for(lambda: len(calls.where(aborted=True)) >= 2, 8, "two aborts")
    finally:
        await asyncio.gather(a.stop(), b.stop())
    for cancel in events.named("cancel")[:2]:
        abort = calls.where(slot=cancel.slot, aborted=True)
        assert abort, cancel
        # heartbeat every 300 ms: the abort comes within one of them after the cancel
        assert abort[0]["at"] - cancel.slot < 700 + 300 + 300, (abort, cancel)
    starts = [c["slot"] for c in calls.items if "start" in c]
    assert len(starts) == len(set(starts)), f"a slot ran twice: {starts}"


def test_buffer_limit_is_validated() -> None:
    s = Scheduler(MemoryBackend(), instance_id="A")
    with pytest.raises(ConfigurationError, match="buffer_limit") as info:
        s.every("a", "1s", lambda ctx: None, overlap="buffer_all", buffer_limit=0)
    assert "'a'" in str(info.value) or "a" in str(info.value)
    with pytest.raises(ConfigurationError, match="1,000"):
        s.every("b", "1s", lambda ctx: None, overlap="buffer_all", buffer_limit=1001)
    with pytest.raises(ConfigurationError, match="only applies with overlap 'buffer_all'"):
        s.every("c", "1s", lambda ctx: None, overlap="buffer_one", buffer_limit=3)
    with pytest.raises(ConfigurationError, match="whole number"):
        s.every("d", "1s", lambda ctx: None, overlap="buffer_all", buffer_limit="3")
    with pytest.raises(ConfigurationError, match="overlap"):
        s.every("e", "1s", lambda ctx: None, overlap="buffer")
    job = s.every("f", "1s", lambda ctx: None, overlap="buffer_all", buffer_limit=1000)
    assert job.options.buffer_limit == 1000
    info_f = next(i for i in s.jobs() if i.name == "f")
    assert (info_f.options["overlap"], info_f.options["buffer_limit"]) == ("buffer_all", 1000)


@pytest.mark.parametrize("overlap", ["buffer_one", "buffer_all", "cancel_other"])
def test_claim_only_stores_refuse_the_lease_policies(overlap: str) -> None:
    s = Scheduler(ClaimOnlyMemoryBackend(), instance_id="A")
    with pytest.raises(ConfigurationError, match="needs a backend with leases") as info:
        s.every("job", "1s", lambda ctx: None, overlap=overlap)
    assert overlap in str(info.value) and "job" in str(info.value)


@pytest.mark.parametrize("strategy", ["stream-id", "script"])
def test_redis_without_leases_refuses_the_lease_policies(strategy: str) -> None:
    """Building the backend connects to nothing: the refusal comes at registration."""
    from django_anarchon.backends.redis import RedisBackend

    s = Scheduler(RedisBackend(url="redis://127.0.0.1:6379/0", strategy=strategy), instance_id="A")
    for overlap in ("buffer_one", "buffer_all", "cancel_other"):
        with pytest.raises(ConfigurationError, match="needs a backend with leases"):
            s.every(f"job-{overlap}", "1s", lambda ctx: None, overlap=overlap)
