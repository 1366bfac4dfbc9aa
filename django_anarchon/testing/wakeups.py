"""Wake-ups, for a backend that offers them: a hint sent by one instance reaches another."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import cast

import pytest

from ..backends.base import BaseBackend, Wakeup
from ._base import BackendFactory, ContractBase, _Backends, unique_job

__all__ = ["WakeupTests"]


class WakeupTests(ContractBase):
    """``wake()`` on one instance reaches ``wakeups()`` on another; junk never does."""

    def test_wakeups_reach_another_instance(self, make_backend: BackendFactory) -> None:
        async def scenario(backends: _Backends) -> None:
            a, b = cast(BaseBackend, await backends.new()), cast(BaseBackend, await backends.new())
            hints = b.wakeups() if callable(getattr(b, "wakeups", None)) else None
            if hints is None:
                pytest.skip("this backend has no push channel (wakeups() is None)")
            seen: list[Wakeup] = []

            async def read(hints: AsyncIterator[Wakeup]) -> None:
                async for hint in hints:
                    seen.append(hint)

            reader = asyncio.create_task(read(hints))
            job = unique_job("wake")
            sent = Wakeup("released", job=job)
            try:
                # Sent until it arrives: the subscription may not be up at the first send.
                deadline = time.monotonic() + self.wait_timeout
                while sent not in seen:
                    assert time.monotonic() < deadline, f"no hint after {self.wait_timeout}s"
                    await a.wake(sent)
                    await asyncio.sleep(0.05)
                request = Wakeup("run-request", job=job, scheduler="default")
                await a.wake(request)
                while request not in seen:
                    assert time.monotonic() < deadline, "the run-request hint never came"
                    await asyncio.sleep(0.01)
                assert {h.kind for h in seen} <= {"released", "run-request", "resync"}, seen
            finally:
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reader

        self.run(make_backend, scenario)
