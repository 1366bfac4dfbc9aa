"""Claims per second and latency of the Redis strategies, beside a bare ``SET NX PX``.

    python benchmarks/bench_redis.py [--url redis://127.0.0.1:6379/0] [--claims 4000]

For 1 and 8 concurrent claimers, each with its own connection, every claimer claims the
same sequence of slots (so with 8, each slot is contested by 8 and won by one), as fast
as it can. ``lease`` is measured through ``runs.claim()`` (what the engine calls) and
through ``claim()``. The bare command is ``SET key token NX PX 60000`` through redis-py,
a floor for any claim that needs one round trip. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis.asyncio
from measure import Close, Maker, Op, measure

from django_anarchon.backends.base import ClaimInput, RunClaim
from django_anarchon.backends.redis import RedisBackend


def bare_set(url: str, prefix: str) -> Maker:
    async def make(i: int) -> tuple[Op, Close]:
        client = redis.asyncio.Redis.from_url(url)

        async def claim(slot: int) -> object:
            return await client.set(f"{prefix}:bare:{slot}", f"t{i}", nx=True, px=60_000)

        return claim, client.aclose

    return make


def backend_claim(url: str, prefix: str, strategy: str, use_runs: bool) -> Maker:
    job = f"bench-{strategy}-{'runs' if use_runs else 'claim'}"
    base = time.time_ns() // 1_000_000 // 1000 * 1000

    async def make(i: int) -> tuple[Op, Close]:
        backend = RedisBackend(url=url, strategy=strategy, key_prefix=prefix)
        await backend.init()
        await backend.prepare_job(job, 100)
        runs = backend.runs

        async def claim(slot: int) -> object:
            if use_runs:
                assert runs is not None
                return await runs.claim(
                    RunClaim(job, base + slot, f"t{i}-{slot}", f"I{i}", overlap="allow",
                             keep_ms=60_000)
                )
            return await backend.claim(ClaimInput(job, base + slot, f"t{i}-{slot}", f"I{i}"))

        return claim, backend.close

    return make


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    default_url = os.environ.get("ANARCHON_REDIS_URL", "redis://127.0.0.1:6379/0")
    parser.add_argument("--url", default=default_url)
    parser.add_argument("--claims", type=int, default=4000, help="slots per claimer")
    args = parser.parse_args()
    prefix = f"anarchon-bench-{uuid.uuid4().hex[:8]}"
    cases = [
        ("bare SET NX PX (redis-py)", bare_set(args.url, prefix)),
        ("lease, runs.claim()", backend_claim(args.url, prefix, "lease", True)),
        ("lease, claim()", backend_claim(args.url, prefix, "lease", False)),
        ("stream-id", backend_claim(args.url, prefix, "stream-id", False)),
        ("script", backend_claim(args.url, prefix, "script", False)),
    ]
    info = await redis.asyncio.Redis.from_url(args.url).info("server")
    print(f"Redis {info['redis_version']}, Python {sys.version.split()[0]}, "
          f"redis-py {redis.__version__}, {args.claims} slots per claimer\n")
    print("| claim | claimers | claims/s | p50 ms | p99 ms |")
    print("|---|---:|---:|---:|---:|")
    try:
        for claimers in (1, 8):
            for name, make in cases:
                rate, p50, p99 = await measure(make, claimers, args.claims)
                print(f"| {name} | {claimers} | {rate:,.0f} | {p50:.3f} | {p99:.3f} |", flush=True)
    finally:
        client = redis.asyncio.Redis.from_url(args.url)
        keys = [k async for k in client.scan_iter(match=f"{prefix}:*", count=1000)]
        for i in range(0, len(keys), 500):
            await client.delete(*keys[i : i + 500])
        await client.aclose()


if __name__ == "__main__":
    asyncio.run(main())
