"""Redis backend: claims and leases in Lua scripts over ``redis.asyncio`` (redis-py).

``RedisBackend(url=..., strategy="lease")`` in ``OPTIONS``. The strategies, their
settings and what each guarantees are described in ``docs/backends/redis.md``.
redis-py is an optional extra (``pip install django-anarchon[redis]``) and is imported
only when a backend is built.
"""

from __future__ import annotations

from typing import Any, ClassVar

from .core import Driver, RedisProtocolBackend, RedisRunStore
from .strategies import STRATEGY_NAMES, StrategyName, StrategySettings, parse_strategy

__all__ = [
    "RedisBackend",
    "RedisDriver",
    "RedisProtocolBackend",
    "RedisRunStore",
    "StrategyName",
    "StrategySettings",
    "parse_strategy",
]


class RedisDriver(Driver):
    """redis-py's asyncio client."""

    package = "redis"
    extra = "redis"

    def module(self) -> Any:
        import redis

        return redis

    def client_class(self) -> Any:
        import redis.asyncio

        return redis.asyncio.Redis

    def cluster_class(self) -> Any:
        import redis.asyncio.cluster

        return redis.asyncio.cluster.RedisCluster


class RedisBackend(RedisProtocolBackend):
    """Redis (any version with Lua; ``idmp`` needs 8.6+). See :class:`RedisProtocolBackend`."""

    name = "redis"
    driver: ClassVar[Driver] = RedisDriver()
    strategies: ClassVar[tuple[StrategyName, ...]] = STRATEGY_NAMES
    product = "Redis"
