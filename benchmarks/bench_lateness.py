"""Start lateness end to end: worker processes, real stores, handlers that time themselves.

    python benchmarks/bench_lateness.py [--workers 4]
                                        [--stores postgres,redis,mysql,sqlite,procrastinate,apscheduler]
                                        [--steady 20] [--burst 35] [--burst-jobs 1000]
                                        [--handler sync|sync-db|async] [--profile DIR] [--trace]

Lateness is handler start minus slot, read by the handler itself on the machine's clock
(every process shares it) and kept in memory until the worker stops: nothing about the
measurement goes through the store. Two workloads per store, each with ``--workers``
worker processes on one store:

- steady: 10 jobs every second for ``--steady`` seconds. Reported: p50, p99 and max
  after the first 3 s, and the worst slot due in the first second after every worker
  was ready ("first slot").
- burst: ``--burst-jobs`` jobs every 10 s (all due at the same instant) for ``--burst``
  seconds, PostgreSQL and Redis only. Reported: per burst, when its last handler
  started; p50/p99 over every run.

Every workload also counts runs, duplicates (a slot started twice), skips (a slot due
while every worker was up that never started, which a worker skipped and said why: an
overlap policy, lateness, a pause) and misses (one that never started, and that no worker
said anything of). The stores ``procrastinate`` and
``apscheduler`` are peers on the steady workload, each on a PostgreSQL database of its own
(benchmarks/peers.py; a peer that is not installed is skipped with a line saying so).
``--profile DIR`` runs each worker of the project's stores under cProfile and writes
``DIR/<store>-<workload>-<i>.prof``. ``--trace`` notes when each batch of claims that won
a slot was answered, and reports per burst when its last winning claim was answered:
the rest of a burst's time is the handlers' dispatch. Prints a Markdown report.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# As benchmarks.peers, never as peers: APScheduler's store names its job by module.
from benchmarks import peers  # noqa: E402

WARM_UP_MS = 3_000
BURST_EVERY_MS = 10_000


# -- the worker process ---------------------------------------------------------------


def _configure(store: str, database: str) -> None:
    import django
    from django.conf import settings

    databases: dict[str, Any] = {}
    if store == "postgres":
        databases["default"] = {
            "ENGINE": "django.db.backends.postgresql", "NAME": database, "HOST": "127.0.0.1",
            "PORT": "5432", "USER": "postgres", "CONN_MAX_AGE": None,
        }
    elif store == "mysql":
        databases["default"] = {
            "ENGINE": "django.db.backends.mysql", "NAME": database, "HOST": "127.0.0.1",
            "PORT": "3306", "USER": "root", "CONN_MAX_AGE": None,
            "OPTIONS": {"charset": "utf8mb4"},
        }
    else:  # sqlite (and redis, which needs no database but Django wants one)
        databases["default"] = {
            "ENGINE": "django.db.backends.sqlite3", "NAME": database, "CONN_MAX_AGE": None,
            "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 20,
                        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"},
        }
    settings.configure(
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_anarchon"],
        DATABASES=databases, USE_TZ=True, ANARCHON={"default": {"SPOOL": False}},
    )
    django.setup()


def _backend(store: str, prefix: str) -> Any:
    if store == "redis":
        from django_anarchon.backends.redis import RedisBackend

        return RedisBackend(url="redis://127.0.0.1:6379/0", strategy="lease", key_prefix=prefix)
    from django_anarchon.backends.database import DatabaseBackend

    return DatabaseBackend()


async def _work(args: argparse.Namespace) -> dict[str, Any]:
    from django.db import connection

    from django_anarchon.engine import JobContext, Scheduler

    starts: list[tuple[str, int, int]] = []

    def record(ctx: JobContext) -> None:
        starts.append((ctx.name, ctx.slot, time.time_ns() // 1_000_000))

    async def arecord(ctx: JobContext) -> None:
        starts.append((ctx.name, ctx.slot, time.time_ns() // 1_000_000))

    def record_and_query(ctx: JobContext) -> None:
        """As most jobs do: a query on the project's database (the store's for PostgreSQL)."""
        record(ctx)
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")

    handler = {"async": arecord, "sync-db": record_and_query}.get(args.handler, record)
    backend = _backend(args.store, args.prefix)
    claims: list[tuple[int, int]] = []  # (slot, when a claim_many that won it was answered)
    if args.trace:
        inner = backend.runs.claim_many

        async def traced(batch: Any) -> Any:
            outcomes = await inner(batch)
            answered = time.time_ns() // 1_000_000
            won = zip(batch, outcomes, strict=True)
            claims.extend((c.slot, answered) for c, o in won if o.kind == "won")
            return outcomes

        backend.runs.claim_many = traced
    scheduler = Scheduler(backend, instance_id=args.instance, spool=None)
    # What else the workers saw: every skip and error, to explain a miss.
    events: list[tuple[str, str | None, int | None, str | None, int]] = []

    def note(event: Any) -> None:
        events.append((event.name, event.job, event.slot, event.reason,
                       time.time_ns() // 1_000_000))

    for name in ("skip", "error"):
        scheduler.on(name, note)
    for i in range(args.jobs):
        scheduler.every(f"{args.prefix}-{i:05d}", f"{args.every_ms}ms", handler,
                        max_late="60s")
    await scheduler.start()
    quiet: asyncio.Task[None] | None = None
    if not args.no_settle:
        from django_anarchon.engine.heap import collect_when_quiet, settle

        settle()  # as anarchon_worker does once its schedulers have started
        quiet = asyncio.create_task(collect_when_quiet([scheduler]))
    ready = time.time_ns() // 1_000_000
    pauses = _GcPauses()
    cpu = time.process_time()
    await asyncio.sleep(max(0.0, (args.until - ready) / 1000))
    cpu = time.process_time() - cpu
    pauses.close()
    if quiet is not None:
        quiet.cancel()
    await scheduler.stop(grace="5s")
    return {"instance": args.instance, "ready": ready, "starts": starts, "claims": claims,
            "cpu_s": cpu, "gc_ms": pauses.total_ms, "gc_max_ms": pauses.max_ms,
            "events": events}


class _GcPauses:
    """The garbage collector's pauses in this process while the workload runs."""

    def __init__(self) -> None:
        import gc

        self.total_ms = self.max_ms = 0.0
        self._began = 0.0
        gc.callbacks.append(self._note)

    def _note(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
            return
        ms = (time.perf_counter() - self._began) * 1000
        self.total_ms += ms
        self.max_ms = max(self.max_ms, ms)

    def close(self) -> None:
        import gc

        gc.callbacks.remove(self._note)


def worker(args: argparse.Namespace) -> None:
    if args.store in peers.PEERS:
        Path(args.out).write_text(json.dumps(peers.work(args)))
        return
    _configure(args.store, args.database)
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
        result = profiler.runcall(asyncio.run, _work(args))
        profiler.dump_stats(args.profile)
    else:
        result = asyncio.run(_work(args))
    Path(args.out).write_text(json.dumps(result))


# -- the parent -----------------------------------------------------------------------


@dataclass
class Report:
    store: str
    workload: str
    runs: int
    duplicates: int
    misses: int
    skips: int
    lateness: list[int]
    first: int | None
    bursts: list[int]
    claimed: list[int]
    #: each burst's runs per worker, the busiest first
    shares: list[list[int]] = field(default_factory=list)
    cpu_s: float = 0.0
    gc_ms: float = 0.0
    gc_max_ms: float = 0.0
    note: str = ""


def _database(store: str) -> tuple[str, Any]:
    """A new database for one workload, and how to drop it."""
    name = f"anarchon_bench_{uuid.uuid4().hex[:8]}"
    if store == "postgres":
        import psycopg

        admin = dict(host="127.0.0.1", port=5432, user="postgres", dbname="postgres",
                     autocommit=True)
        with psycopg.connect(**admin) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')

        def drop() -> None:
            with psycopg.connect(**admin) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

        return name, drop
    if store == "mysql":
        import MySQLdb

        conn = MySQLdb.connect(host="127.0.0.1", port=3306, user="root")
        conn.cursor().execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
        conn.close()

        def drop_mysql() -> None:
            c = MySQLdb.connect(host="127.0.0.1", port=3306, user="root")
            c.cursor().execute(f"DROP DATABASE IF EXISTS `{name}`")
            c.close()

        return name, drop_mysql
    path = Path(tempfile.mkdtemp(prefix="anarchon-bench-")) / "db.sqlite3"

    def drop_file() -> None:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)

    return str(path), drop_file


