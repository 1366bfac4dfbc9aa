"""Distinct job names stay distinct on every backend, against the real servers.

Names that differ only by case, accent (and NFC / NFD form), a trailing space, braces
(and the Redis tag the brace names used to get), dots, wildcards, slashes, emoji or the
last of 200 characters: each is registered as a one-off job of its own at one shared
instant on a real scheduler, must run once, on its own, and its history must hold its
own runs only (the scheduled one, then a ``run_now``). A store that folded two names
together (MariaDB's default collation, the old Redis tag) made one of each pair never
run and show the other's runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from django_anarchon.backends.base import BaseBackend
from django_anarchon.backends.memory import MemoryBackend
from django_anarchon.engine import JobContext, Scheduler

#: The tag ``{x}`` got before keys were one-to-one: a legal plain name, so it shared keys.
OLD_REDIS_TAG = "h" + hashlib.sha1(b"{x}").hexdigest()[:20]

NAMES = [
    "Report", "report", "REPORT",
    "a", "a ", "a  ", " a",
    "e", "\u00e9", "e\u0301", "\u00c9",  # e, é (NFC), é (NFD: e + combining acute), É
    "{x}", OLD_REDIS_TAG, "%7Bx%7D", "{x", "x}", "{}", "%",
    "a.b", "a b", "a_b", "a-b", "a..b",
    "*", "a*", "a.*", ">", "a>", "a.>", "#",
    "a/b", "a\\b", "a/../b", "/",
    "\U0001f389", "\U0001f44d", "\U0001f44d\U0001f3fd",  # party popper, thumbs up, + skin tone
    "x" * 200, "x" * 199 + "y",
]


def test_the_names_differ_and_are_valid() -> None:
    from django_anarchon.backends.naming import job_key
    from django_anarchon.jobs import check_name

    assert len(set(NAMES)) == len(NAMES)
    assert len({job_key(name) for name in NAMES}) == len(NAMES)  # NATS and RabbitMQ names
    assert OLD_REDIS_TAG == "h5d653e7f1d8dcf791782"
    for name in NAMES:
        check_name(name)


def _redis(kind: str) -> Iterator[BaseBackend]:
    from django_anarchon.backends.redis import RedisBackend

    from .redis_support import delete_prefix, redis_url

    url, prefix = redis_url(), f"anarchon-names-{uuid.uuid4().hex[:12]}"
    strategy: Any = {"redis-lease": "lease", "redis-script": {"name": "script", "window": "10m"},
                     "redis-stream-id": "stream-id"}[kind]
    try:
        yield RedisBackend(url=url, strategy=strategy, key_prefix=prefix)
    finally:
        delete_prefix(url, prefix)


def _redis_cluster() -> Iterator[BaseBackend]:
    """A three-node cluster: a key outside its job's slot fails the script (CROSSSLOT)."""
    from django_anarchon.backends.redis import RedisBackend

    from .redis_support import RedisClusterNodes

    nodes = RedisClusterNodes()
    try:
        yield RedisBackend(host="127.0.0.1", port=nodes.ports[0], cluster=True)
    finally:
        nodes.stop()


def _valkey() -> Iterator[BaseBackend]:
    from django_anarchon.backends.valkey import ValkeyBackend

    from .redis_support import ValkeyServer

    server = ValkeyServer()
    try:
        yield ValkeyBackend(url=server.url)
    finally:
        server.stop()


def _rabbitmq() -> Iterator[BaseBackend]:
    from django_anarchon.backends.rabbitmq import RabbitMQBackend

    from .broker_support import delete_queues, rabbitmq_url

    url, prefix = rabbitmq_url(), f"antest-names-{uuid.uuid4().hex[:8]}"
    try:
        yield RabbitMQBackend(url, prefix=prefix, dedupe_window="5m")
    finally:
        delete_queues(url, prefix + ".")  # the history streams and the claim queues


def _nats() -> Iterator[BaseBackend]:
    from django_anarchon.backends.nats import NatsBackend

    from .broker_support import delete_nats_streams, nats_url

    url, tag = nats_url(), uuid.uuid4().hex[:8]
    try:
        yield NatsBackend(url=url, stream_prefix=f"ANTESTN{tag}", subject_prefix=f"antestn{tag}")
    finally:
        asyncio.run(delete_nats_streams(url, f"ANTESTN{tag}"))


