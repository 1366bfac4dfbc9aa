"""The backend contract suite: how to prove that a backend runs each slot exactly once.

Writing a backend
=================
A backend is a class with the async methods of ``django_anarchon.backends.base.Backend``;
``BaseBackend`` is a convenient base (``OPTIONS`` from settings reach its constructor as
keyword arguments). What each method owes the engine:

``claim(input)``
    ``True`` for exactly one instance per (``input.job``, ``input.slot``), decided in ONE
    atomic step on the store (insert with a unique key, put-if-absent, a server-side
    script or transaction). Checking first and writing second, in two calls, lets two
    instances win. Store ``input.token`` with the claim: the same token again must answer
    ``True`` (clients retry after a dropped connection), any other token ``False``.
``dedupe_window_ms``
    How long the store remembers a claim; ``math.inf`` if forever. The engine refuses a
    job whose ``jitter + max_late`` is not shorter. Override ``check_job`` to refuse
    other jobs your store cannot run safely (raise ``ConfigurationError``).
``record_manual_run(input)``
    Record a ``run_now()`` run as running, never deduplicated. If the slot already has
    a manual run, store it under a free slot and return that slot (else ``None``).
``save_result(job, result, history_size, history_ttl_ms)``, ``history(job, limit)``
    Keep attempts (pruned in the store to ``history_size`` per job and to
    ``history_ttl_ms``) and return them newest first from every instance. Build the
    records with ``build_history`` so new fields reach you without changes. If ``claim()``
    does not itself leave a history record, also offer ``record_claim(input)``: the
    engine calls it after a won claim.
``init()``, ``prepare_job(job, history_size)``, ``close()``
    Connect (idempotently), set up per-job structures, and close only what you opened.
``claim_many(inputs)`` (optional)
    Decide many claims in one round trip; the engine uses it for claims due together.
``runs.finish_many(ends)`` (optional, lease stores)
    Each ``RunEnd``'s ``finish()`` and, where that is ``True``, its ``save_result()``, in
    one atomic step; the engine uses it for runs that end together.

A store that can keep leases also offers ``backend.runs``, a ``RunStore`` following the
lease rules of the specification (section 5), every method atomic and timed by the
STORE's clock so that instances with skewed clocks agree. A runner whose token was
replaced must be refused by ``heartbeat``, ``finish`` and ``release``: that is the fencing.

Errors you raise reach the user unchanged. What you store is versioned by you: during a
rolling deploy two releases share one store.

Testing it
==========
Subclass ``BackendContract`` in a test module and give it a ``make_backend`` fixture that
returns a zero-argument factory. Each call of the factory must build a NEW backend
instance (a new client or connection) that talks to the SAME store; the factory may be
a plain function or an ``async`` one, and must not return a client bound to another
event loop::

    import pytest
    from django_anarchon.testing import BackendContract
    from myproject.backends import KeyValueBackend

    class TestKeyValueBackend(BackendContract):
        race_claimers = 50     # concurrent claimers of one slot (built-ins: at least 50)
        race_rounds = 1000     # rounds, each on a new slot (built-ins: at least 1,000)

        @pytest.fixture
        def make_backend(self):
            return lambda: KeyValueBackend(url="kv://127.0.0.1:7000")

A store kept in one process may return the same instance every time (``MemoryBackend``
does); ``close()`` is then called once.

The suite checks:

* the race: ``race_claimers`` claimers of one slot, ``race_rounds`` times, exactly one
  winner each time, through ``claim()`` and, on lease stores, through ``runs.claim()``
  (whose losers must hear ``running(1)``); the same for ``claim_many`` when offered,
  over ``race_many_jobs`` jobs due at once for ``race_many_rounds`` rounds;
* repeat safety: the same token wins again, another token loses; jobs and slots are
  independent; an unknown job has no history;
* history: a claim plus ``save_result()`` comes back as one record with the right job,
  slot, instance, attempt, status, error, duration and times; newest first across
  instances; pruned by ``history_size`` and ``history_ttl``; manual runs appear with
  ``manual=True`` and reason ``manual``, and two of one slot both appear;
* every lease rule, only when ``backend.runs`` is not ``None``: won, running, the same
  claim again, done after success, retries while attempts remain (keeping the claim's
  reason), done when used up, none for a takeover of an unknown run, late, overlap
  (``skip`` and ``allow``; a lapsed lease does not block), takeover after a lapse (attempt
  2 with reason ``takeover``, attempt 1 ``interrupted`` with an error), a lapse with the
  attempts used up (done, ``interrupted``), fencing of stale tokens, renewal of a lapsed
  lease nobody took, ``release`` handing over at once, ``active()``, ``keep_ms``;
  and what SPEC section 9 added: ``early`` for a new run before its slot (nothing
  written), a repeated ``finish`` with the same token and status is ``True``, the
  ``keep_ms`` floor (``MIN_KEEP_MS``), a ``keep_ms`` that never shrinks, and the sweep that
  ends a lapsed run whose attempts are used up; where ``runs.finish_many`` is offered,
  that it answers as ``finish()`` would, stores each end's status (a failed end is
  retried, a succeeded one is done), writes a record only where the finish acted, is
  repeat-safe, prunes history, and that a late one racing a backup's takeover leaves
  exactly one winner and a history that says which;
* the overlap policies, with leases: ``buffer_one`` (one slot waits, the next is
  skipped), ``buffer_all`` (bounded, oldest first), a buffered slot that waited past its
  ``max_late`` still runs, ``cancel_other`` (the old token fenced at once, its attempt
  recorded ``interrupted`` by the canceller, never retried); and races of many claimers,
  through separate backends and through one shared object, counting that each buffered
  slot runs once and each cancel happens once;
* the ledger, on a ``RunStore`` that offers ``LedgerStore`` (skipped otherwise): a claim
  answered ``late`` or ``overlap`` (a full buffer too) writes one ``skipped`` mark, a
  catch-up answered ``late`` none; a paused job's new runs are answered ``paused`` and
  marked, while a run begun before the pause goes on and other jobs are untouched;
  ``resume``, and a pause ``until`` that ends by the store's clock; a ``backfill`` claim
  of a slot that history shows ran is ``done``; ``mark_missed`` refuses a range that
  reaches into another mark; marks are read by ``since``/``until``/``limit`` and pruned
  like history; ``job_since`` keeps its instant for an unchanged fingerprint; and races
  of ``ledger_claimers`` (20) for ``ledger_rounds`` (20), through separate backends and
  one shared object: one mark per late slot, all paused, one backfill winner, no slot
  covered by two marks;
* the race through ONE shared backend object (``race_shared_rounds`` rounds): a backend
  must be safe for concurrent use by the coroutines of one loop.
* wake-ups, when ``wakeups()`` is not ``None``: a hint sent with ``wake()`` by one
  instance reaches another's ``wakeups()`` (skipped for a backend without a push channel).

The suite is a package whose modules follow the contract's parts: ``race``, ``claims``
(repeat safety), ``history``, ``leases``, ``overlap`` and ``ledger``; ``BackendContract``
combines them.

How the suite behaves, so that it can run against a shared real server:

* Every test uses job names made unique with a UUID (only ``[a-z0-9-]``), so runs
  never collide with other test runs or with real data on the same server.
* Every test runs in its own event loop (``asyncio.run``), builds its backends inside
  that loop, and closes every backend it built before the loop ends; a client bound
  to one loop is never used from another. Tests are plain functions: no pytest-asyncio
  configuration is needed.
* Lease timing never assumes the test's clock equals the store's: leases are short
  (``lease_ms``, 400 ms) and the suite waits on ``runs.active()`` with a deadline
  (``wait_timeout``) instead of sleeping a fixed time. Slots are near the test's clock;
  "late" and the history ttl use an hour of margin.

Tuning, as class attributes:

``race_claimers``, ``race_rounds``
    The race's size. A remote store pays a round trip per claim, so keep the product
    affordable; the built-in backends run at least 50 x 1,000.
``race_clients``
    How many backend instances the claimers are spread over (default: one each).
``race_many_jobs``, ``race_many_rounds``
    The size of the ``claim_many`` races (20 x 20).
``race_shared_rounds``
    Rounds of the race through one shared backend object (200).
``ledger_claimers``, ``ledger_rounds``
    The ledger races (20 claimers, 20 rounds).
``overlap_claimers``, ``overlap_rounds``
    The overlap races (buffer_one, buffer_all, cancel_other): how many claimers (20),
    and how many runs the cancel race chains (10).
``race_threads``
    ``True`` runs each claimer in its own thread, with its own backend instance and
    event loop, a barrier starting every round. Use it when concurrent coroutines on
    one loop are not concurrent on the store, for example a backend that calls a
    blocking client through ``sync_to_async(thread_sensitive=True)``, which funnels
    every call through one thread.
``process_factory``, ``process_claimers`` (4), ``process_rounds`` (20)
    A ``"package.module:callable"`` path that builds a backend in a fresh, ``spawn``ed
    process. When set, the race also runs across OS processes. The callable must do
    everything the process needs (``django.setup()`` with the same test database, for
    a backend that uses Django)::

        def kv_factory():
            return KeyValueBackend(url="kv://127.0.0.1:7000")

        class TestKeyValueBackend(BackendContract):
            process_factory = "tests.test_kv:kv_factory"
``supports_leases``
    ``None`` (default) detects a ``RunStore`` from ``backend.runs`` and skips the lease
    tests without one; ``False`` leaves them out of the class altogether.
``supports_claim_many``
    ``None`` (default) detects ``claim_many``; ``False`` leaves its races out.

Tests that cannot apply are not collected: the lease tests with ``supports_leases =
False``, the ``claim_many`` races with ``supports_claim_many = False``, and the race
across OS processes without a ``process_factory``.
``lease_ms``, ``wait_timeout``
    The short lease of the timing tests, and how long to wait for it to lapse (seconds).

A database backend needs database access in its tests, and its threads must see
committed rows: mark the subclass ``pytestmark = pytest.mark.django_db(transaction=True)``.

The helpers are public for tests of your own: ``count_winners`` (how many answers won),
``assert_one_winner_each`` (fails naming the bad rounds), ``race_in_threads`` and
``race_in_processes`` (winners of each round), ``unique_job``.
"""

from __future__ import annotations

from ._base import AnyBackend, BackendFactory, assert_one_winner_each, count_winners, unique_job
from .claims import RepeatSafetyTests
from .history import HistoryTests
from .leases import LeaseTests
from .ledger import LedgerTests
from .overlap import OverlapTests
from .race import RaceTests, race_in_processes, race_in_threads
from .wakeups import WakeupTests

__all__ = [
    "AnyBackend",
    "BackendContract",
    "BackendFactory",
    "assert_one_winner_each",
    "count_winners",
    "race_in_processes",
    "race_in_threads",
    "unique_job",
]


class BackendContract(
    RaceTests, RepeatSafetyTests, HistoryTests, LeaseTests, OverlapTests, LedgerTests,
    WakeupTests,
):
    """The contract every backend must pass; subclass it with a ``make_backend`` fixture.

    See the package docstring for the how-to and the tuning attributes.
    """
