"""History: what ``save_result()`` stores comes back from every instance, newest first, pruned."""

from __future__ import annotations

from ..backends.base import ms_to_datetime
from ..wallclock import now_ms
from ._base import _HOUR_MS, BackendFactory, ContractBase, _Backends, unique_job

__all__ = ["HistoryTests"]


class HistoryTests(ContractBase):
    """Records of claims and results, across instances, pruned by size and ttl."""

    def test_unknown_job_history_is_empty(self, make_backend: BackendFactory) -> None:
        async def scenario(backends: _Backends) -> None:
            backend = await backends.new()
            assert await backend.history(unique_job("unknown"), 10) == []

        self.run(make_backend, scenario)

    def test_history_record(self, make_backend: BackendFactory) -> None:
        async def scenario(backends: _Backends) -> None:
            a, b = await backends.new(), await backends.new()
            job, slot = unique_job("history"), now_ms() // 1000 * 1000
            for backend in (a, b):
                await backend.prepare_job(job, 10)
            assert await self.claim_won(a, self.claim_input(job, slot, "t", "A", history_size=10))
            running = self.find(await b.history(job, 10), slot=slot)
            assert (running.instance_id, running.status, running.attempt) == ("A", "running", 1)
            assert running.finished_at is None

            started = slot + 20
            result = self.result(slot, "A", started, status="failed", error="boom", duration_ms=321)
            await a.save_result(job, result, 10)
            records = await b.history(job, 10)
            assert len(records) == 1, records
            record = records[0]
            assert record.job == job
            assert record.slot == slot
            assert record.scheduled_at == ms_to_datetime(slot)
            assert record.instance_id == "A"
            assert record.manual is False
            assert record.attempt == 1
            assert record.reason == "scheduled"
            assert record.status == "failed"
            assert record.error == "boom"
            assert record.duration_ms == 321
            assert record.started_at == ms_to_datetime(started)
            assert record.finished_at == ms_to_datetime(started + 321)

        self.run(make_backend, scenario)

    def test_history_newest_first_across_instances(self, make_backend: BackendFactory) -> None:
        async def scenario(backends: _Backends) -> None:
            a, b = await backends.new(), await backends.new()
            job, base = unique_job("order"), now_ms() // 1000 * 1000
            for backend in (a, b):
                await backend.prepare_job(job, 10)
            for i in range(4):
                backend, name = (a, "A") if i % 2 == 0 else (b, "B")
                slot = base + i * 1000
                assert await self.claim_won(backend, self.claim_input(job, slot, f"t{i}", name))
                await backend.save_result(job, self.result(slot, name, slot + 5), 10)
            for reader in (a, b):
                records = await reader.history(job, 10)
                assert [r.slot for r in records] == [base + i * 1000 for i in (3, 2, 1, 0)]
                assert [r.instance_id for r in records] == ["B", "A", "B", "A"]
                assert [r.slot for r in await reader.history(job, 2)] == [base + 3000, base + 2000]

        self.run(make_backend, scenario)

    def test_history_size_prunes(self, make_backend: BackendFactory) -> None:
        async def scenario(backends: _Backends) -> None:
            backend = await backends.new()
            job, base = unique_job("size"), now_ms() // 1000 * 1000
            await backend.prepare_job(job, 3)
            for i in range(6):
                slot = base + i * 1000
                claim = self.claim_input(job, slot, f"t{i}", "A", history_size=3)
                assert await self.claim_won(backend, claim)
                await backend.save_result(job, self.result(slot, "A", slot + 5), 3)
            records = await backend.history(job, 100)
            assert [r.slot for r in records] == [base + 5000, base + 4000, base + 3000]

        self.run(make_backend, scenario)

    def test_history_ttl_prunes(self, make_backend: BackendFactory) -> None:
        """A record that ended two hours ago goes with a one-hour ttl; a fresh one stays."""

        async def scenario(backends: _Backends) -> None:
            backend = await backends.new()
            job, now, ttl = unique_job("ttl"), now_ms() // 1000 * 1000, _HOUR_MS
            await backend.prepare_job(job, 10)
            old = now - 2 * _HOUR_MS
            claim = self.claim_input(job, old, "old", "A", history_ttl_ms=ttl)
            assert await self.claim_won(backend, claim)
            await backend.save_result(job, self.result(old, "A", old + 5), 10, ttl)
            claim = self.claim_input(job, now, "new", "A", history_ttl_ms=ttl)
            assert await self.claim_won(backend, claim)
            await backend.save_result(job, self.result(now, "A", now + 5), 10, ttl)
            assert [r.slot for r in await backend.history(job, 10)] == [now]

        self.run(make_backend, scenario)

    def test_manual_runs_are_never_deduplicated(self, make_backend: BackendFactory) -> None:
        async def scenario(backends: _Backends) -> None:
            backend = await backends.new()
            job, slot = unique_job("manual"), now_ms()
            await backend.prepare_job(job, 10)
            used = []
            for token in ("m1", "m2"):
                moved = await backend.record_manual_run(self.claim_input(job, slot, token, "A"))
                used.append(slot if moved is None else moved)
            records = await backend.history(job, 10)
            assert len(records) == 2, records
            assert all(r.manual and r.reason == "manual" for r in records), records
            assert all(r.status == "running" for r in records), records
            for i, used_slot in enumerate(used):
                result = self.result(used_slot, "A", used_slot + 1 + i, manual=True)
                await backend.save_result(job, result, 10)
            records = await backend.history(job, 10)
            assert len(records) == 2, records
            for r in records:
                assert (r.manual, r.reason, r.status, r.instance_id) == (
                    True,
                    "manual",
                    "success",
                    "A",
                )
            assert sorted(r.slot for r in records) == sorted(used)

        self.run(make_backend, scenario)
