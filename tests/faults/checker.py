"""The verdict of a fault run, from the handlers' own logs and the harness's fault log only.

The store's view is never the witness: a store that forgets or double-grants a run would
also report it wrongly. The inputs are

* ``starts``: one ``Line`` per line the handlers wrote (``event`` "start" or "end"), with the
  writer's ``time.time()`` and its known clock skew, so ``true_ms`` is on the true clock;
* ``events``: what the harness did and saw, on the true clock (spawn, ready, kill, exit,
  cut, restart, term);
* ``rules``: the run's parameters (kind of store, lease, observed window, bounds).

The verdict kinds (docs/faults.md states each rule):

``duplicate``  two starts of one (job, slot, attempt); for a job with one attempt (and
               every job on a claim-only store), two starts of one (job, slot) at all.
``attempt``    an attempt above the job's ``max_attempts``, or any attempt > 1 or reason
               ``takeover`` on a claim-only store (they have no leases).
``missed``     a slot inside the observed window that never started, unless excused.
``early``      a start before its slot: on a lease store by more than ``early_tolerance_ms``;
               on a claim-only store by more than the starting worker's clock skew.
``takeover``   attempt n > 1 whose attempt n - 1 ran on a worker that was neither killed,
               crashed, cut off (a store fault) nor stopped in between.
``idle``       a worker alive at the end, up for ``idle_ms``, that started nothing and heard
               no answer to a claim in the last ``idle_ms`` (unless its clock is behind
               one that wins legitimately). A worker that claims and loses every race
               (its clock ahead, armed by an estimate of the store's, against workers
               whose clocks are exact) is claiming, not idle.
``stop``       a worker that did not exit 0 within grace + ``stop_bound_ms`` of SIGTERM.
``crash``      a worker that exited by itself (not killed, not stopped).
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django_anarchon.engine.owed import STOP_BOUND_MS

KINDS = ("duplicate", "attempt", "missed", "early", "takeover", "idle", "stop", "crash")


@dataclass(frozen=True)
class JobSpec:
    """One job of the run, as the workers declare it (tests/faults/workerapp/jobs.py)."""

    name: str
    every_ms: int
    offset_ms: int = 0
    run_ms: int = 0
    max_attempts: int = 1
    max_late_ms: int = 60_000
    catch_up_ms: int = 0

    def slots(self, first_ms: float, last_ms: float) -> range:
        """The job's slots in [first_ms, last_ms]."""
        k0 = math.ceil((first_ms - self.offset_ms) / self.every_ms)
        k1 = math.floor((last_ms - self.offset_ms) / self.every_ms)
        return range(k0 * self.every_ms + self.offset_ms, k1 * self.every_ms + self.offset_ms + 1,
                     self.every_ms)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Line:
    """One line a handler wrote."""

    event: str
    job: str
    slot: int
    instance: str
    attempt: int
    reason: str
    t_ms: float
    skew_ms: int
    raw: str = ""
    aborted: str | None = None

    @property
    def true_ms(self) -> float:
        return self.t_ms - self.skew_ms

    @classmethod
    def parse(cls, raw: str) -> Line:
        d = json.loads(raw)
        return cls(
            event=d["event"], job=d["job"], slot=int(d["slot"]), instance=d["instance"],
            attempt=int(d["attempt"]), reason=d["reason"], t_ms=float(d["t_ms"]),
            skew_ms=int(d.get("skew_ms", 0)), raw=raw.strip(), aborted=d.get("aborted"),
        )


@dataclass(frozen=True)
class Event:
    """Something the harness did or saw, on the true clock (epoch ms)."""

    kind: str  # spawn | ready | kill | exit | cut | restart | term
    t_ms: float
    instance: str = ""
    t_end_ms: float | None = None  # cut/restart: when the store answered again
    skew_ms: int = 0
    rc: int | None = None
    expected: bool = True  # exit: killed or stopped by the harness
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v not in (None, "")}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Event:
        return cls(**d)


