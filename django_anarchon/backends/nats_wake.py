"""The NATS push channel: core NATS ``publish`` of a hint, a subscription on a client of its own.

NATS has claims but no leases, so nothing is ever released: the only hint is the
``run-request`` one. It travels on ``<subject_prefix>.wake``, a subject no stream
captures (core NATS, at most once). The subscriber is its own client (named
``django-anarchon-wake``); nats-py reconnects it and renews the subscription by itself,
and each reconnection yields ``Wakeup("resync")``, since what was published meanwhile
is gone. A connection given with ``connection=`` is subscribed on and left open.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from ..redact import redact_text
from .base import Wakeup
from .reconnect import Backoff

if TYPE_CHECKING:
    from .nats import NatsBackend

__all__ = ["listen", "publish", "subject"]

logger = logging.getLogger("django_anarchon")

#: Hints waiting to be read; beyond it they are dropped (the polls find their rows).
QUEUE_SIZE = 1000


def subject(backend: NatsBackend) -> str:
    return f"{backend.subject_prefix}.wake"


async def publish(backend: NatsBackend, hint: Wakeup) -> None:
    client = await backend._client()
    await client.publish(subject(backend), hint.to_json().encode())
    await client.flush(timeout=backend.timeout_s)


def _put(queue: asyncio.Queue[Wakeup], hint: Wakeup) -> None:
    with contextlib.suppress(asyncio.QueueFull):
        queue.put_nowait(hint)


async def _connect(backend: NatsBackend, queue: asyncio.Queue[Wakeup]) -> tuple[Any, bool]:
    """A client for the subscription and whether it is ours to close."""
    if backend._given is not None:
        return backend._given, False
    from .nats import _import_nats

    nats = _import_nats()

    async def reconnected() -> None:
        _put(queue, Wakeup("resync"))

    async def note(exc: Exception) -> None:
        logger.debug("wake-ups: NATS connection trouble: %s", redact_text(repr(exc)))

    client = nats.aio.client.Client()
    try:
        await asyncio.wait_for(
            client.connect(
                servers=backend.servers, connect_timeout=min(backend.timeout_s, 2.0),
                reconnect_time_wait=0.25, max_reconnect_attempts=-1, allow_reconnect=True,
                name="django-anarchon-wake", error_cb=note, reconnected_cb=reconnected,
            ),
            backend.timeout_s,
        )
    except BaseException:
        with contextlib.suppress(Exception):
            await client.close()
        raise
    return client, True


async def listen(backend: NatsBackend) -> AsyncIterator[Wakeup]:
    """The ``run-request`` hints of ``backend``'s subject, for ever; cancel to stop."""
    queue: asyncio.Queue[Wakeup] = asyncio.Queue(QUEUE_SIZE)

    async def received(message: Any) -> None:
        hint = Wakeup.from_json(message.data)
        if hint is not None:
            _put(queue, hint)

    backoff = Backoff()
    while True:
        try:
            client, own = await _connect(backend, queue)
        except Exception as exc:  # the server is down or refuses: try again later
            logger.warning("wake-ups: cannot connect to NATS (%s); again in %.1fs",
                           redact_text(repr(exc)), backoff.delay)
            await backoff.pause()
            continue
        subscription = None
        try:
            subscription = await client.subscribe(subject(backend), cb=received)
            await client.flush(timeout=backend.timeout_s)
            yield Wakeup("resync")
            while True:
                yield await queue.get()
        finally:
            if subscription is not None:
                with contextlib.suppress(Exception):
                    await subscription.unsubscribe()
            if own:
                with contextlib.suppress(Exception):
                    await client.close()
