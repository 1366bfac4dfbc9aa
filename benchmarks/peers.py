"""The steady workload of bench_lateness.py on two peers: procrastinate and APScheduler 3.

Both run as users set them up to share one PostgreSQL database between processes, and
their handlers time themselves the same way as the project's (start minus slot, on the
machine's clock, kept in memory until the worker stops):

- ``procrastinate``: one periodic task per job (``@app.periodic(cron="* * * * * *")``,
  the sixth field is seconds), every worker process running its own periodic deferrer,
  which PostgreSQL deduplicates (one job per task, ``periodic_id`` and timestamp). The
  slot is the ``timestamp`` argument the deferrer passes.
- ``apscheduler``: a ``BackgroundScheduler`` per process, all on one ``SQLAlchemyJobStore``
  table, each job an interval trigger anchored on the epoch (so every process computes
  the same whole-second grid). The job store is storage, not a lock: this measures what
  the processes really do. The slot is the run time APScheduler hands its executor.

Not in the project's dependencies (benchmarks only): ``pip install procrastinate
"apscheduler>=3.10,<4" "sqlalchemy>=2"``; a peer that is not installed is skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from typing import Any

PEERS = {"procrastinate": ("procrastinate",), "apscheduler": ("apscheduler", "sqlalchemy")}

#: Small pools: 4 workers per peer on a PostgreSQL server shared by other sessions.
POOL_SIZE = 5


def skipped(store: str) -> str | None:
    """Why ``store`` cannot run here (a missing package), or None."""
    for package in PEERS[store]:
        try:
            found = version(package)
        except PackageNotFoundError:
            return f"{store}: skipped, {package} is not installed"
        if package == "apscheduler" and int(found.split(".")[0]) >= 4:
            return f"{store}: skipped, APScheduler {found} is installed, this measures 3.x"
    return None


def versions(stores: list[str]) -> str:
    names = {"procrastinate": "procrastinate", "apscheduler": "APScheduler",
             "sqlalchemy": "SQLAlchemy"}
    found = [f"{names[p]} {version(p)}" for s in stores for p in PEERS[s] if not skipped(s)]
    return ", ".join(found)


def note(store: str, results: list[dict[str, Any]]) -> str:
    """What the duplicates of ``store`` were, from the worker processes' records."""
    by_slot: dict[tuple[str, int], list[tuple[str, int]]] = {}
    for r in results:
        ids = r.get("job_ids") or [0] * len(r["starts"])
        for (job, slot, _), job_id in zip(r["starts"], ids, strict=True):
            by_slot.setdefault((job, slot), []).append((r["instance"], job_id))
    twice = [runs for runs in by_slot.values() if len(runs) > 1]
    if store == "procrastinate":
        if not twice:
            return f"{store}: no slot started more than once"
        deferred = sum(1 for runs in twice if len({i for _, i in runs}) == len(runs))
        return (f"{store}: {len(twice)} slots started more than once; {deferred} of them as "
                "distinct jobs (the slot deferred again), the rest one job run again")
    spread = {n: sum(1 for runs in by_slot.values() if len({w for w, _ in runs}) == n)
              for n in range(1, len(results) + 1)}
    counts = ", ".join(str(n) for n in sorted(spread))
    return (f"{store}: slots by how many processes started them ({counts}): "
            + ", ".join(str(spread[n]) for n in sorted(spread)))


def _conninfo(database: str) -> str:
    return f"host=127.0.0.1 port=5432 user=postgres dbname={database}"


def _url(database: str) -> str:
    return f"postgresql+psycopg://postgres@127.0.0.1:5432/{database}"


def prepare(store: str, database: str) -> None:
    """The peer's schema in ``database``, once, before its workers start."""
    if store == "procrastinate":
        import procrastinate

        app = procrastinate.App(connector=procrastinate.SyncPsycopgConnector(
            conninfo=_conninfo(database)))
        with app.open():
            app.schema_manager.apply_schema()
        return
    from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore

    # Four processes creating the table at once can collide in the catalogue.
    jobstore = SQLAlchemyJobStore(url=_url(database))
    jobstore.jobs_t.create(jobstore.engine, checkfirst=True)
    jobstore.engine.dispose()


def work(args: argparse.Namespace) -> dict[str, Any]:
    """Run one worker process of ``args.store`` until ``args.until``: what bench_lateness reads."""
    if args.every_ms != 1_000:
        raise SystemExit(f"{args.store}: only the steady workload (every 1 s) is measured")
    if args.store == "procrastinate":
        return asyncio.run(_procrastinate(args))
    return _apscheduler(args)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


