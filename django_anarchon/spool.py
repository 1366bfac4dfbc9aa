"""The local spool: records the store could not take, kept on disk until it can.

When an attempt's end cannot reach the store in time (the store is down, or the worker
is stopping and its bound has passed), the runner appends what it owed the store to a
JSON-lines file of its instance, fsynced: the lease's finish (job, slot, token, status)
and the history record. The next start of a scheduler with the same spool directory,
the same name and the same store replays the files it finds, with the same tokens: the
store's rules make a repeat with the same token safe, and a finish whose token no longer
holds the run (it was taken over meanwhile) is refused.

Layout of the directory, one scheduler and store per file name prefix::

    <scheduler>~<store>~<instance>.jsonl         records owed, appended by that instance
    <scheduler>~<store>~<instance>.jsonl.replay  taken by a scheduler replaying it
    <scheduler>~<store>.kept.jsonl               entries that cannot be replayed, with why

``<store>`` is a fingerprint of the store's description, so that a spool is never
replayed into another store (another project on the machine, or a changed URL). Appends
take an exclusive ``flock`` and check that the file they locked is still the one named,
so a file renamed for replay never swallows a later append. JSON only, never pickle.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from .backends.base import FinalStatus, StoredResult
from .logtime import iso

__all__ = ["SPOOL_FORMAT", "Spool", "SpoolEntry", "SpoolError", "store_fingerprint"]

logger = logging.getLogger("django_anarchon")

#: The version of one spool line; a line of another version is kept, not replayed.
SPOOL_FORMAT = 1


class SpoolError(OSError):
    """The spool directory cannot be created or written."""


def store_fingerprint(description: str) -> str:
    """A short, file-name-safe digest of the store's (redacted) description."""
    return hashlib.sha256(description.encode("utf-8", "surrogatepass")).hexdigest()[:16]


@dataclass(frozen=True)
class SpoolEntry:
    """What one attempt still owed the store when it gave up writing."""

    job: str
    result: StoredResult
    history_size: int
    history_ttl_ms: int | None = None
    #: The lease token and the status to finish with; ``None`` when no finish is owed.
    token: str | None = None
    finish: FinalStatus | None = None
    #: Why it cannot be replayed (entries of the kept file only).
    why: str | None = None

    def to_json(self) -> str:
        data: dict[str, Any] = {"v": SPOOL_FORMAT, **asdict(self)}
        if self.why is None:
            del data["why"]
        return json.dumps(data, separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_json(cls, line: str) -> SpoolEntry:
        """Parse one line; ``ValueError`` (or ``KeyError``/``TypeError``) if it is not one."""
        data = json.loads(line)
        if not isinstance(data, dict) or data.get("v") != SPOOL_FORMAT:
            raise ValueError(f"not a spool line of format {SPOOL_FORMAT}")
        ttl = data.get("history_ttl_ms")
        return cls(
            job=str(data["job"]),
            result=StoredResult.from_dict(data["result"]),
            history_size=int(data["history_size"]),
            history_ttl_ms=None if ttl is None else int(ttl),
            token=data.get("token"),
            finish=data.get("finish"),
            why=data.get("why"),
        )

    def describe(self) -> str:
        r = self.result
        return f"job {self.job} slot {iso(r.slot)} attempt {r.attempt} status {r.status}"


@dataclass(frozen=True)
class SpoolFile:
    """A file taken for replay: its entries, and the lines that did not parse."""

    path: Path
    entries: list[SpoolEntry]
    torn: list[int]  # 1-based line numbers


class Spool:
    """The spool of one scheduler (by name and store) on one instance."""

    def __init__(self, directory: str | os.PathLike[str], scheduler: str, store: str,
                 instance_id: str) -> None:
        self.directory = Path(directory)
        self._prefix = f"{quote(scheduler, safe='')}~{store}"
        self.path = self.directory / f"{self._prefix}~{quote(instance_id, safe='')}.jsonl"
        self.kept_path = self.directory / f"{self._prefix}.kept.jsonl"

    def __repr__(self) -> str:
        return f"<Spool {self.path}>"

    def ensure(self) -> None:
        """Create the directory (private to this user) and prove it writable."""
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            probe = self.directory / f".probe-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise SpoolError(f"spool directory {self.directory} is not writable: {exc}") from exc

    # -- writing ------------------------------------------------------------------------

    def append(self, entry: SpoolEntry) -> None:
        """Append one entry to this instance's file, durably (fsync) before returning."""
        self._append_lines(self.path, [entry.to_json()])

    def keep(self, entries: list[SpoolEntry]) -> None:
        """Add entries that cannot be replayed (each with its ``why``) to the kept file."""
        if entries:
            self._append_lines(self.kept_path, [e.to_json() for e in entries])

    def _append_lines(self, path: Path, lines: list[str]) -> None:
        data = "".join(line + "\n" for line in lines).encode("utf-8", "surrogatepass")
        try:
            with self._locked_for_append(path) as fd:
                os.write(fd, data)
                os.fsync(fd)
        except OSError as exc:
            raise SpoolError(f"cannot append to the spool file {path}: {exc}") from exc

    @contextlib.contextmanager
    def _locked_for_append(self, path: Path) -> Iterator[int]:
        """An fd of ``path`` opened for append under ``flock``, still linked at that name."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        while True:
            created = not path.exists()
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                try:
                    same = os.fstat(fd).st_ino == os.stat(path).st_ino
                except FileNotFoundError:
                    same = False
                if same:
                    if created:
                        _fsync_dir(self.directory)
                    yield fd
                    return
            finally:
                os.close(fd)  # closing also drops the lock
            # Renamed for replay between our open and our lock: append to a new file.

    # -- replaying ----------------------------------------------------------------------

    def take(self) -> list[SpoolFile]:
        """Take every file owed to this scheduler and store (any instance's) for replay.

        Renaming is the claim: of two schedulers starting at once, one gets each file. A
        ``.replay`` file left by a replay that died is taken again.
        """
        taken: list[SpoolFile] = []
        if not self.directory.is_dir():
            return taken
        for path in sorted(self.directory.glob(f"{glob.escape(self._prefix)}~*.jsonl*")):
            if path.name.endswith(".jsonl"):
                target = path.with_name(path.name + ".replay")
                try:
                    # Wait for an append in progress on it to end, then claim it.
                    with _locked(path):
                        os.rename(path, target)
                except FileNotFoundError:
                    continue  # another scheduler took it first
            elif path.name.endswith(".jsonl.replay"):
                target = path
            else:
                continue
            taken.append(self._read(target))
        return taken

    def done(self, taken: SpoolFile) -> None:
        with contextlib.suppress(FileNotFoundError):
            taken.path.unlink()
        _fsync_dir(self.directory)

    def kept(self) -> list[SpoolEntry]:
        """The entries kept because they cannot be replayed (reported at every start)."""
        if not self.kept_path.exists():
            return []
        return self._read(self.kept_path).entries

    @staticmethod
    def _read(path: Path) -> SpoolFile:
        entries: list[SpoolEntry] = []
        torn: list[int] = []
        try:
            with path.open("r", encoding="utf-8", errors="surrogateescape", newline="\n") as f:
                lines = f.read().split("\n")
                for number, line in enumerate(lines, 1):
                    if not line.strip():
                        continue
                    try:
                        entries.append(SpoolEntry.from_json(line))
                    except (ValueError, KeyError, TypeError):
                        torn.append(number)
        except FileNotFoundError:
            pass
        return SpoolFile(path=path, entries=entries, torn=torn)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
