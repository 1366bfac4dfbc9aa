"""The fault run: N ``anarchon_worker`` processes on one store, faults, then the verdict.

``run(Config(...), out_dir)`` starts the store (tests/faults/servers.py), N workers (one
clock 5 s ahead and one 5 s behind through libfaketime), and while they run a mix of short
and long jobs (tests/faults/workerapp/jobs.py) it kills a random worker every few seconds
(and starts a replacement at once), and cuts or restarts the store, every choice drawn from
a seeded RNG (the seed is printed; ``--seed`` replays the same decisions). At the end it
sends SIGTERM to every worker and hands the handlers' logs and its own fault log to
tests/faults/checker.py. ``python -m tests.faults.harness`` (scripts/faults) is the long
run on demand; it writes a JSON report and a markdown table row (docs/faults.md).

Every process is started from the calling thread in its own process group with a parent
death signal, and killed in ``finally``: nothing outlives the run.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.support import ROOT, unavailable, wait_for

from .checker import Event, JobSpec, Rules, Verdict, check, read_lines
from .servers import (
    MariaDBStore,
    NatsStore,
    PostgresStore,
    RabbitVhost,
    RedisStore,
    SqliteStore,
    Store,
    ValkeyStore,
    kill_group,
    reap,
    spawn,
)

BANNER = "Press Ctrl+C"


def python_path() -> str:
    """The workers' PYTHONPATH: ``FAULTS_CODE`` (a directory holding another copy of
    ``django_anarchon``, e.g. a release to compare with) first, then the project."""
    code = os.environ.get("FAULTS_CODE")
    return os.pathsep.join([code, str(ROOT)]) if code else str(ROOT)


def work_dir() -> Path:
    """The workers' current directory (``python -m`` puts it first on sys.path)."""
    return Path(os.environ.get("FAULTS_CODE") or ROOT)
FAULT_KINDS = ("kill", "cut", "restart", "skew")


@dataclass(frozen=True)
class Profile:
    """One backend of the suite: its store, and whether it has leases."""

    name: str
    store: type[Store]
    lease: bool
    marker: str  # the pytest marker of the server it needs
    #: Whether skewed worker clocks are a fault this store can meet. SQLite is a file in
    #: the workers' own processes: its clock IS each worker's clock, and the processes
    #: that share one file share one machine, so one clock, in production.
    skew: bool = True
    #: A claim-only store that answers a claim before its slot "wait" (Redis stream-id).
    holds_early_claims: bool = False


PROFILES: dict[str, Profile] = {p.name: p for p in (
    Profile("postgres", PostgresStore, True, "postgres"),
    Profile("mariadb", MariaDBStore, True, "mysql"),
    Profile("sqlite", SqliteStore, True, "faults", skew=False),
    Profile("redis-lease", RedisStore, True, "redis"),
    Profile("redis-stream-id", RedisStore, False, "redis", holds_early_claims=True),
    Profile("redis-script", RedisStore, False, "redis"),
    Profile("valkey-lease", ValkeyStore, True, "redis"),
    Profile("nats", NatsStore, False, "nats"),
    Profile("rabbitmq", RabbitVhost, False, "rabbitmq"),
)}


def default_jobs(lease: bool, extra_quick: int = 0) -> list[JobSpec]:
    """Short jobs every 250-500 ms (one with max_late 2 s and catch-up) and two long ones.

    ``extra_quick`` more jobs every 250 ms (offsets spread over the grid) make a long run
    reach its slots sooner.
    """
    attempts = 2 if lease else 1
    extra = [JobSpec(f"fault.x{i}", 250, offset_ms=(i * 37) % 250) for i in range(extra_quick)]
    return [
        *extra,
        JobSpec("fault.q0", 250),
        JobSpec("fault.q1", 250, offset_ms=125),
        JobSpec("fault.h0", 500),
        JobSpec("fault.h1", 500, offset_ms=250, max_late_ms=2000,
                catch_up_ms=2000 if lease else 0),
        JobSpec("fault.long0", 6000, run_ms=3000, max_attempts=attempts),
        JobSpec("fault.long1", 6000, offset_ms=3000, run_ms=3000, max_attempts=attempts),
    ]