# -- procrastinate --------------------------------------------------------------------


async def _procrastinate(args: argparse.Namespace) -> dict[str, Any]:
    import procrastinate
    from procrastinate.job_context import JobContext
    from procrastinate.worker import Worker

    starts: list[tuple[str, int, int]] = []
    job_ids: list[int] = []  # beside starts: tells a slot deferred twice from a job run twice
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(
        conninfo=_conninfo(args.database), min_size=1, max_size=POOL_SIZE))

    def register(name: str) -> None:
        def started(context: JobContext, timestamp: int) -> None:
            starts.append((name, timestamp * 1000, _now_ms()))
            job_ids.append(context.job.id or 0)

        if args.handler == "async":
            async def handler(context: JobContext, timestamp: int) -> None:
                started(context, timestamp)

            task: Any = app.task(name=name, pass_context=True)(handler)
        else:
            def sync_handler(context: JobContext, timestamp: int) -> None:
                started(context, timestamp)

            task = app.task(name=name, pass_context=True)(sync_handler)
        app.periodic(cron="* * * * * *", periodic_id="bench")(task)

    for i in range(args.jobs):
        register(f"{args.prefix}-{i:05d}")
    async with app.open_async():
        # Ten at once, as the 10 jobs fall due together (the default is one at a time).
        worker = Worker(app=app, concurrency=args.jobs, name=args.instance,
                        install_signal_handlers=False)
        running = asyncio.create_task(worker.run())
        deadline = time.monotonic() + 30
        while worker.worker_id is None:  # registered in the database: it fetches jobs
            if running.done() or time.monotonic() > deadline:
                running.result()
                raise SystemExit(f"procrastinate worker {args.instance} did not start")
            await asyncio.sleep(0.01)
        ready = _now_ms()
        await asyncio.sleep(max(0.0, (args.until - ready) / 1000))
        worker.stop()
        await asyncio.wait_for(running, timeout=10)
    return {"instance": args.instance, "ready": ready, "starts": starts, "job_ids": job_ids}


# -- APScheduler 3 --------------------------------------------------------------------

_STARTS: list[tuple[str, int, int]] = []
_RUN = threading.local()


def record(name: str) -> None:
    """The APScheduler job (referenced by name in the store): its start against its slot."""
    _STARTS.append((name, round(_RUN.time.timestamp() * 1000), _now_ms()))


def _apscheduler(args: argparse.Namespace) -> dict[str, Any]:
    from apscheduler.executors.base import run_job
    from apscheduler.executors.pool import ThreadPoolExecutor
    from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
    from apscheduler.schedulers.background import BackgroundScheduler
    from apscheduler.triggers.interval import IntervalTrigger

    class TimedExecutor(ThreadPoolExecutor):  # type: ignore[misc]
        """APScheduler's thread pool, telling the job which run time it runs.

        ``run_job`` runs each due run time in turn; called once per run time here, so the
        job can read its own from a thread-local. Nothing else changes.
        """

        def _do_submit_job(self, job: Any, run_times: list[datetime]) -> None:
            def run_each() -> list[Any]:
                events: list[Any] = []
                for run_time in run_times:
                    _RUN.time = run_time
                    events += run_job(job, job._jobstore_alias, [run_time], self._logger.name)
                return events

            def done(future: Any) -> None:
                if future.exception():
                    self._run_job_error(job.id, future.exception(), None)
                else:
                    self._run_job_success(job.id, future.result())

            self._pool.submit(run_each).add_done_callback(done)

    scheduler = BackgroundScheduler(
        jobstores={"default": SQLAlchemyJobStore(
            url=_url(args.database), engine_options={"pool_size": POOL_SIZE})},
        executors={"default": TimedExecutor(max_workers=args.jobs)},
        # misfire_grace_time is max_late="60s" of the project's jobs; coalesce and
        # max_instances=1 stay APScheduler's defaults.
        job_defaults={"misfire_grace_time": 60},
        timezone=UTC,
    )
    # Every process adds every job, as each instance of a project would at start.
    anchor = datetime(1970, 1, 1, tzinfo=UTC)
    for i in range(args.jobs):
        name = f"{args.prefix}-{i:05d}"
        scheduler.add_job("benchmarks.peers:record", IntervalTrigger(
            seconds=args.every_ms / 1000, start_date=anchor, timezone=UTC),
            args=[name], id=name, replace_existing=True)
    scheduler.start()
    ready = _now_ms()
    time.sleep(max(0.0, (args.until - ready) / 1000))
    scheduler.shutdown(wait=True)
    return {"instance": args.instance, "ready": ready, "starts": list(_STARTS)}