@dataclass(frozen=True)
class Rules:
    """What the checker needs to know about the run besides the logs."""

    lease_store: bool
    window: tuple[float, float]  # the observed window, true epoch ms
    #: A claim-only store that still holds an early claim until its slot by its own clock
    #: (Redis stream-id): for early starts and who claims when, it is like a lease store.
    holds_early_claims: bool = False
    lease_ms: int = 3000
    heartbeat_ms: int = 1000
    grace_ms: int = 3000
    #: SIGTERM to exit: grace + this, as documented (docs/commands.md): the records' bound
    #: after the grace, 1 s for cancelled tasks, 2 s to close the store, 2 s for the loop.
    stop_bound_ms: int = STOP_BOUND_MS + 5000
    claim_bound_ms: int = 1000  # a worker's claim to its handler's start, at most
    #: ...and more for a worker's first run (its thread pool, connections and scripts are
    #: new), on two loaded cores.
    first_run_ms: int = 2000
    early_tolerance_ms: int = 10
    slack_ms: int = 50  # how far two processes' observations of one instant may differ
    reconnect_ms: int = 2000  # after a store fault ends, until claims get through (backoff)
    idle_ms: int = 5000
    outranks_ms: int = 1000  # a clock this far ahead wins every claim-only claim

    @property
    def store_clock(self) -> bool:
        """Whether the store's clock, not the worker's, decides when a claim may win."""
        return self.lease_store or self.holds_early_claims

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Violation:
    kind: str
    message: str
    lines: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": self.message, "lines": self.lines}


@dataclass
class Verdict:
    violations: list[Violation]
    excused: Counter[str]
    stats: dict[str, Any]

    @property
    def ok(self) -> bool:
        return not self.violations

    def counts(self) -> dict[str, int]:
        found = Counter(v.kind for v in self.violations)
        return {kind: found.get(kind, 0) for kind in KINDS}

    def summary(self, per_kind: int = 3) -> str:
        counts = self.counts()
        out = ["verdict: " + ("CLEAN" if self.ok else "VIOLATIONS"),
               "  " + "  ".join(f"{k}={n}" for k, n in counts.items())]
        if self.excused:
            out.append("  excused: " + ", ".join(f"{k}={n}" for k, n in sorted(self.excused.items())))
        out.append("  " + ", ".join(f"{k}={v}" for k, v in self.stats.items() if not isinstance(v, dict)))
        for kind in KINDS:
            shown = [v for v in self.violations if v.kind == kind][:per_kind]
            for v in shown:
                out.append(f"- {kind}: {v.message}")
                out.extend(f"    {line}" for line in v.lines[:4])
            if counts[kind] > len(shown):
                out.append(f"  ... and {counts[kind] - len(shown)} more {kind}")
        return "\n".join(out)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok, "counts": self.counts(), "excused": dict(self.excused),
            "stats": self.stats, "violations": [v.to_dict() for v in self.violations],
        }


def read_lines(paths: Iterable[Path]) -> tuple[list[Line], int]:
    """Every handler line in ``paths``; also how many lines could not be parsed."""
    lines: list[Line] = []
    bad = 0
    for path in sorted(paths):
        for raw in path.read_text().splitlines():
            if not raw.strip():
                continue
            try:
                lines.append(Line.parse(raw))
            except (ValueError, KeyError, TypeError):
                bad += 1
    return lines, bad


@dataclass
class _Life:
    """One worker process, from the harness's events."""

    instance: str
    skew_ms: int = 0
    spawned: float = math.inf
    ready: float = math.inf
    ended: float = math.inf  # killed or exited
    killed: float | None = None
    termed: float | None = None
    exit_rc: int | None = None
    exited: float | None = None
    crashed: bool = False
    detail: str = ""
    first_start: float = math.inf  # true time of its first handler start
    #: How far behind its own clock its claims were answered in its last seconds
    #: (``_note_lag``): a worker that far behind had claims that far in flight.
    lag_ms: float = 0.0

    def up_at(self, t: float) -> bool:
        return self.ready <= t < self.ended