@dataclass
class Config:
    backend: str
    duration_s: float = 35.0
    seed: int = field(default_factory=lambda: random.randrange(1, 2**31))
    workers: int = 4
    faults: tuple[str, ...] = FAULT_KINDS
    skews_ms: tuple[int, ...] = (5000, -5000)  # of workers 0, 1, ...; the others are true
    kill_every_s: tuple[float, float] = (3.0, 6.0)
    store_every_s: tuple[float, float] = (7.0, 12.0)
    lease_ms: int = 3000
    grace_ms: int = 3000
    jobs: list[JobSpec] | None = None
    extra_quick: int = 0

    @property
    def profile(self) -> Profile:
        return PROFILES[self.backend]

    def job_list(self) -> list[JobSpec]:
        if self.jobs is not None:
            return self.jobs
        return default_jobs(self.profile.lease, self.extra_quick)

    def skew_of(self, slot: int) -> int:
        if "skew" not in self.faults or not self.profile.skew or slot >= len(self.skews_ms):
            return 0
        return self.skews_ms[slot]


def slots_per_second(jobs: list[JobSpec]) -> float:
    return sum(1000 / j.every_ms for j in jobs)


def now_ms() -> float:
    return time.time() * 1000


# -- libfaketime ------------------------------------------------------------------------


def libfaketime() -> str | None:
    """The libfaketime shared object: ``FAULTS_LIBFAKETIME``, or Debian's ``faketime``."""
    if os.environ.get("FAULTS_LIBFAKETIME"):
        return os.environ["FAULTS_LIBFAKETIME"]
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    return found[0] if found else None


#: A ``sitecustomize`` for skewed workers only (a ``time.sleep`` that works under libfaketime).
FAKETIME_SITE = Path(__file__).resolve().parent / "faketime_site"


def skew_env(skew_ms: int) -> dict[str, str]:
    """What makes a child's ``time.time()`` run ``skew_ms`` off, and its monotonic clock true."""
    if not skew_ms:
        return {}
    if skew_ms % 1000:
        raise ValueError(f"skews are whole seconds, not {skew_ms} ms")
    lib = libfaketime()
    if lib is None:
        raise RuntimeError("libfaketime not found (apt-get install faketime)")
    return {"LD_PRELOAD": lib, "FAKETIME": f"{skew_ms // 1000:+d}",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            # time.sleep() fails under that libfaketime setting: see its sitecustomize.
            "PYTHONPATH": os.pathsep.join([str(FAKETIME_SITE), python_path()])}


def probe_skew(skew_ms: int) -> float:
    """Measure the skew a child really gets; raise unless it is ``skew_ms`` (±100 ms)."""
    env = {**os.environ, **skew_env(skew_ms)}
    before = now_ms()
    out = subprocess.run(
        [sys.executable, "-c", "import time; print(time.time() * 1000)"],
        env=env, capture_output=True, text=True, timeout=30, check=True,
    )
    after = now_ms()
    seen = float(out.stdout.strip())
    if not before + skew_ms - 100 <= seen <= after + skew_ms + 100:
        raise RuntimeError(f"libfaketime skew {skew_ms:+d} ms: the child's clock read "
                           f"{seen - (before + after) / 2:+.0f} ms off")
    return seen - (before + after) / 2


# -- the workers ----------------------------------------------------------------------


@dataclass
class Proc:
    instance: str
    slot: int
    skew_ms: int
    popen: subprocess.Popen[bytes]
    log: Path
    ready: bool = False
    ended: bool = False
    killed: bool = False
    termed: bool = False
    replaced: bool = False


