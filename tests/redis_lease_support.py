"""What the tests of the ``lease`` strategy's stored form share: a factory of backends on
Redis and on a Valkey server the tests start (each test under a key prefix of its own),
a runner for an async body, and readers of what the server holds.

A module imports ``valkey_server`` and ``lease_backends`` to have the fixtures ``valkey``
and ``make``."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from django_anarchon.backends.base import RunClaim
from django_anarchon.backends.redis import RedisBackend, RedisProtocolBackend, RedisRunStore
from django_anarchon.backends.valkey import ValkeyBackend

from .redis_support import ValkeyServer, delete_prefix, redis_url

Body = Callable[[RedisProtocolBackend, RedisRunStore], Awaitable[None]]
Make = Callable[[], RedisProtocolBackend]


@pytest.fixture(scope="module", name="valkey")
def valkey_server() -> Iterator[ValkeyServer]:
    server = ValkeyServer()
    yield server
    server.stop()


@pytest.fixture(params=["redis", "valkey"], name="make")
def lease_backends(request: pytest.FixtureRequest) -> Iterator[Make]:
    """A factory of lease backends on one server, under a key prefix of this test's own."""
    prefix = f"anarchon-test-{uuid.uuid4().hex[:12]}"
    if request.param == "redis":
        url = redis_url()
        yield lambda: RedisBackend(url=url, key_prefix=prefix)
        delete_prefix(url, prefix)
    else:
        server: ValkeyServer = request.getfixturevalue("valkey")
        yield lambda: ValkeyBackend(url=server.url, key_prefix=prefix)
        delete_prefix(server.url, prefix)


def run(make: Make, body: Body) -> None:
    """``body(backend, backend.runs)`` on a new backend, closed afterwards."""
    async def main() -> None:
        backend = make()
        assert backend.runs is not None
        try:
            await body(backend, backend.runs)
        finally:
            await backend.close()

    asyncio.run(main())


async def server_ms(backend: RedisProtocolBackend) -> int:
    """The server's clock, which every lease decision uses."""
    sec, usec = await backend.client().time()
    return int(sec) * 1000 + int(usec) // 1000


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def run_hash(backend: RedisProtocolBackend, job: str, slot: int) -> dict[str, str]:
    """The stored run of ``job``'s ``slot``, decoded."""
    raw = await backend.client().hgetall(f"{backend.job_key(job)}:r:{slot}")
    return {text(k): text(v) for k, v in raw.items()}


def claim(job: str, slot: int, token: str, **kw: Any) -> RunClaim:
    """A claim by instance ``token.upper()`` that keeps its run a minute unless told."""
    kw.setdefault("keep_ms", 60_000)
    return RunClaim(job, slot, token, token.upper(), **kw)
