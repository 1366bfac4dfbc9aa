"""What the Redis and Valkey backends share: connections, keys, and the script calls.

The client library (redis-py or valkey) is reached through a small ``Driver`` so that
neither is imported until a backend is built, and the two backends differ only in it.

Clients are bound to an event loop. The engine calls a backend from its own loop, and
the sync twins (``run_now()``, ``history()``) from a fresh loop each time, possibly
from several threads at once, so the backend keeps one client per running loop, made
on first use; a client whose loop has closed is dropped. A client given by the user is
used as it is, on whatever loop the user made it for.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import socket
import threading
from collections.abc import AsyncIterator, Sequence
from typing import Any, ClassVar, NamedTuple
from urllib.parse import urlsplit

from ...exceptions import ConfigurationError
from ...logtime import iso
from ...redact import redact_url, redact_value
from ..base import (
    BUFFER_WAIT_CAP_MS,
    DEFAULT_KEEP_MS,
    MIN_KEEP_MS,
    ActiveRun,
    BaseBackend,
    ClaimInput,
    ClaimOutcome,
    ClaimRecord,
    FinalStatus,
    JobLimits,
    RunClaim,
    RunEnd,
    RunRecord,
    StoredResult,
    Wakeup,
    buffer_hold_ms,
    build_history,
    cancel_reason,
)
from . import scripts, wake
from .ledger import LedgerCalls
from .ordering import SlotOrder
from .scripts import Script
from .strategies import IDMP_MIN_VERSION, STRATEGY_NAMES, StrategyName, parse_strategy

__all__ = ["Driver", "RedisProtocolBackend", "RedisRunStore"]

logger = logging.getLogger("django_anarchon")

#: Longest single wait of a stream-id claim that is ahead of the server's clock.
EARLY_WAIT_CAP_MS = 30_000
#: Calls are retried on a dropped connection; the token makes a repeated claim safe.
RETRIES = 3
#: The format of history records (JSON); run hashes have their own (``scripts.RUN_FORMAT``).
STORE_FORMAT = 1


class Driver:
    """The client library of a backend: how to build a client and which errors it raises."""

    #: Distribution name shown in the "not installed" error, and the pip extra.
    package: ClassVar[str] = "redis"
    extra: ClassVar[str] = "redis"
    #: The URL schemes the client's ``from_url()`` accepts.
    url_schemes: ClassVar[tuple[str, ...]] = ("redis", "rediss", "unix")

    def module(self) -> Any:
        raise NotImplementedError

    def cluster_module(self) -> Any:
        raise NotImplementedError

    def client_class(self) -> Any:
        raise NotImplementedError

    def cluster_class(self) -> Any:
        raise NotImplementedError

    def exceptions(self) -> Any:
        return self.module().exceptions

    def connection_errors(self) -> tuple[type[BaseException], ...]:
        exc = self.exceptions()
        return (exc.ConnectionError, exc.TimeoutError)

    def no_script_error(self) -> type[BaseException]:
        return self.exceptions().NoScriptError  # type: ignore[no-any-return]

    def missing(self, error: ImportError, backend: str) -> ConfigurationError:
        return ConfigurationError(
            f"the {self.package!r} client library is not installed "
            f"(pip install django-anarchon[{self.extra}]): {error}",
            option="BACKEND", value=backend,
        )


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _tagged(job: str) -> str:
    """The job's part of its keys, ``{tag}`` and what follows; one-to-one with the name.

    A name without braces is its own hash tag: ``{name}``, then ``:``. A brace would end
    or start the tag early, so a name with one (or an empty name) is escaped (``%``, ``{``,
    ``}`` as ``%25``, ``%7B``, ``%7D``) and its tag is followed by ``%``: a plain name's
    ``}`` is always followed by ``:``, so neither kind of key can be the other's.
    """
    if job and "{" not in job and "}" not in job:
        return f"{{{job}}}"
    escaped = job.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")
    return f"{{{escaped or '%'}}}%"


def _record_field(slot: int, attempt: int, manual: bool, by: str) -> str:
    return f"{slot:015d}:{attempt:05d}:{int(manual)}:{by}"


def _opt(value: int | None) -> str:
    return "" if value is None else str(int(value))


#: Jobs (with their options) whose claims' constant parts are kept encoded: a burst of
#: that many jobs encodes them once, not once per slot and instance.
CLAIM_PARTS_KEPT = 4096


class _ClaimParts(NamedTuple):
    """The parts of a claim's script call that every slot of a job shares, encoded as
    the client would encode them: of a claim's 30 arguments, 24. The client's packing of
    the arguments was most of a Redis worker's time in a burst of 1,000 jobs."""

    base: str
    keys: list[bytes]  # after the run's key
    options: list[bytes]  # lease_ms ... buffer_limit
    tail: list[bytes]  # after the cancel reason
    prefix: bytes  # ``base``, for RUN_CLAIM_MANY
    option_set: tuple[bytes, ...]  # the instance first; RUN_CLAIM_MANY shares it by value


