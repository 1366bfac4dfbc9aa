"""The real RabbitMQ and NATS servers of the broker tests, a proxy that cuts, and restarts.

* ``rabbitmq_url()`` / ``nats_url()``: the local servers (or ``ANARCHON_RABBITMQ_URL`` /
  ``ANARCHON_NATS_URL``); unreachable means fail under CI and skip, loudly, elsewhere.
* ``CuttingProxy``: a loopback TCP proxy that forwards both ways until told to swallow
  replies; then the server acts on what the client sent, the client never hears back,
  and ``cut()`` closes every connection (a connection lost between request and answer).
* ``restart_rabbitmq()`` / ``restart_nats()``: stop the real server and start it again;
  ``ensure_rabbitmq_up()`` / ``ensure_nats_up()`` bring it back whatever happened (call
  them in ``finally``: other tests share these servers).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from .support import run_workers_and_count, unavailable, wait_for

RABBITMQ_URL = os.environ.get("ANARCHON_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")
NATS_URL = os.environ.get("ANARCHON_NATS_URL", "nats://127.0.0.1:4222")
NATS_SERVER = "/usr/sbin/nats-server"
NATS_ARGS = [
    "-a", "127.0.0.1", "-p", "4222", "-js", "-sd", "/var/lib/nats-server",
    "-l", "/var/log/nats-server.log",
]


def _host_port(url: str, default_port: int) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or default_port


def _answers(host: str, port: int, greeting: bytes, send: bytes = b"") -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0) as sock:
            if send:
                sock.sendall(send)
            sock.settimeout(1.0)
            return sock.recv(64).startswith(greeting)
    except OSError:
        return False


def _amqp_answers(host: str = "127.0.0.1", port: int = 5672) -> bool:
    # A client sends the protocol header; a broker answers with connection.start (frame 1).
    return _answers(host, port, b"\x01", send=b"AMQP\x00\x00\x09\x01")


def _nats_answers(host: str = "127.0.0.1", port: int = 4222) -> bool:
    return _answers(host, port, b"INFO")


def rabbitmq_url() -> str:
    host, port = _host_port(RABBITMQ_URL, 5672)
    if not _amqp_answers(host, port):
        unavailable(f"no RabbitMQ answers at {host}:{port} (set ANARCHON_RABBITMQ_URL)")
    return RABBITMQ_URL


def nats_url() -> str:
    host, port = _host_port(NATS_URL, 4222)
    if not _nats_answers(host, port):
        unavailable(f"no NATS server answers at {host}:{port} (set ANARCHON_NATS_URL)")
    return NATS_URL


async def delete_nats_streams(url: str, prefix: str) -> None:
    """Delete the JetStream streams whose names start with ``prefix`` (test clean-up)."""
    import nats

    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        for info in await js.streams_info():
            name = info.config.name or ""
            if name.startswith(prefix):
                await js.delete_stream(name)
    finally:
        await nc.close()


def delete_queues(url: str, prefix: str) -> None:
    """Delete the queues (history streams) whose names start with ``prefix``.

    AMQP cannot list queues, so the names come from ``rabbitmqctl`` when it is here.
    """
    if shutil.which("rabbitmqctl") is None:
        return
    listed = _run("rabbitmqctl", "list_queues", "-q", "--no-table-headers", "name")
    names = [n.strip() for n in listed.stdout.splitlines() if n.strip().startswith(prefix)]

    async def delete() -> None:
        import aio_pika

        connection = await aio_pika.connect(url)
        try:
            for name in names:
                channel = await connection.channel()
                await channel.queue_delete(name)
                await channel.close()
        finally:
            await connection.close()

    if names:
        asyncio.run(delete())


def closed_port() -> int:
    """A loopback port with nothing listening (bound once, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def init_fails_in_time(backend: Any, within_s: float) -> str:
    """``backend.init()`` on an unreachable server: ``ConnectionError`` within ``within_s``.

    Returns the error's text (one line). A hang fails the test at the deadline.
    """
    started = time.monotonic()
    try:
        await asyncio.wait_for(backend.init(), within_s + 10)
    except ConnectionError as exc:
        elapsed = time.monotonic() - started
        assert elapsed < within_s, f"init() took {elapsed:.1f}s to fail: {exc}"
        text = str(exc)
        assert "\n" not in text, text
        return text
    except TimeoutError:
        raise AssertionError(f"init() still hung after {within_s + 10:.0f}s") from None
    finally:
        await backend.close()
    raise AssertionError("init() succeeded against a closed port")


# -- one backend object shared by many coroutines ------------------------------------


async def race_one_shared_backend(
    backend: Any, *, claimers: int = 50, rounds: int = 40, job: str = "shared"
) -> None:
    """``claimers`` coroutines claim each of ``rounds`` slots through ONE backend object.

    Each round has exactly one winner, whose retry with the same token is still a win;
    history writes and reads (a manual run, a result, ``history()``) run alongside the
    claims. The backend should be made with ``retry_for="0s"``: a broken connection
    then fails the race instead of hiding behind a retry.
    """
    from django_anarchon.backends.base import ClaimInput, StoredResult

    await backend.init()
    await backend.prepare_job(job, 20)
    slot0 = time.time_ns() // 1_000_000
    for r in range(rounds):
        slot = slot0 + r
        inputs = [
            ClaimInput(job=job, slot=slot, token=f"r{r}-c{i}", instance_id=f"I{i}")
            for i in range(claimers)
        ]
        result = StoredResult(
            slot=slot - 1, by="I0", attempt=1, status="success", started_at=slot,
            finished_at=slot, duration_ms=0,
        )
        side = [
            backend.record_manual_run(ClaimInput(job=job, slot=slot, token=f"m{r}", instance_id="M")),
            backend.save_result(job, result, 20),
            backend.history(job, 5),
        ]
        answers = await asyncio.gather(*(backend.claim(i) for i in inputs), *side)
        won_by = [i for i, won in zip(inputs, answers, strict=False) if won is True]
        assert len(won_by) == 1, f"round {r}: {len(won_by)} winners: {won_by}"
        assert await backend.claim(won_by[0]) is True, f"round {r}: the winner's retry lost"
    assert len(await backend.history(job, 100)) > 0


async def race_across_connection_loss(
    backends: list[Any], lose: Callable[[], object], *, claimers: int = 10, job: str = "loss"
) -> int:
    """Two or more backend objects race for slot after slot while ``lose()`` cuts them off.

    ``lose()`` (run in a thread) takes the server's side of the connections away (a
    server-side close, a restart). Every slot, before, during and after, has exactly one
    winner among all claimers; afterwards each winner's token still wins and a new token
    loses. Returns how many slots were raced.
    """
    from django_anarchon.backends.base import ClaimInput

    for backend in backends:
        await backend.init()
    slot0 = time.time_ns() // 1_000_000
    winners: dict[int, ClaimInput] = {}

    async def one_round(r: int) -> None:
        inputs = [
            (b, ClaimInput(job=job, slot=slot0 + r, token=f"r{r}-b{n}-c{i}", instance_id=f"B{n}"))
            for n, b in enumerate(backends) for i in range(claimers)
        ]
        answers = await asyncio.gather(*(b.claim(i) for b, i in inputs))
        won_by = [i for (_, i), won in zip(inputs, answers, strict=False) if won is True]
        assert len(won_by) == 1, f"slot {r}: {len(won_by)} winners: {won_by}"
        winners[r] = won_by[0]

    rounds = 0
    for _ in range(5):
        await one_round(rounds)
        rounds += 1
    losing = asyncio.ensure_future(asyncio.to_thread(lose))
    while not losing.done():
        await one_round(rounds)
        rounds += 1
    await losing
    for _ in range(5):
        await one_round(rounds)
        rounds += 1
    for r, won in winners.items():
        assert await backends[r % len(backends)].claim(won) is True, f"slot {r}: winner lost"
        late = ClaimInput(job=job, slot=won.slot, token=f"late-{r}", instance_id="L")
        assert await backends[0].claim(late) is False, f"slot {r}: a second token won"
    return rounds


# -- restarts of the real local servers ----------------------------------------------


def can_restart_rabbitmq() -> bool:
    return shutil.which("rabbitmqctl") is not None and RABBITMQ_URL.startswith(
        "amqp://guest:guest@127.0.0.1:5672"
    )


def can_restart_nats() -> bool:
    return os.path.exists(NATS_SERVER) and NATS_URL == "nats://127.0.0.1:4222"


def _run(*cmd: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def stop_rabbitmq() -> None:
    """Stop the RabbitMQ application (the Erlang node stays up, so start is quick)."""
    _run("rabbitmqctl", "stop_app")


def ensure_rabbitmq_up(timeout: float = 90) -> None:
    """Start RabbitMQ's application (or the whole node) until AMQP answers again."""
    if _amqp_answers():
        return
    _run("rabbitmqctl", "start_app", timeout=timeout)
    deadline = time.monotonic() + timeout
    while not _amqp_answers():
        if time.monotonic() > deadline:
            raise AssertionError("RabbitMQ did not come back")
        if _run("rabbitmqctl", "status", timeout=20).returncode != 0:
            # The node itself is down: start it detached, then its application.
            _run("rabbitmq-server", "-detached", timeout=20)
            time.sleep(3)
            _run("rabbitmqctl", "start_app", timeout=timeout)
        time.sleep(0.5)


def restart_rabbitmq() -> None:
    try:
        stop_rabbitmq()
    finally:
        ensure_rabbitmq_up()


def _nats_pids() -> list[int]:
    out = _run("pidof", "nats-server").stdout.split()
    return [int(p) for p in out]


def stop_nats() -> None:
    """Stop nats-server (SIGTERM, then SIGKILL) and wait until the port is free."""
    for pid in _nats_pids():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while _nats_pids() and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in _nats_pids():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not _nats_answers(), 10, "nats-server stopped")


def ensure_nats_up(timeout: float = 30) -> None:
    """Start nats-server as the machine's service does, and wait until JetStream answers."""
    if not _nats_answers():
        _run(
            "start-stop-daemon", "--start", "--oknodo", "--background", "--exec", NATS_SERVER,
            "--", *NATS_ARGS,
        )
    wait_for(_nats_answers, timeout, "nats-server answering")
    wait_for(_jetstream_ready, timeout, "JetStream ready")


def _jetstream_ready(url: str = NATS_URL) -> bool:
    async def probe() -> bool:
        import nats

        try:
            nc = await nats.connect(url, connect_timeout=1, max_reconnect_attempts=0)
        except Exception:
            return False
        try:
            await nc.jetstream().account_info()
            return True
        except Exception:
            return False
        finally:
            await nc.close()

    return asyncio.run(probe())


def restart_nats() -> None:
    try:
        stop_nats()
    finally:
        ensure_nats_up()


class PrivateNatsServer:
    """A nats-server of the test's own (JetStream on disk in ``store``), on a free port.

    ``restart()`` stops it (SIGTERM: it flushes its streams; or SIGKILL) and starts it again
    on the same port and store, so clients reconnect to the same URL and find their streams.
    """

    def __init__(self, store: Path) -> None:
        self.store = store
        self.port = closed_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> PrivateNatsServer:
        self._process = subprocess.Popen(
            [NATS_SERVER, "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", str(self.store)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        wait_for(lambda: _nats_answers("127.0.0.1", self.port), 15, "private nats-server answering")
        wait_for(lambda: _jetstream_ready(self.url), 15, "private JetStream ready")
        return self

    def stop(self, *, kill: bool = False) -> None:
        if self._process is not None:
            if kill:
                self._process.kill()
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(10)
            self._process = None

    def restart(self, *, down_s: float = 0.0, kill: bool = False) -> None:
        """Stop (``kill``: SIGKILL, no flush), stay down ``down_s`` (the outage), start."""
        self.stop(kill=kill)
        time.sleep(down_s)
        self.start()


def _local_ports_to(remote_port: int) -> set[int]:
    """Local ports of this process's TCP connections to ``remote_port`` (Linux /proc)."""
    inodes = set()
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                local, remote, inode = fields[1], fields[2], fields[9]
                if inode in inodes and int(remote.rsplit(":", 1)[1], 16) == remote_port:
                    ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports


def can_close_rabbitmq_connections() -> bool:
    return shutil.which("rabbitmqctl") is not None and os.path.isdir("/proc/self/net")


def close_my_rabbitmq_connections() -> int:
    """Have the broker close every connection this process holds to it (a server close).

    Only this process's connections: other tests share the broker. Returns how many.
    """
    mine = _local_ports_to(_host_port(RABBITMQ_URL, 5672)[1])
    listed = _run("rabbitmqctl", "list_connections", "-q", "--no-table-headers", "pid", "peer_port")
    closed = 0
    for line in listed.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit() and int(parts[1]) in mine:
            _run("rabbitmqctl", "close_connection", parts[0], "test: connection closed by the broker")
            closed += 1
    return closed


# -- a proxy that loses answers ------------------------------------------------------


class CuttingProxy:
    """Forwards 127.0.0.1:<port> to a server; can swallow replies and cut connections.

    Runs on the test's event loop. ``swallow()`` keeps forwarding what clients send but
    drops what the server answers; ``cut()`` then closes every connection and goes back
    to forwarding, so the client's reconnect (through the proxy) works.
    """

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self.swallowing = False
        self.forwarded_up = 0  # bytes sent by clients to the server
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> CuttingProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def swallow(self) -> None:
        self.swallowing = True

    async def cut(self) -> None:
        """Close every proxied connection (both sides), then forward normally again."""
        writers, self._writers = list(self._writers), set()
        for writer in writers:
            writer.transport.abort()
        self.swallowing = False
        await asyncio.sleep(0)

    async def close(self) -> None:
        await self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._writers.update((writer, up_writer))

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, up: bool) -> None:
            try:
                while data := await src.read(65536):
                    if up:
                        self.forwarded_up += len(data)
                    elif self.swallowing:
                        continue
                    dst.write(data)
                    await dst.drain()
            except (OSError, asyncio.IncompleteReadError):
                pass
            finally:
                dst.transport.abort()

        await asyncio.gather(
            pump(reader, up_writer, True), pump(up_reader, writer, False), return_exceptions=True
        )
        self._writers.discard(writer)
        self._writers.discard(up_writer)


# -- schedulers across a broker restart ------------------------------------------------


async def schedulers_across_restart(
    make_backend: Callable[[], Any],
    restart: Callable[[], None],
    *,
    instances: int = 3,
    jobs: int = 3,
    every_ms: int = 200,
    before_s: float = 1.5,
    runs_after: int = 5,
) -> dict[str, list[int]]:
    """Run ``instances`` schedulers on one broker, restart it mid-run, check exactly once.

    Every job's slots, from the first that ran to the last, must each have run exactly
    once (slots due while the broker was down run late, once it is back), and each job
    must have run ``runs_after`` slots due after the broker came back: the schedulers
    carried on by themselves. Returns the slots that ran, per job.
    """
    from django_anarchon.engine import JobContext, Scheduler

    ran: list[tuple[str, int, str]] = []

    def handler(ctx: JobContext) -> None:
        ran.append((ctx.name, ctx.slot, ctx.instance_id))

    schedulers = [Scheduler(make_backend(), instance_id=f"I{i}") for i in range(instances)]
    names = [f"restart-{uuid.uuid4().hex[:6]}-{j}" for j in range(jobs)]
    for s in schedulers:
        for name in names:
            s.every(name, f"{every_ms}ms", handler)
    for s in schedulers:
        await s.start()
    try:
        await asyncio.sleep(before_s)  # let the schedulers run a while before the restart
        assert ran, "nothing ran before the restart"
        await asyncio.to_thread(restart)
        back = time.time_ns() // 1_000_000

        def carried_on() -> bool:
            return all(
                sum(1 for (n, slot, _) in ran if n == name and slot > back) >= runs_after
                for name in names
            )

        deadline = time.monotonic() + 90
        while not carried_on():
            assert time.monotonic() < deadline, f"no runs after the restart: {sorted(ran)[-5:]}"
            await asyncio.sleep(0.05)
    finally:
        await asyncio.gather(*(s.stop("5s") for s in schedulers))
        for s in schedulers:
            await s.backend.close()
    per_job: dict[str, list[int]] = {}
    counts: dict[tuple[str, int], list[str]] = {}
    for name, slot, by in ran:
        counts.setdefault((name, slot), []).append(by)
        per_job.setdefault(name, []).append(slot)
    twice = {k: v for k, v in counts.items() if len(v) > 1}
    assert not twice, f"slots that ran more than once: {twice}"
    for name, slots in per_job.items():
        slots.sort()
        missing = sorted(set(range(slots[0], slots[-1] + 1, every_ms)) - set(slots))
        assert not missing, f"{name}: slots that never ran: {missing}"
    return per_job


# -- four anarchon_worker processes on one broker -----------------------------------------

ROOT = Path(__file__).resolve().parent.parent
WORKER_JOBS = 10


def four_workers_each_slot_once(out: Path, broker: str, env_extra: dict[str, str]) -> None:
    """Four ``anarchon_worker`` processes on ``broker``, ten jobs every 200 ms: each slot once."""
    job_prefix = f"broker-{broker}-{uuid.uuid4().hex[:6]}"
    env = {
        "DJANGO_SETTINGS_MODULE": "tests.brokerworker.settings",
        "ANARCHON_TEST_BROKER": broker,
        "ANARCHON_TEST_JOB_PREFIX": job_prefix,
        **env_extra,
    }
    run_workers_and_count(out, env, [f"{job_prefix}.{n}" for n in range(WORKER_JOBS)])
