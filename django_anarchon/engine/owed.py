"""Records owed to the store: written late, spooled when the store cannot take them.

An attempt that has ended owes the store its lease's finish and its history record. The
runner writes them; while it does, the entry waits here, so that a stop whose bound has
passed (or a write that gave up) puts it in the local spool (``django_anarchon.spool``)
instead of losing it. A start replays what the spool holds, with the same tokens.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import TYPE_CHECKING

from ..exceptions import UnknownJobError
from ..redact import describe_backend, redact_text
from ..spool import Spool, SpoolEntry, SpoolError, store_fingerprint
from ..wallclock import now_ms

if TYPE_CHECKING:
    from os import PathLike

    from .runner import Attempt
    from .scheduler import Scheduler

__all__ = ["STOP_BOUND_MS", "STOP_NOW_BOUND_MS", "OwedRecords"]

logger = logging.getLogger("django_anarchon")

#: After a stop's grace, how long the records of its attempts may take to reach the store
#: before they are spooled (and the tasks still writing them cancelled).
STOP_BOUND_MS = 5_000
#: The same after a second signal (``stop_now()``): enough for a store that answers.
STOP_NOW_BOUND_MS = 1_000
#: A replay's store calls are tried once each; an outage leaves the entry for later.
REPLAY_AGAIN_AFTER_S = 60.0


class OwedRecords:
    """The records owed by one scheduler's attempts, and its spool."""

    def __init__(self, host: Scheduler, directory: str | PathLike[str] | None) -> None:
        self.host = host
        self.directory = directory
        self.spool: Spool | None = None
        self._owed: dict[Attempt, SpoolEntry] = {}
        #: Epoch ms after which writes stop retrying (a stop's grace plus its bound).
        self.cut_at_ms: int | None = None
        self._replay_pending = False

    def open(self) -> None:
        """At start: the spool of this scheduler, instance and store (if one is configured)."""
        self.cut_at_ms = None
        self._replay_pending = False
        host = self.host
        if self.directory is None or not getattr(host.backend, "durable", True):
            self.spool = None
            return
        spool = Spool(self.directory, host.name, store_fingerprint(describe_backend(host.backend)),
                      host.instance_id)
        try:
            spool.ensure()
        except SpoolError as exc:
            logger.warning(
                "scheduler %s: no spool: %s; records the store cannot take will be lost",
                host.name, exc,
            )
            self.spool = None
            return
        self.spool = spool

    # -- the runner's side --------------------------------------------------------------

    def owe(self, attempt: Attempt, entry: SpoolEntry) -> None:
        self._owed[attempt] = entry

    def paid(self, attempt: Attempt, finish: bool = False) -> None:
        """The finish (``finish=True``) or everything left of ``attempt``'s records landed."""
        entry = self._owed.get(attempt)
        if entry is None:
            return
        if finish:
            self._owed[attempt] = replace(entry, token=None, finish=None)
        else:
            del self._owed[attempt]

    def settled(self, attempt: Attempt) -> bool:
        """Nothing is owed for ``attempt`` any more (spooled by a stop, or written)."""
        return attempt not in self._owed

    def past_cut(self) -> bool:
        return self.cut_at_ms is not None and now_ms() >= self.cut_at_ms

    def give_up(self, attempt: Attempt) -> None:
        """The store did not take ``attempt``'s records in time: into the spool with them."""
        entry = self._owed.pop(attempt, None)
        if entry is not None:
            self._spool([entry])

    def spool_all(self) -> int:
        """At the stop's bound: every record still owed goes to the spool."""
        entries = list(self._owed.values())
        self._owed.clear()
        self._spool(entries)
        return len(entries)

    def _spool(self, entries: list[SpoolEntry]) -> None:
        name = self.host.name
        for entry in entries:
            owed = "finish and history record" if entry.finish else "history record"
            if self.spool is None:
                logger.error("scheduler %s: %s: the store did not take its %s, and there is no "
                             "spool: lost", name, entry.describe(), owed)
                continue
            try:
                self.spool.append(entry)
            except SpoolError as exc:
                logger.error("scheduler %s: %s: the store did not take its %s, and the spool "
                             "refused it (%s): lost", name, entry.describe(), owed, exc)
                continue
            logger.warning("scheduler %s: %s: the store did not take its %s; spooled to %s",
                           name, entry.describe(), owed, self.spool.path)
        if entries and self.spool is not None and not self.host.stopping:
            self._replay_later()

    def _replay_later(self) -> None:
        if self._replay_pending:
            return
        self._replay_pending = True

        async def later() -> None:
            if await self.host.wait_stopping(REPLAY_AGAIN_AFTER_S):
                return
            self._replay_pending = False
            await self.replay()

        self.host.spawn(later(), "spool replay")

    # -- replay -------------------------------------------------------------------------

    async def replay(self) -> None:
        """Replay every file owed to this scheduler and store; keep what cannot be."""
        spool = self.spool
        if spool is None:
            return
        name = self.host.name
        kept = await asyncio.to_thread(spool.kept)
        if kept:
            logger.warning(
                "scheduler %s: %s spooled record(s) in %s could not be replayed and are kept: %s",
                name, len(kept), spool.kept_path,
                "; ".join(f"{e.describe()} ({e.why})" for e in kept[:5]),
            )
        for taken in await asyncio.to_thread(spool.take):
            for line in taken.torn:
                logger.warning(
                    "scheduler %s: line %s of the spool %s is not a whole record (cut short by "
                    "a crash while it was written?): skipped", name, line, taken.path,
                )
            replayed, again, refused = 0, [], []
            for entry in taken.entries:
                outcome, rest = await self._replay_one(entry)
                if outcome == "done":
                    replayed += 1
                elif outcome == "again":
                    again.append(rest)
                else:
                    refused.append(replace(rest, why=outcome))
            try:
                for entry in again:
                    spool.append(entry)
                spool.keep(refused)
            except SpoolError as exc:
                logger.error("scheduler %s: replaying %s: %s; the file is left for the next "
                             "start", name, taken.path, exc)
                continue
            spool.done(taken)
            if taken.entries or taken.torn:
                logger.info(
                    "scheduler %s: spool %s replayed: %s record(s) written, %s left for later "
                    "(the store did not answer), %s refused and kept in %s",
                    name, taken.path.name, replayed, len(again), len(refused), spool.kept_path,
                )
            for entry in refused:
                logger.warning("scheduler %s: spooled %s refused: %s", name, entry.describe(),
                               entry.why)
            if again:
                self._replay_later()

    async def _replay_one(self, entry: SpoolEntry) -> tuple[str, SpoolEntry]:
        """``done``, ``again`` (an outage: try later), or why the store refuses it."""
        host = self.host
        try:
            host.get_job(entry.job)
        except UnknownJobError:
            return f"no job {entry.job!r} in scheduler {host.name!r}", entry
        backend = host.backend
        try:
            if entry.finish is not None and entry.token is not None:
                runs = backend.runs
                if runs is None:
                    return "the store has no leases to finish", entry
                if not await runs.finish(entry.job, entry.result.slot, entry.token, entry.finish):
                    return ("the store refused the finish: the run was taken over (or "
                            "forgotten) meanwhile"), entry
                entry = replace(entry, token=None, finish=None)
            await backend.save_result(entry.job, entry.result, entry.history_size,
                                      entry.history_ttl_ms)
        except Exception as exc:  # an outage, or a bug: the entry stays for a later replay
            logger.warning("scheduler %s: replaying %s: %s", host.name, entry.describe(),
                           redact_text(exc))
            return "again", entry
        return "done", entry
