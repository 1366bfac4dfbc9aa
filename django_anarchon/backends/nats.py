"""NATS JetStream backend: a claim is a put-if-absent publish on one subject per slot.

``claim()`` publishes the claimer's token on ``<subject_prefix>.claim.<job key>.<slot>``
with ``Nats-Expected-Last-Subject-Sequence: 0``: the stream stores it only while that
subject holds no message, so exactly one publish per slot is stored, the winner's. The
header ``Nats-Msg-Id`` is built from the subject and the token, so the same token sent
again inside the stream's duplicate window is acknowledged as a duplicate (a win). Any
other rejection comes back as "wrong last sequence" (10071, or 10164 in a cluster); the
claimer then reads the subject's stored message and compares tokens, which also answers
a winner whose retry comes after the duplicate window. The claims stream keeps messages
for ``dedupe_window`` (its ``max_age``): that is how long a claim is remembered.

History lives in one stream per job with two subjects (claims, results), each bounded by
``max_msgs_per_subject = history_size``. Works on NATS 2.9 (no per-message TTL needed).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from ..durations import parse_duration
from ..exceptions import ConfigurationError
from ..redact import redact_text, redact_url, redact_value
from ..retry import retry_store_call
from ..wallclock import now_ms
from . import _broker_history as records
from . import nats_wake
from .base import BaseBackend, ClaimInput, JobLimits, RunRecord, StoredResult, Wakeup
from .naming import LoopBound, job_key

T = TypeVar("T")

__all__ = ["NatsBackend"]

logger = logging.getLogger("django_anarchon")

_WRONG_LAST_SEQUENCE = frozenset({10071, 10164})
_STREAM_NAME_IN_USE = 10058
_NO_MESSAGE = 10037
_STREAM_NOT_FOUND = 10059
_STREAM_PREFIX = re.compile(r"[A-Za-z0-9_-]{1,32}")
_SUBJECT_PREFIX = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*")


def _import_nats() -> Any:
    try:
        import nats
        import nats.aio.client
        import nats.errors
        import nats.js.api
        import nats.js.errors
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ConfigurationError(
            "NatsBackend needs the nats-py client: pip install 'django-anarchon[nats]'",
            option="BACKEND", value="django_anarchon.backends.nats.NatsBackend",
        ) from exc
    return nats


class NatsBackend(BaseBackend):
    """Claims and history on NATS JetStream; claim-only (no leases).

    ``servers`` (or ``url``) is one URL or a list; ``connection`` is an already connected
    ``nats.aio.client.Client`` used as it is and never closed here.
    """

    name = "nats"

    def __init__(
        self,
        servers: str | list[str] | None = None,
        *,
        url: str | None = None,
        connection: Any = None,
        stream_prefix: str = "ANARCHON",
        subject_prefix: str = "anarchon",
        dedupe_window: object = "1h",
        duplicate_window: object = "2m",
        timeout: object = "5s",
        retry_for: object = "5s",
        replicas: int = 1,
        storage: str = "file",
    ) -> None:
        _import_nats()  # fail at configuration time, naming the extra, if the client is missing
        if servers is not None and url is not None:
            raise ConfigurationError(
                "give either servers or url, not both", option="url", value=redact_value(url)
            )
        target = servers if servers is not None else url
        if target is None:
            target = "nats://127.0.0.1:4222"
        if isinstance(target, str):
            target = [target]
        if not isinstance(target, list) or not target or not all(
            isinstance(s, str) and s for s in target
        ):
            raise ConfigurationError(
                "expected a NATS URL or a list of them", option="servers",
                value=redact_value(target),
            )
        self.servers: list[str] = target
        if not isinstance(stream_prefix, str) or not _STREAM_PREFIX.fullmatch(stream_prefix):
            raise ConfigurationError(
                "use 1-32 characters from A-Z, a-z, 0-9, '_' and '-'",
                option="stream_prefix", value=stream_prefix,
            )
        if not isinstance(subject_prefix, str) or not _SUBJECT_PREFIX.fullmatch(subject_prefix):
            raise ConfigurationError(
                "use dot-separated tokens of A-Z, a-z, 0-9, '_' and '-' (no wildcards)",
                option="subject_prefix", value=subject_prefix,
            )
        if storage not in ("file", "memory"):
            raise ConfigurationError("expected 'file' or 'memory'", option="storage", value=storage)
        if isinstance(replicas, bool) or not isinstance(replicas, int) or not 1 <= replicas <= 5:
            raise ConfigurationError(
                "expected an integer from 1 to 5", option="replicas", value=replicas
            )
        self.stream_prefix = stream_prefix
        self.subject_prefix = subject_prefix
        self.window_ms = parse_duration(dedupe_window, option="dedupe_window", allow_zero=False)
        self.duplicate_window_ms = min(
            parse_duration(duplicate_window, option="duplicate_window", allow_zero=False),
            self.window_ms,
        )
        self.timeout_s = parse_duration(timeout, option="timeout", allow_zero=False) / 1000
        self.retry_for_s = parse_duration(retry_for, option="retry_for") / 1000
        self.replicas = replicas
        self.storage = storage
        self.dedupe_window_ms: float = float(self.window_ms)
        self.claims_stream = f"{stream_prefix}_CLAIMS"
        self._given = connection
        self._conns: LoopBound[Any] = LoopBound(self._connect, self._disconnect, self._usable)
        self._streams_ready: set[str] = set()

    # -- connection -------------------------------------------------------------------

    async def _connect(self) -> Any:
        """A connected client, or ``ConnectionError`` once ``timeout`` passed without one.

        nats-py keeps trying a first connect forever when it may reconnect (and it must
        reconnect after a first connect succeeded), so the first connect is bounded here:
        a worker started while the server is down fails ``init()`` and can retry or stop.
        """
        nats = _import_nats()
        last_error: list[BaseException] = []

        async def note(exc: Exception) -> None:
            last_error[:] = [exc]
            logger.debug("NATS connection trouble: %s", redact_text(repr(exc)))

        client = nats.aio.client.Client()
        try:
            await asyncio.wait_for(
                client.connect(
                    servers=self.servers,
                    connect_timeout=min(self.timeout_s, 2.0),
                    reconnect_time_wait=0.25,
                    max_reconnect_attempts=-1,
                    allow_reconnect=True,
                    name="django-anarchon",
                    error_cb=note,
                ),
                self.timeout_s,
            )
        except (TimeoutError, OSError, nats.errors.Error) as exc:
            with contextlib.suppress(Exception):
                await client.close()
            cause = last_error[0] if last_error else exc
            raise ConnectionError(
                f"NATS server {self._where()} not reachable "
                f"within {self.timeout_s:g}s: {redact_text(repr(cause))}"
            ) from None
        return client

    @staticmethod
    async def _disconnect(nc: Any) -> None:
        await nc.close()

    @staticmethod
    def _usable(nc: Any) -> bool:
        return not nc.is_closed

    async def _client(self) -> Any:
        if self._given is not None:
            return self._given
        return await self._conns.get()

    async def _js(self) -> Any:
        return (await self._client()).jetstream(timeout=self.timeout_s)

    def _retryable(self, exc: BaseException) -> bool:
        """Errors after which the same request may be sent again (with the same token)."""
        nats = _import_nats()
        if isinstance(exc, nats.js.errors.APIError):
            return exc.code == 503 or isinstance(exc, nats.js.errors.NoStreamResponseError)
        return isinstance(
            exc, (nats.errors.Error, asyncio.TimeoutError, TimeoutError, ConnectionError, OSError)
        )

    async def _retrying(self, what: str, job: str, attempt: Callable[[], Awaitable[T]]) -> T:
        """Run ``attempt()``, retrying connection trouble for ``retry_for`` (same token).

        A closed connection is replaced by the next call's own lookup.
        """
        return await retry_store_call(
            f"NATS {what} for job {job}",
            attempt,
            deadline_ms=now_ms() + int(self.retry_for_s * 1000),
            retryable=self._retryable,
            max_delay_s=1.0,
            log_level=logging.DEBUG,
        )

    # -- names ------------------------------------------------------------------------

    def claim_subject(self, job: str, slot: int) -> str:
        return f"{self.subject_prefix}.claim.{job_key(job)}.{slot}"

    def history_stream(self, job: str) -> str:
        return f"{self.stream_prefix}_H_{job_key(job)}"

    def _history_subject(self, job: str, kind: str) -> str:
        return f"{self.subject_prefix}.history.{job_key(job)}.{kind}"

    # -- streams ----------------------------------------------------------------------

    async def _ensure_stream(self, config: Any, *, never_shorten: bool = False) -> None:
        """Create the stream, or bring an existing one to ``config``.

        With ``never_shorten`` an existing longer ``max_age`` is kept: another instance
        may promise a longer dedupe window, and shortening it would break that promise.
        """
        nats = _import_nats()
        js = await self._js()
        try:
            await js.add_stream(config)
            return
        except nats.js.errors.APIError as exc:
            if exc.err_code != _STREAM_NAME_IN_USE:
                raise
        info = await js.stream_info(config.name)
        current = info.config
        wanted = config
        if never_shorten and (current.max_age or 0) > (config.max_age or 0):
            wanted = config.evolve(max_age=current.max_age)
        if (
            (current.max_age or 0) != (wanted.max_age or 0)
            or current.max_msgs_per_subject != wanted.max_msgs_per_subject
            or (current.duplicate_window or 0) != (wanted.duplicate_window or 0)
            or list(current.subjects or []) != list(wanted.subjects or [])
        ):
            await js.update_stream(wanted)

    def _claims_config(self) -> Any:
        api = _import_nats().js.api
        return api.StreamConfig(
            name=self.claims_stream,
            subjects=[f"{self.subject_prefix}.claim.>"],
            max_age=self.window_ms / 1000,
            duplicate_window=self.duplicate_window_ms / 1000,
            storage=api.StorageType(self.storage),
            num_replicas=self.replicas,
            discard=api.DiscardPolicy.OLD,
        )

    def _history_config(self, job: str, history_size: int) -> Any:
        api = _import_nats().js.api
        return api.StreamConfig(
            name=self.history_stream(job),
            subjects=[f"{self.subject_prefix}.history.{job_key(job)}.*"],
            max_msgs_per_subject=max(history_size, 1),
            duplicate_window=self.duplicate_window_ms / 1000,
            storage=api.StorageType(self.storage),
            num_replicas=self.replicas,
            discard=api.DiscardPolicy.OLD,
        )

    async def init(self) -> None:
        """Connect and create the claims stream (idempotent)."""
        if self.claims_stream in self._streams_ready:
            await self._client()
            return
        await self._retrying(
            "init", "*", lambda: self._ensure_stream(self._claims_config(), never_shorten=True)
        )
        self._streams_ready.add(self.claims_stream)

    async def prepare_job(self, job: str, history_size: int) -> None:
        await self.init()
        await self._retrying(
            "prepare_job", job, lambda: self._ensure_stream(self._history_config(job, history_size))
        )
        self._streams_ready.add(self.history_stream(job))

    def check_job(self, job: JobLimits) -> None:
        reach = job.jitter_ms + job.max_late_ms
        if reach >= self.window_ms:
            raise ConfigurationError(
                f"jitter + max_late ({reach} ms) must be shorter than the NATS backend's "
                f"dedupe_window ({self.window_ms} ms), or a late claimer could run the slot "
                "again after the claim expired; raise dedupe_window or lower max_late",
                job=job.name, option="max_late", value=job.max_late_ms,
            )

    # -- claims -----------------------------------------------------------------------

    async def claim(self, input: ClaimInput) -> bool:
        subject = self.claim_subject(input.job, input.slot)
        at = now_ms()
        payload = json.dumps(
            {"v": records.FORMAT, "token": input.token, "by": input.instance_id, "at": at}
        ).encode()
        headers = {
            "Nats-Expected-Last-Subject-Sequence": "0",
            "Nats-Msg-Id": f"{subject}:{input.token}",
        }

        async def attempt() -> bool:
            nats = _import_nats()
            js = await self._js()
            for _ in range(5):
                try:
                    await js.publish(
                        subject, payload, headers=dict(headers), stream=self.claims_stream
                    )
                    return True  # stored, or a duplicate of our own earlier publish
                except nats.js.errors.APIError as exc:
                    if exc.err_code == _STREAM_NOT_FOUND or isinstance(
                        exc, nats.js.errors.NoStreamResponseError
                    ):
                        await self._ensure_stream(self._claims_config(), never_shorten=True)
                        continue
                    if exc.err_code not in _WRONG_LAST_SEQUENCE:
                        raise
                try:
                    held = await js.get_last_msg(self.claims_stream, subject)
                except nats.js.errors.NotFoundError:
                    continue  # the holder expired between the two calls: publish again
                return bool(json.loads(held.data).get("token") == input.token)
            raise RuntimeError(f"NATS claim of {subject} kept changing under us")

        return bool(await self._retrying("claim", input.job, attempt))

    async def record_claim(self, input: ClaimInput) -> None:
        """Put a won claim in the job's history (the engine calls this after a win)."""
        await self._publish_history(
            input.job,
            input.history_size,
            "claims",
            records.claim_body(input, at=now_ms(), manual=False),
            msg_id=f"claim:{input.slot}:{input.token}",
        )

    async def record_manual_run(self, input: ClaimInput) -> int | None:
        """Record a manual run; a slot that already has one moves to the next free ms."""
        taken = records.manual_slots(await self._read_history(input.job, None))
        slot = input.slot
        while slot in taken:
            slot += 1
        await self._publish_history(
            input.job,
            input.history_size,
            "claims",
            records.claim_body(input, at=now_ms(), manual=True, slot=slot),
            msg_id=None,
        )
        return None if slot == input.slot else slot

    async def save_result(
        self, job: str, result: StoredResult, history_size: int, history_ttl_ms: int | None = None
    ) -> None:
        await self._publish_history(
            job, history_size, "results", records.result_body(result, history_size, history_ttl_ms), msg_id=None
        )

    async def _publish_history(
        self, job: str, history_size: int, kind: str, payload: bytes, msg_id: str | None
    ) -> None:
        stream = self.history_stream(job)
        subject = self._history_subject(job, kind)
        headers = {"Nats-Msg-Id": msg_id} if msg_id else None

        async def attempt() -> None:
            nats = _import_nats()
            js = await self._js()
            if stream not in self._streams_ready:
                await self._ensure_stream(self._history_config(job, history_size))
                self._streams_ready.add(stream)
            try:
                await js.publish(subject, payload, headers=headers, stream=stream)
            except nats.js.errors.APIError as exc:
                if exc.err_code != _STREAM_NOT_FOUND and not isinstance(
                    exc, nats.js.errors.NoStreamResponseError
                ):
                    raise
                await self._ensure_stream(self._history_config(job, history_size))
                await js.publish(subject, payload, headers=headers, stream=stream)

        await self._retrying("history write", job, attempt)

    # -- history ----------------------------------------------------------------------

    async def _read_history(self, job: str, limit: int | None) -> list[dict[str, Any]]:
        """Stored bodies from the newest back: all of them, or until ``limit`` results."""
        nats = _import_nats()
        stream = self.history_stream(job)

        async def read() -> list[dict[str, Any]]:
            js = await self._js()
            try:
                info = await js.stream_info(stream)
            except nats.js.errors.NotFoundError:
                return []
            first, last = info.state.first_seq, info.state.last_seq
            bodies: list[dict[str, Any]] = []
            results = 0
            seq = last
            while seq >= max(first, 1) and (limit is None or results < limit):
                try:
                    msg = await js.get_msg(stream, seq)
                except nats.js.errors.NotFoundError:
                    seq -= 1  # a gap left by per-subject trimming
                    continue
                body = records.parse(msg.data)
                if body is not None:
                    bodies.append(body)
                    results += body.get("kind") == "result"
                seq -= 1
            return bodies

        result: list[dict[str, Any]] = await self._retrying("history read", job, read)
        return result

    async def history(self, job: str, limit: int) -> list[RunRecord]:
        if limit <= 0:
            return []
        bodies = await self._read_history(job, limit)
        return records.to_history(job, bodies, limit, now_ms(), newest_last=False)

    async def close(self) -> None:
        await self._conns.close_all()

    def wakeups(self) -> AsyncIterator[Wakeup]:
        """``run-request`` hints on a core NATS subject (``nats_wake.py``); no leases, no
        releases."""
        return nats_wake.listen(self)

    async def wake(self, hint: Wakeup) -> None:
        await nats_wake.publish(self, hint)

    def describe(self) -> str:
        window = "forever" if math.isinf(self.dedupe_window_ms) else f"{self.window_ms} ms"
        return f"nats ({self._where()}; dedupe window {window})"

    def _where(self) -> str:
        """The servers, without passwords or tokens."""
        if self._given is not None:
            return "given connection"
        return ", ".join(redact_url(s) for s in self.servers)
