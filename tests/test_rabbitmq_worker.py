"""Four ``anarchon_worker`` processes on one RabbitMQ: ten jobs every 200 ms, each slot once."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from .broker_support import delete_queues, four_workers_each_slot_once, rabbitmq_url

pytestmark = [pytest.mark.rabbitmq, pytest.mark.slow, pytest.mark.workers]


def test_four_workers_run_each_slot_once(tmp_path: Path) -> None:
    url = rabbitmq_url()
    tag = uuid.uuid4().hex[:8]
    try:
        four_workers_each_slot_once(
            tmp_path, "rabbitmq", {"ANARCHON_RABBITMQ_URL": url, "ANARCHON_TEST_TAG": tag}
        )
    finally:
        delete_queues(url, f"antestw-{tag}.history.")