class EventLog:
    """The harness's own record of what it did and saw (thread-safe, true clock)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.events: list[Event] = []
        self._lock = threading.Lock()

    def add(self, event: Event) -> None:
        with self._lock:
            self.events.append(event)
            with self.path.open("a") as sink:
                sink.write(json.dumps(event.to_dict()) + "\n")

    def snapshot(self) -> list[Event]:
        with self._lock:
            return list(self.events)


class Fleet:
    """The worker processes: spawned and killed from the calling thread, watched by a monitor.

    The monitor thread only observes (banner printed = ready; exit status), so its times
    stay precise while the calling thread is busy restarting a store.
    """

    def __init__(self, config: Config, out: Path, env: dict[str, str], events: EventLog) -> None:
        self.config = config
        self.handler_dir = out / "handlers"
        self.log_dir = out / "workers"
        self.handler_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.env = {**os.environ, "PYTHONPATH": python_path(), **env,
                    "FAULTS_OUT": str(self.handler_dir)}
        self.events = events
        self.procs: list[Proc] = []
        self.generation: dict[int, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._monitor = threading.Thread(target=self._watch, name="fault-monitor", daemon=True)
        self._monitor.start()

    def spawn(self, slot: int) -> Proc:
        gen = self.generation[slot] = self.generation.get(slot, 0) + 1
        instance = f"w{slot}-{gen}"
        skew = self.config.skew_of(slot)
        log = self.log_dir / f"{instance}.log"
        popen = spawn(
            [sys.executable, "-m", "django", "anarchon_worker", "--instance-id", instance,
             "--grace", f"{self.config.grace_ms}ms",
             *(["-v", "2"] if os.environ.get("FAULTS_DEBUG") else [])],  # each claim's answer
            log, env={**self.env, **skew_env(skew), "FAULTS_SKEW_MS": str(skew)}, cwd=work_dir(),
        )
        proc = Proc(instance, slot, skew, popen, log)
        with self._lock:
            self.procs.append(proc)
        self.events.add(Event("spawn", now_ms(), instance, skew_ms=skew, detail=f"pid {popen.pid}"))
        return proc

    def live(self) -> list[Proc]:
        with self._lock:
            return [p for p in self.procs if not p.ended]

    def ready_live(self) -> list[Proc]:
        return [p for p in self.live() if p.ready and not p.killed and not p.termed]

    def kill(self, proc: Proc) -> None:
        with self._lock:
            proc.killed = True
        self.events.add(Event("kill", now_ms(), proc.instance))
        kill_group(proc.popen)

    def crashed(self) -> list[Proc]:
        with self._lock:
            return [p for p in self.procs
                    if p.ended and not p.killed and not p.termed and not p.replaced]

    def terminate_all(self) -> list[Proc]:
        """SIGTERM every live worker at once (each is its process group's leader)."""
        live = [p for p in self.live() if not p.killed]
        for proc in live:
            with self._lock:
                proc.termed = True
            self.events.add(Event("term", now_ms(), proc.instance))
            kill_group(proc.popen, signal.SIGTERM)
        return live

    def _watch(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                procs = list(self.procs)
            for proc in procs:
                if not proc.ready and not proc.ended:
                    with contextlib.suppress(OSError):
                        if BANNER in proc.log.read_text(errors="replace"):
                            proc.ready = True
                            self.events.add(Event("ready", now_ms(), proc.instance))
                if not proc.ended and proc.popen.poll() is not None:
                    with self._lock:
                        proc.ended = True
                        expected = proc.killed or proc.termed
                    detail = "" if expected else _tail(proc.log, 40)
                    self.events.add(Event("exit", now_ms(), proc.instance,
                                          rc=proc.popen.returncode, expected=expected,
                                          detail=detail))
            self._stop.wait(0.02)

    def close(self) -> None:
        """Kill whatever is left, then stop the monitor."""
        for proc in self.live():
            kill_group(proc.popen)
        for proc in list(self.procs):
            reap(proc.popen)
        self._stop.set()
        self._monitor.join(5)


def _tail(path: Path, n: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


# -- the run ----------------------------------------------------------------------------


@dataclass
class Report:
    config: Config
    verdict: Verdict
    rules: Rules
    out: Path
    started: str
    wall_s: float
    skews_seen_ms: dict[int, float]
    unparsed_lines: int

    def to_dict(self) -> dict[str, Any]:
        c = self.config
        return {
            "backend": c.backend, "seed": c.seed, "started": self.started,
            "wall_s": round(self.wall_s, 1), "duration_s": c.duration_s, "workers": c.workers,
            "faults": list(c.faults), "skews_ms": list(c.skews_ms),
            "skews_seen_ms": {str(k): round(v) for k, v in self.skews_seen_ms.items()},
            "lease_ms": c.lease_ms, "grace_ms": c.grace_ms,
            "jobs": [j.to_dict() for j in c.job_list()], "rules": self.rules.to_dict(),
            "out": str(self.out), "unparsed_lines": self.unparsed_lines,
            "verdict": self.verdict.to_dict(),
        }

    def markdown_row(self) -> str:
        s, n = self.verdict.stats, self.verdict.counts()
        cells = [self.started[:10], self.config.backend, str(self.config.seed),
                 str(s["slots"]), str(s["starts"]), str(s["kills"]), str(s["cuts"]),
                 str(s["restarts"]), str(s["takeovers"]),
                 *(str(n[k]) for k in ("duplicate", "missed", "early", "takeover", "attempt",
                                       "idle", "stop", "crash")),
                 "clean" if self.verdict.ok else "FAIL"]
        return "| " + " | ".join(cells) + " |"

    def summary(self) -> str:
        c = self.config
        return (f"fault run {c.backend}: seed {c.seed}, {c.workers} workers, "
                f"{c.duration_s:.0f} s, faults {','.join(c.faults)}; logs in {self.out}\n"
                + self.verdict.summary())


MARKDOWN_HEADER = (
    "| date | backend | seed | slots | starts | kills | cuts | restarts | takeovers | "
    "duplicates | missed | early | unexplained takeovers | bad attempts | idle | slow stops | "
    "crashes | verdict |\n" + "|---" * 18 + "|"
)


def _migrate(env: dict[str, str], out: Path) -> None:
    """The store's tables, made by the same settings the workers use."""
    result = subprocess.run(
        [sys.executable, "-m", "django", "migrate", "django_anarchon", "--verbosity", "0"],
        env={**os.environ, "PYTHONPATH": python_path(), **env}, cwd=work_dir(), capture_output=True,
        text=True, timeout=180,
    )
    (out / "migrate.log").write_text(result.stdout + result.stderr)
    if result.returncode != 0:
        raise AssertionError(f"migrate failed:\n{result.stderr[-3000:]}")


def run(config: Config, out: Path, say: Any = print) -> Report:
    """One fault run; every process and private server is gone when it returns or raises."""
    profile = config.profile
    jobs = config.job_list()
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(config.seed)
    say(f"faults: backend {config.backend}, seed {config.seed} (replay: scripts/faults "
        f"--backend {config.backend} --seed {config.seed} --duration {config.duration_s:g}); "
        f"logs in {out}")
    started = datetime.now(UTC).isoformat(timespec="seconds")
    t_wall = time.monotonic()
    events = EventLog(out / "faults.jsonl")
    skews_seen: dict[int, float] = {}
    with contextlib.ExitStack() as stack:
        for slot in range(config.workers):
            skew = config.skew_of(slot)
            if skew:
                try:
                    skews_seen[slot] = probe_skew(skew)
                except (RuntimeError, subprocess.SubprocessError, ValueError) as exc:
                    unavailable(f"no clock skew for the fault workers: {exc}")
        store = profile.store()
        stack.callback(store.close)
        tag = f"faults{uuid.uuid4().hex[:6]}"
        env = {
            "DJANGO_SETTINGS_MODULE": "tests.faults.settings", "FAULTS_BACKEND": config.backend,
            "FAULTS_JOBS": json.dumps([j.to_dict() for j in jobs]),
            "FAULTS_LEASE": f"{config.lease_ms}ms", "FAULTS_TAG": tag,
            "FAULTS_LEASE_STORE": "1" if profile.lease else "0", **store.env(),
        }
        (out / "env.json").write_text(json.dumps(env, indent=1))
        if store.migrate:
            _migrate(env, out)
        fleet = Fleet(config, out, env, events)
        stack.callback(fleet.close)
        for slot in range(config.workers):
            fleet.spawn(slot)

        def all_ready() -> bool:
            for p in fleet.procs:
                if p.ended:
                    raise AssertionError(f"worker {p.instance} exited at start:\n"
                                         f"{_tail(p.log, 40)}")
            return all(p.ready for p in fleet.procs)

        wait_for(all_ready, 120, f"{config.workers} workers printing their banner")
        all_up = now_ms()
        say(f"faults: {config.workers} workers up; running {config.duration_s:g} s")
        _fault_loop(config, store, fleet, events, rng, all_up + config.duration_s * 1000, say)
        t_term = now_ms()
        stopping = fleet.terminate_all()
        limit = (config.grace_ms + Rules.stop_bound_ms) / 1000 + 5
        with contextlib.suppress(AssertionError):
            wait_for(lambda: all(p.ended for p in stopping), limit, "workers exiting")
        fleet.close()
    rules = Rules(
        lease_store=profile.lease, holds_early_claims=profile.holds_early_claims,
        window=(all_up + 1000, t_term - Rules.claim_bound_ms - 500),
        lease_ms=config.lease_ms, heartbeat_ms=config.lease_ms // 3, grace_ms=config.grace_ms,
    )
    (out / "run.json").write_text(json.dumps(
        {"jobs": [j.to_dict() for j in jobs], "rules": rules.to_dict()}, indent=1))
    lines, bad = read_lines((out / "handlers").glob("*.jsonl"))
    verdict = check(jobs, lines, events.snapshot(), rules)
    return Report(config, verdict, rules, out, started, time.monotonic() - t_wall, skews_seen, bad)


def recheck(out: Path) -> Verdict:
    """Judge a finished run's logs again (after a change of the rules, say)."""
    saved = json.loads((out / "run.json").read_text())
    rules = saved["rules"]
    rules["window"] = tuple(rules["window"])
    events = [Event.from_dict(json.loads(raw))
              for raw in (out / "faults.jsonl").read_text().splitlines() if raw.strip()]
    lines, _ = read_lines((out / "handlers").glob("*.jsonl"))
    return check([JobSpec(**j) for j in saved["jobs"]], lines, events, Rules(**rules))


def _fault_loop(
    config: Config, store: Store, fleet: Fleet, events: EventLog, rng: random.Random,
    until_ms: float, say: Any,
) -> None:
    """Kill, cut and restart on the RNG's schedule until ``until_ms``; replace the dead."""
    store_kinds = [k for k in store.faults if k in config.faults]
    start = time.monotonic()
    next_kill = start + rng.uniform(*config.kill_every_s) if "kill" in config.faults else math.inf
    next_store = start + rng.uniform(*config.store_every_s) if store_kinds else math.inf
    while now_ms() < until_ms:
        for proc in fleet.crashed():
            proc.replaced = True
            say(f"faults: worker {proc.instance} died by itself; starting a replacement")
            fleet.spawn(proc.slot)
        tick = time.monotonic()
        if tick >= next_kill:
            victims = sorted(fleet.ready_live(), key=lambda p: p.instance)
            if victims:
                victim = rng.choice(victims)
                fleet.kill(victim)
                fleet.spawn(victim.slot)
            next_kill = tick + rng.uniform(*config.kill_every_s)
        if tick >= next_store:
            kind = rng.choice(store_kinds)
            began = now_ms()
            try:
                detail = store.cut() if kind == "cut" else store.restart()
            except Exception as exc:  # a cut that fails is recorded; the run goes on
                if kind == "restart":
                    raise
                detail = f"failed: {exc!r}"
            events.add(Event(kind, began, t_end_ms=now_ms(), detail=detail))
            next_store = time.monotonic() + rng.uniform(*config.store_every_s)
        time.sleep(0.05)  # the loop's tick: faults fire on their schedule, not on a condition


# -- leftovers and the command line ---------------------------------------------------------


@contextlib.contextmanager
def fault_dir(base: Path, backend: str) -> Iterator[Path]:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = base / f"{backend}-{stamp}"
    path.mkdir(parents=True, exist_ok=True)
    yield path


def write_report(report: Report, base: Path) -> tuple[Path, Path]:
    """``<base>/<backend>-<stamp>.json`` and ``.md`` (the table row); the row is also
    appended to ``<base>/results.md``."""
    base.mkdir(parents=True, exist_ok=True)
    stem = report.out.name
    json_path = base / f"{stem}.json"
    md_path = base / f"{stem}.md"
    json_path.write_text(json.dumps(report.to_dict(), indent=1))
    md_path.write_text(MARKDOWN_HEADER + "\n" + report.markdown_row() + "\n\n```\n"
                       + report.summary() + "\n```\n")
    results = base / "results.md"
    if not results.exists():
        results.write_text(MARKDOWN_HEADER + "\n")
    with results.open("a") as sink:
        sink.write(report.markdown_row() + "\n")
    return json_path, md_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/faults", description="The fault-injection run on demand (docs/faults.md).")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--backend", choices=sorted(PROFILES))
    which.add_argument("--all", action="store_true", help="every backend, one after another")
    which.add_argument("--recheck", type=Path, metavar="RUN_DIR",
                       help="judge the logs of a finished run again, and print the verdict")
    parser.add_argument("--slots", type=int, default=0,
                        help="run until this many (job, slot) pairs fell due (e.g. 10000)")
    parser.add_argument("--duration", type=float, default=35.0, help="seconds (when no --slots)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--extra-jobs", type=int, default=0, metavar="N",
                        help="N more jobs every 250 ms, so that --slots is reached sooner")
    parser.add_argument("--faults", default=",".join(FAULT_KINDS),
                        help=f"comma-separated subset of {','.join(FAULT_KINDS)}")
    parser.add_argument("--out", type=Path, default=ROOT / ".tmp" / "faults")
    args = parser.parse_args(argv)
    if args.recheck:
        verdict = recheck(args.recheck)
        print(verdict.summary())
        return 0 if verdict.ok else 1
    faults = tuple(f for f in args.faults.split(",") if f)
    unknown = set(faults) - set(FAULT_KINDS)
    if unknown:
        parser.error(f"unknown faults: {', '.join(sorted(unknown))}")
    if args.workers < 4:
        parser.error("the suite needs at least 4 workers")
    backends = sorted(PROFILES) if args.all else [args.backend]
    status = 0
    for backend in backends:
        config = Config(
            backend, workers=args.workers, faults=faults, extra_quick=args.extra_jobs
        )
        if args.seed is not None:
            config.seed = args.seed
        if args.slots:
            config.duration_s = args.slots / slots_per_second(config.job_list()) + 2.5
        else:
            config.duration_s = args.duration
        with fault_dir(args.out, backend) as out:
            try:
                report = run(config, out)
            except BaseException as exc:
                if isinstance(exc, KeyboardInterrupt):
                    raise
                print(f"faults: {backend}: the run could not be made: {exc}", file=sys.stderr)
                status = 1
                continue
        json_path, md_path = write_report(report, args.out)
        print(report.summary())
        print(f"faults: report {json_path}\nfaults: table row {md_path} "
              f"(also appended to {args.out / 'results.md'})")
        status |= 0 if report.verdict.ok else 1
    return status


if __name__ == "__main__":
    sys.exit(main())
