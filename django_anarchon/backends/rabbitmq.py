"""RabbitMQ backend: a claim is the creation of one durable queue per slot, token inside.

RabbitMQ has no put-if-absent for messages that a claimer can read back without taking
the message (``docs/backends/rabbitmq.md`` explains why a bounded queue with
``reject-publish`` is atomic but not repeat-safe). It does have one for queues:
``queue.declare`` creates the queue if it is absent, and if it exists compares the
arguments and refuses a different value with ``PRECONDITION_FAILED``. Both happen in one
step on the broker (a transaction of its metadata store), on every node of a cluster.

So ``claim()`` declares ``<prefix>.claim.<job key>.<slot>`` (durable) and puts the
claimer's token in an argument the broker compares, ``x-dead-letter-routing-key``:

* the queue did not exist: it is created with this token -> ``True``;
* it exists with this token (the same claimer again, for instance after a lost
  ``declare-ok``): the declaration is equivalent -> ``True``;
* it exists with another token -> ``PRECONDITION_FAILED`` -> ``False``.

Nothing is ever read or consumed, so no read can open a window for a competitor. The
queue holds no messages (``x-max-length: 0``) and deletes itself ``dedupe_window`` after
its last declaration (``x-expires``); that is how long a claim is remembered. ``init()``
checks once that the broker really refuses an inequivalent token, and refuses to start
otherwise.

History lives in one stream queue per job (``x-queue-type: stream``), bounded in bytes
from ``history_size`` and in age by ``history_max_age``; readers never remove anything.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import re
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..durations import parse_duration
from ..exceptions import ConfigurationError
from ..redact import redact_text, redact_url, redact_value
from ..retry import retry_store_call
from ..wallclock import now_ms
from . import _broker_history as records
from .base import BaseBackend, ClaimInput, JobLimits, RunRecord, StoredResult
from .naming import LoopBound, job_key

__all__ = ["RabbitMQBackend"]

logger = logging.getLogger("django_anarchon")

T = TypeVar("T")

_PREFIX = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*")
_TOKEN_ARG = "x-dead-letter-routing-key"
_RECORD_BYTES = 600  # a generous size of one history message, for the stream's byte bound
_MAX_AGE = re.compile(r"\d+[YMDhms]")
_PREFETCH = 500  # history messages in flight to a reader
_ACK_EVERY = 100  # a reader acks (multiple) every this many, well inside _PREFETCH


def _import_aio_pika() -> Any:
    try:
        import aio_pika
        import aiormq.exceptions  # noqa: F401 - aio-pika brings it; checked here
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ConfigurationError(
            "RabbitMQBackend needs the aio-pika client: pip install 'django-anarchon[rabbitmq]'",
            option="BACKEND", value="django_anarchon.backends.rabbitmq.RabbitMQBackend",
        ) from exc
    return aio_pika


def _errors() -> Any:
    _import_aio_pika()
    import aiormq.exceptions

    return aiormq.exceptions


#: Operations at once on one connection; more at once open more connections (``_Pool``).
#:
#: aiormq (7.2 at least) queues at most 10 frames per connection, and when that queue is
#: full it silently drops the ``channel.close-ok`` it owes the broker for a channel the
#: broker closed, as it closes the channel of every lost claim (``PRECONDITION_FAILED``).
#: The broker then keeps that channel number half-closed, aiormq reuses the number, and
#: the broker ends the whole connection: "CHANNEL_ERROR - second 'channel.open' seen".
#: Each operation here has at most one frame queued at a time and one request awaiting
#: its answer, so with 4 at once the queue holds at most 4 requests, 4 close-oks and a
#: heartbeat: never full.
IN_FLIGHT = 4
#: Connections one event loop opens at most (so ``IN_FLIGHT`` x this operations at once).
MAX_CONNECTIONS = 4


@dataclass(eq=False)
class _Link:
    """One AMQP connection, its idle channels (a 406 closes a channel, so pool them), and
    how many operations use it now (at most ``IN_FLIGHT``)."""

    connection: Any
    plain: list[Any] = field(default_factory=list)
    confirmed: list[Any] = field(default_factory=list)
    busy: int = 0

    def usable(self) -> bool:
        # aio-pika marks its connection closed a little after the socket is gone: ask the
        # underlying aiormq connection too.
        if self.connection.is_closed:
            return False
        transport = getattr(self.connection, "transport", None)
        raw = getattr(transport, "connection", None)
        return not getattr(raw, "is_closed", False)


class _Pool:
    """One event loop's connections: an operation takes a permit on the least busy one.

    A new connection opens only when every open one has ``IN_FLIGHT`` operations, up to
    ``limit``; past that, operations wait for a permit to come back. A broken
    connection is dropped (and closed) the next time an operation looks; the next one
    needed is opened afresh. ``release`` is synchronous, so a cancelled operation can
    never keep its permit.
    """

    def __init__(self, open_link: Callable[[], Awaitable[_Link]] | None, limit: int) -> None:
        self._open_link = open_link  # None: a connection we were given, the only one
        self._limit = limit
        self.links: list[_Link] = []
        self._opening = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    async def acquire(self) -> _Link:
        while True:
            for link in [link for link in self.links if not link.usable()]:
                if self._open_link is None:
                    raise ConnectionError("the RabbitMQ connection given to the backend is closed")
                await self.drop(link)
            free = [link for link in self.links if link.busy < IN_FLIGHT]
            if free:
                link = min(free, key=lambda link: link.busy)
                link.busy += 1
                return link
            if self._open_link is not None and len(self.links) + self._opening < self._limit:
                self._opening += 1
                try:
                    link = await self._open_link()
                finally:
                    self._opening -= 1
                    self._wake()  # if it failed, a waiter may try to open one itself
                link.busy = 1
                self.links.append(link)
                return link
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._wake()  # woken, then cancelled: pass the turn on
                raise
            finally:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)

    def release(self, link: _Link) -> None:
        link.busy -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def drop(self, link: _Link) -> None:
        """Forget ``link`` (it broke) and close it; its operations fail and retry."""
        if self._open_link is None or link not in self.links:
            return  # a connection we were given stays, and is never closed here
        self.links.remove(link)
        self._wake()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(link.connection.close(), 1.0)

    async def close(self) -> None:
        for link in list(self.links):
            await self.drop(link)


class RabbitMQBackend(BaseBackend):
    """Claims and history on RabbitMQ 3.9+ (streams); claim-only (no leases).

    ``url`` is an AMQP URL; ``connection`` an open ``aio_pika`` connection used as it is
    and never closed here.
    """

    name = "rabbitmq"

    def __init__(
        self,
        url: str | None = None,
        *,
        connection: Any = None,
        prefix: str = "anarchon",
        dedupe_window: object = "10m",
        history_max_age: str = "30D",
        timeout: object = "5s",
        retry_for: object = "5s",
    ) -> None:
        _import_aio_pika()  # fail at configuration time, naming the extra, if it is missing
        if url is not None and connection is not None:
            raise ConfigurationError(
                "give either url or connection, not both", option="url", value=redact_value(url)
            )
        if url is None and connection is None:
            url = "amqp://guest:guest@127.0.0.1:5672/"
        if url is not None and (not isinstance(url, str) or not url.startswith(("amqp://", "amqps://"))):
            raise ConfigurationError(
                "expected an amqp:// or amqps:// URL", option="url", value=redact_value(url)
            )
        if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix) or len(prefix) > 64:
            raise ConfigurationError(
                "use up to 64 characters: dot-separated words of A-Z, a-z, 0-9, '_' and '-'",
                option="prefix", value=prefix,
            )
        if not isinstance(history_max_age, str) or not _MAX_AGE.fullmatch(history_max_age):
            raise ConfigurationError(
                "expected a RabbitMQ stream age such as '30D', '12h' or '1Y'",
                option="history_max_age", value=history_max_age,
            )
        self.url = url
        self.prefix = prefix
        self.window_ms = parse_duration(dedupe_window, option="dedupe_window", allow_zero=False)
        if self.window_ms > 2**32 - 1:
            raise ConfigurationError(
                "RabbitMQ's x-expires holds at most 2^32-1 ms (about 49 days)",
                option="dedupe_window", value=dedupe_window,
            )
        self.dedupe_window_ms: float = float(self.window_ms)
        self.history_max_age = history_max_age
        self.timeout_s = parse_duration(timeout, option="timeout", allow_zero=False) / 1000
        self.retry_for_s = parse_duration(retry_for, option="retry_for") / 1000
        self._given: _Pool | None = None
        if connection is not None:
            self._given = _Pool(None, 1)
            self._given.links.append(_Link(connection))
        self._pools: LoopBound[_Pool] = LoopBound(self._connect, self._disconnect, self._usable)
        self._checked = False
        self._streams_ready: set[str] = set()

    # -- connection -------------------------------------------------------------------

    async def _connect(self) -> _Pool:
        pool = _Pool(self._open_link, MAX_CONNECTIONS)
        pool.links.append(await self._open_link())
        return pool

    async def _open_link(self) -> _Link:
        aio_pika = _import_aio_pika()
        try:
            connection = await aio_pika.connect(
                self.url, timeout=self.timeout_s,
                client_properties={"connection_name": "django-anarchon"},
            )
        except (TimeoutError, OSError, _errors().AMQPError) as exc:
            detail = redact_text(repr(exc))
            raise ConnectionError(f"RabbitMQ at {self._safe_url()} not reachable: {detail}") from exc
        return _Link(connection)

    @staticmethod
    async def _disconnect(pool: _Pool) -> None:
        await pool.close()

    @staticmethod
    def _usable(pool: _Pool) -> bool:
        # Broken connections are the pool's business; an empty pool opens one afresh.
        return True

    async def _pool(self) -> _Pool:
        if self._given is not None:
            return self._given
        return await self._pools.get()

    async def _with_channel(self, confirmed: bool, use: Callable[[Any], Awaitable[T]]) -> T:
        """Run ``use(channel)`` on an idle channel of a connection of this loop."""
        pool = await self._pool()
        link = await pool.acquire()
        try:
            idle = link.confirmed if confirmed else link.plain
            channel = None
            while idle and channel is None:
                candidate = idle.pop()
                if not candidate.is_closed:
                    channel = candidate
            if channel is None:
                channel = await self._open_channel(pool, link, confirmed)
            try:
                return await use(channel)
            finally:
                if not channel.is_closed and link.usable():
                    idle.append(channel)
        finally:
            pool.release(link)

    @staticmethod
    async def _open_channel(pool: _Pool, link: _Link, confirmed: bool) -> Any:
        """A new channel on ``link`` (the caller holds one of its permits)."""
        try:
            return await link.connection.channel(publisher_confirms=confirmed)
        except RuntimeError as exc:  # aiormq: "<Connection ...> closed"
            await pool.drop(link)
            raise ConnectionError(str(exc)) from exc

    def _retryable(self, exc: BaseException) -> bool:
        errors = _errors()
        if isinstance(exc, errors.ChannelClosed):
            return type(exc) is errors.ChannelClosed  # closed under us, not refused
        return isinstance(
            exc,
            (
                errors.AMQPConnectionError,
                errors.ChannelInvalidStateError,
                asyncio.TimeoutError,
                TimeoutError,
                ConnectionError,
                OSError,
            ),
        )

    async def _retrying(self, what: str, job: str, attempt: Callable[[], Awaitable[T]]) -> T:
        """Run ``attempt()``, retrying connection trouble for ``retry_for`` (same token).

        A closed connection is replaced by the next call's own lookup.
        """
        return await retry_store_call(
            f"RabbitMQ {what} for job {job}",
            attempt,
            deadline_ms=now_ms() + int(self.retry_for_s * 1000),
            retryable=self._retryable,
            max_delay_s=1.0,
            log_level=logging.DEBUG,
        )

    # -- names ------------------------------------------------------------------------

    def claim_queue(self, job: str, slot: int) -> str:
        return f"{self.prefix}.claim.{job_key(job)}.{slot}"

    def history_queue(self, job: str) -> str:
        return f"{self.prefix}.history.{job_key(job)}"

    def _claim_arguments(self, token: str, instance_id: str) -> dict[str, Any]:
        return {
            "x-expires": self.window_ms,
            "x-max-length": 0,
            "x-overflow": "reject-publish",
            "x-dead-letter-exchange": f"{self.prefix}.claims",
            _TOKEN_ARG: f"v{records.FORMAT}:{token}",
            # Not compared by the broker; there for people looking at the queue list.
            "x-anarchon-instance": instance_id,
            "x-anarchon-claimed-at": now_ms(),
        }

    # -- setup ------------------------------------------------------------------------

    async def init(self) -> None:
        """Connect, and check once that the broker refuses a claim queue with another token."""
        if self._checked:
            await self._pool()
            return
        await self._retrying("init", "*", self._check_refusal)
        self._checked = True

    async def _check_refusal(self) -> None:
        errors = _errors()
        probe = f"{self.prefix}.selftest.{uuid.uuid4().hex}"

        async def declare(token: str) -> Any:
            arguments = self._claim_arguments(token, "selftest")
            arguments["x-expires"] = 60_000
            return await self._with_channel(
                False,
                lambda ch: ch.declare_queue(
                    probe, durable=True, arguments=arguments, timeout=self.timeout_s
                ),
            )

        await declare("a")
        try:
            await declare("b")
        except errors.ChannelPreconditionFailed:
            refused = True
        else:
            refused = False
        finally:
            await self._with_channel(False, lambda ch: ch.queue_delete(probe))
        if not refused:
            raise ConfigurationError(
                "this RabbitMQ accepted a claim queue re-declared with another token, so its "
                "claims would not be exclusive; RabbitMQBackend cannot run on it",
                option="url", value=self.describe(),
            )

    async def prepare_job(self, job: str, history_size: int) -> None:
        await self.init()
        await self._retrying("prepare_job", job, lambda: self._ensure_history(job, history_size))

    async def _ensure_history(self, job: str, history_size: int) -> None:
        """Declare the job's history stream; keep it as it is if another size made it."""
        errors = _errors()
        name = self.history_queue(job)
        max_bytes = max(64 * 1024, 2 * max(history_size, 1) * _RECORD_BYTES)
        arguments = {
            "x-queue-type": "stream",
            "x-max-length-bytes": max_bytes,
            "x-stream-max-segment-size-bytes": max(16 * 1024, max_bytes // 4),
            "x-max-age": self.history_max_age,
        }
        try:
            await self._with_channel(
                False,
                lambda ch: ch.declare_queue(
                    name, durable=True, arguments=arguments, timeout=self.timeout_s
                ),
            )
        except errors.ChannelPreconditionFailed as exc:
            logger.info("history stream %s kept as it is (%s)", name, exc)
        self._streams_ready.add(name)

    def check_job(self, job: JobLimits) -> None:
        reach = job.jitter_ms + job.max_late_ms
        if reach >= self.window_ms:
            raise ConfigurationError(
                f"jitter + max_late ({reach} ms) must be shorter than the RabbitMQ backend's "
                f"dedupe_window ({self.window_ms} ms), or a late claimer could run the slot "
                "again after the claim queue expired; raise dedupe_window or lower max_late",
                job=job.name, option="max_late", value=job.max_late_ms,
            )

    # -- claims -----------------------------------------------------------------------

    async def claim(self, input: ClaimInput) -> bool:
        errors = _errors()
        name = self.claim_queue(input.job, input.slot)
        arguments = self._claim_arguments(input.token, input.instance_id)

        async def attempt() -> bool:
            try:
                await self._with_channel(
                    False,
                    lambda ch: ch.declare_queue(
                        name, durable=True, arguments=arguments, timeout=self.timeout_s
                    ),
                )
            except errors.ChannelPreconditionFailed as exc:
                if _TOKEN_ARG not in str(exc):
                    logger.warning(
                        "claim queue %s exists with other settings (%s): another instance "
                        "uses another dedupe_window or prefix setup", name, exc,
                    )
                return False
            return True

        return await self._retrying("claim", input.job, attempt)

    async def record_claim(self, input: ClaimInput) -> None:
        """Put a won claim in the job's history (the engine calls this after a win)."""
        body = records.claim_body(input, at=now_ms(), manual=False)
        await self._publish_history(input.job, input.history_size, body)

    async def record_manual_run(self, input: ClaimInput) -> int | None:
        """Record a manual run; a slot that already has one moves to the next free ms."""
        taken = records.manual_slots(await self._read_history(input.job))
        slot = input.slot
        while slot in taken:
            slot += 1
        body = records.claim_body(input, at=now_ms(), manual=True, slot=slot)
        await self._publish_history(input.job, input.history_size, body)
        return None if slot == input.slot else slot

    async def save_result(
        self, job: str, result: StoredResult, history_size: int, history_ttl_ms: int | None = None
    ) -> None:
        await self._publish_history(job, history_size, records.result_body(result, history_size, history_ttl_ms))

    async def _publish_history(self, job: str, history_size: int, body: bytes) -> None:
        aio_pika = _import_aio_pika()
        name = self.history_queue(job)

        async def attempt() -> None:
            if name not in self._streams_ready:
                await self._ensure_history(job, history_size)
            message = aio_pika.Message(body, content_type="application/json")
            await self._with_channel(
                True,
                lambda ch: ch.default_exchange.publish(
                    message, routing_key=name, mandatory=True, timeout=self.timeout_s
                ),
            )

        await self._retrying("history write", job, attempt)

    # -- history ----------------------------------------------------------------------

    async def _read_history(self, job: str) -> list[dict[str, Any]]:
        """Every stored body of the job's stream, oldest first, read without removing any.

        A stream consumer cannot tell "nothing more" from "not yet", so the reader first
        appends a marker of its own, then reads from the first offset up to that marker.
        One coroutine sends every frame of the read (acks included), so it takes one
        ``IN_FLIGHT`` permit.
        """
        aio_pika = _import_aio_pika()
        errors = _errors()
        name = self.history_queue(job)

        async def read() -> list[dict[str, Any]]:
            pool = await self._pool()
            link = await pool.acquire()
            try:
                channel = await self._open_channel(pool, link, True)
                try:
                    return await asyncio.wait_for(scan(channel), self.timeout_s)
                finally:
                    if not channel.is_closed:  # closing it also ends the consumer
                        await channel.close()
            finally:
                pool.release(link)

        async def scan(channel: Any) -> list[dict[str, Any]]:
            try:
                queue = await channel.declare_queue(name, passive=True, timeout=self.timeout_s)
            except errors.ChannelNotFoundEntity:
                return []
            marker = uuid.uuid4().hex
            marker_body = b'{"v": %d, "kind": "marker", "id": "%s"}' % (
                records.FORMAT, marker.encode(),
            )
            await channel.default_exchange.publish(
                aio_pika.Message(marker_body), routing_key=name, timeout=self.timeout_s
            )
            await channel.set_qos(prefetch_count=_PREFETCH)
            inbox: asyncio.Queue[Any] = asyncio.Queue()

            async def on_message(message: Any) -> None:
                inbox.put_nowait(message)  # no frame here: this coroutine sends them all

            await queue.consume(
                on_message, arguments={"x-stream-offset": "first"}, timeout=self.timeout_s
            )
            bodies: list[dict[str, Any]] = []
            seen = 0
            while True:
                message = await inbox.get()
                seen += 1
                if seen % _ACK_EVERY == 0:  # a stream consumer acks to get more credit
                    await message.ack(multiple=True)
                body = records.parse(message.body)
                if body is None:
                    continue
                if body.get("kind") == "marker":
                    if body.get("id") == marker:
                        return bodies
                    continue
                bodies.append(body)

        return await self._retrying("history read", job, read)

    async def history(self, job: str, limit: int) -> list[RunRecord]:
        if limit <= 0:
            return []
        bodies = await self._read_history(job)
        return records.to_history(job, bodies, limit, now_ms(), newest_last=True)

    async def close(self) -> None:
        await self._pools.close_all()

    def describe(self) -> str:
        if self.url is None:
            return f"rabbitmq (given connection; dedupe window {self.window_ms} ms)"
        return f"rabbitmq ({self._safe_url()}; dedupe window {self.window_ms} ms)"

    def _safe_url(self) -> str:
        return redact_url(self.url or "")
