"""Claims per second and latency on RabbitMQ and NATS, beside each broker's bare operation.

    python benchmarks/bench_brokers.py [--rabbitmq-url amqp://...] [--nats-url nats://...]
                                       [--claims 1000]

For 1 and 8 concurrent claimers, each with its own backend (its own connection), every
claimer claims the same sequence of slots of one job as fast as it can, so with 8 each
slot is contested by 8 and won by one. The bare operations, measured the same way in the
same run: a confirmed publish to a classic queue (aio-pika, publisher confirms), and a
JetStream publish (nats-py, acknowledged). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from measure import Close, Maker, Op, measure

from django_anarchon.backends.base import ClaimInput
from django_anarchon.backends.nats import NatsBackend
from django_anarchon.backends.rabbitmq import RabbitMQBackend


def claims_of(make_backend: Callable[[], RabbitMQBackend | NatsBackend]) -> Maker:
    job = f"bench-{uuid.uuid4().hex[:8]}"
    base = time.time_ns() // 1_000_000

    async def make(index: int) -> tuple[Op, Close]:
        backend = make_backend()
        await backend.init()
        await backend.prepare_job(job, 100)

        async def op(slot: int) -> object:
            claim = ClaimInput(
                job=job, slot=base + slot, token=f"t{index}-{slot}", instance_id=f"I{index}"
            )
            return await backend.claim(claim)

        async def close() -> None:
            if index == 0:
                await drop(backend, job)
            await backend.close()

        return op, close

    return make


async def drop(backend: RabbitMQBackend | NatsBackend, job: str) -> None:
    """Delete what the benchmark made (claim queues and the claims stream expire alone)."""
    if isinstance(backend, NatsBackend):
        js = (await backend._client()).jetstream()
        for stream in (backend.history_stream(job), backend.claims_stream):
            await js.delete_stream(stream)
    else:
        link = await backend._link()
        channel = await link.connection.channel()
        await channel.queue_delete(backend.history_queue(job))
        await channel.close()


def confirmed_publish(url: str) -> Maker:
    queue = f"bench-bare-{uuid.uuid4().hex[:8]}"

    async def make(index: int) -> tuple[Op, Close]:
        import aio_pika

        connection = await aio_pika.connect(url)
        channel = await connection.channel(publisher_confirms=True)
        await channel.declare_queue(queue, arguments={"x-expires": 60_000, "x-max-length": 1000})

        async def op(slot: int) -> object:
            return await channel.default_exchange.publish(
                aio_pika.Message(b'{"token": "t"}'), routing_key=queue
            )

        return op, connection.close

    return make


def jetstream_publish(url: str) -> Maker:
    stream = f"BENCHBARE{uuid.uuid4().hex[:8]}"

    async def make(index: int) -> tuple[Op, Close]:
        import nats
        from nats.js.api import StreamConfig

        nc = await nats.connect(url)
        js = nc.jetstream()
        if index == 0:
            await js.add_stream(StreamConfig(name=stream, subjects=[f"{stream}.>"], max_age=60))

        async def op(slot: int) -> object:
            return await js.publish(f"{stream}.{index}.{slot}", b'{"token": "t"}', stream=stream)

        async def close() -> None:
            if index == 0:
                await js.delete_stream(stream)
            await nc.close()

        return op, close

    return make


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rabbitmq-url", default="amqp://guest:guest@127.0.0.1:5672/")
    parser.add_argument("--nats-url", default="nats://127.0.0.1:4222")
    parser.add_argument("--claims", type=int, default=1000, help="slots per claimer")
    args = parser.parse_args()
    tag = uuid.uuid4().hex[:8]
    rows: list[tuple[str, int, float, float, float]] = []
    cases: list[tuple[str, Callable[[], Maker]]] = [
        ("RabbitMQ: confirmed publish (bare)", lambda: confirmed_publish(args.rabbitmq_url)),
        (
            "RabbitMQ: `claim()`",
            lambda: claims_of(
                lambda: RabbitMQBackend(
                    args.rabbitmq_url, prefix=f"bench-{tag}", dedupe_window="2m"
                )
            ),
        ),
        ("NATS: JetStream publish (bare)", lambda: jetstream_publish(args.nats_url)),
        (
            "NATS: `claim()`",
            lambda: claims_of(
                lambda: NatsBackend(
                    url=args.nats_url, stream_prefix=f"BENCH{tag}", subject_prefix=f"bench{tag}",
                    dedupe_window="2m",
                )
            ),
        ),
    ]
    for label, maker in cases:
        for claimers in (1, 8):
            rate, p50, p99 = await measure(maker(), claimers, args.claims)
            rows.append((label, claimers, rate, p50, p99))
            print(
                f"{label:40} {claimers} {rate:9.0f}/s p50 {p50:.2f} ms p99 {p99:.2f} ms",
                file=sys.stderr,
            )
    print("| operation | concurrent | per second | p50 | p99 |")
    print("|---|---|---|---|---|")
    for label, claimers, rate, p50, p99 in rows:
        print(f"| {label} | {claimers} | {rate:,.0f} | {p50:.2f} ms | {p99:.2f} ms |")


if __name__ == "__main__":
    asyncio.run(main())