def _lives(events: list[Event]) -> dict[str, _Life]:
    lives: dict[str, _Life] = {}
    for e in sorted(events, key=lambda e: e.t_ms):
        if not e.instance:
            continue
        life = lives.setdefault(e.instance, _Life(e.instance))
        if e.kind == "spawn":
            life.spawned, life.skew_ms = e.t_ms, e.skew_ms
        elif e.kind == "ready":
            life.ready = min(life.ready, e.t_ms)
        elif e.kind == "kill":
            life.killed = e.t_ms
            life.ended = min(life.ended, e.t_ms)
        elif e.kind == "term":
            life.termed = e.t_ms
        elif e.kind == "exit":
            life.exit_rc, life.exited = e.rc, e.t_ms
            life.ended = min(life.ended, e.t_ms)
            if not e.expected:
                life.crashed, life.detail = True, e.detail
    return lives


def check(jobs: list[JobSpec], lines: list[Line], events: list[Event], rules: Rules) -> Verdict:
    """The verdict: every violation found, the misses excused (and why), and figures."""
    violations: list[Violation] = []
    excused: Counter[str] = Counter()
    specs = {j.name: j for j in jobs}
    starts = [line for line in lines if line.event == "start" and line.job in specs]
    lives = _lives(events)
    store_faults = [e for e in events if e.kind in ("cut", "restart")]
    deaths = [(life.killed if life.killed is not None else life.exited or 0.0, life)
              for life in lives.values() if life.killed is not None or life.crashed]
    terms = [life.termed for life in lives.values() if life.termed is not None]
    first_term = min(terms) if terms else math.inf
    max_ahead = max([0, *(life.skew_ms for life in lives.values())])
    slack = rules.slack_ms

    def faulted(a: float, b: float) -> Event | None:
        """A store fault (cut or restart) that overlaps [a, b]."""
        for e in store_faults:
            if e.t_ms - slack <= b and (e.t_end_ms or e.t_ms) + slack >= a:
                return e
        return None

    # -- duplicates and attempts ------------------------------------------------------
    by_run: dict[tuple[str, int], list[Line]] = defaultdict(list)
    for s in starts:
        by_run[(s.job, s.slot)].append(s)
    for (job, slot), runs in sorted(by_run.items()):
        spec = specs[job]
        single = spec.max_attempts == 1 or not rules.lease_store
        per_attempt = Counter(s.attempt for s in runs)
        if single and len(runs) > 1:
            violations.append(Violation(
                "duplicate", f"{job} slot {slot} started {len(runs)} times",
                [s.raw for s in runs]))
        elif not single:
            for attempt, n in sorted(per_attempt.items()):
                if n > 1:
                    violations.append(Violation(
                        "duplicate", f"{job} slot {slot} attempt {attempt} started {n} times",
                        [s.raw for s in runs if s.attempt == attempt]))
        for s in runs:
            if not rules.lease_store and (s.attempt > 1 or s.reason == "takeover"):
                violations.append(Violation(
                    "attempt", f"{job} slot {slot}: attempt {s.attempt} ({s.reason}) on a "
                    "claim-only store", [s.raw]))
            elif s.attempt > spec.max_attempts:
                violations.append(Violation(
                    "attempt", f"{job} slot {slot}: attempt {s.attempt} > max_attempts "
                    f"{spec.max_attempts}", [s.raw]))

    # -- early starts -----------------------------------------------------------------
    for s in starts:
        allowed = rules.early_tolerance_ms + (0 if rules.store_clock else max(0, s.skew_ms))
        if s.true_ms < s.slot - allowed:
            violations.append(Violation(
                "early", f"{s.job} slot {s.slot} started {s.slot - s.true_ms:.0f} ms before "
                f"its slot on {s.instance} (clock {s.skew_ms:+d} ms; allowed {allowed} ms)",
                [s.raw]))

    # -- takeovers --------------------------------------------------------------------
    takeovers_explained = 0
    if rules.lease_store:
        for (job, slot), runs in sorted(by_run.items()):
            for s in sorted(runs, key=lambda r: r.attempt):
                if s.attempt < 2:
                    continue
                before = [r for r in runs if r.attempt == s.attempt - 1]
                why = _explain_takeover(s, before, lives, deaths, faulted, first_term,
                                        max_ahead, slack)
                if why is None:
                    prev = before[0].raw if before else "(no start of the previous attempt)"
                    violations.append(Violation(
                        "takeover", f"{job} slot {slot} attempt {s.attempt} ({s.reason}) on "
                        f"{s.instance}: its previous runner was neither killed, cut off nor "
                        "stopped", [prev, s.raw]))
                else:
                    takeovers_explained += 1
                    excused[f"takeover: {why}"] += 1

    # -- misses -----------------------------------------------------------------------
    for s in starts:
        if s.instance in lives:
            lives[s.instance].first_start = min(lives[s.instance].first_start, s.true_ms)
    first, last = rules.window
    answered: dict[tuple[str, int], list[Line]] = defaultdict(list)
    for line in lines:
        if line.event == "claim":
            answered[(line.job, line.slot)].append(line)
    _note_lag(lines, lives, rules)
    expected = 0
    for spec in jobs:
        for slot in spec.slots(first, last):
            expected += 1
            if (spec.name, slot) in by_run:
                continue
            why = _excuse_miss(spec, slot, rules, lives, deaths, store_faults,
                               answered.get((spec.name, slot), []))
            if why is None:
                violations.append(Violation(
                    "missed", f"{spec.name} slot {slot} never started "
                    f"({_fmt_near(slot, events)})"))
            else:
                excused[f"missed: {why}"] += 1

    # -- workers: crashes, stops, liveness ------------------------------------------------
    last_start: dict[str, float] = {}
    per_instance: Counter[str] = Counter()
    for s in starts:
        per_instance[s.instance] += 1
        last_start[s.instance] = max(last_start.get(s.instance, -math.inf), s.true_ms)
    last_answer: dict[str, float] = {}
    for line in lines:
        if line.event == "claim":
            last_answer[line.instance] = max(last_answer.get(line.instance, -math.inf),
                                             line.true_ms)
    for life in lives.values():
        if life.crashed:
            violations.append(Violation(
                "crash", f"worker {life.instance} exited by itself with status {life.exit_rc}",
                life.detail.splitlines()[-6:]))
        if life.termed is not None and life.killed is None and not life.crashed:
            bound = rules.grace_ms + rules.stop_bound_ms
            # A worker still starting (no banner yet) may die of SIGTERM's default action.
            fine = (0,) if life.ready <= life.termed else (0, -15)
            if life.exited is None:
                violations.append(Violation(
                    "stop", f"worker {life.instance} did not exit after SIGTERM"))
            elif life.exited - life.termed > bound or life.exit_rc not in fine:
                violations.append(Violation(
                    "stop", f"worker {life.instance} exited {life.exited - life.termed:.0f} ms "
                    f"after SIGTERM with status {life.exit_rc} (bound {bound} ms)"))
    exempt = 0
    if terms:
        end = first_term
        since = end - rules.idle_ms
        # A worker ahead of a lease store's clock arms its first slots at its own "now":
        # it can start nothing until ready + skew (true time), so only then does it count.
        alive = [life for life in lives.values()
                 if life.termed is not None and life.killed is None and not life.crashed
                 and life.ready + (max(life.skew_ms, 0) if rules.store_clock else 0) <= since]
        for life in alive:
            if last_start.get(life.instance, -math.inf) >= since:
                continue
            if last_answer.get(life.instance, -math.inf) >= since:
                continue  # claiming and answered: it lost its races, it is not wedged
            if _uncovered(life, lives.values(), since, end, rules) <= rules.claim_bound_ms:
                exempt += 1
                continue
            violations.append(Violation(
                "idle", f"worker {life.instance} (clock {life.skew_ms:+d} ms) started nothing in "
                f"the last {rules.idle_ms} ms before SIGTERM and heard no claim answered "
                f"(last start {_ago(last_start.get(life.instance), end)}, last answer "
                f"{_ago(last_answer.get(life.instance), end)})"))

    stats: dict[str, Any] = {
        "slots": expected, "starts": len(starts),
        "kills": sum(1 for e in events if e.kind == "kill"),
        "cuts": sum(1 for e in events if e.kind == "cut"),
        "restarts": sum(1 for e in events if e.kind == "restart"),
        "workers": len(lives), "takeovers": sum(1 for s in starts if s.attempt > 1),
        "takeovers_explained": takeovers_explained, "idle_exempt": exempt,
        "starts_after_sigterm": sum(1 for s in starts if s.true_ms > first_term),
        "fenced": sum(1 for line in lines if line.event == "end" and line.aborted == "takeover"),
        "per_instance": dict(sorted(per_instance.items())),
    }
    return Verdict(violations, excused, stats)


