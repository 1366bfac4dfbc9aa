"""The Redis/Valkey push channel: ``PUBLISH`` a hint, ``SUBSCRIBE`` on a connection of its own.

The subscriber is a client of its own (one connection, named ``{key_prefix}:wake`` so an
operator can tell it in ``CLIENT LIST``), made from the backend's settings, never the
client the claims use. It is pinged when quiet and made anew with backoff when its
connection drops (a restart, ``CLIENT KILL``, a failover); after each subscription it
yields ``Wakeup("resync")``, since messages published while it was away are gone (pub/sub
keeps nothing). A client given with ``client=`` lends its pool instead. Redis Cluster
has no push channel here: its instances poll.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from ..base import Wakeup
from ..reconnect import Backoff, reason

if TYPE_CHECKING:
    from .core import RedisProtocolBackend

__all__ = ["channel", "listen", "publish"]

logger = logging.getLogger("django_anarchon")

#: A subscription that brought nothing for this long is pinged...
PROBE_AFTER_S = 30.0
#: ...and must answer within this, or its connection is taken for dead and made anew.
PROBE_TIMEOUT_S = 5.0


def channel(backend: RedisProtocolBackend) -> str:
    """One channel per key prefix: deployments that share a server do not wake each other."""
    return f"{backend.key_prefix}:wake"


async def publish(backend: RedisProtocolBackend, hint: Wakeup) -> None:
    await backend.client().publish(channel(backend), hint.to_json())


def _subscriber(backend: RedisProtocolBackend) -> tuple[Any, bool]:
    """A client for the subscription and whether it is ours to close."""
    if backend._given is not None:
        return backend._given, False
    return backend._new_client(client_name=channel(backend)), True


async def listen(backend: RedisProtocolBackend) -> AsyncIterator[Wakeup]:
    """The hints of ``backend``'s channel, for ever; cancel the iteration to stop."""
    errors: tuple[type[BaseException], ...] = (
        *backend.driver.connection_errors(), OSError, TimeoutError,
    )
    name = channel(backend)
    backoff = Backoff()
    while True:
        client, own = _subscriber(backend)
        pubsub = client.pubsub()
        try:
            await pubsub.subscribe(name)
            backoff.reset()
            yield Wakeup("resync")
            pinged = False
            while True:
                message = await pubsub.get_message(
                    ignore_subscribe_messages=True,
                    timeout=PROBE_TIMEOUT_S if pinged else PROBE_AFTER_S,
                )
                if message is None:
                    if pinged:
                        raise TimeoutError("no answer to PING")
                    await pubsub.ping()
                    pinged = True
                    continue
                pinged = False
                if message.get("type") == "message":
                    hint = Wakeup.from_json(message.get("data"))
                    if hint is not None:
                        yield hint
        except errors as exc:
            logger.warning("wake-ups: the subscription to %s dropped (%s); subscribing again",
                           name, reason(exc))
        finally:
            with contextlib.suppress(Exception):
                await pubsub.aclose()
            if own:
                with contextlib.suppress(Exception):
                    await client.aclose()
        await backoff.pause()