def _database(request: pytest.FixtureRequest, fixture: str) -> Iterator[BaseBackend]:
    from django_anarchon.backends.database import DatabaseBackend

    request.getfixturevalue("database_access")
    yield DatabaseBackend(using=request.getfixturevalue(fixture))


BACKENDS = [
    "memory",
    pytest.param("postgres", marks=pytest.mark.postgres),
    pytest.param("mysql", marks=pytest.mark.mysql),
    "sqlite",
    pytest.param("redis-lease", marks=pytest.mark.redis),
    pytest.param("redis-script", marks=pytest.mark.redis),
    pytest.param("redis-stream-id", marks=pytest.mark.redis),
    pytest.param("redis-cluster", marks=pytest.mark.redis),
    pytest.param("valkey", marks=pytest.mark.redis),
    pytest.param("rabbitmq", marks=pytest.mark.rabbitmq),
    pytest.param("nats", marks=pytest.mark.nats),
]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Iterator[BaseBackend]:
    """A backend on the real server of ``request.param``, cleaned up afterwards."""
    kind: str = request.param
    builders: dict[str, Callable[[], Iterator[BaseBackend]]] = {
        "memory": lambda: iter([MemoryBackend()]),
        "postgres": lambda: _database(request, "postgres_database"),
        "mysql": lambda: _database(request, "mysql_database"),
        "sqlite": lambda: _database(request, "sqlite_database"),
        "redis-cluster": _redis_cluster,
        "valkey": _valkey,
        "rabbitmq": _rabbitmq,
        "nats": _nats,
    }
    built = builders[kind]() if kind in builders else _redis(kind)
    yield from built


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat()