def _explain_takeover(
    s: Line, before: list[Line], lives: dict[str, _Life], deaths: list[tuple[float, _Life]],
    faulted: Any, first_term: float, max_ahead: int, slack: int,
) -> str | None:
    """Why attempt ``s`` could rightly take the run over, or None."""
    if s.true_ms >= first_term - slack:
        return "hand-over at stop"
    if before:
        for prev in before:
            life = lives.get(prev.instance)
            if life is None:
                continue
            if life.killed is not None and prev.true_ms - slack <= life.killed <= s.true_ms + slack:
                return "runner killed"
            if life.crashed and life.exited is not None and life.exited <= s.true_ms + slack:
                return "runner crashed"
            if life.termed is not None and life.termed <= s.true_ms + slack:
                return "runner stopped"
            if faulted(prev.true_ms, s.true_ms) is not None:
                return "runner cut off"
        return None
    # The previous attempt never started: its claimer died or lost the store first.
    since = s.slot - max_ahead - slack
    if any(since <= t <= s.true_ms + slack for t, _ in deaths):
        return "unstarted attempt, a worker died"
    if faulted(since, s.true_ms) is not None:
        return "unstarted attempt, store fault"
    return None


#: How long before its death a worker's claim answers tell how far behind it was.
LAG_WINDOW_MS = 3_000


