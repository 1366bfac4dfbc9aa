"""Repeat safety of ``claim()``: the same token wins again, another loses; claims are independent."""

from __future__ import annotations

from ..wallclock import now_ms
from ._base import BackendFactory, ContractBase, _Backends, unique_job

__all__ = ["RepeatSafetyTests"]


class RepeatSafetyTests(ContractBase):
    """A retried claim (same token) is still the winner's; nobody else's."""

    def test_repeat_safety(self, make_backend: BackendFactory) -> None:
        async def scenario(backends: _Backends) -> None:
            a, b = await backends.new(), await backends.new()
            job, slot = unique_job("repeat"), now_ms()
            await a.prepare_job(job, 100)
            await b.prepare_job(job, 100)
            assert await a.claim(self.claim_input(job, slot, "tok-a", "A")) is True
            assert await a.claim(self.claim_input(job, slot, "tok-a", "A")) is True
            assert await b.claim(self.claim_input(job, slot, "tok-b", "B")) is False
            assert await b.claim(self.claim_input(job, slot, "tok-a", "A")) is True
            assert await a.claim(self.claim_input(job, slot, "tok-b", "B")) is False

        self.run(make_backend, scenario)

    def test_claims_are_independent(self, make_backend: BackendFactory) -> None:
        async def scenario(backends: _Backends) -> None:
            backend = await backends.new()
            one, two, slot = unique_job("one"), unique_job("two"), now_ms()
            await backend.prepare_job(one, 100)
            await backend.prepare_job(two, 100)
            assert await backend.claim(self.claim_input(one, slot, "t1", "A")) is True
            assert await backend.claim(self.claim_input(two, slot, "t2", "B")) is True
            assert await backend.claim(self.claim_input(one, slot + 1, "t3", "B")) is True
            assert await backend.claim(self.claim_input(one, slot, "t4", "B")) is False

        self.run(make_backend, scenario)
