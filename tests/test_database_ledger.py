"""The ledger on the database backend beyond the contract: where marks are written, races
of different writers, the fast path's pause check, round trips.

The contract (``LedgerTests``) says what the answers are; these tests say that each mark
a claim writes goes out in that claim's own transaction on every path (PostgreSQL's
function, the general path, the lock path), that a paused job's claim never reaches the
PostgreSQL function, and that the common claim stays one round trip.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid

import pytest

from django_anarchon.backends.base import ClaimOutcome, RunClaim, SlotMark, StoredResult
from django_anarchon.backends.database import DatabaseBackend
from django_anarchon.backends.database.store import Store
from django_anarchon.models import JobLock, LedgerMark, Run
from tests.test_database_backend import Trips, count
from tests.test_database_rules import PATHS, Path, Runs

pytestmark = pytest.mark.usefixtures("database_access")

ALIASES = [
    pytest.param("postgres_database", marks=pytest.mark.postgres, id="postgres"),
    pytest.param("mysql_database", marks=pytest.mark.mysql, id="mysql"),
    pytest.param("sqlite_database", id="sqlite"),
]


@pytest.fixture(params=PATHS)
def runs(request: pytest.FixtureRequest) -> Runs:
    path: Path = request.param
    alias: str = request.getfixturevalue(path.fixture)
    return Runs(alias, path)


@pytest.fixture(params=ALIASES)
def alias(request: pytest.FixtureRequest) -> str:
    name: str = request.getfixturevalue(request.param)
    return name


def _job(label: str) -> str:
    return f"ledger-{label}-{uuid.uuid4().hex}"


def _mark_in_transaction(trips: Trips) -> bool:
    """Exactly one ledger INSERT went out, inside a transaction (not in autocommit)."""
    inserts = [
        auto for sql, auto in trips.statements
        if "INSERT INTO" in sql and LedgerMark._meta.db_table in sql
    ]
    return len(inserts) == 1 and not inserts[0]


def _marks(alias: str, job: str) -> list[tuple[int, str]]:
    rows = LedgerMark.objects.using(alias).filter(job=job).order_by("slot")
    return list(rows.values_list("slot", "reason"))


# -- each mark in its claim's transaction ------------------------------------------------


def test_late_is_marked_in_the_claims_transaction(runs: Runs) -> None:
    job, now = _job("late"), runs.store.now_ms()
    runs.store.prepare_job(job)
    slot = now - 600_000
    outcome, trips = count(runs.alias, lambda: runs.claim(job, slot, "a", max_late_ms=1000))
    assert outcome.kind == "late", outcome
    assert trips.transactions == 1 and _mark_in_transaction(trips), trips.statements
    assert _marks(runs.alias, job) == [(slot, "late")]
    # Marked already: the next one writes nothing and (but on the lock path) locks nothing.
    outcome, trips = count(runs.alias, lambda: runs.claim(job, slot, "b", max_late_ms=1000))
    assert outcome.kind == "late", outcome
    if not runs.path.lock_only:
        assert trips.round_trips == 1, trips.statements
    # A catch-up answered late is not a skip.
    catch = runs.claim(job, slot - 1000, "c", max_late_ms=1000, reason="catch-up")
    assert catch.kind == "late" and _marks(runs.alias, job) == [(slot, "late")]


def test_overlap_is_marked_in_the_claims_transaction(runs: Runs) -> None:
    job, now = _job("overlap"), runs.store.now_ms()
    runs.store.prepare_job(job)
    assert runs.claim(job, now - 2000, "a") == ClaimOutcome.won(1)
    outcome, trips = count(runs.alias, lambda: runs.claim(job, now - 1000, "b"))
    assert outcome == ClaimOutcome.overlap(now - 2000), outcome
    assert _mark_in_transaction(trips), trips.statements
    assert not runs.remembered(job, now - 1000)  # its insert did not stay
    assert runs.claim(job, now - 1000, "c") == ClaimOutcome.overlap(now - 2000)
    assert _marks(runs.alias, job) == [(now - 1000, "overlap")]


def test_a_full_buffer_is_marked_in_the_claims_transaction(runs: Runs) -> None:
    job, now = _job("buffer"), runs.store.now_ms()
    assert runs.claim(job, now - 3000, "a", overlap="buffer_one") == ClaimOutcome.won(1)
    assert runs.claim(job, now - 2000, "b", overlap="buffer_one").kind == "buffered"
    outcome, trips = count(
        runs.alias, lambda: runs.claim(job, now - 1000, "c", overlap="buffer_one")
    )
    assert outcome == ClaimOutcome.overlap(now - 3000), outcome
    assert trips.transactions == 1 and _mark_in_transaction(trips), trips.statements
    assert _marks(runs.alias, job) == [(now - 1000, "overlap")]


def test_paused_is_marked_and_never_inserts_a_run(runs: Runs) -> None:
    job, now = _job("paused"), runs.store.now_ms()
    runs.store.ledger.pause(job, "", "op", None)
    for i, overlap in enumerate(("skip", "allow")):
        slot = now - 1000 * (i + 1)
        outcome, trips = count(
            runs.alias, lambda s=slot, o=overlap: runs.claim(job, s, f"p{s}", overlap=o)
        )
        assert outcome == ClaimOutcome.paused(), outcome
        assert trips.transactions == 1 and _mark_in_transaction(trips), trips.statements
        assert not runs.remembered(job, slot)
    assert _marks(runs.alias, job) == [(now - 2000, "paused"), (now - 1000, "paused")]
    # A pause whose until has come is none: the claim is won as usual.
    runs.store.ledger.pause(job, "", "op", now - 3_600_000)
    assert runs.claim(job, now - 500, "w") == ClaimOutcome.won(1)


def test_backfill_reads_history_in_the_claims_transaction(runs: Runs) -> None:
    job, now = _job("backfill"), runs.store.now_ms()
    slot = now - 600_000
    runs.store.save_result(
        job,
        StoredResult(slot=slot, by="X", attempt=1, status="success", started_at=now,
                     finished_at=now, duration_ms=0),
        100,
        None,
    )
    assert runs.claim(job, slot, "a", reason="backfill") == ClaimOutcome.done()
    assert not runs.remembered(job, slot)
    assert runs.claim(job, slot + 1000, "b", reason="backfill") == ClaimOutcome.won(1)
    assert runs.row(job, slot + 1000).reason == "backfill"


# -- PostgreSQL's fast path ------------------------------------------------------------


@pytest.mark.postgres
def test_fast_path_pause_check_is_in_the_one_statement(postgres_database: str) -> None:
    """Not paused: one statement, as before. Paused: the function never runs (no run row
    appears), and the lock path answers ``paused``; in a batch too."""
    store = Store(postgres_database)
    assert store._use_functions()
    job, other, now = _job("fastpause"), _job("fastfree"), store.now_ms()

    def claim(job: str, slot: int, token: str, overlap: str = "skip") -> RunClaim:
        return RunClaim(job=job, slot=slot, token=token, instance_id=token.upper(),
                        keep_ms=600_000, overlap=overlap)  # type: ignore[arg-type]

    store.ledger.pause(job, "", "op", None)
    outcome, trips = count(postgres_database, lambda: store.run_claim(claim(job, now, "a")))
    assert outcome == ClaimOutcome.paused()
    first, auto = trips.statements[0]
    assert auto and "anarchon_run_claim_v5" in first  # its job's lock, then v4
    assert trips.transactions == 1 and _mark_in_transaction(trips), trips.statements
    assert not Run.objects.using(postgres_database).filter(job=job).exists()

    batch = [
        claim(job, now - 1000, "b"),
        claim(other, now, "c", "allow"),
        claim(other, now - 1000, "d", "allow"),
    ]
    outcomes, trips = count(postgres_database, lambda: store.run_claim_many(batch))
    assert outcomes == [ClaimOutcome.paused(), ClaimOutcome.won(1), ClaimOutcome.won(1)]
    first, auto = trips.statements[0]
    assert auto and "anarchon_run_claim_many_v6" in first  # v4 inside it
    assert trips.transactions == 1 and _mark_in_transaction(trips), trips.statements
    assert not Run.objects.using(postgres_database).filter(job=job).exists()

    assert store.ledger.resume(job) is not None
    outcome, trips = count(postgres_database, lambda: store.run_claim(claim(job, now, "e")))
    assert outcome == ClaimOutcome.won(1) and trips.round_trips == 1, trips.statements
    # Two overlaps owe marks: the batch's one statement, then a lock-path transaction each.
    skipped = [claim(other, now - 2000, "f"), claim(other, now - 3000, "g")]
    outcomes, trips = count(postgres_database, lambda: store.run_claim_many(skipped))
    assert outcomes == [ClaimOutcome.overlap(now)] * 2, outcomes
    inserts = [auto for sql, auto in trips.statements if "INSERT INTO" in sql and "ledger" in sql]
    assert inserts == [False, False], trips.statements
    # Marked already: the batch's statement answers them.
    again = [claim(other, now - 2000, "h"), claim(other, now - 3000, "i")]
    outcomes, trips = count(postgres_database, lambda: store.run_claim_many(again))
    assert outcomes == [ClaimOutcome.overlap(now)] * 2 and trips.round_trips == 1, trips.statements
    assert _marks(postgres_database, other) == [(now - 3000, "overlap"), (now - 2000, "overlap")]


# -- writers of different kinds at once ------------------------------------------------


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast", "general"])
def test_claims_and_missed_ranges_never_cover_a_slot_twice(alias: str, fast_path: bool) -> None:
    """Late claims of a slot and missed ranges around it, all at once, on connections of
    their own: the marks of the job never overlap."""
    claimers, rounds = 6, 8

    async def scenario() -> list[SlotMark]:
        backends = [
            DatabaseBackend(using=alias, max_connections=1, fast_path=fast_path)
            for _ in range(2 * claimers)
        ]
        try:
            first = backends[0].runs
            job = _job("mixed")
            base = await first.now_ms(job) - 3_600_000
            for r in range(rounds):
                slot = base + r * 10_000
                await asyncio.gather(
                    *(
                        b.runs.claim(RunClaim(job=job, slot=slot, token=f"l{r}-{i}",
                                              instance_id=f"L{i}", max_late_ms=1000))
                        for i, b in enumerate(backends[:claimers])
                    ),
                    *(
                        b.runs.mark_missed(
                            job, [(slot - 2000 + i * 700, slot - 2000 + i * 700 + 1400, 3)],
                            f"M{i}", 1000, None,
                        )
                        for i, b in enumerate(backends[claimers:])
                    ),
                )
            return await first.marks(job, None, None, 10_000)
        finally:
            await asyncio.gather(*(b.close() for b in backends))

    marks = asyncio.run(scenario())
    spans = sorted((m.slot, m.last) for m in marks)
    for (a, a_last), (b, _) in itertools.pairwise(spans):
        assert a_last < b, f"marks overlap: {a}..{a_last} and {b}"
    assert len(marks) >= rounds


def test_job_since_at_once_agrees(alias: str) -> None:
    """Many instances start with one new schedule at once: all are told one instant."""

    async def scenario() -> tuple[list[int], list[list[int]]]:
        backends = [DatabaseBackend(using=alias, max_connections=1) for _ in range(8)]
        try:
            jobs = [(_job(f"since{i}"), f"every {i}m") for i in range(5)]
            first = await backends[0].runs.job_since(jobs)
            changed = [(job, "cron 0 * * * *") for job, _ in jobs]
            answers = await asyncio.gather(*(b.runs.job_since(changed) for b in backends))
            return first, answers
        finally:
            await asyncio.gather(*(b.close() for b in backends))

    first, answers = asyncio.run(scenario())
    assert all(answer == answers[0] for answer in answers), answers
    assert all(new >= old for new, old in zip(answers[0], first, strict=True))


def test_job_since_reads_known_jobs_without_a_lock_and_writes_in_one_statement(
    alias: str,
) -> None:
    """Every instance asks at start, and claims lock the same rows: a locking read of a
    thousand known jobs, and a ``CASE`` of a thousand branches to write them, held a
    burst's first claims up to a second (issue 10)."""
    store = Store(alias)
    jobs = [(_job(f"known{i}"), "every 1m") for i in range(300)]
    first = store.ledger.job_since(jobs)
    again, trips = count(alias, lambda: store.ledger.job_since(jobs))
    assert again == first
    assert trips.transactions == 0 and len(trips.statements) == 1, trips.statements
    changed = [(job, "every 2m") for job, _ in jobs[:200]] + jobs[200:]
    answers, trips = count(alias, lambda: store.ledger.job_since(changed))
    assert answers[200:] == first[200:] and answers[0] >= first[0]
    assert len(set(answers[:200])) == 1
    assert trips.transactions == 1, trips.statements
    writes = [sql for sql, _ in trips.statements if sql.lstrip().upper().startswith("UPDATE")]
    # SQLite takes its write lock with an UPDATE too; PostgreSQL's jobs go in an array.
    assert len(writes) == (2 if store.vendor == "sqlite" else 1), trips.statements
    assert store.vendor != "postgresql" or "CASE" not in writes[0].upper(), writes
    assert store.ledger.job_since(changed) == answers