def _claims_at(slot: int, life: _Life, rules: Rules) -> float:
    """The true time at which ``life`` claims ``slot`` when it keeps up with its clock."""
    return slot if rules.store_clock else slot - life.skew_ms


def _note_lag(lines: list[Line], lives: dict[str, _Life], rules: Rules) -> None:
    """Each killed worker's lag: the latest answer to its claims, past the time it would
    have claimed, in its last ``LAG_WINDOW_MS``. Seen in CI (rabbitmq, a loaded machine):
    a +5 s worker answered 2.6 s behind its clock, killed with two claims in flight."""
    for line in lines:
        life = lives.get(line.instance)
        if line.event != "claim" or life is None or life.killed is None:
            continue
        if life.killed - LAG_WINDOW_MS <= line.true_ms <= life.killed:
            life.lag_ms = max(life.lag_ms, line.true_ms - _claims_at(line.slot, life, rules))


def _excuse_miss(
    spec: JobSpec, slot: int, rules: Rules, lives: dict[str, _Life],
    deaths: list[tuple[float, _Life]], store_faults: list[Event], answered: list[Line],
) -> str | None:
    """The documented blind spot that explains a slot that never started, or None.

    ``answered``: the lines of the claims of ``slot`` that workers heard answered.
    """
    slack = rules.slack_ms
    won = [line for line in answered if line.reason == "won"]
    if not any(life.up_at(slot) for life in lives.values()):
        return "every worker down"
    attempts = spec.max_attempts if rules.lease_store else 1
    if attempts == 1:
        # The winner said when it won: killed within claim_bound of that (more before its
        # first start), it never started. This holds whenever it claimed, early or late
        # (a worker still working through its first seconds claims later than its clock).
        for claim in won:
            life = lives.get(claim.instance)
            if life is None or life.killed is None:
                continue
            bound = rules.claim_bound_ms + (
                rules.first_run_ms if life.first_start > life.killed else 0)
            if claim.true_ms - slack <= life.killed <= claim.true_ms + bound:
                return "winner killed before starting"
        # A worker claims slot s at its own clock's s (true s - skew) and starts within
        # claim_bound; killed in that gap, the claim is won and the start never comes.
        # (A lease store answers an early claim "early"; the worker claims again at s.)
        for t, life in deaths:
            # A fresh worker's first run (it had started nothing, and the slot is among
            # its first) may take longer from claim to start.
            fresh = life.first_start > t and slot - life.ready <= max(life.skew_ms, 0) + (
                rules.first_run_ms)
            bound = rules.claim_bound_ms + (rules.first_run_ms if fresh else 0)
            lo = slot - life.skew_ms - slack
            hi = slot - life.skew_ms + bound
            if rules.store_clock and life.skew_ms > 0:
                hi = slot + bound  # told "early", it waits for the slot
            # Where the store's clock decides (a lease store, stream-id), every worker arms
            # its timers by it (engine/clock.py): whatever its skew, it claims at the slot.
            by_store = rules.store_clock and slot - slack <= t <= slot + bound
            if (lo <= t <= hi or by_store) and life.ready <= t:
                return "winner killed before starting"
            # A worker behind its clock (a loaded machine) had claims in flight as far
            # back as its lag: killed before this slot's answer came, with every other
            # claim of it lost (so the store had given it to someone), its claim won.
            claimed = _claims_at(slot, life, rules)
            lost = answered and all(line.reason == "lost" for line in answered)
            if lost and life.lag_ms and claimed - slack <= t <= claimed + life.lag_ms + bound:
                return "claimer killed with its claim in flight"
    else:
        # Every attempt's claimer must have died before its start.
        span = attempts * (rules.lease_ms + rules.heartbeat_ms) + rules.claim_bound_ms
        lo = slot - max(0, *(life.skew_ms for _, life in deaths)) - slack
        if sum(1 for t, _ in deaths if lo <= t <= slot + span) >= attempts:
            return "every attempt's winner killed before starting"
    for e in store_faults:
        end = (e.t_end_ms or e.t_ms) + rules.reconnect_ms
        if e.t_ms - slack <= slot and slot + spec.max_late_ms <= end:
            return f"store {e.kind} outlasted max_late"
    return None


