"""RabbitMQ closing connections under racing claimers, or restarted under running schedulers.

The close is ``rabbitmqctl close_connection`` of this test process's connections only
(other tests share the broker). The restart stops and starts the machine's real RabbitMQ
application (claim queues are durable and come back); it is always started again when
the test ends, whatever happened.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from django_anarchon.backends.rabbitmq import RabbitMQBackend

from .broker_support import (
    can_close_rabbitmq_connections,
    can_restart_rabbitmq,
    close_my_rabbitmq_connections,
    delete_queues,
    ensure_rabbitmq_up,
    rabbitmq_url,
    race_across_connection_loss,
    restart_rabbitmq,
    schedulers_across_restart,
)

pytestmark = [pytest.mark.rabbitmq, pytest.mark.slow, pytest.mark.workers]


async def test_schedulers_survive_a_rabbitmq_restart() -> None:
    url = rabbitmq_url()
    if not can_restart_rabbitmq():
        pytest.skip("SKIPPED, NOT TESTED: this RabbitMQ cannot be restarted from here")
    prefix = f"antestr-{uuid.uuid4().hex[:8]}"
    try:
        per_job = await schedulers_across_restart(
            lambda: RabbitMQBackend(
                url, prefix=prefix, dedupe_window="5m", timeout="2s", retry_for="1s"
            ),
            restart_rabbitmq,
        )
        assert all(len(slots) >= 10 for slots in per_job.values()), per_job
    finally:
        await asyncio.to_thread(ensure_rabbitmq_up)
        await asyncio.to_thread(delete_queues, url, f"{prefix}.history.")


async def test_claims_survive_the_broker_closing_the_connections() -> None:
    url = rabbitmq_url()
    if not can_close_rabbitmq_connections():
        pytest.skip("SKIPPED, NOT TESTED: no rabbitmqctl here to close connections with")
    prefix = f"antestl-{uuid.uuid4().hex[:8]}"
    backends = [
        RabbitMQBackend(url, prefix=prefix, dedupe_window="5m", timeout="2s", retry_for="20s")
        for _ in range(2)
    ]
    closed: list[int] = []
    try:
        rounds = await race_across_connection_loss(
            backends, lambda: closed.append(close_my_rabbitmq_connections())
        )
        assert closed[0] >= 2, f"closed {closed[0]} connection(s), expected one per backend"
        assert rounds > 10
    finally:
        for backend in backends:
            await backend.close()
        delete_queues(url, f"{prefix}.history.")