def _encoded(values: list[Any]) -> list[bytes]:
    """Strings and integers as redis-py and valkey encode them (UTF-8, ``repr``)."""
    return [value.encode() if isinstance(value, str) else repr(value).encode()
            for value in values]


def _cancel_arg(c: RunClaim) -> str | bytes:
    """Read only by a cancel_other claim (the fenced run's error): not built otherwise."""
    return cancel_reason(c.slot, c.instance_id) if c.overlap == "cancel_other" else b""


def _result_args(result: StoredResult, history_size: int, history_ttl_ms: int | None) -> list[Any]:
    """SAVE_RESULT's ARGV: the record's field and JSON, its times, the history's bounds."""
    record = {"v": STORE_FORMAT, **result.to_dict()}
    return [
        _record_field(result.slot, result.attempt, result.manual, result.by),
        json.dumps(record, separators=(",", ":")),
        result.started_at,
        result.finished_at,
        history_size,
        _opt(history_ttl_ms),
    ]


def _abandon(client: Any) -> None:
    """Shut the sockets of a client whose event loop is gone (it cannot be awaited)."""
    pool = getattr(client, "connection_pool", None)
    conns = [
        *getattr(pool, "_available_connections", ()),
        *getattr(pool, "_in_use_connections", ()),
    ]
    for conn in conns:
        writer = getattr(conn, "_writer", None)
        if writer is None:
            continue
        with contextlib.suppress(Exception):
            sock = writer.transport.get_extra_info("socket")
            if sock is not None:
                sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(Exception):
            conn._reader = None
            conn._writer = None


