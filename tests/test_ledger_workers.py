"""The ledger, a pause and two backfills with real ``anarchon_worker`` processes on one
PostgreSQL database (the jobs of scenario ``ledger`` in tests/dbworkerapp/jobs.py).

No fixed sleeps: every wait is on a condition with a deadline. Four workers run while
one job skips overlapping slots, one is mostly late, and one is
paused and resumed; then every worker stops for a while (nobody is up), two come back,
and two operators backfill the same range at once. Afterwards every slot of each job,
from its first entry to its last, has exactly one entry in the ledger, of the fate the
scenario gave it, and no slot ran twice.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from tests.test_database_workers import ROOT, Database, Workers, now_ms, pg_db, wait_for, workers  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.slow, pytest.mark.workers, pytest.mark.postgres]

INTERVALS = {"ledger-overlap": 1000, "ledger-late": 1000, "ledger-pulse": 200,
             "ledger-backfill": 60_000}


def _django(db: Database, code: str) -> subprocess.Popen[str]:
    """``manage.py shell -c code`` in the workers' project, started (not waited for)."""
    return subprocess.Popen(
        [sys.executable, "-m", "django", "shell", "-c", code], cwd=ROOT, env=db.env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _call(db: Database, code: str) -> Any:
    """Run ``code`` (its last line prints one JSON value) and return that value."""
    proc = _django(db, "import json\nfrom django_anarchon import get_scheduler\n"
                   "s = get_scheduler()\n" + code)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def _ledger(db: Database, job: str) -> list[dict[str, Any]]:
    return _call(db, f"print(json.dumps([e.to_dict() for e in s.ledger({job!r}, limit=5000)]))")  # type: ignore[no-any-return]


def _fates(job: str, entries: list[dict[str, Any]]) -> dict[int, str]:
    """Each slot from the oldest entry to the newest with its one fate (fails otherwise)."""
    step = INTERVALS[job]
    fates: dict[int, list[str]] = {}
    for e in entries:
        slots = range(e["slot"], e["last_slot"] + 1, step)
        assert len(slots) == e["count"], e
        for slot in slots:
            fates.setdefault(slot, []).append(f"{e['fate']}:{e['reason']}")
    low, high = min(fates), max(fates)
    missing = [s for s in range(low, high + 1, step) if s not in fates]
    assert not missing, f"{job}: slots without an entry: {missing[:10]}"
    twice = {s: f for s, f in fates.items() if len(f) != 1}
    assert not twice, f"{job}: slots with two entries: {dict(list(twice.items())[:10])}"
    return {s: f[0] for s, f in fates.items()}


def _runs(db: Database, job: str) -> list[tuple[int, str]]:
    return [(slot, note) for j, slot, _, _, note in db.executions() if j == job]


def _until(ms: int) -> Callable[[], bool]:
    return lambda: now_ms() > ms


def test_four_workers_keep_the_ledger_honour_a_pause_and_backfill_once(
    pg_db: Callable[..., Database], workers: Workers,  # noqa: F811
) -> None:
    db = pg_db("ledger", lease="2s")
    for i in range(4):
        workers.start(db, f"W{i + 1}", grace="10s")
    workers.wait_started()
    wait_for(lambda: len(_runs(db, "ledger-overlap")) >= 2 and len(_runs(db, "ledger-pulse")) >= 5,
             60, "runs of the overlap and pulse jobs")

    # A pause holds every worker from the store's next answer on.
    pause = _call(db, "print(json.dumps(s.pause('ledger-pulse', note='deploy', by='test')"
                      ".to_dict()))")
    assert (pause["note"], pause["by"], pause["until"]) == ("deploy", "test", None)
    wait_for(_until(pause["at"] + 2_000), 10, "two paused seconds")
    ran_paused = [r for r in _runs(db, "ledger-pulse") if r[0] > pause["at"]]
    assert not ran_paused, f"slots due after the pause ran: {ran_paused}"
    resumed = _call(db, "print(json.dumps(s.resume('ledger-pulse').to_dict()))")
    assert resumed["note"] == "deploy"
    back = now_ms()
    wait_for(lambda: any(slot > back for slot, _ in _runs(db, "ledger-pulse")), 30,
             "a run after the resume")

    # Nobody is up for three seconds; two workers come back and look back.
    stopped = now_ms()
    workers.stop_all(timeout=60)
    wait_for(_until(now_ms() + 3_000), 10, "three seconds with no worker")
    for name in [n for n, proc in workers.procs.items() if proc.poll() is not None]:
        del workers.procs[name]  # stopped for good: only the new ones are waited for
    for name in ("W5", "W6"):
        workers.start(db, name, grace="10s")
    workers.wait_started()
    restarted = now_ms()

    # Two operators backfill the same eight minutes at once.
    end = now_ms() // 60_000 * 60_000 - 120_000
    start = end - 7 * 60_000
    code = ("from django_anarchon.backends.base import ms_to_datetime as t\n"
            f"p = s.backfill('ledger-backfill', t({start}), t({end}), requested_by='op')\n"
            "print(json.dumps([list(p.slots), p.already_ran]))")
    filers = [_django(db, "import json\nfrom django_anarchon import get_scheduler\n"
                          "s = get_scheduler()\n" + code) for _ in range(2)]
    plans = []
    for proc in filers:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        plans.append(json.loads(out.strip().splitlines()[-1]))
    expected = list(range(start, end + 1, 60_000))
    # The first filer finds nothing ran; the second may find that the workers already ran
    # some of the first request's slots, and leaves those out of its plan.
    assert expected in [slots for slots, _ in plans], plans
    for slots, already_ran in plans:
        assert set(slots) <= set(expected) and len(slots) + already_ran == len(expected), plans
    wait_for(lambda: sorted(s for s, _ in _runs(db, "ledger-backfill") if s <= end) == expected,
             120, "the backfilled slots to run")
    pulse_missed = lambda: any(  # noqa: E731
        e["fate"] == "missed" for e in _ledger(db, "ledger-pulse")
    )
    wait_for(pulse_missed, 60, "the look back to mark the window with no worker")
    workers.stop_all(timeout=60)

    executions = Counter((job, slot) for job, slot, *_ in db.executions())
    twice = [key for key, n in executions.items() if n > 1]
    assert not twice, f"ran more than once: {twice[:10]}"
    backfilled = [(s, note) for s, note in _runs(db, "ledger-backfill") if s <= end]
    assert {note for _, note in backfilled} == {"backfill"}, backfilled

    fates = {job: _fates(job, _ledger(db, job)) for job in INTERVALS if job != "ledger-backfill"}
    # The backfill job is checked over its range: before the workers first started (the
    # range) it was not known, so the slots between the range and the start have no entry.
    fates["ledger-backfill"] = _fates(
        "ledger-backfill", [e for e in _ledger(db, "ledger-backfill") if e["slot"] <= end]
    )
    assert {"ran:scheduled", "skipped:overlap"} <= set(fates["ledger-overlap"].values())
    assert "skipped:late" in set(fates["ledger-late"].values())
    pulse = fates["ledger-pulse"]
    paused = sorted(s for s, f in pulse.items() if f == "skipped:paused")
    assert len(paused) >= 8 and pause["at"] < paused[0] and paused[-1] <= back + 1_000, paused
    missed = sorted(s for s, f in pulse.items() if f == "missed:missed")
    assert len(missed) >= 10, missed
    assert stopped - 5_000 <= missed[0] and missed[-1] <= restarted + 5_000, (missed, stopped)
    for job in INTERVALS:  # every slot that ran is a ``ran`` entry, and the other way round
        ran = {s for s, f in fates[job].items() if f.startswith("ran:")}
        handled = {s for s, _ in _runs(db, job) if min(fates[job]) <= s <= max(fates[job])}
        assert ran == handled, (job, sorted(ran ^ handled)[:10])
    assert {fates["ledger-backfill"][s] for s in expected} == {"ran:backfill"}