def _uncovered(
    life: _Life, lives: Iterable[_Life], since: float, end: float, rules: Rules,
) -> float:
    """How much of [since, end] no worker with a later clock covered for ``life``.

    A worker ``skew`` ahead claims (and, claim-only, starts) each slot ``skew`` early, so
    from its ready instant until ``skew`` after its death it wins every claim-only claim of
    a worker behind it. On a lease store the store's clock holds early claims back, so only
    a worker behind the store's clock (``life.skew_ms`` negative) always comes late.
    """
    if rules.store_clock and life.skew_ms > -rules.outranks_ms:
        return end - since
    spans = sorted(
        (other.ready, other.ended + (other.skew_ms - life.skew_ms))
        for other in lives
        if other is not life and other.skew_ms - life.skew_ms >= rules.outranks_ms
        and other.ready < math.inf
    )
    uncovered, at = 0.0, since
    for lo, hi in spans:
        if hi <= at:
            continue
        if lo > at:
            uncovered += min(lo, end) - at
        at = max(at, hi)
        if at >= end:
            break
    return uncovered + max(0.0, end - at)


def _ago(t: float | None, end: float) -> str:
    return "never" if t is None else f"{(end - t) / 1000:.1f} s before"


def _fmt_near(slot: int, events: list[Event]) -> str:
    near = [e for e in events if abs(e.t_ms - slot) <= 3000 and e.kind in ("kill", "cut", "restart",
                                                                             "exit")]
    if not near:
        return "no fault within 3 s"
    return "near: " + ", ".join(f"{e.kind} {e.instance} at {e.t_ms - slot:+.0f} ms".replace("  ", " ")
                                for e in near[:4])
