"""PostgreSQL's push channel: ``NOTIFY`` to send a hint, ``LISTEN`` on a connection of its own.

The listening connection is a psycopg 3 ``AsyncConnection`` made from the alias's
settings, never one of the ORM connections the claims use: a connection that listens
waits on the server for ever, and the claim threads must stay free. It is probed when
quiet, and reconnected with backoff when it drops (a restart, ``pg_terminate_backend``,
a failover); after each connection it yields ``Wakeup("resync")``, since hints sent
while it was away are gone. ``NOTIFY`` is sent on a claim thread's connection in
autocommit, so it is delivered at once (PostgreSQL delivers a notification when the
transaction that sent it commits).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from django.db import connections

from ..base import Wakeup
from ..reconnect import Backoff, reason

__all__ = ["CHANNEL", "listen", "notify", "supports_push"]

logger = logging.getLogger("django_anarchon")

#: The channel of every hint in one database (schedulers filter what they wait for).
CHANNEL = "anarchon_wake"
#: How the listening connection shows in ``pg_stat_activity``.
APPLICATION_NAME = "anarchon-wake"
#: Pauses between reconnection attempts, doubling from the first to the last.
#: A connection that brought nothing for this long is probed with a query...
PROBE_AFTER_S = 30.0
#: ...which must answer within this, or it is taken for dead and made anew.
PROBE_TIMEOUT_S = 5.0
#: Connection settings of Django's that are not libpq's or suit only sync connections.
_DJANGO_ONLY = ("cursor_factory", "context", "prepare_threshold")


def supports_push(using: str) -> bool:
    """PostgreSQL through psycopg 3 (Django's psycopg2 support has no async listener)."""
    connection = connections[using]
    if connection.vendor != "postgresql":
        return False
    from django.db.backends.postgresql import base

    return bool(getattr(base, "is_psycopg3", False))


def _params(using: str) -> dict[str, Any]:
    params = dict(connections[using].get_connection_params())
    for key in _DJANGO_ONLY:
        params.pop(key, None)
    params["application_name"] = APPLICATION_NAME
    return params


def notify(using: str, hint: Wakeup) -> None:
    """Send ``hint`` (call it in a claim thread; the payload is at most a few hundred bytes)."""
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, hint.to_json()])


async def listen(using: str) -> AsyncIterator[Wakeup]:
    """The hints of the database of ``using``, for ever; cancel the iteration to stop."""
    import psycopg

    backoff = Backoff()
    while True:
        try:
            conn = await psycopg.AsyncConnection.connect(**_params(using), autocommit=True)
        except (psycopg.Error, OSError) as exc:
            logger.warning("wake-ups: cannot connect to %s (%s); again in %.1fs", using,
                           reason(exc), backoff.delay)
            await backoff.pause()
            continue
        try:
            await conn.execute(f"LISTEN {CHANNEL}")
            backoff.reset()
            yield Wakeup("resync")
            while True:
                quiet = True
                async for message in conn.notifies(timeout=PROBE_AFTER_S):
                    quiet = False
                    hint = Wakeup.from_json(message.payload)
                    if hint is not None:
                        yield hint
                if quiet:
                    async with asyncio.timeout(PROBE_TIMEOUT_S):
                        await conn.execute("SELECT 1")
        except (psycopg.Error, OSError, TimeoutError) as exc:
            logger.warning("wake-ups: the listening connection to %s dropped (%s); reconnecting",
                           using, reason(exc))
        finally:
            with contextlib.suppress(Exception):
                await conn.close()
        await backoff.pause()
