"""The worker's HTTP endpoints: ``/livez`` and ``/readyz`` (asyncio), ``/metrics`` (extra).

The health server is a plain asyncio server on the worker's own loop, so that an answer
proves the loop answers: a handler that blocks the loop makes the probe time out, which
is what a liveness probe is for. ``/readyz`` asks each scheduler's store a cheap read
(``history(job, 1)``) bounded by ``READY_TIMEOUT_S``; its failure is one line naming the
scheduler and the error's class, never the error's text (it may carry a URL).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from django.core.management.base import CommandError

if TYPE_CHECKING:
    from django_anarchon.engine import Scheduler

logger = logging.getLogger("django_anarchon")

#: How long the store of each scheduler has to answer ``/readyz``'s read.
READY_TIMEOUT_S = 2.0
#: How long a client has to send its request line and headers.
REQUEST_TIMEOUT_S = 5.0
MAX_REQUEST_BYTES = 8192

_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}


def check_port(value: str, option: str) -> int:
    """A TCP port for ``option`` (0 means any free one), or a one-line ``CommandError``."""
    try:
        port = int(value)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise CommandError(f"{option} {value!r}: expected a TCP port number (0-65535)")
    return port


def listen_error(option: str, address: str, port: int, exc: OSError) -> CommandError:
    why = os.strerror(exc.errno) if exc.errno else str(exc)  # asyncio's text repeats the address
    return CommandError(f"{option} {port}: cannot listen on {address}:{port}: {why}")


def url(address: str, port: int, path: str) -> str:
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{port}{path}"


def start_metrics_server(schedulers: Sequence[Scheduler], address: str, port: int) -> tuple[Any, int]:
    """Register the schedulers' metrics and serve them from a thread; ``(server, port)``.

    A clear one-line error when the ``[prometheus]`` extra is missing or the port is taken.
    """
    try:
        from prometheus_client import start_http_server

        from django_anarchon.contrib.prometheus import register
    except ImportError as exc:
        raise CommandError(
            "--metrics-port needs prometheus-client: pip install 'django-anarchon[prometheus]'"
        ) from exc
    try:
        server, _thread = start_http_server(port, addr=address)
    except OSError as exc:
        raise listen_error("--metrics-port", address, port, exc) from exc
    for scheduler in schedulers:
        register(scheduler)
    return server, int(server.server_address[1])


def start_traces(schedulers: Sequence[Scheduler]) -> str:
    """Instrument the schedulers (``contrib.otel``); what the banner says of the provider."""
    from django_anarchon.contrib.otel import HAVE_OTEL, instrument

    if not HAVE_OTEL:
        raise CommandError(
            "--traces needs opentelemetry-api: pip install 'django-anarchon[otel]'"
        )
    from opentelemetry import trace

    for scheduler in schedulers:
        instrument(scheduler)
    provider = trace.get_tracer_provider()
    if type(provider).__name__ in ("ProxyTracerProvider", "NoOpTracerProvider"):
        return "OpenTelemetry, but no tracer provider is set: spans go nowhere"
    return f"OpenTelemetry ({type(provider).__module__}.{type(provider).__qualname__})"


def flush_traces() -> None:
    """Export the spans still buffered (a batch processor) before the worker exits."""
    from opentelemetry import trace

    flush = getattr(trace.get_tracer_provider(), "force_flush", None)
    if callable(flush):
        try:
            flush()
        except Exception:
            logger.exception("flushing the OpenTelemetry spans failed")


class HealthServer:
    """``/livez`` and ``/readyz`` for the schedulers of one worker."""

    def __init__(self, schedulers: Sequence[Scheduler], stopping: Callable[[], bool]) -> None:
        self.schedulers = schedulers
        self.stopping = stopping
        self.started: set[str] = set()  # aliases whose start() returned
        self.server: asyncio.Server | None = None
        self._ready: asyncio.Task[str | None] | None = None

    async def start(self, address: str, port: int) -> int:
        try:
            self.server = await asyncio.start_server(
                self._serve, address, port, family=socket.AF_UNSPEC, reuse_address=True
            )
        except OSError as exc:
            raise listen_error("--health-port", address, port, exc) from exc
        return int(self.server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
        if self._ready is not None:
            self._ready.cancel()

    def live(self) -> str | None:
        """``None`` when alive, else why not.

        A worker still waiting for its store at start is alive (restarting it would not
        bring the store back) but not ready; once stopping, or with a started scheduler
        no longer running, it is not alive.
        """
        if self.stopping():
            return "the worker is stopping"
        for scheduler in self.schedulers:
            if scheduler.name in self.started and not scheduler.running:
                return f"scheduler {scheduler.name!r} is not running"
        return None

    async def ready(self) -> str | None:
        """``None`` when every store answered in time, else one line saying which did not."""
        reason = self.live()
        if reason is not None:
            return reason
        for scheduler in self.schedulers:
            if scheduler.name not in self.started:
                return f"scheduler {scheduler.name!r} is still starting (waiting for its store)"
        # Concurrent probes share one round of reads, so a slow store never piles them up.
        if self._ready is None or self._ready.done():
            self._ready = asyncio.ensure_future(self._ask_stores())
        return await asyncio.shield(self._ready)

    async def _ask_stores(self) -> str | None:
        for scheduler in self.schedulers:
            jobs = scheduler.jobs()
            job = jobs[0].name if jobs else "anarchon-readyz"
            try:
                async with asyncio.timeout(READY_TIMEOUT_S):
                    await scheduler.backend.history(job, 1)
            except TimeoutError:
                return (f"the store of scheduler {scheduler.name!r} did not answer within "
                        f"{READY_TIMEOUT_S:g}s")
            except Exception as exc:
                return f"the store of scheduler {scheduler.name!r} failed: {type(exc).__name__}"
        return None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                async with asyncio.timeout(REQUEST_TIMEOUT_S):
                    head = await reader.readuntil(b"\r\n\r\n")
            except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                return
            if len(head) > MAX_REQUEST_BYTES:
                return
            parts = head.split(b"\r\n", 1)[0].decode("latin-1").split()
            method, path = (parts[0], parts[1].split("?", 1)[0]) if len(parts) >= 2 else ("", "")
            if method not in ("GET", "HEAD"):
                status, body = 405, "only GET and HEAD"
            elif path == "/livez":
                reason = self.live()
                status, body = (200, "ok") if reason is None else (503, reason)
            elif path == "/readyz":
                reason = await self.ready()
                status, body = (200, "ok") if reason is None else (503, reason)
            else:
                status, body = 404, "try /livez or /readyz"
            data = (body + "\n").encode()
            writer.write(
                f"HTTP/1.1 {status} {_REASONS[status]}\r\n"
                "Content-Type: text/plain; charset=utf-8\r\n"
                f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
                + (b"" if method == "HEAD" else data)
            )
            await writer.drain()
        except ConnectionError:
            pass
        except Exception:
            logger.exception("the health endpoint failed")
        finally:
            writer.close()
