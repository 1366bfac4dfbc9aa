"""Four ``anarchon_worker`` processes on one NATS server: ten jobs every 200 ms, each slot once."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from .broker_support import delete_nats_streams, four_workers_each_slot_once, nats_url

pytestmark = [pytest.mark.nats, pytest.mark.slow, pytest.mark.workers]


def test_four_workers_run_each_slot_once(tmp_path: Path) -> None:
    url = nats_url()
    tag = uuid.uuid4().hex[:8]
    try:
        four_workers_each_slot_once(
            tmp_path, "nats", {"ANARCHON_NATS_URL": url, "ANARCHON_TEST_TAG": tag}
        )
    finally:
        asyncio.run(delete_nats_streams(url, f"ANTESTW{tag}"))