def _migrate(store: str, database: str) -> None:
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT)!r}); "
        "from benchmarks.bench_lateness import _configure; "
        f"_configure({store!r}, {database!r}); from django.core.management import call_command; "
        "call_command('migrate', verbosity=0)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _run(args: argparse.Namespace, store: str, workload: str, jobs: int, every_ms: int,
         seconds: float) -> Report:
    peer = store in peers.PEERS
    database, drop = _database("postgres" if peer else store)
    prefix = f"lb{uuid.uuid4().hex[:6]}"
    try:
        if peer:
            peers.prepare(store, database)
        elif store != "redis":
            _migrate(store, database)
        # Every worker gets time to import Django and start before the measured window.
        until = int(time.time() * 1000) + 5_000 + int(seconds * 1000)
        out_dir = Path(tempfile.mkdtemp(prefix="anarchon-bench-"))
        procs = []
        for i in range(args.workers):
            cmd = [sys.executable, __file__, "--worker", "--store", store, "--database", database,
                   "--prefix", prefix, "--instance", f"w{i}", "--jobs", str(jobs),
                   "--every-ms", str(every_ms), "--until", str(until),
                   "--out", str(out_dir / f"{i}.json"), "--handler", args.handler]
            if args.trace and not peer:
                cmd.append("--trace")
            if args.no_settle:
                cmd.append("--no-settle")
            if args.profile and not peer:
                Path(args.profile).mkdir(parents=True, exist_ok=True)
                cmd += ["--profile", str(Path(args.profile) / f"{store}-{workload}-{i}.prof")]
            procs.append(subprocess.Popen(cmd, cwd=ROOT))
        for proc in procs:
            if proc.wait(timeout=seconds + 120) != 0:
                raise SystemExit(f"a {store} worker failed with exit code {proc.returncode}")
        results = [json.loads((out_dir / f"{i}.json").read_text()) for i in range(args.workers)]
    finally:
        drop()
        if store == "redis":
            _delete_prefix(prefix)
    report = _report(store, workload, results, [f"{prefix}-{i:05d}" for i in range(jobs)],
                     every_ms, until)
    if peer:
        report.note = peers.note(store, results)
    return report