async def test_every_name_runs_on_its_own_and_keeps_its_own_history(
    backend: BaseBackend,
) -> None:
    scheduler = Scheduler(backend, instance_id="names-A")
    ran: list[tuple[str, str, int]] = []  # (registered as, ctx.name, slot)
    all_ran = asyncio.Event()

    def handler_of(name: str) -> Callable[[JobContext], Any]:
        async def handler(ctx: JobContext) -> None:
            ran.append((name, ctx.name, ctx.slot))
            if len(ran) >= len(NAMES):
                all_ran.set()

        return handler

    # Whole seconds: the NATS and RabbitMQ claims are per slot, and so is the comparison.
    slot = (time.time_ns() // 1_000_000 // 1000 + 3) * 1000
    for name in NAMES:
        scheduler.at(name, _iso(slot), handler_of(name))
    await scheduler.start()
    try:
        deadline = time.monotonic() + 30
        with contextlib.suppress(TimeoutError):  # the assertions below say which never ran
            await asyncio.wait_for(all_ran.wait(), 30)
        # Every run has ended (and saved its result) once history shows each as finished.
        while time.monotonic() < deadline:
            records = [await scheduler.ahistory(name) for name in NAMES]
            if all(r and r[0].status != "running" for r in records):
                break
            await asyncio.sleep(0.1)
    finally:
        await scheduler.stop()
    try:
        times = Counter(name for name, _, _ in ran)
        never = [name for name in NAMES if times[name] == 0]
        assert not never, f"{len(never)} jobs never ran: {never}"
        assert all(n == 1 for n in times.values()), f"ran more than once: {times}"
        assert all(name == seen and at == slot for name, seen, at in ran), ran
        for name in NAMES:
            history = await scheduler.ahistory(name)
            assert [(r.job, r.slot, r.status, r.manual) for r in history] == [
                (name, slot, "success", False)
            ], f"history of {name!r}: {history}"

        # A manual run of each (record_manual_run: another write path) stays with its job.
        for name in NAMES:
            record = await scheduler.arun_now(name)
            assert (record.job, record.status, record.manual) == (name, "success", True), name
        for name in NAMES:
            history = await scheduler.ahistory(name)
            assert sorted((r.job, r.manual) for r in history) == [
                (name, False), (name, True)
            ], f"history of {name!r}: {history}"
    finally:
        await backend.close()


def test_redis_keys_are_one_to_one_and_each_job_keeps_one_cluster_slot() -> None:
    """No two names share a key family (in either direction: a brace name's key is never a
    plain name's), a plain name keeps the key format stores already hold, and every key of
    a job hashes to one Redis Cluster slot (redis-py's own CRC16 and hash-tag rule)."""
    from redis.crc import key_slot

    from django_anarchon.backends.redis import RedisBackend

    backend = RedisBackend(url="redis://127.0.0.1:6379/0", key_prefix="p")
    tricky = [*NAMES, "", "%7B", "%257B", "{%7B}", "}{", "{{", "}}", "a:b", "a}:b", "%%"]
    bases = {name: backend.job_key(name) for name in tricky}
    assert len(set(bases.values())) == len(tricky)
    for a, base_a in bases.items():
        for b, base_b in bases.items():
            assert a == b or not f"{base_b}:".startswith(f"{base_a}:"), (a, b)
    assert backend.job_key("Report") == "p:{Report}"
    assert backend.job_key(OLD_REDIS_TAG) == f"p:{{{OLD_REDIS_TAG}}}"
    assert backend.job_key("{x}") == "p:{%7Bx%7D}%"
    for name, base in bases.items():
        keys = [*backend.history_keys(name), f"{base}:r:1000", f"{base}:s", f"{base}:active"]
        assert len({key_slot(key.encode()) for key in keys}) == 1, name
        tag = base[len("p:{") : base.index("}")]
        assert tag and key_slot(keys[0].encode()) == key_slot(tag.encode()), name


@pytest.mark.mysql
def test_mariadb_job_columns_get_a_no_pad_binary_collation_reversibly(
    mysql_database: str, database_access: None
) -> None:
    """Migration 0003 on a database of its own: forward, back to 0002 and forward again."""
    import importlib

    import MySQLdb  # type: ignore[import-untyped]
    from django.core.management import call_command
    from django.db import IntegrityError, connections

    migration = importlib.import_module(
        "django_anarchon.migrations.0003_job_names_binary_collation"
    )
    base = connections.settings[mysql_database]
    name, alias = f"anarchon_names_{uuid.uuid4().hex[:8]}", "names_mysql"
    admin = dict(host=base["HOST"], port=int(base["PORT"]), user=base["USER"],
                 password=base["PASSWORD"], connect_timeout=5)
    server = MySQLdb.connect(**admin)
    server.cursor().execute(
        f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci"
    )
    connections.settings[alias] = {**base, "NAME": name}
    try:

        def collations() -> dict[tuple[str, str], str]:
            with connections[alias].cursor() as cursor:
                cursor.execute(
                    "SELECT TABLE_NAME, COLUMN_NAME, COLLATION_NAME FROM information_schema.COLUMNS"
                    " WHERE TABLE_SCHEMA = %s",
                    [name],
                )
                return {(t, c): coll for t, c, coll in cursor.fetchall()}

        columns = [
            (f"django_anarchon_{model}", field)
            for model, fields in migration.COLLATE_COLUMNS.items()
            for field in fields
        ]
        exact = migration.exact_collation(connections[alias])
        assert exact in ("utf8mb4_nopad_bin", "utf8mb4_0900_bin")
        call_command("migrate", "django_anarchon", database=alias, verbosity=0)
        after = collations()
        assert {column: after[column] for column in columns} == dict.fromkeys(columns, exact)
        assert after[("django_anarchon_run", "reason")] == "utf8mb4_unicode_ci"  # untouched
        with connections[alias].cursor() as cursor:  # the unique key still holds, exactly
            cursor.execute(
                "INSERT INTO django_anarchon_joblock (job, created_at) VALUES "
                "('a', NOW()), ('a ', NOW()), ('A', NOW()), ('\u00e9', NOW()), ('e\u0301', NOW())"
            )
            with pytest.raises(IntegrityError, match="Duplicate"):
                cursor.execute(
                    "INSERT INTO django_anarchon_joblock (job, created_at) VALUES ('a ', NOW())"
                )
            cursor.execute("DELETE FROM django_anarchon_joblock")
        call_command("migrate", "django_anarchon", "0002", database=alias, verbosity=0)
        before = collations()
        assert {c: before[c] for c in columns} == dict.fromkeys(columns, "utf8mb4_unicode_ci")
        call_command("migrate", "django_anarchon", database=alias, verbosity=0)
        assert {c: collations()[c] for c in columns} == dict.fromkeys(columns, exact)
    finally:
        connections[alias].close()
        del connections[alias]
        del connections.settings[alias]
        server.cursor().execute(f"DROP DATABASE IF EXISTS `{name}`")
        server.close()
