"""Claims per second and latency of DatabaseBackend on PostgreSQL, beside a bare INSERT.

    python benchmarks/bench_database.py [--host 127.0.0.1] [--port 5432] [--user postgres]
                                        [--claims 1000]

Creates a database of its own, migrates it, and drops it at the end. For 1 and 8
concurrent claimers, each with its own backend (its own connection thread and
connection), every claimer claims the same sequence of slots of one job as fast as it
can, so with 8 each slot is contested by 8 and won by one. The bare operation, measured
the same way in the same run: ``INSERT ... ON CONFLICT DO NOTHING`` on a table with a
primary key (job, slot), through psycopg's async connection, one per claimer.
``runs.claim()`` uses ``overlap="allow"`` (the runs are never finished here, so "skip"
would answer ``overlap`` to every later slot). Each case runs ``--repeat`` times and the
best run counts, since the test machine is shared. ``--also mariadb,sqlite`` adds the
general path on those servers (8 claimers). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from measure import Close, Maker, Op, measure


def bare(conninfo: dict[str, Any]) -> Maker:
    import psycopg

    job = f"bench-bare-{uuid.uuid4().hex[:8]}"
    base = time.time_ns() // 1_000_000

    async def make(index: int) -> tuple[Op, Close]:
        conn = await psycopg.AsyncConnection.connect(autocommit=True, **conninfo)

        async def op(slot: int) -> object:
            cursor = await conn.execute(
                "INSERT INTO bench_bare (job, slot, token) VALUES (%s, %s, %s) "
                "ON CONFLICT DO NOTHING",
                (job, base + slot, f"t{index}-{slot}"),
            )
            return cursor.rowcount

        return op, conn.close

    return make


def bare_in_threads(conninfo: dict[str, Any]) -> Maker:
    """The bare statement the way the backend calls the database: a blocking connection in
    a thread of its own per claimer, awaited from the event loop."""
    import psycopg

    job = f"bench-bare-{uuid.uuid4().hex[:8]}"
    base = time.time_ns() // 1_000_000

    async def make(index: int) -> tuple[Op, Close]:
        pool = ThreadPoolExecutor(1)
        loop = asyncio.get_running_loop()
        conn = await loop.run_in_executor(
            pool, lambda: psycopg.connect(autocommit=True, **conninfo)
        )

        def insert(slot: int) -> int:
            cursor = conn.execute(
                "INSERT INTO bench_bare (job, slot, token) VALUES (%s, %s, %s) "
                "ON CONFLICT DO NOTHING",
                (job, base + slot, f"t{index}-{slot}"),
            )
            return cursor.rowcount

        async def op(slot: int) -> object:
            return await loop.run_in_executor(pool, insert, slot)

        async def close() -> None:
            await loop.run_in_executor(pool, conn.close)
            pool.shutdown()

        return op, close

    return make


def backend_claims(use_runs: bool, fast_path: bool = True, using: str = "default") -> Maker:
    from django_anarchon.backends.base import ClaimInput, RunClaim
    from django_anarchon.backends.database import DatabaseBackend

    job = f"bench-{uuid.uuid4().hex[:8]}"
    base = time.time_ns() // 1_000_000

    async def make(index: int) -> tuple[Op, Close]:
        backend = DatabaseBackend(using=using, max_connections=1, fast_path=fast_path)
        await backend.init()
        await backend.prepare_job(job, 100)

        async def op(slot: int) -> object:
            token, instance = f"t{index}-{slot}", f"I{index}"
            if use_runs:
                claim = RunClaim(job=job, slot=base + slot, token=token, instance_id=instance,
                                 overlap="allow", keep_ms=600_000)
                return await backend.runs.claim(claim)
            return await backend.claim(
                ClaimInput(job=job, slot=base + slot, token=token, instance_id=instance)
            )

        return op, backend.close

    return make


async def batch_vs_single(jobs: int) -> list[str]:
    """``runs.claim_many()`` of ``jobs`` new runs (one per job) against one claim at a time."""
    from django_anarchon.backends.base import RunClaim
    from django_anarchon.backends.database import DatabaseBackend

    backend = DatabaseBackend(using="default", max_connections=1)
    await backend.init()
    lines = []
    try:
        for label in ("`runs.claim_many()`", "`runs.claim()` one at a time"):
            names = [f"bench-batch-{uuid.uuid4().hex[:8]}-{i}" for i in range(jobs)]
            for name in names:  # as the engine does at start
                await backend.prepare_job(name, 100)
            slot = time.time_ns() // 1_000_000
            claims = [RunClaim(job=name, slot=slot, token=f"t{i}", instance_id="A",
                               keep_ms=600_000) for i, name in enumerate(names)]
            began = time.perf_counter()
            if label.startswith("`runs.claim_many"):
                outcomes = await backend.runs.claim_many(claims)
            else:
                outcomes = [await backend.runs.claim(c) for c in claims]
            elapsed = (time.perf_counter() - began) * 1000
            assert all(o.kind == "won" for o in outcomes), outcomes[:3]
            lines.append(f"| {label}, {jobs:,} jobs due at once | {elapsed:.0f} ms |")
    finally:
        await backend.close()
    return lines


def setup_django(conninfo: dict[str, Any], name: str, also: dict[str, Any]) -> None:
    import django
    from django.conf import settings

    settings.configure(
        INSTALLED_APPS=["django.contrib.contenttypes", "django_anarchon"],
        DATABASES={"default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": name,
            "HOST": conninfo["host"],
            "PORT": conninfo["port"],
            "USER": conninfo["user"],
            "CONN_MAX_AGE": None,
        }, **also},
        USE_TZ=True,
    )
    django.setup()
    from django.core.management import call_command

    for alias in ("default", *also):
        call_command("migrate", "django_anarchon", database=alias, verbosity=0)


def other_databases(names: list[str], name: str, folder: str) -> dict[str, Any]:
    """Django settings of the other servers ``--also`` names, each in a new database."""
    databases: dict[str, Any] = {}
    if "mariadb" in names:
        import MySQLdb

        with contextlib.closing(MySQLdb.connect(host="127.0.0.1", user="root")) as conn:
            conn.cursor().execute(f"CREATE DATABASE {name}")
        databases["mariadb"] = {"ENGINE": "django.db.backends.mysql", "NAME": name,
                                "HOST": "127.0.0.1", "USER": "root", "CONN_MAX_AGE": None}
    if "sqlite" in names:
        databases["sqlite"] = {
            "ENGINE": "django.db.backends.sqlite3", "NAME": str(Path(folder) / "bench.sqlite3"),
            "OPTIONS": {"init_command": "PRAGMA journal_mode=WAL;", "timeout": 20},
        }
    return databases


def drop_other_databases(databases: dict[str, Any]) -> None:
    if "mariadb" in databases:
        import MySQLdb

        with contextlib.closing(MySQLdb.connect(host="127.0.0.1", user="root")) as conn:
            conn.cursor().execute(f"DROP DATABASE IF EXISTS {databases['mariadb']['NAME']}")


async def general_elsewhere(aliases: list[str], claims: int, repeat: int) -> list[str]:
    """The general path on the other servers, 8 claimers as above."""
    rows = []
    for alias in aliases:
        runs = [await measure(backend_claims(True, False, alias), 8, claims) for _ in range(repeat)]
        per_s, p50, p99 = max(runs)
        rows.append(f"| `runs.claim()`, general path, {alias} | 8 | {per_s:,.0f} | "
                    f"{p50:.2f} ms | {p99:.2f} ms |")
    return rows


async def run_cases(
    conninfo: dict[str, Any], claims: int, repeat: int, only: str = ""
) -> tuple[list[str], list[str]]:
    """The table's rows, and what each backend row is worth against the bare statement."""
    cases: list[tuple[str, Callable[[], Maker]]] = [
        ("`INSERT ... ON CONFLICT DO NOTHING` (bare psycopg, async)", lambda: bare(conninfo)),
        ("`INSERT ... ON CONFLICT DO NOTHING` (bare psycopg, a thread per claimer)",
         lambda: bare_in_threads(conninfo)),
        ("`runs.claim()`, fast path", lambda: backend_claims(True)),
        ("`claim()`, fast path", lambda: backend_claims(False)),
        ("`runs.claim()`, general path (as on MariaDB and SQLite)", lambda: backend_claims(True, False)),
    ]
    rows: list[str] = []
    results: dict[tuple[str, int], float] = {}
    if only:  # the bare statements stay: every ratio is against them
        cases = cases[:2] + [case for case in cases[2:] if only in case[0]]
    for label, maker in cases:
        for claimers in (1, 8):
            runs = [await measure(maker(), claimers, claims) for _ in range(repeat)]
            per_s, p50, p99 = max(runs)  # the best run: the machine is shared
            results[(label, claimers)] = per_s
            rows.append(f"| {label} | {claimers} | {per_s:,.0f} | {p50:.2f} ms | {p99:.2f} ms |")
    ratios = [
        f"{label} at 8 claimers: {results[(label, 8)] / results[(bare, 8)]:.2f} of {bare}"
        for label, _ in cases[2:]
        for bare in (cases[0][0], cases[1][0])
    ]
    fast, general = cases[2][0], cases[-1][0]  # issue 10: general at least 0.5 of fast
    if (fast, 8) in results and (general, 8) in results and fast != general:
        ratios.append(f"{general} at 8 claimers: "
                      f"{results[(general, 8)] / results[(fast, 8)]:.2f} of {fast}")
    return rows, ratios


