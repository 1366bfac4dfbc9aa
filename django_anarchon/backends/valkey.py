"""Valkey backend: the Redis backend's scripts over the ``valkey`` client's asyncio module.

Valkey has no idempotent XADD, so the strategies are ``lease`` (default), ``stream-id``
and ``script``; asking for ``idmp`` is refused by name. The ``valkey`` client is an
optional extra (``pip install django-anarchon[valkey]``), imported only when a backend is
built.
"""

from __future__ import annotations

from typing import Any, ClassVar

from .redis.core import Driver, RedisProtocolBackend
from .redis.strategies import StrategyName

__all__ = ["ValkeyBackend", "ValkeyDriver"]


class ValkeyDriver(Driver):
    """The ``valkey`` client's asyncio module."""

    package = "valkey"
    extra = "valkey"
    url_schemes = ("valkey", "valkeys", "redis", "rediss", "unix")

    def module(self) -> Any:
        import valkey

        return valkey

    def client_class(self) -> Any:
        import valkey.asyncio

        return valkey.asyncio.Valkey

    def cluster_class(self) -> Any:
        import valkey.asyncio.cluster

        return valkey.asyncio.cluster.ValkeyCluster


class ValkeyBackend(RedisProtocolBackend):
    """Valkey 7.2+ (or any server that speaks its protocol and runs Lua)."""

    name = "valkey"
    driver: ClassVar[Driver] = ValkeyDriver()
    strategies: ClassVar[tuple[StrategyName, ...]] = ("lease", "stream-id", "script")
    product = "Valkey"
