"""Latency of a hand-over and of "Run now", woken by the store's push channel.

    python benchmarks/bench_handover.py [--host 127.0.0.1] [--port 5432] [--user postgres]
                                        [--redis redis://127.0.0.1:6379/0] [--samples 20]

Creates a PostgreSQL database of its own (the database backend's tables and the run
requests), migrates it, and drops it at the end. For each store (the database backend
on PostgreSQL: LISTEN/NOTIFY; Redis: pub/sub), two schedulers in this process, each on
its own backend object, with a heartbeat of 10 s and a lease of 60 s:

* hand-over: one runs a long job (``max_attempts=2``), the other watches it; the runner
  is stopped gracefully, and the time from ``stop()`` to the backup's start is measured;
* run now: each runs the run-request pickup with a 10 s poll; a request is filed as the
  admin files it (``file_request`` from another thread), and the time to the handler's
  start is measured.

Without the wake-ups both would take up to the 10 s interval. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SLOW = {"lease": "60s", "heartbeat": "10s"}


def setup_django(server: dict[str, Any], name: str, redis_url: str, prefix: str) -> None:
    import django
    from django.conf import settings

    settings.configure(
        INSTALLED_APPS=["django.contrib.contenttypes", "django_anarchon"],
        DATABASES={"default": {
            "ENGINE": "django.db.backends.postgresql", "NAME": name, "HOST": server["host"],
            "PORT": server["port"], "USER": server["user"], "CONN_MAX_AGE": None,
        }},
        ANARCHON={
            "postgres": {"BACKEND": "django_anarchon.backends.database.DatabaseBackend"},
            "redis": {"BACKEND": "django_anarchon.backends.redis.RedisBackend",
                      "OPTIONS": {"url": redis_url, "key_prefix": prefix}},
        },
        USE_TZ=True,
    )
    django.setup()
    from django.core.management import call_command

    call_command("migrate", "django_anarchon", verbosity=0)


async def until(condition: Callable[[], bool], within_s: float, what: str) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        await asyncio.sleep(0.002)


async def handover(make: Callable[[], Any], n: int) -> float:
    """Seconds from the runner's ``stop()`` to the backup's start of the takeover."""
    from django_anarchon.engine import JobContext, Scheduler

    async def long(ctx: JobContext) -> None:
        await ctx.signal.sleep(120)

    job, when = f"bench.handover.{uuid.uuid4().hex[:8]}", datetime.now(UTC) + timedelta(seconds=0.3)
    starts: list[tuple[str, str, float]] = []
    pair = [Scheduler(make(), name="bench", instance_id=i, **SLOW) for i in ("A", "B")]  # type: ignore[arg-type]
    for s in pair:
        s.at(job, when, long, max_attempts=2)
        s.on("start", lambda e: starts.append((e.record.instance_id, e.record.reason,
                                               time.monotonic())))
        await s.start()
    try:
        await until(lambda: all(s.wakes.count for s in pair), 10, "the listeners")
        await until(lambda: len(starts) == 1, 10, "the first run")
        runner, backup = pair if starts[0][0] == "A" else pair[::-1]
        await until(lambda: bool(backup._claims.watching), 10, "the watch")
        began = time.monotonic()
        await runner.stop("5s")
        await until(lambda: len(starts) == 2, 15, "the takeover")
        assert starts[1][:2] == (backup.instance_id, "takeover"), starts
        return starts[1][2] - began
    finally:
        for s in pair:
            await s.stop("5s")
            await s.backend.close()


async def run_now(alias: str, make: Callable[[], Any], samples: int) -> list[float]:
    """Seconds from filing a request (in another thread) to its handler's start."""
    from django_anarchon.engine import JobContext, Scheduler
    from django_anarchon.run_requests import file_request, pickup_loop

    started: list[float] = []

    def handler(ctx: JobContext) -> None:
        started.append(time.monotonic())

    job = f"bench.request.{uuid.uuid4().hex[:8]}"
    workers = [Scheduler(make(), name=alias, instance_id=i, **SLOW) for i in ("A", "B")]  # type: ignore[arg-type]
    for w in workers:
        w.every(job, "1d", handler)
        await w.start()
    await until(lambda: all(w.wakes.count for w in workers), 10, "the listeners")
    pickers = [asyncio.create_task(pickup_loop([w], poll_s=10)) for w in workers]
    latencies = []
    try:
        await asyncio.to_thread(file_request, alias, job)  # the first may meet a first poll
        await until(lambda: len(started) == 1, 15, "the first request")
        await asyncio.sleep(0.2)  # both pickups back in their 10 s wait
        for n in range(2, samples + 2):
            began = time.monotonic()
            await asyncio.to_thread(file_request, alias, job)
            await until(lambda n=n: len(started) == n, 15, f"request {n}")  # type: ignore[misc]
            latencies.append(started[-1] - began)
            await asyncio.sleep(0.05)
    finally:
        for t in pickers:
            t.cancel()
        await asyncio.gather(*pickers, return_exceptions=True)
        for w in workers:
            await w.stop("5s")
            await w.backend.close()
    return latencies


def row(store: str, what: str, latencies: list[float]) -> str:
    ms = sorted(x * 1000 for x in latencies)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    return (f"| {store} | {what} | {len(ms)} | {statistics.median(ms):.1f} ms | {p99:.1f} ms "
            f"| {ms[-1]:.1f} ms |")


async def run_all(redis_url: str, prefix: str, samples: int) -> list[str]:
    from django_anarchon.backends.database import DatabaseBackend
    from django_anarchon.backends.redis import RedisBackend

    stores: list[tuple[str, str, Callable[[], Any]]] = [
        ("PostgreSQL (database backend)", "postgres", lambda: DatabaseBackend()),
        ("Redis", "redis", lambda: RedisBackend(url=redis_url, key_prefix=prefix)),
    ]
    rows = []
    for label, alias, make in stores:
        rows.append(row(label, "hand-over", [await handover(make, n) for n in range(samples)]))
        rows.append(row(label, "run now", await run_now(alias, make, samples)))
        print(rows[-2], rows[-1], sep="\n", file=sys.stderr, flush=True)
    return rows


def main(args: argparse.Namespace) -> None:
    import psycopg
    import redis

    server = {"host": args.host, "port": args.port, "user": args.user}
    name, prefix = f"anarchon_bench_{uuid.uuid4().hex[:8]}", f"anarchon-bench-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dbname="postgres", autocommit=True, **server) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
        version = conn.execute("SHOW server_version").fetchone()
    client = redis.Redis.from_url(args.redis)
    try:
        setup_django(server, name, args.redis, prefix)
        rows = asyncio.run(run_all(args.redis, prefix, args.samples))
        print(f"PostgreSQL {version[0] if version else '?'}, Redis "
              f"{client.info('server')['redis_version']}, psycopg {psycopg.__version__}, "
              f"redis-py {redis.__version__}, Python {sys.version.split()[0]}; heartbeat and "
              f"poll 10 s\n")
        print("| store | what | samples | p50 | p99 | max |")
        print("|---|---|---:|---:|---:|---:|")
        print("\n".join(rows))
    finally:
        from django.db import connections

        connections.close_all()
        with psycopg.connect(dbname="postgres", autocommit=True, **server) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        for i in range(0, len(keys), 500):
            client.delete(*keys[i : i + 500])
        client.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5432)
    parser.add_argument("--user", default="postgres")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--samples", type=int, default=20)
    main(parser.parse_args())
