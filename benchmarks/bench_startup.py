"""Start-up with many jobs: ``start()`` until every job is armed, then the idle cost.

    python benchmarks/bench_startup.py [--jobs 10000] [--idle 20] [--host 127.0.0.1]
                                       [--port 5432] [--user postgres] [--redis URL]

For the database backend (on a PostgreSQL database of its own, migrated, dropped at the
end) and the Redis backend (under a key prefix of its own, deleted at the end): registers
``--jobs`` jobs every hour (none due), times ``start()`` (connect, prepare every job,
arm every timer), then measures the process's CPU time and resident memory over
``--idle`` seconds with nothing due. The database backend runs twice in the same run:
with jobs prepared in batches (``prepare_jobs``, 500 per call) and one by one
(``prepare_job``, as before batching), so the two figures are side by side; each
measurement's jobs are new to the store (their lock rows are created). Then both again
with every job already known to the store (a restart). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _measure(backend: Any, jobs: int, idle_s: float, run: str | None = None
                   ) -> tuple[float, float, float]:
    """(seconds to start, share of a core while idle, RSS MB after the idle time).

    ``run`` names the jobs; by default new ones.
    """
    from django_anarchon.engine import Scheduler

    scheduler = Scheduler(backend, instance_id="bench", spool=None)
    run = run or uuid.uuid4().hex[:6]
    for i in range(jobs):
        scheduler.every(f"bench-{run}-{i:05d}", "1h", lambda ctx: None)
    began = time.perf_counter()
    await scheduler.start()
    took = time.perf_counter() - began
    assert all(info.next_run_at is not None for info in scheduler.jobs())
    cpu, wall = _cpu_s(), time.perf_counter()
    await asyncio.sleep(idle_s)
    share = (_cpu_s() - cpu) / (time.perf_counter() - wall)
    rss = _rss_mb()
    await scheduler.stop(grace="1s")
    await backend.close()
    return took, share, rss


def _configure_django(args: argparse.Namespace, database: str) -> None:
    import django
    from django.conf import settings

    settings.configure(
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_anarchon"],
        DATABASES={"default": {
            "ENGINE": "django.db.backends.postgresql", "NAME": database, "HOST": args.host,
            "PORT": args.port, "USER": args.user, "PASSWORD": "", "CONN_MAX_AGE": None,
        }},
        USE_TZ=True,
        ANARCHON={"default": {"SPOOL": False}},
    )
    django.setup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--idle", type=float, default=20.0, help="seconds of idle time to measure")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5432)
    parser.add_argument("--user", default="postgres")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args()

    import psycopg

    admin = dict(host=args.host, port=args.port, user=args.user, dbname="postgres",
                 autocommit=True)
    database = f"anarchon_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(**admin) as conn:
        conn.execute(f'CREATE DATABASE "{database}"')
    rows: list[tuple[str, float, float, float]] = []
    try:
        _configure_django(args, database)
        from django.core.management import call_command

        from django_anarchon.backends.base import BaseBackend
        from django_anarchon.backends.database import DatabaseBackend
        from django_anarchon.backends.redis import RedisBackend

        call_command("migrate", verbosity=0)

        class OneByOne(DatabaseBackend):
            """The database backend as it prepared jobs before batching."""

            prepare_jobs = BaseBackend.prepare_jobs

        known = uuid.uuid4().hex[:6]
        asyncio.run(_measure(DatabaseBackend(), args.jobs, 0, known))  # the store knows them
        for label, backend, run in (
            ("database (PostgreSQL), one by one, new jobs", OneByOne(), None),
            ("database (PostgreSQL), batched, new jobs", DatabaseBackend(), None),
            ("database (PostgreSQL), one by one, known jobs", OneByOne(), known),
            ("database (PostgreSQL), batched, known jobs", DatabaseBackend(), known),
        ):
            rows.append((label, *asyncio.run(_measure(backend, args.jobs, args.idle, run))))
        prefix = f"bench-{uuid.uuid4().hex[:8]}"
        redis_backend = RedisBackend(url=args.redis, strategy="lease", key_prefix=prefix)
        try:
            rows.append(("Redis `lease`", *asyncio.run(_measure(redis_backend, args.jobs,
                                                                args.idle))))
        finally:
            import redis

            client = redis.Redis.from_url(args.redis)
            keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
            if keys:
                client.delete(*keys)
            client.close()
    finally:
        from django.db import connections

        connections.close_all()
        with psycopg.connect(**admin) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    print(f"{args.jobs:,} jobs every hour, none due; idle measured over {args.idle:g} s\n")
    print("| backend | `start()` until every job is armed | idle CPU (share of a core) | RSS |")
    print("|---|---|---|---|")
    for label, took, share, rss in rows:
        print(f"| {label} | {took:.2f} s | {share * 100:.1f}% | {rss:.0f} MB |")


if __name__ == "__main__":
    main()
