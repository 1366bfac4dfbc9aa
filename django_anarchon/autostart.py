"""``"AUTOSTART": True``: run a scheduler inside the web processes as well.

Started on the first request a process serves (Django's ``request_started``), so it
never starts during ``migrate`` or any other management command, and it starts after a
pre-forking server (gunicorn) has forked, never before. The schedulers run on an event
loop in one daemon thread; they stop gracefully when the process exits.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import threading
from typing import TYPE_CHECKING, Any

from . import conf

if TYPE_CHECKING:
    from .engine import Scheduler

logger = logging.getLogger("django_anarchon")

#: Grace given to runs still going when a web process exits.
EXIT_GRACE_S = 10.0
#: How long the first request waits for the schedulers to start (a store that is down
#: is retried in their thread meanwhile).
START_WAIT_S = 5.0


class AutoStarter:
    """Starts the AUTOSTART schedulers once per process, in a thread of their own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._schedulers: list[Scheduler] = []

    @property
    def started(self) -> bool:
        return self._thread is not None

    def aliases(self) -> list[str]:
        return [alias for alias, entry in conf.get_config().items() if entry["AUTOSTART"]]

    def on_request_started(self, **kwargs: Any) -> None:
        """``request_started`` receiver: cheap after the first call."""
        if self._thread is None:
            self.start()

    def start(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            aliases = self.aliases()
            if not aliases:
                self._thread = threading.Thread()  # nothing to run; remember that we looked
                return
            from .handler import schedulers

            self._schedulers = [schedulers[alias] for alias in aliases]
            ready = threading.Event()
            self._thread = threading.Thread(
                target=self._run, args=(ready,), name="anarchon-autostart", daemon=True
            )
            self._thread.start()
            # A store that is down at start is retried in the thread; the request goes on.
            ready.wait(timeout=START_WAIT_S)
            atexit.register(self.stop)

    def _run(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)

        async def start_all() -> None:
            for scheduler in self._schedulers:
                try:
                    await scheduler.start()
                    logger.info("autostarted scheduler %r as %s", scheduler.name, scheduler.instance_id)
                except Exception:
                    logger.exception("could not autostart scheduler %r", scheduler.name)

        try:
            loop.run_until_complete(start_all())
        finally:
            ready.set()
        loop.run_forever()
        loop.close()

    def stop(self, grace: float = EXIT_GRACE_S) -> None:
        """Stop the schedulers gracefully and end the thread (atexit, or tests)."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None or not loop.is_running():
            return

        async def stop_all() -> None:
            await asyncio.gather(
                # Also the ones still waiting for their store: stop() ends that wait.
                *(s.stop(grace=grace) for s in self._schedulers), return_exceptions=True
            )

        future = asyncio.run_coroutine_threadsafe(stop_all(), loop)
        try:
            future.result(timeout=grace + 5)
        except Exception:
            logger.exception("error while stopping autostarted schedulers")
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        with self._lock:
            self._loop = None
            self._thread = None
            self._schedulers = []


autostarter = AutoStarter()