# -- the other methods: round trips, columns ---------------------------------------------


def test_pruning_marks_is_set_based(alias: str) -> None:
    store = Store(alias)
    job, base = _job("prune"), store.now_ms() - 3_600_000
    store.prepare_job(job)
    LedgerMark.objects.using(alias).bulk_create([
        LedgerMark(job=job, slot=base + i, last_slot=base + i, fate="skipped", reason="late",
                   at_ms=base, instance_id="I")
        for i in range(300)
    ])
    fresh = store.now_ms()
    _, trips = count(
        alias, lambda: store.ledger.mark_skipped(job, fresh, "late", "I", 5, 60_000)
    )
    # the lock, the insert, the cut, one DELETE (SQLite: its BEGIN, and a lock of two)
    assert trips.transactions == 1 and len(trips.statements) <= 6, trips.statements
    assert _marks(alias, job) == [(fresh, "late")]  # the ttl took the other 300
    _, trips = count(alias, lambda: store.ledger.mark_missed(
        job, [(base + 600 + i * 10, base + 605 + i * 10, 2) for i in range(20)], "I", 5, None
    ))
    # the lock, an insert a range, the cut, one DELETE
    assert trips.transactions == 1 and len(trips.statements) <= 25, trips.statements
    slots = sorted(LedgerMark.objects.using(alias).filter(job=job).values_list("slot", flat=True))
    assert slots == [*(base + 600 + i * 10 for i in range(16, 20)), fresh]


