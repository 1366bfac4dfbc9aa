"""The local spool (issue 15): a bounded stop, and records the store cannot take kept on disk.

The engine tests run the real memory store (made durable: one object outlives the
"restarts" of the schedulers) behind a transport that fails every call while ``down``;
tests/test_spool_workers.py does the same with real workers on PostgreSQL and Redis.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from django_anarchon.backends.base import StoredResult
from django_anarchon.backends.memory import MemoryBackend
from django_anarchon.engine import JobContext, Scheduler
from django_anarchon.logtime import iso
from django_anarchon.spool import Spool, SpoolEntry

from .test_engine_support import Calls, wait_for, wait_for_sync

ROOT = Path(__file__).resolve().parent.parent


def files(directory: Path, pattern: str) -> list[Path]:
    return list(directory.glob(pattern))


def entry(slot: int = 1_000, job: str = "work", **result: Any) -> SpoolEntry:
    fields: dict[str, Any] = dict(slot=slot, by="A", attempt=1, status="success",
                                  started_at=slot + 5, finished_at=slot + 25, duration_ms=20)
    fields.update(result)
    return SpoolEntry(job=job, result=StoredResult(**fields), history_size=10,
                      token="tok", finish="success")


# -- the file ------------------------------------------------------------------------------


def test_entries_survive_a_round_trip_and_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    spool = Spool(tmp_path, "default", "abc", "A")
    first, second = entry(1_000, error="boom: ü \u2028 \"quoted\""), entry(2_000, job="report ✓")
    spool.append(first)
    spool.append(second)
    with spool.path.open("a") as f:
        f.write('{"v":1,"job":"cut sh')  # a crash in the middle of a line
    (taken,) = spool.take()
    assert taken.entries == [first, second]
    assert taken.torn == [3]
    assert not spool.path.exists()  # renamed: it is being replayed
    spool.done(taken)
    assert list(tmp_path.iterdir()) == []


def test_kill_9_while_appending_leaves_a_spool_that_parses(tmp_path: Path) -> None:
    writer = (
        "import sys\n"
        "from django_anarchon.backends.base import StoredResult\n"
        "from django_anarchon.spool import Spool, SpoolEntry\n"
        "spool = Spool(sys.argv[1], 'default', 'abc', 'A')\n"
        "n = 0\n"
        "while True:\n"
        "    n += 1\n"
        "    spool.append(SpoolEntry(job='work', history_size=5, result=StoredResult(slot=n, by='A',\n"
        "        attempt=1, status='failed', started_at=n, finished_at=n, duration_ms=0,\n"
        "        error='x' * 20000)))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", writer, str(tmp_path)], cwd=ROOT)
    path = Spool(tmp_path, "default", "abc", "A").path
    try:
        # An entry is a little over 20 kB: 2 MB held only 99 whole ones once (CI), so
        # wait for room for well over a hundred, one of them possibly torn.
        wait_for_sync(lambda: path.exists() and path.stat().st_size > 2_500_000, 30,
                      "the writer to append over a hundred entries")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    (taken,) = Spool(tmp_path, "default", "abc", "B").take()
    assert len(taken.entries) >= 100
    assert [e.result.slot for e in taken.entries] == list(range(1, len(taken.entries) + 1))
    # Whole lines are fsynced one at a time: at most the last one is cut short.
    assert taken.torn in ([], [len(taken.entries) + 1])


def test_a_file_taken_for_replay_never_swallows_a_later_append(tmp_path: Path) -> None:
    spool = Spool(tmp_path, "default", "abc", "A")
    spool.append(entry(1_000))
    (taken,) = spool.take()
    spool.append(entry(2_000))  # the instance goes on spooling while another replays
    assert [e.result.slot for e in taken.entries] == [1_000]
    spool.done(taken)
    (later,) = spool.take()
    assert [e.result.slot for e in later.entries] == [2_000]


def test_a_spool_is_replayed_only_into_its_own_scheduler_and_store(tmp_path: Path) -> None:
    Spool(tmp_path, "default", "store1", "A").append(entry(1_000))
    Spool(tmp_path, "other", "store1", "A").append(entry(2_000))
    Spool(tmp_path, "default", "store2", "A").append(entry(3_000))
    (taken,) = Spool(tmp_path, "default", "store1", "B").take()
    assert [e.result.slot for e in taken.entries] == [1_000]
    assert len(list(tmp_path.glob("*.jsonl"))) == 2  # the others are left alone


# -- the engine ------------------------------------------------------------------------------


#: The store calls a transport that is down refuses (reads of history stay the test's).
_CALLS = ("claim", "claim_many", "record_claim", "save_result")
_RUN_CALLS = ("claim", "claim_many", "heartbeat", "finish", "finish_many", "release", "active")


class _Guarded:
    """``target``'s methods named in ``calls`` fail while ``outage.down``; the rest pass."""

    def __init__(self, outage: Outage, target: Any, calls: tuple[str, ...]) -> None:
        self._outage, self._target, self._calls = outage, target, calls

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if name not in self._calls or not callable(value):
            return value

        async def guarded(*args: Any, **kwargs: Any) -> Any:
            if self._outage.down:
                raise ConnectionError("connection refused (the store is down)")
            return await value(*args, **kwargs)

        return guarded


