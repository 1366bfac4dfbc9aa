"""The overlap policies of a ``RunStore``: skip, buffer_one, buffer_all, cancel_other.

Each rule is a test, and each policy has a race of many claimers (one backend each, and
all through one shared backend object) that counts winners: a buffered slot runs once,
however many instances waited for it, and a cancel fences the old token at once.
Slots lie a minute in the past, like the rest of the suite; the default ``keep_ms`` of
the suite keeps every run remembered for the whole test.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from ..backends.base import ClaimOutcome, RunStore
from ..wallclock import now_ms
from ._base import (
    BackendFactory,
    ContractBase,
    _active,
    _Backends,
    _past_ms,
    unique_job,
)

__all__ = ["OverlapTests"]


class OverlapTests(ContractBase):
    """The overlap policies that the store decides; left out without leases."""

    #: Claimers of each overlap race, and how many runs each race chains.
    overlap_claimers = 20
    overlap_rounds = 10

    # -- single rules -------------------------------------------------------------------

    def test_lease_overlap_buffer_one(self, make_backend: BackendFactory) -> None:
        async def scenario(backends: _Backends) -> None:
            _, runs = await self.leases(backends)
            _, other = await self.leases(backends)
            job, base = unique_job("bufone"), _past_ms()
            first, second, third = base, base + 1000, base + 2000

            def claim(slot: int, token: str, **kw: Any) -> Any:
                return self.run_claim(job, slot, token, token.upper(), overlap="buffer_one", **kw)

            assert await runs.claim(claim(first, "a")) == ClaimOutcome.won(1)
            held = await runs.claim(claim(second, "b"))
            assert (held.kind, held.slot) == ("buffered", first), held
            assert held.wait_ms is not None and 1 <= held.wait_ms <= 10_000, held
            # Every instance that claims the buffered slot is told to wait for it too.
            also = await other.claim(claim(second, "c"))
            assert (also.kind, also.slot) == ("buffered", first), also
            # One slot is buffered already: a further one is skipped.
            assert await other.claim(claim(third, "d")) == ClaimOutcome.overlap(first)
            assert await runs.active(job) == [_active(first, 1, True)]
            assert await runs.finish(job, first, "a", "success")
            assert await other.claim(claim(second, "c")) == ClaimOutcome.won(1)
            assert await runs.claim(claim(second, "b")) == ClaimOutcome.running(1)
            assert await runs.active(job) == [_active(second, 1, True)]
            # The slot skipped while the buffer was full stays skipped: nothing holds it.
            assert await runs.finish(job, second, "c", "success")
            later = await runs.claim(claim(third + 1000, "e"))
            assert later == ClaimOutcome.won(1), later

        self.run(make_backend, scenario)

    def test_lease_overlap_buffered_slot_is_not_late(self, make_backend: BackendFactory) -> None:
        """A buffered slot that waited past its max_late still runs when its turn comes."""

        async def scenario(backends: _Backends) -> None:
            _, runs = await self.leases(backends)
            job, base = unique_job("buflate"), _past_ms()
            first, second = base - 1000, base
            # max_late reaches a second or two past the store's now: in time for the
            # first claim, then late by the store's clock while the slot waits.
            max_late = now_ms() - second + 1500

            def claim(slot: int, token: str, max_late_ms: int | None = max_late) -> Any:
                return self.run_claim(
                    job, slot, token, token.upper(), overlap="buffer_one", max_late_ms=max_late_ms
                )

            assert await runs.claim(claim(first, "a", None)) == ClaimOutcome.won(1)
            held = await runs.claim(claim(second, "b"))
            assert (held.kind, held.slot) == ("buffered", first), held
            await self._wait_late(runs, second, max_late)
            assert await runs.finish(job, first, "a", "success")
            assert await runs.claim(claim(second, "b")) == ClaimOutcome.won(1)

        self.run(make_backend, scenario)

    def test_lease_overlap_buffer_all(self, make_backend: BackendFactory) -> None:
        async def scenario(backends: _Backends) -> None:
            backend, runs = await self.leases(backends)
            job, base = unique_job("bufall"), _past_ms()
            slots = [base + i * 1000 for i in range(5)]

            def claim(slot: int, token: str) -> Any:
                return self.run_claim(
                    job, slot, token, token.upper(), overlap="buffer_all", buffer_limit=2
                )

            assert await runs.claim(claim(slots[0], "t0")) == ClaimOutcome.won(1)
            for i in (1, 2):
                held = await runs.claim(claim(slots[i], f"t{i}"))
                assert (held.kind, held.slot) == ("buffered", slots[0]), held
            assert await runs.claim(claim(slots[3], "t3")) == ClaimOutcome.overlap(slots[0])
            assert await runs.finish(job, slots[0], "t0", "success")
            # Oldest first: the newer buffered slot waits for the older one.
            held = await runs.claim(claim(slots[2], "t2"))
            assert (held.kind, held.slot) == ("buffered", slots[1]), held
            assert await runs.claim(claim(slots[1], "t1")) == ClaimOutcome.won(1)
            held = await runs.claim(claim(slots[2], "t2"))
            assert (held.kind, held.slot) == ("buffered", slots[1]), held
            # A slot that arrives now joins the buffer behind it (room for two).
            held = await runs.claim(claim(slots[4], "t4"))
            assert (held.kind, held.slot) == ("buffered", slots[1]), held
            assert await runs.finish(job, slots[1], "t1", "success")
            assert await runs.claim(claim(slots[2], "t2")) == ClaimOutcome.won(1)
            assert await runs.finish(job, slots[2], "t2", "success")
            assert await runs.claim(claim(slots[4], "t4")) == ClaimOutcome.won(1)
            assert await runs.finish(job, slots[4], "t4", "success")
            records = await backend.history(job, 10)
            assert sorted(r.slot for r in records) == [slots[0], slots[1], slots[2], slots[4]]

        self.run(make_backend, scenario)

    def test_lease_overlap_cancel_other(self, make_backend: BackendFactory) -> None:
        async def scenario(backends: _Backends) -> None:
            backend, runs = await self.leases(backends)
            job, base = unique_job("cancel"), _past_ms()
            first, second = base, base + 1000

            def claim(slot: int, token: str, **kw: Any) -> Any:
                return self.run_claim(
                    job, slot, token, token.upper(), overlap="cancel_other", **kw
                )

            assert await runs.claim(claim(first, "a", max_attempts=3)) == ClaimOutcome.won(1)
            won = await runs.claim(claim(second, "b", max_attempts=3))
            assert won == ClaimOutcome.won(1, cancelled=first), won
            # The old token is fenced at once: every call of it is refused.
            assert await runs.heartbeat(job, first, "a", self.lease_ms) is False
            assert await runs.finish(job, first, "a", "success") is False
            assert await runs.finish(job, first, "a", "interrupted") is False
            assert await runs.release(job, first, "a") is False
            assert await runs.active(job) == [_active(second, 1, True)]
            # A cancelled run is not retried, nor taken over, whatever attempts remain.
            assert await runs.claim(claim(first, "c", max_attempts=3)) == ClaimOutcome.done()
            takeover = claim(first, "d", max_attempts=3, mode="takeover", reason="takeover")
            assert await runs.claim(takeover) == ClaimOutcome.done()
            record = self.find(await backend.history(job, 10), slot=first)
            assert (record.status, record.instance_id, record.attempt) == ("interrupted", "A", 1)
            assert record.error is not None and "cancelled by slot" in record.error, record
            assert str(second) in record.error, record
            # The canceller is an ordinary run.
            assert await runs.heartbeat(job, second, "b", self.lease_ms) is True
            assert await runs.finish(job, second, "b", "success") is True
            third = await runs.claim(claim(second + 1000, "e"))
            assert third == ClaimOutcome.won(1), third

        self.run(make_backend, scenario)

    # -- races --------------------------------------------------------------------------

    def test_lease_overlap_buffer_race(self, make_backend: BackendFactory) -> None:
        self._buffer_race(make_backend, shared=False)

    def test_lease_overlap_buffer_race_shared_backend(self, make_backend: BackendFactory) -> None:
        self._buffer_race(make_backend, shared=True)

    def test_lease_overlap_cancel_race(self, make_backend: BackendFactory) -> None:
        self._cancel_race(make_backend, shared=False)

    def test_lease_overlap_cancel_race_shared_backend(self, make_backend: BackendFactory) -> None:
        self._cancel_race(make_backend, shared=True)

    async def _stores(self, backends: _Backends, shared: bool) -> list[RunStore]:
        if shared:
            return [(await self.leases(backends))[1]] * self.overlap_claimers
        return [(await self.leases(backends))[1] for _ in range(self.overlap_claimers)]

    def _buffer_race(self, make_backend: BackendFactory, *, shared: bool) -> None:
        """Many instances claim the same slots while a run blocks them: buffer_one keeps
        one slot, buffer_all the first ``limit`` to arrive; each buffered slot then runs
        once, oldest first, whichever instance claims it."""

        async def scenario(backends: _Backends) -> None:
            stores = await self._stores(backends, shared)
            for policy, limit in (("buffer_one", 1), ("buffer_all", 3)):
                job, base = unique_job(f"race-{policy}"), _past_ms()
                slots = [base + i * 1000 for i in range(limit + 3)]

                def claim(
                    slot: int, i: int, policy: str = policy, job: str = job, limit: int = limit
                ) -> Any:
                    return self.run_claim(
                        job, slot, f"{slot}-{i}", f"I{i}", overlap=policy, buffer_limit=limit
                    )

                assert await stores[0].claim(claim(slots[0], 0)) == ClaimOutcome.won(1)
                running, token = slots[0], f"{slots[0]}-0"
                # Every claimer claims every later slot at once, in its own order.
                answers = await asyncio.gather(
                    *(
                        s.claim(claim(slot, i))
                        for i, s in enumerate(stores)
                        for slot in (slots[1:] if i % 2 else slots[:0:-1])
                    )
                )
                held = {
                    (s, a.kind)
                    for s, a in zip(self._order(stores, slots), answers, strict=True)
                }
                buffered = sorted({s for s, kind in held if kind == "buffered"})
                assert all(kind in ("buffered", "overlap") for _, kind in held), held
                assert len(buffered) == limit, (policy, held)
                ran: list[int] = [running]
                for _ in range(limit):
                    assert await stores[0].finish(job, running, token, "success")
                    answers = await asyncio.gather(
                        *(s.claim(claim(slot, i)) for i, s in enumerate(stores)
                          for slot in buffered)
                    )
                    winners = [
                        (slot, i)
                        for (slot, i), a in zip(
                            ((slot, i) for i in range(len(stores)) for slot in buffered),
                            answers,
                            strict=True,
                        )
                        if a.kind == "won"
                    ]
                    assert len(winners) == 1, (policy, winners, answers)
                    running, winner = winners[0]
                    assert running == buffered[0], (policy, running, buffered)
                    token = f"{running}-{winner}"
                    buffered.remove(running)
                    ran.append(running)
                assert await stores[0].finish(job, running, token, "success")
                assert ran == sorted(ran) and len(set(ran)) == limit + 1, (policy, ran)
                assert await stores[0].active(job) == []

        self.run(make_backend, scenario)

    @staticmethod
    def _order(stores: Sequence[RunStore], slots: list[int]) -> list[int]:
        """The slot of each claim of ``_buffer_race``'s first gather, in its order."""
        return [
            slot
            for i in range(len(stores))
            for slot in (slots[1:] if i % 2 else slots[:0:-1])
        ]

    def _cancel_race(self, make_backend: BackendFactory, *, shared: bool) -> None:
        """Round after round, many claimers claim the next slot at once: one wins and
        cancels the run before it, exactly once, and the old token is fenced at once."""

        async def scenario(backends: _Backends) -> None:
            stores = await self._stores(backends, shared)
            job, base = unique_job("race-cancel"), _past_ms()

            def claim(slot: int, i: int) -> Any:
                return self.run_claim(job, slot, f"{slot}-{i}", f"I{i}", overlap="cancel_other")

            assert await stores[0].claim(claim(base, 0)) == ClaimOutcome.won(1)
            running, token = base, f"{base}-0"
            for r in range(1, self.overlap_rounds + 1):
                slot = base + r * 1000
                answers = await asyncio.gather(
                    *(s.claim(claim(slot, i)) for i, s in enumerate(stores))
                )
                won = [i for i, a in enumerate(answers) if a.kind == "won"]
                assert len(won) == 1, (r, answers)
                assert answers[won[0]].cancelled == running, (r, answers[won[0]])
                assert all(
                    a.kind == "running" and a.cancelled is None
                    for i, a in enumerate(answers) if i != won[0]
                ), answers
                assert await stores[1].heartbeat(job, running, token, self.lease_ms) is False
                assert await stores[1].finish(job, running, token, "success") is False
                running, token = slot, f"{slot}-{won[0]}"
                assert await stores[0].active(job) == [_active(running, 1, True)]
            assert await stores[0].finish(job, running, token, "success")

        self.run(make_backend, scenario)

    # -- helpers ------------------------------------------------------------------------

    async def _wait_late(self, runs: RunStore, slot: int, max_late_ms: int) -> None:
        """Wait until the store's clock is past ``slot + max_late_ms`` (a probe job says so)."""
        deadline = time.monotonic() + self.wait_timeout
        while True:
            probe = self.run_claim(unique_job("probe"), slot, "p", "P", max_late_ms=max_late_ms)
            outcome = await runs.claim(probe)
            if outcome.kind == "late":
                return
            if outcome.kind == "won":
                await runs.finish(probe.job, slot, "p", "success")
            if time.monotonic() > deadline:
                raise AssertionError(f"slot {slot} not late after {self.wait_timeout}s")
            await asyncio.sleep(0.1)