def main(args: argparse.Namespace) -> None:
    import psycopg

    server = {"host": args.host, "port": args.port, "user": args.user}
    name = f"anarchon_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dbname="postgres", autocommit=True, **server) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
        version = conn.execute("SHOW server_version").fetchone()
    conninfo = {**server, "dbname": name}
    also: dict[str, Any] = {}
    folder = tempfile.TemporaryDirectory()
    try:
        with psycopg.connect(autocommit=True, **conninfo) as conn:
            conn.execute("CREATE TABLE bench_bare (job text, slot bigint, token text, "
                         "PRIMARY KEY (job, slot))")
        also = other_databases([n for n in args.also.split(",") if n], name, folder.name)
        setup_django(server, name, also)
        rows, ratios = asyncio.run(run_cases(conninfo, args.claims, args.repeat, args.only))
        rows += asyncio.run(general_elsewhere(list(also), args.claims, args.repeat))
        batch = asyncio.run(batch_vs_single(args.batch))
        print(f"PostgreSQL {version[0] if version else '?'}, {args.claims} claims per claimer, "
              f"best of {args.repeat}\n")
        print("| operation | concurrent | per second | p50 | p99 |")
        print("|---|---|---|---|---|")
        print("\n".join(rows))
        print()
        print("\n".join(ratios))
        print("\n| batch | time |\n|---|---|")
        print("\n".join(batch))
    finally:
        from django.db import connections

        connections.close_all()
        with psycopg.connect(dbname="postgres", autocommit=True, **server) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        drop_other_databases(also)
        folder.cleanup()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5432)
    parser.add_argument("--user", default="postgres")
    parser.add_argument("--claims", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=1000, help="jobs in the claim_many case")
    parser.add_argument("--repeat", type=int, default=3, help="runs per case; the best counts")
    parser.add_argument("--only", default="", help="only the backend cases whose label has this")
    parser.add_argument("--also", default="", help="the general path on these servers too, "
                        "8 claimers: mariadb (root@127.0.0.1:3306), sqlite (a file)")
    main(parser.parse_args())
