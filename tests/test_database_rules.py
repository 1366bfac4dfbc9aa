"""The lease-store rules of SPEC section 9 on the database backend, path by path.

Each rule runs on every way a claim is decided: PostgreSQL's one-round-trip functions
(``fast``), the general path (peek, insert first, lock path) on PostgreSQL, MariaDB and
SQLite, and the lock path alone (``Store._decide``, which the others fall back on). Every
path must give the same answers. Time is the server's: slots come from
``store.now_ms()``, and a test moves a run's ``finished_at_ms`` in its row (epoch ms)
instead of waiting.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from django.db import connections

from django_anarchon.backends.base import (
    DEFAULT_KEEP_MS,
    MIN_KEEP_MS,
    ActiveRun,
    ClaimOutcome,
    RunClaim,
    StoredResult,
)
from django_anarchon.backends.database.store import Store
from django_anarchon.models import Run, RunAttempt

pytestmark = pytest.mark.usefixtures("database_access")

KEEP = 600_000
USED_UP = "lease lapsed; attempts used up"


@dataclass(frozen=True)
class Path:
    fixture: str
    fast_path: bool = False
    lock_only: bool = False


PATHS = [
    pytest.param(Path("postgres_database", fast_path=True), marks=pytest.mark.postgres,
                 id="postgres-fast"),
    pytest.param(Path("postgres_database"), marks=pytest.mark.postgres, id="postgres-general"),
    pytest.param(Path("postgres_database", lock_only=True), marks=pytest.mark.postgres,
                 id="postgres-lock"),
    pytest.param(Path("mysql_database"), marks=pytest.mark.mysql, id="mysql-general"),
    pytest.param(Path("mysql_database", lock_only=True), marks=pytest.mark.mysql,
                 id="mysql-lock"),
    pytest.param(Path("sqlite_database"), id="sqlite-general"),
    pytest.param(Path("sqlite_database", lock_only=True), id="sqlite-lock"),
]
#: The general path on each database (PostgreSQL with ``fast_path=False``).
GENERAL = [
    pytest.param(Path("postgres_database"), marks=pytest.mark.postgres, id="postgres"),
    pytest.param(Path("mysql_database"), marks=pytest.mark.mysql, id="mysql"),
    pytest.param(Path("sqlite_database"), id="sqlite"),
]


class Runs:
    """One store, claimed through one path; rows read and moved on its alias."""

    def __init__(self, alias: str, path: Path) -> None:
        self.alias = alias
        self.path = path
        self.store = Store(alias, fast_path=path.fast_path)
        if path.fast_path:
            assert self.store._use_functions(), "the v2 functions are not installed"

    def claim(self, job: str, slot: int, token: str, **kw: Any) -> ClaimOutcome:
        kw.setdefault("keep_ms", KEEP)
        kw.setdefault("instance_id", token.upper())
        c = RunClaim(job=job, slot=slot, token=token, **kw)
        if self.path.lock_only:
            store = self.store
            return store._retrying(lambda: store._run_claim_locked(c), also_conflicts=True)
        return self.store.run_claim(c)

    def row(self, job: str, slot: int) -> Run:
        return Run.objects.using(self.alias).get(job=job, slot=slot)

    def move(self, job: str, at: int, **fields: Any) -> None:
        """Change the row of run (job, at) directly: how a test moves time without waiting."""
        assert Run.objects.using(self.alias).filter(job=job, slot=at).update(**fields) == 1

    def prune(self, job: str) -> None:
        """``save_result`` of an unrelated attempt: what forgets finished runs."""
        now = self.store.now_ms()
        self.store.save_result(
            job,
            StoredResult(slot=1, by="P", attempt=1, status="success", started_at=now,
                         finished_at=now, duration_ms=0),
            100,
            None,
        )

    def remembered(self, job: str, slot: int) -> bool:
        return Run.objects.using(self.alias).filter(job=job, slot=slot).exists()


@pytest.fixture(params=PATHS)
def runs(request: pytest.FixtureRequest) -> Runs:
    path: Path = request.param
    alias: str = request.getfixturevalue(path.fixture)
    return Runs(alias, path)


def _job(label: str) -> str:
    return f"rules-{label}-{uuid.uuid4().hex}"


# -- early -----------------------------------------------------------------------------


@pytest.mark.parametrize("overlap", ["skip", "allow"])
def test_early_claim_is_answered_and_writes_nothing(runs: Runs, overlap: str) -> None:
    job, now = _job("early"), runs.store.now_ms()
    slot = now + 60_000
    outcome = runs.claim(job, slot, "a", overlap=overlap, max_late_ms=5_000)
    assert outcome.kind == "early", outcome
    assert outcome.wait_ms is not None and 55_000 < outcome.wait_ms <= 60_000, outcome
    assert not Run.objects.using(runs.alias).filter(job=job).exists()
    assert not RunAttempt.objects.using(runs.alias).filter(job=job).exists()
    assert runs.store.active(job) == []
    # The same once its slot has come: a past slot of the job is won as usual.
    assert runs.claim(job, now - 1_000, "b", overlap=overlap) == ClaimOutcome.won(1)


def test_an_existing_run_is_decided_before_early(runs: Runs) -> None:
    """``early`` is for a run that does not exist: the table of SPEC section 5 goes first."""
    job, now = _job("earlyexists"), runs.store.now_ms()
    slot = now + 60_000
    assert runs.claim(job, now - 1_000, "a").kind == "won"
    runs.move(job, now - 1_000, slot=slot)  # a run an earlier release started early
    assert runs.claim(job, slot, "a") == ClaimOutcome.won(1)
    assert runs.claim(job, slot, "b") == ClaimOutcome.running(1)


# -- retention -------------------------------------------------------------------------


def test_keep_never_shrinks(runs: Runs) -> None:
    """Claims with a smaller keep_ms leave the larger; the run outlives the smaller keep."""
    job, now = _job("shrink"), runs.store.now_ms()
    slot = now - 30_000
    assert runs.claim(job, slot, "a", keep_ms=KEEP) == ClaimOutcome.won(1)
    assert runs.claim(job, slot, "a", keep_ms=MIN_KEEP_MS) == ClaimOutcome.won(1)  # renewal
    assert runs.claim(job, slot, "b", keep_ms=MIN_KEEP_MS) == ClaimOutcome.running(1)
    assert runs.store.finish(job, slot, "a", "success")
    assert runs.claim(job, slot, "c", keep_ms=MIN_KEEP_MS) == ClaimOutcome.done()
    assert runs.row(job, slot).keep_ms == KEEP
    # max(finished_at, slot) + MIN_KEEP_MS has passed; max(...) + KEEP has not.
    runs.move(job, slot, finished_at_ms=now - 20_000)
    runs.prune(job)
    assert runs.remembered(job, slot)
    assert runs.claim(job, slot, "d", keep_ms=MIN_KEEP_MS) == ClaimOutcome.done()


def test_keep_grows_from_a_loser(runs: Runs) -> None:
    """A claim told ``running`` with a larger keep_ms (a newer release) still raises it."""
    job, now = _job("grow"), runs.store.now_ms()
    slot = now - 1_000
    assert runs.claim(job, slot, "a", keep_ms=MIN_KEEP_MS) == ClaimOutcome.won(1)
    assert runs.claim(job, slot, "b", keep_ms=KEEP, max_attempts=3) == ClaimOutcome.running(1)
    row = runs.row(job, slot)
    assert (row.keep_ms, row.max_attempts) == (KEEP, 3)
    assert runs.claim(job, slot, "c", keep_ms=None, max_attempts=1) == ClaimOutcome.running(1)
    row = runs.row(job, slot)
    assert (row.keep_ms, row.max_attempts) == (KEEP, 3)


def test_retention_counts_from_the_slot(runs: Runs) -> None:
    """A run that finished "before" its slot (its runner's clock ran ahead) is kept from the
    slot on, so a late claimer of that slot is told ``done``, not ``won(1)`` again."""
    job, now = _job("fromslot"), runs.store.now_ms()
    slot = now - 1_000
    assert runs.claim(job, slot, "a", keep_ms=60_000) == ClaimOutcome.won(1)
    assert runs.store.finish(job, slot, "a", "success")
    runs.move(job, slot, finished_at_ms=slot - 120_000)  # finished + keep_ms has passed
    runs.prune(job)
    assert runs.remembered(job, slot)
    late = runs.claim(job, slot, "b", keep_ms=60_000, max_late_ms=600_000)
    assert late == ClaimOutcome.done()

    old = now - 61_000  # slot + keep_ms has passed too: forgotten
    assert runs.claim(job, old, "c", keep_ms=60_000, overlap="allow") == ClaimOutcome.won(1)
    assert runs.store.finish(job, old, "c", "success")
    runs.move(job, old, finished_at_ms=old - 120_000)
    runs.prune(job)
    assert not runs.remembered(job, old)


def test_keep_floor_keeps_a_failed_run_for_its_retry(runs: Runs) -> None:
    job, now = _job("floor"), runs.store.now_ms()
    slot = now - 6_000
    assert runs.claim(job, slot, "a", keep_ms=1, max_attempts=2) == ClaimOutcome.won(1)
    assert runs.store.finish(job, slot, "a", "failed")
    runs.move(job, slot, finished_at_ms=now - 5_000)  # keep_ms=1 long past; the floor not
    runs.prune(job)
    assert runs.remembered(job, slot)
    assert runs.claim(job, slot, "b", keep_ms=1, max_attempts=2) == ClaimOutcome.won(2)


def test_unknown_keep_is_a_day(runs: Runs) -> None:
    """A run no claim gave a keep_ms for (the previous release: never forgotten) is kept
    DEFAULT_KEEP_MS, then forgotten."""
    job, now = _job("default"), runs.store.now_ms()
    slot = now - 90_000_000  # 25 hours ago
    assert runs.claim(job, slot, "a", keep_ms=None) == ClaimOutcome.won(1)
    assert runs.store.finish(job, slot, "a", "success")
    runs.move(job, slot, finished_at_ms=now - 3_600_000)
    runs.prune(job)
    assert runs.claim(job, slot, "b", keep_ms=None) == ClaimOutcome.done()
    runs.move(job, slot, finished_at_ms=now - DEFAULT_KEEP_MS - 60_000)
    runs.prune(job)
    assert not runs.remembered(job, slot)


def test_a_forgettable_run_is_forgotten_by_the_claim(runs: Runs) -> None:
    """Without pruning, the claim itself treats a run past its retention as absent."""
    job, now = _job("forgotten"), runs.store.now_ms()
    slot = now - 120_000
    assert runs.claim(job, slot, "a", keep_ms=MIN_KEEP_MS) == ClaimOutcome.won(1)
    assert runs.store.finish(job, slot, "a", "success")
    runs.move(job, slot, finished_at_ms=now - 20_000)
    assert runs.claim(job, slot, "b", keep_ms=MIN_KEEP_MS) == ClaimOutcome.won(1)


# -- the sweep -------------------------------------------------------------------------


@pytest.mark.parametrize("overlap", ["skip", "allow"])
def test_sweep_ends_a_lapsed_run_with_attempts_used_up(runs: Runs, overlap: str) -> None:
    job, now = _job(f"sweep{overlap}"), runs.store.now_ms()
    dead, nxt = now - 20_000, now - 10_000
    assert runs.claim(job, dead, "a", max_attempts=1) == ClaimOutcome.won(1)
    assert runs.store.release(job, dead, "a")  # its lease lapses now: a crashed runner
    assert runs.claim(job, nxt, "b", overlap=overlap) == ClaimOutcome.won(1)

    row = runs.row(job, dead)
    assert (row.state, row.status) == ("finished", "interrupted")
    assert row.finished_at_ms is not None and row.finished_at_ms >= now
    assert runs.store.active(job) == [ActiveRun(slot=nxt, attempt=1, alive=True)]
    (swept,) = [r for r in runs.store.history(job, 10) if r.slot == dead]
    assert (swept.attempt, swept.status, swept.error) == (1, "interrupted", USED_UP)
    assert swept.finished_at is not None and swept.duration_ms is not None
    assert runs.store.heartbeat(job, dead, "a", 30_000) is False  # fenced
    # Nobody else could run it: its own runner's late finish still counts.
    assert runs.store.finish(job, dead, "a", "success") is True
    assert runs.store.finish(job, dead, "b", "success") is False
    takeover = runs.claim(job, dead, "c", mode="takeover", max_attempts=1)
    assert takeover == ClaimOutcome.done()


def test_sweep_keeps_a_result_its_runner_saved(runs: Runs) -> None:
    job, now = _job("sweptresult"), runs.store.now_ms()
    dead = now - 20_000
    assert runs.claim(job, dead, "a") == ClaimOutcome.won(1)
    runs.store.save_result(
        job,
        StoredResult(slot=dead, by="A", attempt=1, status="success", started_at=now - 100,
                     finished_at=now, duration_ms=100),
        100,
        None,
    )
    assert runs.store.release(job, dead, "a")  # saved, then died before finish()
    assert runs.claim(job, now - 10_000, "b") == ClaimOutcome.won(1)
    assert runs.row(job, dead).state == "finished"
    (record,) = [r for r in runs.store.history(job, 10) if r.slot == dead]
    assert (record.status, record.error) == ("success", None)


def test_sweep_leaves_runs_a_backup_may_take(runs: Runs) -> None:
    """Attempts left (stored: the largest any claim carried), or no stored max_attempts
    (the previous release wrote the row): not swept."""
    job, now = _job("nosweep"), runs.store.now_ms()
    spare, grown, legacy, nxt = now - 40_000, now - 30_000, now - 20_000, now - 10_000
    allow: dict[str, Any] = {"overlap": "allow"}
    assert runs.claim(job, spare, "a", max_attempts=2, **allow) == ClaimOutcome.won(1)
    assert runs.claim(job, grown, "g", max_attempts=1, **allow) == ClaimOutcome.won(1)
    # a backup with more attempts was told "running": the store must remember them
    assert runs.claim(job, grown, "h", max_attempts=2, **allow) == ClaimOutcome.running(1)
    assert runs.claim(job, legacy, "l", max_attempts=1, **allow) == ClaimOutcome.won(1)
    runs.move(job, legacy, max_attempts=None)
    for slot, token in ((spare, "a"), (grown, "g"), (legacy, "l")):
        assert runs.store.release(job, slot, token)
    assert runs.claim(job, nxt, "b") == ClaimOutcome.won(1)
    assert runs.store.active(job) == [
        ActiveRun(slot=spare, attempt=1, alive=False),
        ActiveRun(slot=grown, attempt=1, alive=False),
        ActiveRun(slot=legacy, attempt=1, alive=False),
        ActiveRun(slot=nxt, attempt=1, alive=True),
    ]
    for slot in (spare, grown):
        takeover = runs.claim(job, slot, "t", mode="takeover", max_attempts=2, **allow)
        assert takeover == ClaimOutcome.won(2)


# -- finish ----------------------------------------------------------------------------


def test_finish_is_repeat_safe(runs: Runs) -> None:
    job, now = _job("finish"), runs.store.now_ms()
    slot = now - 1_000
    assert runs.claim(job, slot, "a") == ClaimOutcome.won(1)
    assert runs.store.finish(job, slot, "a", "success") is True
    finished = runs.row(job, slot).finished_at_ms
    assert runs.store.finish(job, slot, "a", "success") is True  # its reply was lost
    assert runs.row(job, slot).finished_at_ms == finished
    assert runs.store.finish(job, slot, "a", "failed") is False
    assert runs.store.finish(job, slot, "b", "success") is False
    assert runs.store.finish(job, slot + 1, "a", "success") is False


# -- one scenario, every path ----------------------------------------------------------


def _scenario(runs: Runs) -> list[Any]:
    """A little of every rule; its answers, as plain values, for comparing paths."""
    job, now = _job("scenario"), runs.store.now_ms()
    s1, s2, s3 = now - 30_000, now - 20_000, now - 10_000
    seen: list[Any] = []

    def claim(slot: int, token: str, **kw: Any) -> None:
        seen.append(runs.claim(job, slot, token, **kw).to_dict())

    def act(name: str, fn: Callable[[], Any]) -> None:
        seen.append((name, fn()))

    claim(now + 30_000, "e")  # early
    claim(now - 7_200_000, "l", max_late_ms=60_000)  # late
    claim(s1, "a", max_attempts=1)  # won(1)
    claim(s1, "a", keep_ms=MIN_KEEP_MS)  # won(1) again, keep stays
    claim(s1, "b")  # running(1)
    claim(s2, "c")  # overlap(s1)
    seen[-1] = {**seen[-1], "slot": "s1"} if seen[-1].get("slot") == s1 else seen[-1]
    act("release", lambda: runs.store.release(job, s1, "a"))
    claim(s2, "c", max_attempts=2)  # won(1): s1 swept
    act("finish", lambda: runs.store.finish(job, s2, "c", "failed"))
    act("finish", lambda: runs.store.finish(job, s2, "c", "failed"))
    claim(s2, "d", max_attempts=2)  # won(2): the retry
    claim(s3, "f", overlap="allow")  # won(1)
    act("release", lambda: runs.store.release(job, s2, "d"))
    claim(s2, "g", mode="takeover", max_attempts=2)  # done: attempts used up
    seen.append([(a.slot - now, a.attempt, a.alive) for a in runs.store.active(job)])
    seen.append(
        [(r.slot - now, r.attempt, r.status, r.error) for r in runs.store.history(job, 10)]
    )
    seen.append(runs.row(job, s1).keep_ms)
    return seen


SCENARIO = [
    {"kind": "early", "wait_ms": "about 30 s"},
    {"kind": "late", "late_ms": "about 2 h"},
    {"kind": "won", "attempt": 1},
    {"kind": "won", "attempt": 1},
    {"kind": "running", "attempt": 1},
    {"kind": "overlap", "slot": "s1"},
    ("release", True),
    {"kind": "won", "attempt": 1},
    ("finish", True),
    ("finish", True),
    {"kind": "won", "attempt": 2},
    {"kind": "won", "attempt": 1},
    ("release", True),
    {"kind": "done"},
    [(-10_000, 1, True)],
    [
        (-10_000, 1, "running", None),
        (-20_000, 2, "interrupted", USED_UP),
        (-20_000, 1, "running", None),  # failed, but no save_result in the scenario
        (-30_000, 1, "interrupted", USED_UP),
    ],
    KEEP,
]


def _plain(seen: list[Any]) -> list[Any]:
    """Times that depend on when the scenario ran, as words."""
    out = list(seen)
    assert 25_000 < out[0]["wait_ms"] <= 30_000, out[0]
    assert 7_200_000 <= out[1]["late_ms"] < 7_260_000, out[1]
    out[0] = {**out[0], "wait_ms": "about 30 s"}
    out[1] = {**out[1], "late_ms": "about 2 h"}
    return out


def test_every_path_gives_the_same_answers(runs: Runs) -> None:
    """The same scenario on every path; on PostgreSQL with fast_path on and off."""
    assert _plain(_scenario(runs)) == SCENARIO


@pytest.mark.postgres
def test_fast_and_general_path_agree(postgres_database: str) -> None:
    fast = _plain(_scenario(Runs(postgres_database, Path("postgres_database", fast_path=True))))
    general = _plain(_scenario(Runs(postgres_database, Path("postgres_database"))))
    assert fast == general


# -- PostgreSQL ------------------------------------------------------------------------


_V1 = (
    "anarchon_claim_v1(text, bigint, text, text)",
    "anarchon_run_claim_v1(text, bigint, text, text, bigint, text, boolean, bigint, bigint)",
    "anarchon_run_claim_many_v1(text[], bigint[], text[], text[], bigint[], text[], boolean[],"
    " bigint[], bigint[])",
)
_V2 = (
    "anarchon_run_claim_v2(text, bigint, text, text, bigint, text, boolean, bigint, bigint,"
    " integer)",
    "anarchon_run_claim_many_v2(text[], bigint[], text[], text[], bigint[], text[], boolean[],"
    " bigint[], bigint[], integer[])",
)


@pytest.mark.postgres
def test_v1_functions_stay_for_a_rolling_deploy(postgres_database: str) -> None:
    """After migrate, the previous release's functions still work beside this release's,
    and the rows they write (no max_attempts) are never swept."""
    connection = connections[postgres_database]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT " + ", ".join("to_regprocedure(%s) IS NOT NULL" for _ in _V1 + _V2),
            [*_V1, *_V2],
        )
        assert all(cursor.fetchone())
    runs = Runs(postgres_database, Path("postgres_database", fast_path=True))
    job, now = _job("rolling"), runs.store.now_ms()
    old = now - 20_000
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT o_kind, o_attempt FROM anarchon_run_claim_v1(%s, %s, %s, %s, %s, %s, %s, "
            "%s, %s)",
            [job, old, "v1", "OLD", 30_000, "scheduled", True, None, KEEP],
        )
        assert cursor.fetchone() == ("won", 1)
    assert runs.row(job, old).max_attempts is None
    assert runs.claim(job, old, "new") == ClaimOutcome.running(1)  # v2 reads a v1 row
    assert runs.row(job, old).max_attempts == 1  # and now knows its limit
    runs.move(job, old, max_attempts=None)
    assert runs.store.release(job, old, "v1")
    assert runs.claim(job, now - 10_000, "b") == ClaimOutcome.won(1)
    assert runs.row(job, old).state == "running"  # a v1 row: not swept
    assert runs.store.finish(job, old, "v1", "success") is True


@pytest.mark.postgres
def test_fast_path_round_trips_of_the_new_rules(postgres_database: str) -> None:
    """early, the sweep and a claim_many batch of them: each one round trip."""
    from tests.test_database_backend import count

    runs = Runs(postgres_database, Path("postgres_database", fast_path=True))
    job, now = _job("fasttrips"), runs.store.now_ms()
    outcome, trips = count(postgres_database, lambda: runs.claim(job, now + 60_000, "e"))
    assert outcome.kind == "early" and trips.round_trips == 1, trips.statements
    dead = now - 20_000
    assert runs.claim(job, dead, "a") == ClaimOutcome.won(1)
    assert runs.store.release(job, dead, "a")
    outcome, trips = count(postgres_database, lambda: runs.claim(job, now - 10_000, "b"))
    assert outcome == ClaimOutcome.won(1) and trips.round_trips == 1, trips.statements
    assert runs.row(job, dead).status == "interrupted"

    other = _job("fastmany")
    batch = [
        RunClaim(job=other, slot=now + 60_000, token="x", instance_id="X", keep_ms=KEEP),
        RunClaim(job=other, slot=now - 5_000, token="y", instance_id="Y", keep_ms=KEEP),
        RunClaim(job=job, slot=now - 10_000, token="z", instance_id="Z", keep_ms=KEEP),
    ]
    outcomes, trips = count(postgres_database, lambda: runs.store.run_claim_many(batch))
    assert [o.kind for o in outcomes] == ["early", "won", "running"]
    assert trips.round_trips == 1, trips.statements


@pytest.mark.parametrize("path", GENERAL)
def test_general_path_early_is_one_statement(path: Path, request: pytest.FixtureRequest) -> None:
    """The general path answers ``early`` (and a ``late`` that owes no mark) from its
    lock-free peek; a ``late`` that owes one takes the lock path, which writes it."""
    from tests.test_database_backend import count

    runs = Runs(request.getfixturevalue(path.fixture), path)

    job, now = _job("peektrips"), runs.store.now_ms()
    runs.store.prepare_job(job)
    outcome, trips = count(runs.alias, lambda: runs.claim(job, now + 60_000, "e"))
    assert outcome.kind == "early" and trips.round_trips == 1, trips.statements
    late = now - 7_200_000
    outcome, trips = count(
        runs.alias, lambda: runs.claim(job, late, "c", max_late_ms=60_000, reason="catch-up")
    )
    assert outcome.kind == "late" and trips.round_trips == 1, trips.statements
    outcome, trips = count(runs.alias, lambda: runs.claim(job, late, "l", max_late_ms=60_000))
    assert outcome.kind == "late" and trips.transactions == 1, trips.statements
    assert _mark_inserted_in_a_transaction(trips.statements)
    # The slot's mark is there: the next late claimer of it is answered by the peek.
    outcome, trips = count(runs.alias, lambda: runs.claim(job, late, "m", max_late_ms=60_000))
    assert outcome.kind == "late" and trips.round_trips == 1, trips.statements
    assert [m.slot for m in runs.store.ledger.marks(job, None, None, 10)] == [late]


def _mark_inserted_in_a_transaction(statements: list[tuple[str, bool]]) -> bool:
    """The ledger's INSERT went out inside a transaction (not in autocommit)."""
    inserts = [auto for sql, auto in statements if "INSERT INTO" in sql and "ledgermark" in sql]
    return len(inserts) == 1 and not inserts[0]


@pytest.mark.parametrize("path", GENERAL)
def test_general_path_round_trips_of_a_contested_slot(
    path: Path, request: pytest.FixtureRequest
) -> None:
    """overlap "allow": the winner's peek, its run, its history row and the sweep's read
    of the job's other runs are four statements, no transaction; a loser after it, one
    (the peek, which reads no other run). With "skip" the insert,
    the overlap look under the job's lock and the history row are one transaction."""
    from tests.test_database_backend import count

    runs = Runs(request.getfixturevalue(path.fixture), path)
    job, now = _job("generaltrips"), runs.store.now_ms()
    runs.store.prepare_job(job)
    allow: dict[str, Any] = {"overlap": "allow"}
    outcome, trips = count(runs.alias, lambda: runs.claim(job, now - 5_000, "w", **allow))
    assert outcome == ClaimOutcome.won(1)
    assert (trips.round_trips, trips.transactions) == (4, 0), trips.statements
    outcome, trips = count(runs.alias, lambda: runs.claim(job, now - 5_000, "l", **allow))
    assert outcome == ClaimOutcome.running(1) and trips.round_trips == 1, trips.statements
    (record,) = runs.store.history(job, 10)
    assert (record.attempt, record.status, record.instance_id) == (1, "running", "W")

    skip = _job("generalskip")
    runs.store.prepare_job(skip)
    outcome, trips = count(runs.alias, lambda: runs.claim(skip, now - 5_000, "s"))
    assert outcome == ClaimOutcome.won(1) and trips.transactions == 1, trips.statements


@pytest.mark.parametrize("path", GENERAL)
def test_a_runner_that_died_between_its_run_and_its_history_row_still_gets_its_record(
    path: Path, request: pytest.FixtureRequest
) -> None:
    """The general path's "allow" winner writes its run and its history row one after
    the other: died in between, its attempt is recorded when the run is taken over."""
    runs = Runs(request.getfixturevalue(path.fixture), path)
    job, now = _job("diedbetween"), runs.store.now_ms()
    slot = now - 5_000
    assert runs.claim(job, slot, "a", overlap="allow", max_attempts=2) == ClaimOutcome.won(1)
    RunAttempt.objects.using(runs.alias).filter(job=job).delete()  # never written
    runs.move(job, slot, lease_until_ms=now - 1)  # its runner is gone
    takeover = runs.claim(job, slot, "b", mode="takeover", max_attempts=2, overlap="allow")
    assert takeover == ClaimOutcome.won(2)
    records = sorted(runs.store.history(job, 10), key=lambda r: r.attempt)
    assert [(r.attempt, r.status, r.instance_id) for r in records] == [
        (1, "interrupted", "A"), (2, "running", "B")
    ]
