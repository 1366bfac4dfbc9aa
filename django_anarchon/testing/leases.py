"""The lease rules of a ``RunStore`` (SPEC sections 5 and 9), each rule a test.

Every time here is the store's: leases are short and the tests wait on ``active()``
with a deadline, never on the test's own clock. Slots lie a minute in the past, so a
store whose clock lags a little never answers ``early`` where a test does not ask it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from ..backends.base import MIN_KEEP_MS, ClaimOutcome, FinalStatus, RunClaim, RunEnd, RunStore
from ..wallclock import now_ms
from ._base import (
    _HOUR_MS,
    _KEEP_MS,
    BackendFactory,
    ContractBase,
    _active,
    _Backends,
    _past_ms,
    unique_job,
)

__all__ = ["LeaseTests"]


class LeaseTests(ContractBase):
    """Every lease rule; left out for a backend declared ``supports_leases = False``."""

    def test_lease_won_running_and_repeat(self, make_backend: BackendFactory) -> None:
        async def scenario(backends: _Backends) -> None:
            backend, runs = await self.leases(backends)
            _, other = await self.leases(backends)
            job, slot = unique_job("won"), _past_ms()
            assert await runs.claim(self.run_claim(job, slot, "a", "A")) == ClaimOutcome.won(1)
            assert await other.claim(self.run_claim(job, slot, "b", "B")) == ClaimOutcome.running(1)
            assert await other.claim(self.run_claim(job, slot, "a", "A")) == ClaimOutcome.won(1)
            takeover = self.run_claim(job, slot, "c", "C", mode="takeover", max_attempts=3)
            assert await runs.claim(takeover) == ClaimOutcome.running(1)
            assert await runs.active(job) == [_active(slot, 1, True)]
            record = self.find(await backend.history(job, 10), slot=slot)
            assert (record.instance_id, record.attempt, record.status) == ("A", 1, "running")
            assert (record.reason, record.manual) == ("scheduled", False)

        self.run(make_backend, scenario)

    def test_lease_done_after_success(self, make_backend: BackendFactory) -> None:
        async def scenario(backends: _Backends) -> None:
            _, runs = await self.leases(backends)
            job, slot = unique_job("done"), _past_ms()
            assert (
                await runs.claim(self.run_claim(job, slot, "a", "A", max_attempts=3))
            ).kind == "won"
            assert await runs.finish(job, slot, "a", "success") is True
            for token, instance in (("b", "B"), ("a", "A")):
                again = self.run_claim(job, slot, token, instance, max_attempts=3)
                assert await runs.claim(again) == ClaimOutcome.done()
            assert await runs.active(job) == []

        self.run(make_backend, scenario)

    def test_lease_retry_while_attempts_remain(self, make_backend: BackendFactory) -> None:
        async def scenario(backends: _Backends) -> None:
            backend, runs = await self.leases(backends)
            job, slot = unique_job("retry"), _past_ms()
            statuses: list[FinalStatus] = ["failed", "interrupted", "failed"]
            for attempt, status in enumerate(statuses, start=1):
                token, instance = f"t{attempt}", f"I{attempt}"
                claim = self.run_claim(job, slot, token, instance, max_attempts=3)
                assert await runs.claim(claim) == ClaimOutcome.won(attempt)
                assert await runs.active(job) == [_active(slot, attempt, True)]
                assert await runs.finish(job, slot, token, status) is True
                await backend.save_result(
                    job, self.result(slot, instance, now_ms(), attempt=attempt, status=status), 10
                )
            last = self.run_claim(job, slot, "t4", "I4", max_attempts=3)
            assert await runs.claim(last) == ClaimOutcome.done()
            records = await backend.history(job, 10)
            assert [(r.attempt, r.instance_id, r.status) for r in records] == [
                (3, "I3", "failed"),
                (2, "I2", "interrupted"),
                (1, "I1", "failed"),
            ]

        self.run(make_backend, scenario)

    def test_lease_retry_keeps_the_claim_reason(self, make_backend: BackendFactory) -> None:
        async def scenario(backends: _Backends) -> None:
            backend, runs = await self.leases(backends)
            job, slot = unique_job("reason"), _past_ms()
            first = self.run_claim(job, slot, "a", "A", max_attempts=2, reason="catch-up")
            assert await runs.claim(first) == ClaimOutcome.won(1)
            assert await runs.finish(job, slot, "a", "failed")
            retry = self.run_claim(job, slot, "b", "B", max_attempts=2)
            assert await runs.claim(retry) == ClaimOutcome.won(2)
            records = await backend.history(job, 10)
            assert self.find(records, attempt=1).reason == "catch-up"
            second = self.find(records, attempt=2)
            assert (second.reason, second.instance_id, second.status) == (
                "scheduled",
                "B",
                "running",
            )

        self.run(make_backend, scenario)

    def test_lease_done_when_attempts_used_up(self, make_backend: BackendFactory) -> None:
        async def scenario(backends: _Backends) -> None:
            _, runs = await self.leases(backends)
            job, slot = unique_job("usedup"), _past_ms()
            assert await runs.claim(self.run_claim(job, slot, "a", "A")) == ClaimOutcome.won(1)
            assert await runs.finish(job, slot, "a", "failed")
            assert await runs.claim(self.run_claim(job, slot, "b", "B")) == ClaimOutcome.done()
            takeover = self.run_claim(job, slot, "c", "C", mode="takeover")
            assert await runs.claim(takeover) == ClaimOutcome.done()

        self.run(make_backend, scenario)

    def test_lease_none_for_takeover_of_unknown_run(self, make_backend: BackendFactory) -> None:
        async def scenario(backends: _Backends) -> None:
            _, runs = await self.leases(backends)
            job, slot = unique_job("none"), _past_ms()
            takeover = self.run_claim(job, slot, "a", "A", mode="takeover", max_attempts=3)
            assert await runs.claim(takeover) == ClaimOutcome.none()
            assert await runs.active(job) == []
            assert await runs.claim(self.run_claim(job, slot, "b", "B")) == ClaimOutcome.won(1)

        self.run(make_backend, scenario)

    def test_lease_late(self, make_backend: BackendFactory) -> None:
        """Late by the store's clock: an hour of margin absorbs any clock skew."""

        async def scenario(backends: _Backends) -> None:
            _, runs = await self.leases(backends)
            job, now = unique_job("late"), _past_ms()
            slot = now - _HOUR_MS
            outcome = await runs.claim(self.run_claim(job, slot, "a", "A", max_late_ms=60_000))
            assert outcome.kind == "late", outcome
            assert outcome.late_ms is not None and outcome.late_ms > 60_000, outcome
            assert abs(outcome.late_ms - _HOUR_MS) < _HOUR_MS // 2, outcome
            assert await runs.active(job) == []
            in_time = self.run_claim(job, now, "b", "B", max_late_ms=_HOUR_MS)
            assert await runs.claim(in_time) == ClaimOutcome.won(1)

        self.run(make_backend, scenario)

    def test_lease_overlap_skip_and_allow(self, make_backend: BackendFactory) -> None:
        async def scenario(backends: _Backends) -> None:
            _, runs = await self.leases(backends)
            job, base = unique_job("overlap"), _past_ms()
            first, second, third = base, base + 1000, base + 2000
            assert await runs.claim(self.run_claim(job, first, "a", "A")) == ClaimOutcome.won(1)
            skip = self.run_claim(job, second, "b", "B", overlap="skip")
            assert await runs.claim(skip) == ClaimOutcome.overlap(first)
            assert await runs.active(job) == [_active(first, 1, True)]
            allow = self.run_claim(job, second, "c", "C", overlap="allow")
            assert await runs.claim(allow) == ClaimOutcome.won(1)
            assert await runs.finish(job, first, "a", "success")
            assert await runs.finish(job, second, "c", "success")
            assert await runs.claim(self.run_claim(job, third, "d", "D")) == ClaimOutcome.won(1)

        self.run(make_backend, scenario)

    def test_lease_lapsed_lease_does_not_block(self, make_backend: BackendFactory) -> None:
        async def scenario(backends: _Backends) -> None:
            _, runs = await self.leases(backends)
            job, base = unique_job("lapsedoverlap"), _past_ms()
            assert await runs.claim(self.run_claim(job, base, "a", "A")) == ClaimOutcome.won(1)
            assert await runs.release(job, base, "a") is True
            nxt = self.run_claim(job, base + 1000, "b", "B", overlap="skip")
            assert await runs.claim(nxt) == ClaimOutcome.won(1)

        self.run(make_backend, scenario)

    def test_lease_takeover_after_lapse(self, make_backend: BackendFactory) -> None:
        async def scenario(backends: _Backends) -> None:
            backend, runs = await self.leases(backends)
            _, backup = await self.leases(backends)
            job, slot, lease = unique_job("takeover"), _past_ms(), self.lease_ms
            first = self.run_claim(job, slot, "a", "A", lease_ms=lease, max_attempts=2)
            assert await runs.claim(first) == ClaimOutcome.won(1)
            await self.wait_lapsed(runs, job, slot)
            takeover = self.run_claim(job, slot, "b", "B", mode="takeover", max_attempts=2)
            assert await backup.claim(takeover) == ClaimOutcome.won(2)
            assert await runs.active(job) == [_active(slot, 2, True)]

            # Fencing: the stale runner is refused everywhere.
            assert await runs.heartbeat(job, slot, "a", 30_000) is False
            assert await runs.release(job, slot, "a") is False
            assert await runs.finish(job, slot, "a", "success") is False
            again = self.run_claim(job, slot, "a", "A", max_attempts=2)
            assert await runs.claim(again) == ClaimOutcome.running(2)
            assert await backup.heartbeat(job, slot, "b", 30_000) is True

            records = await backend.history(job, 10)
            second = self.find(records, attempt=2)
            assert (second.instance_id, second.reason, second.status) == (
                "B",
                "takeover",
                "running",
            )
            first_rec = self.find(records, attempt=1)
            assert (first_rec.instance_id, first_rec.status) == ("A", "interrupted")
            assert first_rec.error, first_rec

            assert await backup.finish(job, slot, "b", "success") is True
            assert await runs.claim(self.run_claim(job, slot, "c", "C", max_attempts=2)) == (
                ClaimOutcome.done()
            )

        self.run(make_backend, scenario)

    def test_lease_lapsed_with_attempts_used_up(self, make_backend: BackendFactory) -> None:
        async def scenario(backends: _Backends) -> None:
            backend, runs = await self.leases(backends)
            job, slot = unique_job("lapsedone"), _past_ms()
            first = self.run_claim(job, slot, "a", "A", lease_ms=self.lease_ms)
            assert await runs.claim(first) == ClaimOutcome.won(1)
            await self.wait_lapsed(runs, job, slot)
            takeover = self.run_claim(job, slot, "b", "B", mode="takeover")
            assert await runs.claim(takeover) == ClaimOutcome.done()
            assert await runs.active(job) == []
            assert await runs.claim(self.run_claim(job, slot, "c", "C")) == ClaimOutcome.done()
            assert await runs.heartbeat(job, slot, "a", 30_000) is False
            record = self.find(await backend.history(job, 10), slot=slot)
            assert (record.attempt, record.instance_id, record.status) == (1, "A", "interrupted")

        self.run(make_backend, scenario)

    def test_lease_peek_many_answers_as_a_claim_that_changes_nothing(
        self, make_backend: BackendFactory
    ) -> None:
        """``peek_many`` (optional): where a claim of the run would change nothing, the
        claim's answer; ``None`` wherever it would (a new run, a takeover, a retry, a
        larger keep or ``max_attempts``). The peek itself changes nothing."""

        async def scenario(backends: _Backends) -> None:
            backend, runs = await self.leases(backends)
            peek = getattr(runs, "peek_many", None)
            if not callable(peek):
                pytest.skip(f"{type(runs).__name__} has no peek_many()")
            _, other = await self.leases(backends)
            slot = _past_ms()
            jobs = {name: unique_job(f"peek{name}") for name in (
                "new", "running", "mine", "lapsed", "done", "failed", "used", "more", "keep")}

            def claim(name: str, token: str, **kw: Any) -> RunClaim:
                return self.run_claim(jobs[name], slot, token, token.upper(), **kw)

            for name in ("running", "mine", "more", "keep"):
                assert await runs.claim(claim(name, "a")) == ClaimOutcome.won(1)
            ends: list[tuple[str, FinalStatus, int]] = [
                ("done", "success", 3), ("failed", "failed", 3), ("used", "failed", 2)
            ]
            for name, status, attempts in ends:
                won = await runs.claim(claim(name, "a", max_attempts=attempts))
                assert won == ClaimOutcome.won(1)
                assert await runs.finish(jobs[name], slot, "a", status) is True
            assert await runs.claim(claim("used", "b", max_attempts=2)) == ClaimOutcome.won(2)
            assert await runs.finish(jobs["used"], slot, "b", "failed") is True
            lapsed = claim("lapsed", "a", lease_ms=self.lease_ms)
            assert await runs.claim(lapsed) == ClaimOutcome.won(1)
            await self.wait_lapsed(runs, jobs["lapsed"], slot)

            looks = {
                "new": (claim("new", "z"), None),
                "running": (claim("running", "z"), ClaimOutcome.running(1)),
                "mine": (claim("mine", "a"), None),  # the same claim again renews the lease
                "lapsed": (claim("lapsed", "z"), None),  # a takeover, or the store ends it
                "done": (claim("done", "z", max_attempts=3), ClaimOutcome.done()),
                "failed": (claim("failed", "z", max_attempts=3), None),  # its retry
                "used": (claim("used", "z", max_attempts=2), ClaimOutcome.done()),
                "more": (claim("more", "z", max_attempts=2), None),  # a larger max_attempts
                "keep": (claim("keep", "z", keep_ms=_HOUR_MS), None),  # a larger keep
            }
            seen = {name: (await runs.active(job), await backend.history(job, 10))
                    for name, job in jobs.items()}
            peeked = await peek([c for c, _ in looks.values()])
            assert dict(zip(looks, peeked, strict=True)) == {n: a for n, (_, a) in looks.items()}
            for name, job in jobs.items():
                assert (await runs.active(job), await backend.history(job, 10)) == seen[name], name
            # What the peek answered, the claim answers.
            for name, (c, answer) in looks.items():
                if answer is not None:
                    assert await other.claim(c) == answer, name

        self.run(make_backend, scenario)

    def test_lease_heartbeat_renews_a_lapsed_lease(self, make_backend: BackendFactory) -> None:
        async def scenario(backends: _Backends) -> None:
            _, runs = await self.leases(backends)
            job, slot = unique_job("renew"), _past_ms()
            claim = self.run_claim(job, slot, "a", "A", lease_ms=self.lease_ms, max_attempts=2)
            assert await runs.claim(claim) == ClaimOutcome.won(1)
            await self.wait_lapsed(runs, job, slot)
            assert await runs.heartbeat(job, slot, "a", 30_000) is True
            assert await runs.active(job) == [_active(slot, 1, True)]
            takeover = self.run_claim(job, slot, "b", "B", mode="takeover", max_attempts=2)
            assert await runs.claim(takeover) == ClaimOutcome.running(1)

        self.run(make_backend, scenario)

    def test_lease_release_hands_over_at_once(self, make_backend: BackendFactory) -> None:
        async def scenario(backends: _Backends) -> None:
            backend, runs = await self.leases(backends)
            job, slot = unique_job("release"), _past_ms()
            claim = self.run_claim(job, slot, "a", "A", lease_ms=600_000, max_attempts=2)
            assert await runs.claim(claim) == ClaimOutcome.won(1)
            assert await runs.release(job, slot, "x") is False
            assert await runs.active(job) == [_active(slot, 1, True)]
            assert await runs.release(job, slot, "a") is True
            assert await runs.active(job) == [_active(slot, 1, False)]
            takeover = self.run_claim(job, slot, "b", "B", mode="takeover", max_attempts=2)
            assert await runs.claim(takeover) == ClaimOutcome.won(2)
            assert await runs.finish(job, slot, "a", "interrupted") is False
            record = self.find(await backend.history(job, 10), attempt=2)
            assert (record.instance_id, record.reason) == ("B", "takeover")

        self.run(make_backend, scenario)

    def test_lease_token_fencing(self, make_backend: BackendFactory) -> None:
        async def scenario(backends: _Backends) -> None:
            _, runs = await self.leases(backends)
            job, slot = unique_job("fencing"), _past_ms()
            assert await runs.claim(self.run_claim(job, slot, "a", "A")) == ClaimOutcome.won(1)
            assert await runs.heartbeat(job, slot, "x", 30_000) is False
            assert await runs.finish(job, slot, "x", "success") is False
            assert await runs.release(job, slot, "x") is False
            assert await runs.active(job) == [_active(slot, 1, True)]
            assert await runs.heartbeat(job, slot + 1, "a", 30_000) is False
            assert await runs.finish(job, slot + 1, "a", "success") is False
            assert await runs.heartbeat(job, slot, "a", 30_000) is True
            assert await runs.finish(job, slot, "a", "success") is True
            assert await runs.heartbeat(job, slot, "a", 30_000) is False
            assert await runs.release(job, slot, "a") is False
            assert await runs.active(job) == []

        self.run(make_backend, scenario)

    def test_lease_active_lists_running_runs(self, make_backend: BackendFactory) -> None:
        async def scenario(backends: _Backends) -> None:
            _, runs = await self.leases(backends)
            job, base = unique_job("active"), _past_ms()
            assert await runs.active(job) == []
            for i, token in enumerate(("a", "b", "c")):
                claim = self.run_claim(job, base + i * 1000, token, "A", overlap="allow")
                assert await runs.claim(claim) == ClaimOutcome.won(1)
            assert await runs.release(job, base + 1000, "b")
            assert await runs.finish(job, base + 2000, "c", "success")
            active = sorted(await runs.active(job), key=lambda a: a.slot)
            assert active == [_active(base, 1, True), _active(base + 1000, 1, False)]

        self.run(make_backend, scenario)

    def test_lease_keep_ms_remembers_finished_run(self, make_backend: BackendFactory) -> None:
        async def scenario(backends: _Backends) -> None:
            _, runs = await self.leases(backends)
            job, slot = unique_job("keep"), _past_ms()
            claim = self.run_claim(job, slot, "a", "A", keep_ms=60_000)
            assert await runs.claim(claim) == ClaimOutcome.won(1)
            assert await runs.finish(job, slot, "a", "success")
            again = self.run_claim(job, slot, "b", "B", keep_ms=60_000)
            assert await runs.claim(again) == ClaimOutcome.done()

        self.run(make_backend, scenario)

    def test_lease_runs_of_jobs_are_independent(self, make_backend: BackendFactory) -> None:
        async def scenario(backends: _Backends) -> None:
            _, runs = await self.leases(backends)
            one, two, slot = unique_job("r1"), unique_job("r2"), _past_ms()
            assert await runs.claim(self.run_claim(one, slot, "a", "A")) == ClaimOutcome.won(1)
            assert await runs.claim(self.run_claim(two, slot, "b", "B")) == ClaimOutcome.won(1)
            assert await runs.active(two) == [_active(slot, 1, True)]
            assert await runs.finish(two, slot, "b", "success")
            assert await runs.active(one) == [_active(slot, 1, True)]

        self.run(make_backend, scenario)

    # -- what SPEC section 9 added -----------------------------------------------------

    def test_lease_early_claim_waits(self, make_backend: BackendFactory) -> None:
        """A new run is never started before its slot by the store's clock."""

        async def scenario(backends: _Backends) -> None:
            backend, runs = await self.leases(backends)
            job, slot = unique_job("early"), now_ms() + _HOUR_MS
            outcome = await runs.claim(self.run_claim(job, slot, "a", "A"))
            assert outcome.kind == "early", outcome
            assert outcome.wait_ms is not None, outcome
            assert abs(outcome.wait_ms - _HOUR_MS) < _HOUR_MS // 2, outcome
            # Nothing was written: no run to take over, nothing running, no history.
            assert await runs.active(job) == []
            takeover = self.run_claim(job, slot, "b", "B", mode="takeover", max_attempts=2)
            assert await runs.claim(takeover) == ClaimOutcome.none()
            assert await backend.history(job, 10) == []

        self.run(make_backend, scenario)

    def test_lease_now_ms_is_the_clock_claims_are_judged_by(
        self, make_backend: BackendFactory
    ) -> None:
        """The optional ``runs.now_ms(job)``: a claim of a slot 20 s after it is ``early``
        by 20 s, give or take the round trips, and one 20 s before it is ``late``."""

        async def scenario(backends: _Backends) -> None:
            _, runs = await self.leases(backends)
            clock = getattr(runs, "now_ms", None)
            if clock is None:
                pytest.skip("the RunStore has no now_ms(job)")
            job = unique_job("clock")
            now = int(await clock(job))
            outcome = await runs.claim(self.run_claim(job, now + 20_000, "a", "A"))
            assert outcome.kind == "early" and outcome.wait_ms is not None, outcome
            assert 15_000 <= outcome.wait_ms <= 20_000, outcome
            late = self.run_claim(job, now - 20_000, "b", "B", max_late_ms=10_000)
            outcome = await runs.claim(late)
            assert outcome.kind == "late" and outcome.late_ms is not None, outcome
            assert 20_000 <= outcome.late_ms <= 25_000, outcome

        self.run(make_backend, scenario)

    def test_lease_finish_is_repeat_safe(self, make_backend: BackendFactory) -> None:
        """A finish whose reply was lost is sent again: the same token and status is True."""

        async def scenario(backends: _Backends) -> None:
            _, runs = await self.leases(backends)
            job, slot = unique_job("finishagain"), _past_ms()
            assert await runs.claim(self.run_claim(job, slot, "a", "A")) == ClaimOutcome.won(1)
            assert await runs.finish(job, slot, "a", "success") is True
            assert await runs.finish(job, slot, "a", "success") is True
            assert await runs.finish(job, slot, "a", "failed") is False
            assert await runs.finish(job, slot, "x", "success") is False
            assert await runs.finish(job, slot + 1, "a", "success") is False

        self.run(make_backend, scenario)

    @staticmethod
    def finishes_many(runs: RunStore) -> None:
        """Skips the test where the store has no ``runs.finish_many`` (it is optional)."""
        if not callable(getattr(runs, "finish_many", None)):
            pytest.skip("no runs.finish_many (optional)")

    def test_lease_finish_many_finishes_and_records_together(
        self, make_backend: BackendFactory
    ) -> None:
        """Each end is ``finish()``; its record is written only where that finish acted.
        The stored status is read back through a retry: a failed run with an attempt left
        is won again as attempt 2, a succeeded one is done."""

        async def scenario(backends: _Backends) -> None:
            backend, runs = await self.leases(backends)
            self.finishes_many(runs)
            jobs = [unique_job(f"ends{i}") for i in range(4)]
            slot = _past_ms()
            for i, job in enumerate(jobs[:3]):
                claim = self.run_claim(job, slot, f"t{i}", "A", max_attempts=2)
                assert await runs.claim(claim) == ClaimOutcome.won(1)
            started = now_ms()
            ends = [
                RunEnd(jobs[0], "t0", "success", self.result(slot, "A", started), 10),
                RunEnd(jobs[1], "t1", "failed",
                       self.result(slot, "A", started, status="failed", error="boom"), 10),
                # Another token than the one that holds the run: refused, and no record.
                RunEnd(jobs[2], "stale", "success", self.result(slot, "Z", started), 10),
                # A run nobody claimed: refused, and no record either.
                RunEnd(jobs[3], "t3", "success", self.result(slot, "A", started), 10),
            ]
            assert await runs.finish_many(ends) == [True, True, False, False]  # type: ignore[attr-defined]
            # Repeat-safe, as finish() is: the reply of the first call may have been lost.
            assert await runs.finish_many(ends) == [True, True, False, False]  # type: ignore[attr-defined]
            for job, status in ((jobs[0], "success"), (jobs[1], "failed")):
                (record,) = await backend.history(job, 10)
                assert (record.instance_id, record.status) == ("A", status), record
            assert (await backend.history(jobs[1], 10))[0].error == "boom"
            for job, answer in ((jobs[0], ClaimOutcome.done()), (jobs[1], ClaimOutcome.won(2))):
                assert await runs.claim(self.run_claim(job, slot, "x", "X", max_attempts=2)) == (
                    answer
                )
            (held,) = await backend.history(jobs[2], 10)
            assert (held.instance_id, held.status) == ("A", "running"), held
            assert await runs.active(jobs[2]) == [_active(slot, 1, True)]
            assert await backend.history(jobs[3], 10) == []
            assert await runs.finish(jobs[2], slot, "t2", "success") is True

        self.run(make_backend, scenario)

    def test_lease_finish_many_keeps_history_bounded(self, make_backend: BackendFactory) -> None:
        """Ends of one job in one call: its history is pruned to ``history_size`` after them."""

        async def scenario(backends: _Backends) -> None:
            backend, runs = await self.leases(backends)
            self.finishes_many(runs)
            job, base = unique_job("endsbound"), _past_ms()
            slots = [base + i * 1000 for i in range(3)]
            for i, slot in enumerate(slots):
                claim = self.run_claim(job, slot, f"t{i}", "A", overlap="allow")
                assert await runs.claim(claim) == ClaimOutcome.won(1)
            started = now_ms()
            ends = [
                RunEnd(job, f"t{i}", "success", self.result(slot, "A", started + i), 2)
                for i, slot in enumerate(slots)
            ]
            assert await runs.finish_many(ends) == [True, True, True]  # type: ignore[attr-defined]
            records = await backend.history(job, 10)
            assert [(r.slot, r.status) for r in records] == [
                (slots[2], "success"), (slots[1], "success")
            ], records

        self.run(make_backend, scenario)

    def test_lease_finish_many_races_a_takeover(self, make_backend: BackendFactory) -> None:
        """A lapsed run's late ``finish_many`` against a backup's takeover: one of them wins,
        and history says which (never "success" for a run the backup holds), whether the
        two go through separate backends or through one shared object."""

        async def scenario(backends: _Backends) -> None:
            backend, runs = await self.leases(backends)
            self.finishes_many(runs)
            _, backup = await self.leases(backends)
            for round_ in range(6):  # through another backend, then through the same one
                claimer = backup if round_ % 2 == 0 else runs
                job, slot = unique_job(f"endrace{round_}"), _past_ms()
                first = self.run_claim(job, slot, "a", "A", lease_ms=self.lease_ms, max_attempts=2)
                assert await runs.claim(first) == ClaimOutcome.won(1)
                await self.wait_lapsed(runs, job, slot)
                end = RunEnd(job, "a", "success", self.result(slot, "A", now_ms()), 10)
                takeover = self.run_claim(job, slot, "b", "B", mode="takeover", max_attempts=2)
                (finished,), taken = await asyncio.gather(
                    runs.finish_many([end]),  # type: ignore[attr-defined]
                    claimer.claim(takeover),
                )
                records = {r.attempt: r for r in await backend.history(job, 10)}
                if finished:
                    assert taken == ClaimOutcome.done(), taken
                    assert list(records) == [1] and records[1].status == "success", records
                else:
                    assert taken == ClaimOutcome.won(2), taken
                    assert records[1].status == "interrupted", records
                    assert records[2].status == "running", records

        self.run(make_backend, scenario)

    def test_lease_keep_floor_keeps_a_failed_run_for_its_retry(
        self, make_backend: BackendFactory
    ) -> None:
        """However small a claim's ``keep_ms``, a failed run is remembered for its retry."""

        async def scenario(backends: _Backends) -> None:
            _, runs = await self.leases(backends)
            job, slot = unique_job("floor"), _past_ms()
            claim = self.run_claim(job, slot, "a", "A", keep_ms=1, max_attempts=2)
            assert await runs.claim(claim) == ClaimOutcome.won(1)
            assert await runs.finish(job, slot, "a", "failed") is True
            await asyncio.sleep(0.05)  # well past keep_ms=1, well inside MIN_KEEP_MS
            retry = self.run_claim(job, slot, "b", "B", keep_ms=1, max_attempts=2)
            assert await runs.claim(retry) == ClaimOutcome.won(2)

        self.run(make_backend, scenario)

    def test_lease_keep_never_shrinks(self, make_backend: BackendFactory) -> None:
        """A claimer with a smaller ``keep_ms`` (a newer release, say) never shortens it.

        The store's clock is watched through a probe run of the same job kept only the
        minimum: once the store forgot the probe, a run that a shrunk ``keep_ms`` would
        also have let go must still be remembered.
        """

        async def scenario(backends: _Backends) -> None:
            _, runs = await self.leases(backends)
            job, slot = unique_job("keepgrows"), _past_ms()
            probe = slot - 10_000
            first = self.run_claim(job, slot, "a", "A", keep_ms=_KEEP_MS, overlap="allow")
            assert await runs.claim(first) == ClaimOutcome.won(1)
            assert await runs.finish(job, slot, "a", "success") is True
            small = self.run_claim(job, slot, "b", "B", keep_ms=MIN_KEEP_MS, overlap="allow")
            assert await runs.claim(small) == ClaimOutcome.done()
            p = self.run_claim(job, probe, "p", "P", keep_ms=MIN_KEEP_MS, overlap="allow")
            assert await runs.claim(p) == ClaimOutcome.won(1)
            assert await runs.finish(job, probe, "p", "success") is True
            deadline = time.monotonic() + self.wait_timeout + MIN_KEEP_MS / 1000
            check = self.run_claim(job, probe, "q", "Q", keep_ms=MIN_KEEP_MS, overlap="allow")
            while (await runs.claim(check)).kind != "won":
                assert time.monotonic() < deadline, "the store never forgot the probe run"
                await asyncio.sleep(0.2)
            late = self.run_claim(job, slot, "c", "C", keep_ms=MIN_KEEP_MS, overlap="allow")
            assert await runs.claim(late) == ClaimOutcome.done()

        self.run(make_backend, scenario)

    def test_lease_sweep_ends_lapsed_runs_with_attempts_used_up(
        self, make_backend: BackendFactory
    ) -> None:
        """A crashed runner's run does not stay ``running`` forever once nobody may take it.

        The next run of the job decided by the store ends it ``interrupted``; a lapsed run
        with attempts left is left for a backup to take over.
        """

        async def scenario(backends: _Backends) -> None:
            backend, runs = await self.leases(backends)
            for overlap in ("skip", "allow"):
                job, base = unique_job(f"sweep{overlap}"), _past_ms()
                dead, spare, nxt = base - 10_000, base - 5_000, base
                used_up = self.run_claim(job, dead, "a", "A", lease_ms=self.lease_ms)
                assert await runs.claim(used_up) == ClaimOutcome.won(1)
                left = self.run_claim(
                    job, spare, "s", "S", lease_ms=self.lease_ms, max_attempts=2, overlap="allow"
                )
                assert await runs.claim(left) == ClaimOutcome.won(1)
                await self.wait_lapsed(runs, job, dead)
                await self.wait_lapsed(runs, job, spare)
                claim = self.run_claim(job, nxt, "b", "B", overlap=overlap)
                assert await runs.claim(claim) == ClaimOutcome.won(1)
                active = sorted(await runs.active(job), key=lambda a: a.slot)
                assert active == [_active(spare, 1, False), _active(nxt, 1, True)], overlap
                assert await runs.heartbeat(job, dead, "a", 30_000) is False
                records = await backend.history(job, 10)
                swept = self.find(records, slot=dead)
                assert (swept.attempt, swept.status) == (1, "interrupted"), swept
                assert swept.error, swept
                # Nobody else could run it: its runner's late finish still counts.
                assert await runs.finish(job, dead, "a", "success") is True
                assert await runs.finish(job, dead, "x", "success") is False
                takeover = self.run_claim(
                    job, spare, "t", "T", mode="takeover", max_attempts=2, overlap="allow"
                )
                assert await runs.claim(takeover) == ClaimOutcome.won(2)

        self.run(make_backend, scenario)