class RedisProtocolBackend(BaseBackend):
    """A backend on a server that speaks the Redis protocol and runs Lua scripts.

    Settings (``OPTIONS``): ``client=`` an existing asyncio client (used as is, never
    closed), or ``url=``, or ``host``/``port``/``username``/``password``/``db``/``ssl``;
    ``cluster=True`` for a Redis Cluster; ``client_options`` passed to the client
    (TLS certificates, timeouts); ``strategy`` a name or a dict with its settings;
    ``key_prefix`` before every key.
    """

    name: ClassVar[str] = "redis"
    driver: ClassVar[Driver]
    strategies: ClassVar[tuple[StrategyName, ...]] = STRATEGY_NAMES
    product: ClassVar[str] = "Redis"

    def __init__(
        self,
        *,
        url: str | None = None,
        client: Any = None,
        host: str = "127.0.0.1",
        port: int = 6379,
        username: str | None = None,
        password: str | None = None,
        db: int = 0,
        ssl: bool = False,
        cluster: bool = False,
        client_options: dict[str, Any] | None = None,
        strategy: str | dict[str, Any] = "lease",
        key_prefix: str = "anarchon",
    ) -> None:
        self.strategy = parse_strategy(strategy, backend=self.product, allowed=self.strategies)
        self._slot_order = SlotOrder()
        if not isinstance(key_prefix, str) or not key_prefix or set("{}") & set(key_prefix):
            raise ConfigurationError(
                "a non-empty string without braces (braces would change the hash tag)",
                option="key_prefix", value=key_prefix,
            )
        if client is not None and url is not None:
            raise ConfigurationError(
                "give either client= or url=, not both", option="url", value=redact_value(url)
            )
        if url is not None:
            self._check_url(url)
        if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            raise ConfigurationError("a TCP port from 1 to 65535", option="port", value=port)
        if not isinstance(db, int) or isinstance(db, bool) or db < 0:
            raise ConfigurationError("a database number, 0 or more", option="db", value=db)
        if cluster and db:
            raise ConfigurationError("Redis Cluster has database 0 only", option="db", value=db)
        self.key_prefix = key_prefix
        self._url = url
        self._given = client
        self._host = host
        self._port = port
        self._username = username
        self._password = password
        self._db = db
        self._ssl = ssl
        self._cluster = cluster
        self._client_options = dict(client_options or {})
        self._clients: dict[asyncio.AbstractEventLoop, Any] = {}
        #: Per loop: bounds script calls in flight below the client's pool (``_gate``).
        self._gates: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}
        self._lock = threading.Lock()
        self._server_version: str | None = None
        self._prepared: dict[str, tuple[int, int]] = {}
        self.dedupe_window_ms = self.strategy.dedupe_window_ms
        self.runs: RedisRunStore | None = (
            RedisRunStore(self) if self.strategy.name == "lease" else None
        )
        if self.strategy.name == "stream-id":
            self.store_now = self._server_now  # its claim script answers "early" by TIME
            # Its claims are a round trip each (in slot order, ordering.py), and a batch
            # is answered when its last claim is: alone, each win is acted on at once.
            self.claim_many = None  # type: ignore[method-assign, assignment]
        if client is None:
            self._client_class()  # fail now, with the extra to install, if the library is missing

    def _check_url(self, url: object) -> None:
        """Refuse a URL the client library would fail on later, with the value redacted."""
        schemes = self.driver.url_schemes
        expected = f"a URL with one of the schemes {', '.join(s + '://' for s in schemes)}"
        if not isinstance(url, str):
            raise ConfigurationError(expected, option="url", value=redact_value(url))
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - raises ValueError on a port that is not a number
        except ValueError:  # its message may quote a password that ended the host early
            raise ConfigurationError(
                f"{expected}, a host and a numeric port", option="url", value=redact_url(url)
            ) from None
        if parts.scheme.lower() not in schemes:
            raise ConfigurationError(expected, option="url", value=redact_url(url))

    # -- connections --------------------------------------------------------------------

    def _client_class(self) -> Any:
        try:
            return self.driver.cluster_class() if self._cluster else self.driver.client_class()
        except ImportError as error:
            cls = type(self)
            raise self.driver.missing(error, f"{cls.__module__}.{cls.__qualname__}") from error

    def _new_client(self, **extra: Any) -> Any:
        cls = self._client_class()
        options = {**self._client_options, **extra}
        if self._url is not None:
            return cls.from_url(self._url, **options)
        if self._cluster:
            return cls(
                host=self._host, port=self._port, username=self._username,
                password=self._password, ssl=self._ssl, **options,
            )
        return cls(
            host=self._host, port=self._port, username=self._username,
            password=self._password, db=self._db, ssl=self._ssl, **options,
        )

    def client(self) -> Any:
        """The client for the running event loop (the given one, or one made for this loop)."""
        if self._given is not None:
            return self._given
        loop = asyncio.get_running_loop()
        with self._lock:
            client = self._clients.get(loop)
            if client is None:
                for old in [old for old in self._clients if old.is_closed()]:
                    _abandon(self._clients.pop(old))
                    self._gates.pop(old, None)
                client = self._clients[loop] = self._new_client()
            return client

    async def close(self) -> None:
        """Close the clients this backend made; a client given with ``client=`` stays open."""
        with self._lock:
            clients, self._clients = self._clients, {}
            self._gates = {}
        try:
            here: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        for loop, client in clients.items():
            if loop is here:
                with contextlib.suppress(Exception):
                    await client.aclose()
            elif loop.is_running():
                with contextlib.suppress(Exception):
                    asyncio.run_coroutine_threadsafe(client.aclose(), loop)
            else:
                _abandon(client)

    async def eval(
        self, script: Script, keys: Sequence[str | bytes], args: Sequence[Any]
    ) -> Any:
        """Run a script by its SHA (loading it with EVAL when the server lacks it), retrying
        on a dropped connection: every script is safe to repeat with the same arguments."""
        client = self.client()
        retry_on = self.driver.connection_errors()
        no_script = self.driver.no_script_error()
        for attempt in range(RETRIES):
            try:
                async with self._gate(client):
                    try:
                        return await client.evalsha(script.sha, len(keys), *keys, *args)
                    except no_script:
                        return await client.eval(script.source, len(keys), *keys, *args)
            except retry_on:
                if attempt == RETRIES - 1:
                    raise
                await asyncio.sleep(0.02 * 4**attempt)
        raise AssertionError("unreachable")

    def _gate(self, client: Any) -> contextlib.AbstractAsyncContextManager[Any]:
        """At most the pool's size, less a spare tenth, of script calls in flight on this
        loop: a burst of runs ending together waits for a connection here instead of
        failing with the pool's "too many connections" and retrying after a backoff. The
        spare is for the wake-up listener, history reads and the like."""
        size = getattr(getattr(client, "connection_pool", None), "max_connections", None)
        if not isinstance(size, int) or size < 2:
            return contextlib.nullcontext()  # a cluster (a pool per node) or a tiny pool
        loop = asyncio.get_running_loop()
        gate = self._gates.get(loop)
        if gate is None:
            gate = self._gates[loop] = asyncio.Semaphore(max(size - max(size // 10, 1), 1))
        return gate

    def is_cluster(self) -> bool:
        """Whether the client talks to a Redis Cluster: a script there touches one node."""
        return hasattr(self.client(), "get_node_from_key")

    async def eval_many(
        self, calls: Sequence[tuple[Script, Sequence[str | bytes], Sequence[Any]]]
    ) -> list[Any]:
        """Several script calls in one round trip (a pipeline, not a transaction)."""
        if len(calls) <= 1:
            return [await self.eval(*call) for call in calls]
        client = self.client()
        if self.is_cluster():
            # A cluster pipeline refuses scripts; the cluster client sends to every node at once.
            return list(await asyncio.gather(*(self.eval(*call) for call in calls)))
        retry_on = self.driver.connection_errors()
        no_script = self.driver.no_script_error()
        for attempt in range(RETRIES):
            try:
                pipe = client.pipeline(transaction=False)
                for script, keys, args in calls:
                    pipe.evalsha(script.sha, len(keys), *keys, *args)
                async with self._gate(client):
                    results = list(await pipe.execute(raise_on_error=False))
                break
            except retry_on:
                if attempt == RETRIES - 1:
                    raise
                await asyncio.sleep(0.02 * 4**attempt)
        for i, result in enumerate(results):
            if isinstance(result, no_script):
                results[i] = await self.eval(*calls[i])
            elif isinstance(result, BaseException):
                raise result
        return results

    # -- keys -------------------------------------------------------------------------

    def job_key(self, job: str) -> str:
        """The prefix of every key of ``job``; the braces make them one cluster slot."""
        return f"{self.key_prefix}:{_tagged(job)}"

    def history_keys(self, job: str) -> list[str]:
        base = self.job_key(job)
        return [f"{base}:hc", f"{base}:hr", f"{base}:hs", f"{base}:he", f"{base}:hm"]

    # -- the Backend contract ----------------------------------------------------------

    async def server_version(self) -> str:
        """The server's version string (``redis_version`` or ``valkey_version``)."""
        if self._server_version is None:
            info = await self.client().info("server")
            if isinstance(info, dict) and info and all(isinstance(v, dict) for v in info.values()):
                info = next(iter(info.values()))  # a cluster client answers per node
            version = info.get("valkey_version") or info.get("redis_version") or "unknown"
            self._server_version = _text(version)
        return self._server_version

    async def init(self) -> None:
        """Reach the server and check that it can run the strategy."""
        version = await self.server_version()
        if self.strategy.name == "idmp":
            found = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
            needed = ".".join(map(str, IDMP_MIN_VERSION))
            if len(found) < 2 or found < IDMP_MIN_VERSION:
                raise ConfigurationError(
                    f"the idmp strategy needs Redis {needed} or later (XADD ... IDMP); "
                    f"{self.describe_server()} runs version {version}",
                    option="strategy", value="idmp",
                )

    async def prepare_job(self, job: str, history_size: int) -> None:
        if self.strategy.name == "idmp":
            await self._prepare_idmp(job)

    async def _prepare_idmp(self, job: str) -> None:
        """Create the job's stream and set its IDMP settings, only when they differ: XCFGSET
        clears what the server remembers, so an unchanged setting must not be sent again."""
        wanted = (self.strategy.duration_sec, self.strategy.max_size)
        if self._prepared.get(job) == wanted:
            return
        client = self.client()
        key = f"{self.job_key(job)}:s"
        if not await client.exists(key):
            # MAXLEN 0 creates the stream empty; the id is not a slot of any strategy.
            await client.execute_command("XADD", key, "MAXLEN", "0", "*", "init", "1")
        info = await client.execute_command("XINFO", "STREAM", key)
        current = _idmp_settings(info)
        if current != wanted:
            await client.execute_command(
                "XCFGSET", key, "IDMP-DURATION", wanted[0], "IDMP-MAXSIZE", wanted[1]
            )
        self._prepared[job] = wanted

    def check_job(self, job: JobLimits) -> None:
        if self.strategy.name != "idmp":
            return
        window = min(self.strategy.duration_sec * 1000, self.strategy.max_size * job.min_gap_ms)
        if job.jitter_ms + job.max_late_ms >= window:
            raise ConfigurationError(
                f"the idmp strategy remembers a claim for min(duration_sec x 1000, max_size x "
                f"the smallest gap) = {window:g} ms, no longer than jitter + max_late = "
                f"{job.jitter_ms + job.max_late_ms} ms; raise duration_sec or max_size, or "
                "lower max_late",
                job=job.name, option="max_late", value=job.max_late_ms,
            )

    def _claim_call(self, input: ClaimInput) -> tuple[Script, list[str], list[Any]]:
        base = self.job_key(input.job)
        hist = self.history_keys(input.job)
        common = [input.slot, input.token, input.instance_id]
        tail = [input.history_size, _opt(input.history_ttl_ms)]
        name = self.strategy.name
        if name == "stream-id":
            args = [*common, self.strategy.maxlen, *tail]
            return scripts.STREAM_CLAIM, [f"{base}:s", *hist], args
        if name == "idmp":
            return (
                scripts.IDMP_CLAIM,
                [f"{base}:s", *hist],
                [*common, input.job, *tail, self.strategy.maxlen],
            )
        return (
            scripts.CLAIM_KEY,
            [f"{base}:c:{input.slot}", *hist],
            [*common, self.strategy.window_ms, *tail],
        )

    async def _server_now(self, job: str) -> int:
        """The clock of the server that holds ``job``'s keys (``store_now``, ``runs.now_ms``)."""
        return int(await self.eval(scripts.NOW, [f"{self.job_key(job)}:s"], []))

    async def claim(self, input: ClaimInput) -> bool:
        if self.strategy.name != "stream-id":
            return self._claimed(input, await self.eval(*self._claim_call(input)))
        await self._slot_order.wait_turn(input.job, input.slot)
        try:
            reply = int(await self.eval(*self._claim_call(input)))
            while reply < 0:  # ahead of the server's clock: wait for the slot
                await asyncio.sleep(min(-reply, EARLY_WAIT_CAP_MS) / 1000)
                reply = int(await self.eval(*self._claim_call(input)))
        except BaseException:
            self._slot_order.failed(input.job, input.slot)
            raise
        self._slot_order.answered(input.job, input.slot)
        return self._claimed(input, reply)

    async def claim_many(self, inputs: list[ClaimInput]) -> list[bool]:
        results = await self.eval_many([self._claim_call(i) for i in inputs])
        return [self._claimed(i, r) for i, r in zip(inputs, results, strict=True)]

    def _claimed(self, input: ClaimInput, reply: Any) -> bool:
        """Whether a claim script's reply is a win; says so loudly when the slot is lost."""
        answer = int(reply)
        if answer == scripts.STREAM_PASSED:
            logger.warning(
                "stream-id: slot %s of job %r is lost: nobody claimed it, and it can no longer "
                "be claimed because a later slot of the job was claimed first (XADD only "
                "accepts a larger ID); use the 'lease' or 'script' strategy for jobs whose "
                "claims may arrive out of order (docs/backends/redis.md)",
                iso(input.slot), input.job,
            )
        return answer == 1

    async def record_manual_run(self, input: ClaimInput) -> int | None:
        """Record a manual run; a slot that already has one moves on by 1 ms (returned)."""
        slot = await self.eval(
            scripts.MANUAL,
            self.history_keys(input.job),
            [input.slot, input.token, input.instance_id, input.history_size,
             _opt(input.history_ttl_ms)],
        )
        slot = int(slot)
        return None if slot == input.slot else slot

    async def save_result(
        self, job: str, result: StoredResult, history_size: int, history_ttl_ms: int | None = None
    ) -> None:
        await self.eval(
            scripts.SAVE_RESULT,
            self.history_keys(job),
            _result_args(result, history_size, history_ttl_ms),
        )

    async def history(self, job: str, limit: int) -> list[RunRecord]:
        if limit <= 0:
            return []
        hc, hr, hs, _, _ = self.history_keys(job)
        raw_claims, raw_results = await self.eval(scripts.HISTORY, [hc, hr, hs], [limit])
        claims = [_claim_record(json.loads(_text(c))) for c in raw_claims if c]
        results = [StoredResult.from_dict(json.loads(_text(r))) for r in raw_results if r]
        return build_history(job, claims, results, limit)

    # -- descriptions -------------------------------------------------------------------

    def describe_server(self) -> str:
        """Where the server is, without a password."""
        if self._url is not None:
            return redact_url(self._url)
        if self._given is not None:
            kwargs = getattr(getattr(self._given, "connection_pool", None), "connection_kwargs", {})
            if "host" in kwargs:
                return f"{kwargs['host']}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"
            return "the given client"
        where = f"{self._host}:{self._port}"
        return where if self._cluster else f"{where}/{self._db}"

    def wakeups(self) -> AsyncIterator[Wakeup] | None:
        """Pub/sub on a connection of its own (``wake.py``); none on Redis Cluster."""
        return None if self._cluster else wake.listen(self)

    async def wake(self, hint: Wakeup) -> None:
        if not self._cluster:
            await wake.publish(self, hint)

    def describe(self) -> str:
        kind = f"{self.name} cluster" if self._cluster else self.name
        return f"{kind} {self.describe_server()} ({self.strategy.describe()})"


def _idmp_settings(info: Any) -> tuple[int, int] | None:
    """IDMP duration and max size from an XINFO STREAM reply (a flat list or a dict)."""
    if isinstance(info, (list, tuple)):
        info = {_text(info[i]): info[i + 1] for i in range(0, len(info) - 1, 2)}
    if not isinstance(info, dict):
        return None
    fields = {_text(k).lower(): v for k, v in info.items()}
    duration = fields.get("idmp-duration")
    size = fields.get("idmp-maxsize")
    if duration is None or size is None:
        return None
    return int(duration), int(size)


def _claim_record(data: dict[str, Any]) -> ClaimRecord:
    return ClaimRecord(
        slot=int(data["slot"]),
        by=str(data["by"]),
        at=int(data["at"]),
        manual=bool(data.get("manual", False)),
        attempt=int(data.get("attempt", 1)),
        reason=data.get("reason", "scheduled"),
    )


class RedisRunStore(LedgerCalls):
    """The lease rules (SPEC sections 5 and 9) in Lua: each call is one script, on the
    server's clock, so retention, the early answer and the sweep agree across instances.
    With the ledger and pauses (``LedgerStore``, ``ledger.py``)."""

    def __init__(self, backend: RedisProtocolBackend) -> None:
        self._backend = backend
        # Thread-safe (the sync twins claim from threads of their own), least recently
        # used out first.
        self._claim_parts = functools.lru_cache(maxsize=CLAIM_PARTS_KEPT)(self._new_claim_parts)

    def _run_key(self, job: str, slot: int) -> str:
        return f"{self._backend.job_key(job)}:r:{slot}"

    def _parts_of(self, c: RunClaim) -> _ClaimParts:
        return self._claim_parts(
            c.job, c.instance_id, c.lease_ms, c.overlap, c.max_attempts, c.max_late_ms,
            c.keep_ms, c.history_size, c.history_ttl_ms, c.buffer_limit,
        )

    def _claim_call(self, c: RunClaim) -> tuple[Script, list[str | bytes], list[Any]]:
        parts = self._parts_of(c)
        keys: list[str | bytes] = [f"{parts.base}:r:{c.slot}", *parts.keys]
        args: list[Any] = [
            c.slot, c.token, parts.option_set[0], c.mode, c.reason, *parts.options,
            _cancel_arg(c), *parts.tail,
        ]
        return scripts.RUN_CLAIM, keys, args

    def _new_claim_parts(
        self, job: str, instance_id: str, lease_ms: int, overlap: str, max_attempts: int,
        max_late_ms: int | None, keep_ms: int | None, history_size: int,
        history_ttl_ms: int | None, buffer_limit: int,
    ) -> _ClaimParts:
        """What every claim of ``job`` with these options sends alike (every field of the
        claim but its slot, token, mode and reason: they are the cache's key)."""
        base = self._backend.job_key(job)
        keys = [f"{base}{suffix}" for suffix in scripts.CLAIM_KEY_SUFFIXES]
        options = [lease_ms, overlap, max_attempts, _opt(max_late_ms), _opt(keep_ms),
                   history_size, _opt(history_ttl_ms), f"{base}:r:", DEFAULT_KEEP_MS,
                   MIN_KEEP_MS, buffer_limit]
        tail = [buffer_hold_ms(lease_ms), BUFFER_WAIT_CAP_MS]
        option_set = _encoded([
            instance_id, lease_ms, overlap, max_attempts, _opt(max_late_ms), _opt(keep_ms),
            history_size, _opt(history_ttl_ms), DEFAULT_KEEP_MS, MIN_KEEP_MS, buffer_limit,
            *tail,
        ])
        return _ClaimParts(
            base, _encoded(keys), _encoded(options), _encoded(tail), base.encode(),
            tuple(option_set),
        )

    async def claim(self, input: RunClaim) -> ClaimOutcome:
        return _outcome(await self._backend.eval(*self._claim_call(input)))

    async def claim_many(self, claims: list[RunClaim]) -> list[ClaimOutcome]:
        """One script call (RUN_CLAIM_MANY) for the whole batch where one node holds every
        job, seven arguments a claim and one reply for all; on a cluster one per claim."""
        if len(claims) <= 1 or self._backend.is_cluster():
            calls = [self._claim_call(c) for c in claims]
            return [_outcome(r) for r in await self._backend.eval_many(calls)]
        numbers: dict[tuple[bytes, ...], int] = {}  # option set -> its number, from 1
        sets: list[bytes] = []
        per_claim: list[Any] = []
        for c in claims:
            parts = self._parts_of(c)
            number = numbers.get(parts.option_set)
            if number is None:
                number = numbers[parts.option_set] = len(numbers) + 1
                sets += parts.option_set
            per_claim += (parts.prefix, c.slot, c.token, c.mode, c.reason,
                          _cancel_arg(c), number)
        reply = await self._backend.eval(scripts.RUN_CLAIM_MANY, [], [len(numbers), *sets,
                                                                       *per_claim])
        return [_outcome(word.split(":")) for word in _text(reply).split(" ")]

    async def peek_many(self, claims: list[RunClaim]) -> list[ClaimOutcome | None]:
        """What each claim would be answered where it would change nothing, read in one
        script call (one per claim on a cluster, whose nodes hold different jobs); ``None``
        where the claim must decide. Three short arguments a claim, not thirty."""
        if not claims:
            return []
        calls = [
            (self._run_key(c.job, c.slot), (c.token, c.max_attempts, _opt(c.keep_ms)))
            for c in claims
        ]
        if self._backend.is_cluster():
            replies = await self._backend.eval_many(
                [(scripts.RUN_PEEK, [key], args) for key, args in calls]
            )
            words = [_text(reply) for reply in replies]
        else:
            reply = await self._backend.eval(
                scripts.RUN_PEEK, [key for key, _ in calls], [a for _, args in calls for a in args]
            )
            words = _text(reply).split(" ")
        return [_peeked(word) for word in words]

    async def heartbeat(self, job: str, slot: int, token: str, lease_ms: int) -> bool:
        done = await self._backend.eval(
            scripts.HEARTBEAT, [self._run_key(job, slot)], [token, lease_ms]
        )
        return int(done) == 1

    async def finish(self, job: str, slot: int, token: str, status: FinalStatus) -> bool:
        base = self._backend.job_key(job)
        done = await self._backend.eval(
            scripts.FINISH,
            [f"{base}:r:{slot}", f"{base}:active"],
            [token, status, slot, DEFAULT_KEEP_MS, MIN_KEEP_MS],
        )
        return int(done) == 1

    async def finish_many(self, ends: list[RunEnd]) -> list[bool]:
        """Each end's finish, then its record if that acted: one script call for them all
        where one node holds every job (FINISH_RESULT_MANY), else one script per end."""
        if len(ends) > 1 and not self._backend.is_cluster():
            args: list[Any] = [DEFAULT_KEEP_MS, MIN_KEEP_MS]
            for end in ends:
                args += (self._backend.job_key(end.job), end.slot, end.token, end.status,
                         *_result_args(end.result, end.history_size, end.history_ttl_ms))
            reply = _text(await self._backend.eval(scripts.FINISH_RESULT_MANY, [], args))
            return [digit == "1" for digit in reply]
        calls = []
        for end in ends:
            base = self._backend.job_key(end.job)
            calls.append((
                scripts.FINISH_RESULT,
                [f"{base}:r:{end.slot}", f"{base}:active", *self._backend.history_keys(end.job)],
                [end.token, end.status, end.slot, DEFAULT_KEEP_MS, MIN_KEEP_MS,
                 *_result_args(end.result, end.history_size, end.history_ttl_ms)],
            ))
        return [int(done) == 1 for done in await self._backend.eval_many(calls)]

    async def release(self, job: str, slot: int, token: str) -> bool:
        done = await self._backend.eval(scripts.RELEASE, [self._run_key(job, slot)], [token])
        return int(done) == 1

    async def now_ms(self, job: str) -> int:
        """The clock of the server that holds ``job``'s runs (optional capability)."""
        return await self._backend._server_now(job)

    async def active(self, job: str) -> list[ActiveRun]:
        base = self._backend.job_key(job)
        rows = await self._backend.eval(scripts.ACTIVE, [f"{base}:active"], [f"{base}:r:"])
        return [
            ActiveRun(slot=int(slot), attempt=int(attempt), alive=int(alive) == 1)
            for slot, attempt, alive in rows
        ]


def _peeked(word: str) -> ClaimOutcome | None:
    """One word of RUN_PEEK's answer."""
    if word == "-":
        return None
    return ClaimOutcome.done() if word == "d" else ClaimOutcome.running(int(word[1:]))


def _outcome(reply: Any) -> ClaimOutcome:
    kind, number = _text(reply[0]), int(reply[1])
    if kind == "won":
        return ClaimOutcome.won(number, cancelled=int(reply[2]) if len(reply) > 2 else None)
    if kind == "buffered":
        return ClaimOutcome.buffered(number, int(reply[2]))
    if kind == "running":
        return ClaimOutcome.running(number)
    if kind == "overlap":
        return ClaimOutcome.overlap(number)
    if kind == "late":
        return ClaimOutcome.late(number)
    if kind == "early":
        return ClaimOutcome.early(number)
    if kind == "none":
        return ClaimOutcome.none()
    if kind == "paused":
        return ClaimOutcome.paused()
    return ClaimOutcome.done()