def _delete_prefix(prefix: str) -> None:
    import redis

    client = redis.Redis.from_url("redis://127.0.0.1:6379/0")
    keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


def _report(store: str, workload: str, results: list[dict[str, Any]], names: list[str],
            every_ms: int, until: int) -> Report:
    ready = max(r["ready"] for r in results)
    seen: dict[tuple[str, int], int] = {}
    duplicates = 0
    per_worker: list[Counter[int]] = []
    for r in results:
        per_worker.append(Counter(slot for _, slot, _ in r["starts"]))
        for job, slot, start in r["starts"]:
            if (job, slot) in seen:
                duplicates += 1
            seen[(job, slot)] = start
    # Slots due while every worker was up, leaving the last 2 s for the stop.
    first_slot = (ready // every_ms + 1) * every_ms
    due = range(first_slot, until - 2_000, every_ms)
    missed = [(job, slot) for job in names for slot in due if (job, slot) not in seen]
    said = {(job, slot) for r in results for name, job, slot, _, _ in r.get("events", ())
            if name == "skip"}
    skips = sum(1 for key in missed if key in said)
    misses = len(missed) - skips
    if missed:  # say which slots, and what the workers saw of them
        by_slot: dict[int, int] = {}
        for _, slot in missed:
            by_slot[slot] = by_slot.get(slot, 0) + 1
        lost = set(missed)
        seen_events: dict[str, int] = {}
        for r in results:
            for name, job, slot, reason, _ in r.get("events", ()):
                if (job, slot) in lost:
                    key = f"{r['instance']} {name} {reason}"
                    seen_events[key] = seen_events.get(key, 0) + 1
        print(f"{store} {workload}: missed per slot (relative to until={until}): "
              f"{ {slot - until: n for slot, n in sorted(by_slot.items())} }; "
              f"events of missed slots: {seen_events}; worker ready at "
              f"{[r['ready'] - until for r in results]}", file=sys.stderr)
    measured = [(slot, start - slot) for (_, slot), start in seen.items() if slot in due]
    steady_from = first_slot + WARM_UP_MS
    lateness = sorted(late for slot, late in measured if slot >= steady_from or workload == "burst")
    first = max((late for slot, late in measured if slot == first_slot), default=None)
    bursts, claimed, shares = [], [], []
    if workload == "burst":
        answers = [(slot, at - slot) for r in results for slot, at in r.get("claims", ())]
        for slot in due:
            lates = [late for s, late in measured if s == slot]
            if lates:
                bursts.append(max(lates))
                shares.append(sorted((ran[slot] for ran in per_worker), reverse=True))
            won = [late for s, late in answers if s == slot]
            if won:
                claimed.append(max(won))
    return Report(store, workload, len(seen), duplicates, misses, skips, lateness, first, bursts,
                  claimed, shares, cpu_s=sum(r.get("cpu_s", 0.0) for r in results),
                  gc_ms=sum(r.get("gc_ms", 0.0) for r in results),
                  gc_max_ms=max(r.get("gc_max_ms", 0.0) for r in results))


def _pct(values: list[int], q: float) -> str:
    if not values:
        return "-"
    return f"{values[min(len(values) - 1, int(len(values) * q))]} ms"


def _print(reports: list[Report], args: argparse.Namespace, skipped: list[str]) -> None:
    from importlib.metadata import version

    import django

    measured = [r.store for r in reports if r.store in peers.PEERS]
    others = peers.versions(measured)
    print(f"{args.workers} worker processes per store, {args.handler} handlers; "
          f"Python {sys.version.split()[0]}, Django {django.get_version()}, "
          f"django-anarchon {version('django-anarchon')}{', ' + others if others else ''}, "
          f"{os.cpu_count()} cores, load average {args.load:.1f} at the start and "
          f"{os.getloadavg()[0]:.1f} at the end\n")
    for line in skipped:
        print(f"{line}\n")
    print("| store | workload | runs | duplicates | skips | misses | p50 | p99 | max | first slot "
          "| last handler of each burst |" + (" last winning claim answered |" if args.trace else ""))
    print("|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if args.trace else ""))
    for r in reports:
        median = f"{statistics.median(r.lateness):.0f} ms" if r.lateness else "-"
        first = "-" if r.first is None else f"{r.first} ms"
        bursts = ", ".join(f"{b} ms" for b in r.bursts) or "-"
        claimed = ", ".join(f"{c} ms" for c in r.claimed) or "-"
        traced = f" {claimed} |" if args.trace else ""
        print(f"| {r.store} | {r.workload} | {r.runs:,} | {r.duplicates} | {r.skips} | {r.misses} "
              f"| {median} "
              f"| {_pct(r.lateness, 0.99)} | {_pct(r.lateness, 1.0)} | {first} | {bursts} |"
              f"{traced}")
    print("\nWhat the workers spent while measured (all workers together): CPU, and the "
          "garbage collector's pauses (their sum, and the longest).\n")
    print("| store | workload | CPU | GC pauses | longest GC pause |\n|---|---|---:|---:|---:|")
    for r in reports:
        if r.store not in peers.PEERS:
            print(f"| {r.store} | {r.workload} | {r.cpu_s:.1f} s | {r.gc_ms:,.0f} ms "
                  f"| {r.gc_max_ms:.0f} ms |")
    split = [r for r in reports if r.shares]
    if split:
        print("\nEach burst's runs per worker, the busiest first (the last handler is usually "
              "the busiest worker's).\n")
        for r in split:
            print(f"- {r.store}: " + "; ".join("/".join(map(str, s)) for s in r.shares))
    notes = [r.note for r in reports if r.note]
    if notes:
        print("\n" + "\n".join(f"- {n}" for n in notes))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    for name in ("--store", "--database", "--prefix", "--instance", "--out"):
        parser.add_argument(name, help=argparse.SUPPRESS)
    for name in ("--jobs", "--every-ms", "--until"):
        parser.add_argument(name, type=int, help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--stores",
                        default="postgres,redis,mysql,sqlite,procrastinate,apscheduler")
    parser.add_argument("--steady", type=float, default=20.0, help="seconds of the 10-job run")
    parser.add_argument("--burst", type=float, default=35.0, help="seconds of the burst run")
    parser.add_argument("--burst-jobs", type=int, default=1000)
    parser.add_argument("--handler", choices=("sync", "sync-db", "async"), default="sync",
                        help="sync-db: a sync handler that then runs one query on its database")
    parser.add_argument("--profile", help="directory for one cProfile file per worker")
    parser.add_argument("--no-settle", action="store_true",
                        help="workers leave their heap to the garbage collector (no settle, "
                        "no quiet collections)")
    parser.add_argument("--trace", action="store_true",
                        help="report when each burst's last winning claim was answered")
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    args.load = os.getloadavg()[0]  # the machine may be shared: say how busy it was
    reports, skipped = [], []
    for store in args.stores.split(","):
        reason = peers.skipped(store) if store in peers.PEERS else None
        if reason:
            skipped.append(reason)
            continue
        reports.append(_run(args, store, "steady", 10, 1_000, args.steady))
        if store in ("postgres", "redis") and args.burst > 0:
            reports.append(_run(args, store, "burst", args.burst_jobs, BURST_EVERY_MS, args.burst))
    _print(reports, args, skipped)


if __name__ == "__main__":
    main()