class Outage(_Guarded):
    """A real store behind a transport that refuses every call while ``down``."""

    def __init__(self, backend: Any) -> None:
        super().__init__(self, backend, _CALLS)
        self.down = False
        self.backend = backend
        self.runs = None if backend.runs is None else _Guarded(self, backend.runs, _RUN_CALLS)


class DurableMemory(MemoryBackend):
    """The memory store, durable for these tests: one object outlives their "restarts"."""

    durable = True


@pytest.fixture(params=["memory", "redis", "postgres"])
def real_store(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The store under the transport: built here, outside the event loop (Django's setup)."""
    if request.param == "memory":
        yield DurableMemory()
    elif request.param == "redis":
        from django_anarchon.backends.redis import RedisBackend

        from .redis_support import delete_prefix, redis_url

        url, prefix = redis_url(), f"spool-{uuid.uuid4().hex[:8]}"
        try:
            yield RedisBackend(url=url, strategy="lease", key_prefix=prefix)
        finally:
            delete_prefix(url, prefix)
    else:
        from django_anarchon.backends.database import DatabaseBackend

        alias = request.getfixturevalue("postgres_database")
        request.getfixturevalue("database_access")
        yield DatabaseBackend(using=alias)


@pytest.fixture
async def store(real_store: Any) -> AsyncIterator[Outage]:
    yield Outage(real_store)
    await real_store.close()


@pytest.fixture
def short_bound(monkeypatch: pytest.MonkeyPatch) -> int:
    """The stop's bound for records, shortened from 5 s so that the tests stay quick."""
    import django_anarchon.engine.scheduler as scheduler_module

    monkeypatch.setattr(scheduler_module, "STOP_BOUND_MS", 1_000)
    return 1_000


def _worker(store: Outage, instance: str, spool: Path | None, calls: Calls,
            release: threading.Event, **options: Any) -> Scheduler:
    scheduler = Scheduler(store, instance_id=instance, spool=spool, lease="2s")

    def work(ctx: JobContext) -> None:
        calls.add(by=ctx.instance_id, slot=ctx.slot, attempt=ctx.attempt, at=time.time())
        release.wait(10)

    scheduler.every("work", "1s", work, **options)
    return scheduler


async def test_a_stop_with_the_store_down_ends_within_the_bound_and_a_start_replays(
    store: Outage, tmp_path: Path, short_bound: int
) -> None:
    """Issue 15: the stop waited 10 s more for the records, then cancelled them: lost."""
    calls, release = Calls(), threading.Event()
    a = _worker(store, "A", tmp_path, calls, release)
    await a.start()
    await wait_for(lambda: len(calls) >= 1, 5, "a run")
    run = calls.items[0]
    store.down = True
    release.set()  # the handler returns: its finish and record cannot reach the store
    began = time.monotonic()
    await a.stop(grace="1s")
    took = time.monotonic() - began
    assert took < 1 + short_bound / 1000 + 1.5, f"the stop took {took:.1f}s"
    (taken,) = Spool(tmp_path, "default", a.owed.spool.path.name.split("~")[1], "X").take()
    assert [(e.job, e.result.slot, e.finish, e.result.status) for e in taken.entries] == [
        ("work", run["slot"], "success", "success")]
    spooled = taken.entries[0]
    assert spooled.token is not None and spooled.result.by == "A"
    assert abs(spooled.result.started_at - run["at"] * 1000) < 200
    os.rename(taken.path, str(taken.path).removesuffix(".replay"))  # as it was left

    store.down = False
    b = _worker(store, "B", tmp_path, Calls(), threading.Event())
    await b.start()
    try:
        def replayed() -> bool:
            return not list(tmp_path.glob("*.jsonl*"))

        await wait_for(replayed, 5, "the spool to be replayed")
        history = [r for r in await store.history("work", 50) if r.slot == run["slot"]]
        assert [(r.instance_id, r.attempt, r.status) for r in history] == [("A", 1, "success")]
        assert abs(history[0].started_at.timestamp() - run["at"]) < 0.2  # its real times
        assert not [r for r in await store.runs.active("work") if r.slot == run["slot"]]
    finally:
        await b.stop(grace="1s")


async def test_a_spooled_finish_of_a_run_taken_over_meanwhile_is_refused_and_kept(
    store: Outage, tmp_path: Path, short_bound: int, caplog: pytest.LogCaptureFixture
) -> None:
    calls, release = Calls(), threading.Event()
    a = _worker(store, "A", tmp_path, calls, release, max_attempts=2)
    await a.start()
    await wait_for(lambda: len(calls) >= 1, 5, "a run")
    slot = calls.items[0]["slot"]
    # A backup (no spool of its own) that finds A's run in the way watches it.
    backup_calls, backup_release = Calls(), threading.Event()
    backup_release.set()
    c = _worker(store, "C", None, backup_calls, backup_release, max_attempts=2)
    c.on("skip", lambda event: None)
    await c.start()
    try:
        await asyncio.sleep(1.5)  # C has claimed a later slot: "overlap", and watches
        store.down = True
        release.set()
        await a.stop(grace="1s")
        assert len(files(tmp_path, "*.jsonl")) == 1
        store.down = False
        await wait_for(lambda: backup_calls.where(slot=slot, attempt=2), 10, "the takeover")
    finally:
        await c.stop(grace="1s")

    caplog.set_level(logging.WARNING, "django_anarchon")
    b = _worker(store, "B", tmp_path, Calls(), threading.Event(), max_attempts=2)
    await b.start()
    try:
        await wait_for(lambda: not list(tmp_path.glob("*~*~*.jsonl*")), 5, "the replay")
    finally:
        await b.stop(grace="1s")
    assert b.owed.spool is not None
    (kept,) = b.owed.spool.kept()
    assert (kept.result.slot, kept.result.attempt) == (slot, 1)
    assert kept.why is not None and "taken over" in kept.why
    assert any("refused" in r.getMessage() and str(iso(slot)) in r.getMessage()
               for r in caplog.records)
    history = {(r.attempt, r.status) for r in await store.history("work", 50) if r.slot == slot}
    assert (1, "success") not in history  # the refused record was not written


async def test_a_write_that_gives_up_while_running_is_spooled_and_replayed_by_the_same_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Outage(DurableMemory())
    import django_anarchon.engine.owed as owed_module
    import django_anarchon.engine.runner as runner_module

    monkeypatch.setattr(runner_module, "RECORD_RETRY_MS", 300)
    monkeypatch.setattr(owed_module, "REPLAY_AGAIN_AFTER_S", 0.5)
    calls, release = Calls(), threading.Event()
    a = _worker(store, "A", tmp_path, calls, release)
    await a.start()
    try:
        await wait_for(lambda: len(calls) >= 1, 5, "a run")
        slot = calls.items[0]["slot"]
        store.down = True
        release.set()
        await wait_for(lambda: bool(list(tmp_path.glob("*.jsonl"))), 5, "the record spooled")
        store.down = False

        async def written() -> bool:
            return any(r.slot == slot and r.status == "success"
                       for r in await store.history("work", 50))

        deadline = time.monotonic() + 10
        while not await written():
            assert time.monotonic() < deadline, "the spooled record was never replayed"
            await asyncio.sleep(0.05)
    finally:
        await a.stop(grace="1s")


async def test_a_second_signal_cuts_the_records_short(tmp_path: Path) -> None:
    """stop_now() while the store is down: the stop ends in about a second, records spooled."""
    store = Outage(DurableMemory())
    calls, release = Calls(), threading.Event()
    a = _worker(store, "A", tmp_path, calls, release)
    await a.start()
    await wait_for(lambda: len(calls) >= 1, 5, "a run")
    store.down = True
    began = time.monotonic()
    stopping = asyncio.create_task(a.stop(grace="30s"))  # the handler ignores its signal
    await asyncio.sleep(0.2)
    a.stop_now()
    await asyncio.wait_for(stopping, 10)
    took = time.monotonic() - began
    release.set()
    assert took < 3, f"the stop took {took:.1f}s after stop_now()"
    (taken,) = Spool(tmp_path, "default", a.owed.spool.path.name.split("~")[1], "X").take()
    assert [e.result.status for e in taken.entries] == ["interrupted"]


async def test_an_entry_for_a_job_no_longer_registered_is_kept_and_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = Outage(DurableMemory())
    b = _worker(store, "B", tmp_path, Calls(), threading.Event())
    b.owed.open()  # the spool B will use, to plant an entry of a job B does not have
    assert b.owed.spool is not None
    Spool(tmp_path, "default", b.owed.spool.path.name.split("~")[1], "A").append(
        entry(1_000, job="gone"))
    caplog.set_level(logging.WARNING, "django_anarchon")
    await b.start()
    try:
        await wait_for(lambda: not files(tmp_path, "*~*~*.jsonl*"), 5, "the replay")
    finally:
        await b.stop(grace="1s")
    (kept,) = b.owed.spool.kept()
    assert kept.job == "gone" and kept.why == "no job 'gone' in scheduler 'default'"
    assert any("refused" in r.getMessage() and "gone" in r.getMessage() for r in caplog.records)
    # Reported again at the next start, never dropped.
    caplog.clear()
    await b.start()
    await b.stop(grace="1s")
    assert any("could not be replayed and are kept" in r.getMessage() for r in caplog.records)
