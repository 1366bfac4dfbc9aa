"""RabbitMQ restarted under running schedulers: they carry on by themselves, no slot twice.

Stops and starts the machine's real RabbitMQ application (claim queues are durable and
come back); it is always started again when the test ends, whatever happened.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from django_anarchon.backends.rabbitmq import RabbitMQBackend

from .broker_support import (
    can_restart_rabbitmq,
    delete_queues,
    ensure_rabbitmq_up,
    rabbitmq_url,
    restart_rabbitmq,
    schedulers_across_restart,
)

pytestmark = [pytest.mark.rabbitmq, pytest.mark.slow]


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