def test_pauses_is_one_query_and_resume_clears_every_column(alias: str) -> None:
    store = Store(alias)
    now = store.now_ms()
    jobs = [_job(f"pauses{i}") for i in range(30)]
    for job in jobs[:5]:
        store.ledger.pause(job, "note", "op", None)
    store.ledger.pause(jobs[5], "", "op", now - 3_600_000)  # ended
    store.ledger.pause(jobs[6], "", "op", now + 3_600_000)
    found, trips = count(alias, lambda: store.ledger.pauses(jobs))
    assert len(trips.statements) == 1, trips.statements
    assert set(found) == {*jobs[:5], jobs[6]}
    assert found[jobs[6]].until == now + 3_600_000
    resumed = store.ledger.resume(jobs[0])
    assert resumed is not None and (resumed.note, resumed.by) == ("note", "op")
    row = JobLock.objects.using(alias).get(job=jobs[0])
    assert (row.paused_at_ms, row.paused_until_ms, row.paused_by, row.pause_note) == (
        None, None, None, None
    )
    assert store.ledger.resume(jobs[5]) is None  # its until had come: nothing in force
    assert JobLock.objects.using(alias).get(job=jobs[5]).paused_at_ms is None


def test_too_long_values_are_refused_by_name(alias: str) -> None:
    from django_anarchon.exceptions import ConfigurationError

    store = Store(alias)
    job = _job("long")
    with pytest.raises(ConfigurationError, match="'by'"):
        store.ledger.pause(job, "", "x" * 151, None)
    with pytest.raises(ConfigurationError, match="reason"):
        store.ledger.mark_skipped(job, 1, "r" * 17, "I", 10, None)
    assert not JobLock.objects.using(alias).filter(job=job, paused_at_ms__isnull=False).exists()


@pytest.mark.postgres
def test_v3_wraps_v2_which_stays_for_a_rolling_deploy(postgres_database: str) -> None:
    """After migrate 0008: v3 answers ``paused`` for a paused job and writes nothing; v2,
    which the previous release calls, is still there and still claims (it knows no
    pauses: only this release's instances honour them)."""
    from django.db import connections

    store = Store(postgres_database)
    job, now = _job("v3"), store.now_ms()
    store.ledger.pause(job, "", "op", None)
    args = [job, now - 1000, "t", "T", 30_000, "scheduled", True, None, 600_000, 1]
    with connections[postgres_database].cursor() as cursor:
        cursor.execute(
            "SELECT o_kind, o_marked FROM anarchon_run_claim_v3(%s, %s, %s, %s, %s, %s, %s, "
            "%s, %s, %s)",
            args,
        )
        assert cursor.fetchone() == ("paused", False)
        assert not Run.objects.using(postgres_database).filter(job=job).exists()
        cursor.execute(
            "SELECT o_kind FROM anarchon_run_claim_v2(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            args,
        )
        assert cursor.fetchone() == ("won",)
