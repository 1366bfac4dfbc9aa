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
import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..durations import parse_duration
from ..exceptions import ConfigurationError
from ..retry import retry_store_call
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


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class _Link:
    """One AMQP connection and its idle channels (a 406 closes a channel, so pool them)."""

    connection: Any
    plain: list[Any] = field(default_factory=list)
    confirmed: list[Any] = field(default_factory=list)


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
                "give either url or connection, not both", option="url", value=url
            )
        if url is None and connection is None:
            url = "amqp://guest:guest@127.0.0.1:5672/"
        if url is not None and (not isinstance(url, str) or not url.startswith(("amqp://", "amqps://"))):
            raise ConfigurationError("expected an amqp:// or amqps:// URL", option="url", value=url)
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
        self._given = _Link(connection) if connection is not None else None
        self._links: LoopBound[_Link] = LoopBound(self._connect, self._disconnect, self._usable)
        self._checked = False
        self._streams_ready: set[str] = set()

    # -- connection -------------------------------------------------------------------

    async def _connect(self) -> _Link:
        aio_pika = _import_aio_pika()
        connection = await aio_pika.connect(
            self.url, timeout=self.timeout_s, client_properties={"connection_name": "django-anarchon"}
        )
        return _Link(connection)

    @staticmethod
    async def _disconnect(link: _Link) -> None:
        await link.connection.close()

    @staticmethod
    def _usable(link: _Link) -> bool:
        # aio-pika marks its connection closed a little after the socket is gone: ask the
        # underlying aiormq connection too.
        if link.connection.is_closed:
            return False
        transport = getattr(link.connection, "transport", None)
        raw = getattr(transport, "connection", None)
        return not getattr(raw, "is_closed", False)

    async def _link(self) -> _Link:
        if self._given is not None:
            return self._given
        return await self._links.get()

    async def _with_channel(self, confirmed: bool, use: Callable[[Any], Awaitable[T]]) -> T:
        """Run ``use(channel)`` on an idle channel of this loop's connection."""
        link = await self._link()
        idle = link.confirmed if confirmed else link.plain
        channel = None
        while idle and channel is None:
            candidate = idle.pop()
            if not candidate.is_closed:
                channel = candidate
        if channel is None:
            try:
                channel = await link.connection.channel(publisher_confirms=confirmed)
            except RuntimeError as exc:  # aiormq: "<Connection ...> closed"
                if link is not self._given:
                    await self._links.discard(link)
                raise ConnectionError(str(exc)) from exc
        try:
            return await use(channel)
        finally:
            if not channel.is_closed and not link.connection.is_closed:
                idle.append(channel)

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
            deadline_ms=int(time.time() * 1000 + self.retry_for_s * 1000),
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
            "x-anarchon-claimed-at": _now_ms(),
        }

    # -- setup ------------------------------------------------------------------------

    async def init(self) -> None:
        """Connect, and check once that the broker refuses a claim queue with another token."""
        if self._checked:
            await self._link()
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
        body = records.claim_body(input, at=_now_ms(), manual=False)
        await self._publish_history(input.job, input.history_size, body)

    async def record_manual_run(self, input: ClaimInput) -> int | None:
        """Record a manual run; a slot that already has one moves to the next free ms."""
        taken = records.manual_slots(await self._read_history(input.job))
        slot = input.slot
        while slot in taken:
            slot += 1
        body = records.claim_body(input, at=_now_ms(), manual=True, slot=slot)
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
        """
        aio_pika = _import_aio_pika()
        errors = _errors()
        name = self.history_queue(job)

        async def read() -> list[dict[str, Any]]:
            link = await self._link()
            channel = await link.connection.channel(publisher_confirms=True)
            try:
                try:
                    queue = await channel.declare_queue(name, passive=True, timeout=self.timeout_s)
                except errors.ChannelNotFoundEntity:
                    return []
                marker = uuid.uuid4().hex
                marker_body = (
                    b'{"v": %d, "kind": "marker", "id": "%s"}' % (records.FORMAT, marker.encode())
                )
                await channel.default_exchange.publish(
                    aio_pika.Message(marker_body), routing_key=name, timeout=self.timeout_s
                )
                await channel.set_qos(prefetch_count=500)
                bodies: list[dict[str, Any]] = []
                done = asyncio.get_running_loop().create_future()

                async def on_message(message: Any) -> None:
                    await message.ack()
                    body = records.parse(message.body)
                    if body is None or done.done():
                        return
                    if body.get("kind") == "marker":
                        if body.get("id") == marker:
                            done.set_result(None)
                        return
                    bodies.append(body)

                tag = await queue.consume(
                    on_message, arguments={"x-stream-offset": "first"}, timeout=self.timeout_s
                )
                try:
                    await asyncio.wait_for(done, self.timeout_s)
                finally:
                    await queue.cancel(tag)
                return bodies
            finally:
                if not channel.is_closed:
                    await channel.close()

        return await self._retrying("history read", job, read)

    async def history(self, job: str, limit: int) -> list[RunRecord]:
        if limit <= 0:
            return []
        bodies = await self._read_history(job)
        return records.to_history(job, bodies, limit, _now_ms(), newest_last=True)

    async def close(self) -> None:
        await self._links.close_all()

    def describe(self) -> str:
        if self.url is None:
            return f"rabbitmq (given connection; dedupe window {self.window_ms} ms)"
        safe = re.sub(r"//([^:/@]+):[^@/]*@", r"//\1:***@", self.url)
        return f"rabbitmq ({safe}; dedupe window {self.window_ms} ms)"
