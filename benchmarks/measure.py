"""The timing loop every benchmark shares: concurrent claimers, throughput and p50/p99."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable

Op = Callable[[int], Awaitable[object]]
Close = Callable[[], Awaitable[None]]
#: Builds claimer number ``i``: its operation (called with a slot) and how to close it.
Maker = Callable[[int], Awaitable[tuple[Op, Close]]]


async def measure(make: Maker, claimers: int, claims: int) -> tuple[float, float, float]:
    """(operations per second, p50 ms, p99 ms) for ``claimers`` running ``claims`` each.

    Every claimer first runs once on slot -1 (connect, load scripts, start threads), so
    set-up cost stays out of the figures.
    """
    built = [await make(i) for i in range(claimers)]
    for op, _ in built:
        await op(-1)
    latencies: list[float] = []

    async def run(op: Op) -> None:
        for slot in range(claims):
            start = time.perf_counter()
            await op(slot)
            latencies.append(time.perf_counter() - start)

    began = time.perf_counter()
    await asyncio.gather(*(run(op) for op, _ in built))
    elapsed = time.perf_counter() - began
    for _, close in built:
        await close()
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    return len(latencies) / elapsed, statistics.median(latencies) * 1000, p99 * 1000
