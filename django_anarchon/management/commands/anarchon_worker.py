"""``manage.py anarchon_worker``: run the configured schedulers until SIGINT or SIGTERM.

The worker exits promptly whatever a handler does. ``asyncio.run()`` would wait at the end
for every task, so an async handler that swallows its cancellation would keep a stopped
worker alive forever; the worker instead gives the tasks left after the stop
``EXIT_WAIT_S`` to end once cancelled, then exits without them (their attempts are
already recorded ``interrupted`` and their leases handed over).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from django_anarchon.checks import scheduler_databases
from django_anarchon.durations import format_duration, parse_duration
from django_anarchon.engine.heap import collect_when_quiet, settle
from django_anarchon.exceptions import AnarchonError
from django_anarchon.handler import build_scheduler
from django_anarchon.jobs import check_instance_id
from django_anarchon.redact import describe_backend

from ._output import chosen_aliases, error_line, pause_text, store_errors
from ._probes import HealthServer, check_port, flush_traces, start_metrics_server, start_traces, url

if TYPE_CHECKING:
    from django_anarchon.backends.base import PauseState
    from django_anarchon.engine import Scheduler

logger = logging.getLogger("django_anarchon")

#: How long tasks still pending after the stop get to end once cancelled, and how long the
#: loop's last clean-up (async generators, the default executor) may take, before exiting.
EXIT_WAIT_S = 2.0
#: How long the banner waits for a store's pauses before it says it could not read them.
BANNER_PAUSES_S = 5.0


class Command(BaseCommand):
    help = "Run the scheduled jobs of the configured schedulers until SIGINT or SIGTERM."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--scheduler", action="append", dest="schedulers", metavar="ALIAS",
            help="A scheduler alias from settings.ANARCHON; repeat for several (default: all).",
        )
        parser.add_argument(
            "--instance-id", help="This worker's name in history and leases (default: host-pid-random)."
        )
        parser.add_argument(
            "--grace", default="30s",
            help="How long running jobs may take to finish after SIGINT/SIGTERM (default 30s).",
        )
        parser.add_argument(
            "--spool", metavar="DIR",
            help="Keep records the store cannot take in DIR until a worker replays them "
                 "(default: SPOOL in settings, else a directory under the system's temp dir).",
        )
        parser.add_argument(
            "--health-file", metavar="PATH",
            help="Touch PATH every few seconds while the worker is healthy (a liveness probe).",
        )
        parser.add_argument(
            "--metrics-port", metavar="PORT",
            help="Serve Prometheus metrics on PORT at /metrics (needs the [prometheus] extra).",
        )
        parser.add_argument(
            "--metrics-address", metavar="ADDR", default="0.0.0.0",
            help="The address --metrics-port listens on (default 0.0.0.0).",
        )
        parser.add_argument(
            "--traces", action="store_true",
            help="Trace each attempt with OpenTelemetry, to the global tracer provider "
                 "(needs the [otel] extra).",
        )
        parser.add_argument(
            "--health-port", metavar="PORT",
            help="Answer /livez and /readyz on PORT (Kubernetes liveness and readiness probes).",
        )
        parser.add_argument(
            "--health-address", metavar="ADDR", default="0.0.0.0",
            help="The address --health-port listens on (default 0.0.0.0).",
        )

    def check(self, *args: Any, **kwargs: Any) -> None:
        """The system checks, with the database ones for the schedulers' databases.

        Like ``migrate``, the worker names its databases, so that a database never
        migrated (anarchon.E007) stops it at start with the fix, instead of a worker that
        waits for tables nobody will create. ``--skip-checks`` skips this too.
        """
        kwargs.setdefault("databases", scheduler_databases())
        try:
            super().check(*args, **kwargs)
        except DatabaseError:
            # A database that is down cannot be checked (Django's MySQL check queries it):
            # the start waits for it like for any store outage, so check without it.
            kwargs["databases"] = []
            super().check(*args, **kwargs)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            grace_ms = parse_duration(options["grace"], option="--grace")
        except AnarchonError as exc:
            raise CommandError(str(exc)) from exc
        aliases = chosen_aliases(options["schedulers"])
        overrides = {}
        if options["instance_id"] is not None:
            try:
                overrides["instance_id"] = check_instance_id(
                    options["instance_id"], option="--instance-id"
                )
            except AnarchonError as exc:
                raise CommandError(str(exc)) from exc
        if options["spool"] is not None:
            if not options["spool"]:
                raise CommandError("--spool: expected a directory")
            overrides["spool"] = options["spool"]
        health = None if options["health_file"] is None else _probe_path(options["health_file"])
        metrics_port = health_port = None
        if options["metrics_port"] is not None:
            metrics_port = check_port(options["metrics_port"], "--metrics-port")
        if options["health_port"] is not None:
            health_port = check_port(options["health_port"], "--health-port")
        try:
            schedulers = [build_scheduler(alias, **overrides) for alias in aliases]
        except AnarchonError as exc:
            raise CommandError(str(exc)) from exc
        self._setup_logging(int(options["verbosity"]))
        endpoints: list[str] = []
        metrics_server = None
        if metrics_port is not None:
            address = options["metrics_address"]
            metrics_server, bound = start_metrics_server(schedulers, address, metrics_port)
            endpoints.append(f"  metrics {url(address, bound, '/metrics')}")
        if options["traces"]:
            endpoints.append(f"  traces {start_traces(schedulers)}")
        worker = Worker(schedulers, grace_ms, health, self.stdout.write)
        worker.endpoints = endpoints
        worker.watch_pauses = metrics_server is not None
        if health_port is not None:
            worker.health_at = (options["health_address"], health_port)
        runner = asyncio.Runner()
        try:
            runner.run(worker.run())
        finally:
            if metrics_server is not None:
                metrics_server.shutdown()
                metrics_server.server_close()
            if options["traces"]:
                flush_traces()
            clean = _close_loop(runner)
        if not clean or any(t.is_alive() and not t.daemon for t in threading.enumerate()[1:]):
            # A handler that ignored its abort signal (a thread) or its cancellation (a
            # task) is still running; it was recorded interrupted and its lease released,
            # so exit without waiting for it.
            logger.warning("exiting with handlers still running (recorded interrupted)")
            sys.stdout.flush()
            sys.stderr.flush()
            logging.shutdown()
            os._exit(0)

    def _setup_logging(self, verbosity: int) -> None:
        """Make run lines visible when the project has not configured the logger itself."""
        if logger.handlers or logging.getLogger().handlers or verbosity == 0:
            return
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG if verbosity > 1 else logging.INFO)


def _probe_path(given: str) -> Path:
    """``--health-file``, refused at start unless the worker will be able to touch it.

    A probe that can never be written looks, to the orchestrator, like a worker that
    never became healthy; better to say why at once than to be restarted in a loop.
    """
    path = Path(given)
    folder = path.parent
    if not given or path.is_dir():
        raise CommandError(f"--health-file {given!r} is a directory, not a file")
    if not folder.is_dir():
        raise CommandError(f"--health-file {given!r}: the directory {str(folder)!r} does not exist")
    writable = os.access(path, os.W_OK) if path.exists() else os.access(folder, os.W_OK | os.X_OK)
    if not writable:
        raise CommandError(f"--health-file {given!r} cannot be written by this user")
    return path


def _close_loop(runner: asyncio.Runner) -> bool:
    """Cancel what is left on the loop and close it, each step bounded by ``EXIT_WAIT_S``.

    Returns ``False`` when something would not end in time: the loop is left open and the
    caller exits the process without waiting for it.
    """
    loop = runner.get_loop()
    tasks = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.wait(tasks, timeout=EXIT_WAIT_S))
    stuck = [task for task in tasks if not task.done()]
    if stuck:
        logger.warning(
            "%s task(s) ignored cancellation after the stop: %s",
            len(stuck),
            ", ".join(task.get_name() for task in stuck),
        )
        return False
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            logger.error("error in a task left after the stop: %r", task.exception())
    try:
        loop.run_until_complete(asyncio.wait_for(loop.shutdown_asyncgens(), EXIT_WAIT_S))
        loop.run_until_complete(
            asyncio.wait_for(loop.shutdown_default_executor(), EXIT_WAIT_S)
        )
    except TimeoutError:
        logger.warning("closing the event loop took longer than %ss", EXIT_WAIT_S)
        return False
    runner.close()
    return True


class Worker:
    """Runs schedulers on one event loop; the first signal stops gracefully, a second at once."""

    def __init__(
        self, schedulers: list[Scheduler], grace_ms: int, health_file: Path | None,
        write: Any,
    ) -> None:
        self.schedulers = schedulers
        self.grace_ms = grace_ms
        self.health_file = health_file
        self.write = write
        self.stopping = asyncio.Event()
        self.signals = 0
        self.endpoints: list[str] = []  # banner lines of the HTTP endpoints
        self.health_at: tuple[str, int] | None = None
        self.health: HealthServer | None = None
        #: Refresh ``anarchon_job_paused`` from the stores (set when metrics are served).
        self.watch_pauses = False

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        if self.health_at is not None:  # before anything starts: a taken port stops us at once
            self.health = HealthServer(self.schedulers, self.stopping.is_set)
            address, port = self.health_at
            bound = await self.health.start(address, port)
            self.endpoints.append(f"  health {url(address, bound, '/livez')} and /readyz")
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal, sig)
        for scheduler in self.schedulers:
            if not scheduler.jobs():
                logger.warning(
                    "scheduler %r has no jobs: define them in a jobs.py module of an installed "
                    "app, or import their module from one", scheduler.name,
                )
        failure: CommandError | None = None
        try:
            for scheduler in self.schedulers:
                _log_runs(scheduler)
                try:
                    with store_errors(scheduler.name, scheduler):
                        await scheduler.start()
                except CommandError as exc:  # not an outage (those are waited for)
                    failure = exc
                    break
                if self.health is not None and scheduler.running:
                    self.health.started.add(scheduler.name)
                if self.stopping.is_set():
                    break
            else:
                await self._banner()
                settle()  # what start-up built lives as long as the worker (engine/heap.py)
            if failure is None:
                tasks = [
                    asyncio.create_task(self._pickup_requests()),
                    asyncio.create_task(collect_when_quiet(self.schedulers)),
                ]
                if self.health_file is not None:
                    tasks.append(asyncio.create_task(self._touch_health()))
                if self.watch_pauses:
                    from django_anarchon.contrib.prometheus import watch_pauses

                    tasks.append(asyncio.create_task(watch_pauses(self.schedulers)))
                await self.stopping.wait()
                for task in tasks:
                    task.cancel()
            grace = 0 if self.signals > 1 or failure is not None else self.grace_ms
            logger.info("stopping (grace %s)", format_duration(grace))
            stops = [asyncio.create_task(s.stop(grace=grace / 1000)) for s in self.schedulers]
            done, _ = await asyncio.wait(stops)
            for task in done:
                if task.exception() is not None:
                    logger.error("error while stopping: %s", task.exception())
            for scheduler in self.schedulers:  # built here, so their backends are ours to close
                try:
                    async with asyncio.timeout(EXIT_WAIT_S):  # a store that is down
                        await scheduler.backend.close()
                except TimeoutError:
                    logger.warning("closing the %s backend took longer than %ss: left open",
                                   scheduler.name, EXIT_WAIT_S)
                except Exception:
                    logger.exception("error while closing the %s backend", scheduler.name)
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            if self.health is not None:
                await self.health.close()
        logger.info("stopped")
        if failure is not None:
            raise failure

    def _on_signal(self, sig: signal.Signals) -> None:
        self.signals += 1
        logger.info("received %s", sig.name)
        for scheduler in self.schedulers:
            scheduler.request_stop()  # also ends a start() still waiting for its store
        if self.signals > 1:
            # A second signal: stop at once, whatever is still running.
            for scheduler in self.schedulers:
                scheduler.stop_now()
        self.stopping.set()

    async def _banner(self) -> None:
        for scheduler in self.schedulers:
            self.write(
                f"anarchon worker: scheduler {scheduler.name!r}, "
                f"backend {describe_backend(scheduler.backend)}, instance {scheduler.instance_id}"
            )
            spool = scheduler.owed.spool
            self.write(f"  spool {spool.directory if spool is not None else 'off'}")
            pauses = await _pauses(scheduler)
            if pauses is None:
                self.write("  pauses unknown: the store did not answer (see the log)")
            for info in scheduler.jobs():
                next_run = info.next_run_at.isoformat() if info.next_run_at else "never"
                line = f"  {info.name:<40} {info.schedule:<40} next run {next_run}"
                paused = (pauses or {}).get(info.name)
                if paused is not None:
                    line += f"  PAUSED {pause_text(paused, note_width=60)}"
                self.write(line)
        for line in self.endpoints:
            self.write(line)
        self.write("Press Ctrl+C (SIGINT) or send SIGTERM to stop gracefully.")

    async def _touch_health(self) -> None:
        """Touch the probe while every scheduler runs; a failure is logged once per streak."""
        assert self.health_file is not None
        failing = False
        while True:
            if all(s.running for s in self.schedulers):
                try:
                    self.health_file.touch()
                except OSError as exc:
                    if not failing:
                        logger.warning("cannot touch the health file %s: %s", self.health_file, exc)
                    failing = True
                else:
                    failing = False
            await asyncio.sleep(5)

    async def _pickup_requests(self) -> None:
        """Run the "Run now" requests filed by the admin for these schedulers."""
        from django_anarchon.run_requests import pickup_loop

        await pickup_loop(self.schedulers)


async def _pauses(scheduler: Scheduler) -> dict[str, PauseState] | None:
    """The paused jobs of ``scheduler`` for the banner (read once), or ``None`` on failure.

    A store that is slow or fails here does not stop a worker that already started.
    """
    try:
        async with asyncio.timeout(BANNER_PAUSES_S):
            return dict(await scheduler.apauses())
    except TimeoutError:
        logger.warning("scheduler %s: the pauses were not read within %ss", scheduler.name,
                       BANNER_PAUSES_S)
    except Exception as exc:
        logger.warning("scheduler %s: the pauses could not be read: %s", scheduler.name,
                       error_line(exc))
    return None


def _log_runs(scheduler: Scheduler) -> None:
    """One log line per run start and end: job, slot, instance, attempt, status, duration."""

    def started(event: Any) -> None:
        record = event.record
        logger.info(
            "run started: job=%s slot=%s instance=%s attempt=%s reason=%s",
            record.job, record.scheduled_at.isoformat(), record.instance_id, record.attempt,
            record.reason,
        )

    def ended(event: Any) -> None:
        record = event.record
        logger.info(
            "run ended: job=%s slot=%s instance=%s attempt=%s status=%s duration=%sms%s",
            record.job, record.scheduled_at.isoformat(), record.instance_id, record.attempt,
            record.status, record.duration_ms, f" error={record.error.splitlines()[0]}" if record.error else "",
        )

    def skipped(event: Any) -> None:
        logger.info("run skipped: job=%s slot=%s reason=%s", event.job, event.scheduled_at.isoformat(),
                    event.reason)

    def lost(event: Any) -> None:
        logger.warning("run lost: job=%s slot=%s instance=%s (taken over by another instance)",
                       event.job, event.scheduled_at.isoformat(), event.instance_id)

    def buffered(event: Any) -> None:
        logger.info("run buffered: job=%s slot=%s reason=%s", event.job,
                    event.scheduled_at.isoformat(), event.reason)

    def cancelled(event: Any) -> None:
        logger.info("run cancelled: job=%s slot=%s instance=%s (%s)", event.job,
                    event.scheduled_at.isoformat(), event.instance_id, event.error)

    scheduler.on("buffer", buffered)
    scheduler.on("cancel", cancelled)
    scheduler.on("start", started)
    for name in ("success", "failure", "interrupted"):
        scheduler.on(name, ended)
    scheduler.on("skip", skipped)
    scheduler.on("lost", lost)
