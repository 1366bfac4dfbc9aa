"""NATS restarted under running schedulers: they carry on by themselves, no slot twice.

Stops and starts the machine's real nats-server (streams are on disk and come back); the
server is always started again when the test ends, whatever happened.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from django_anarchon.backends.nats import NatsBackend

from .broker_support import (
    can_restart_nats,
    delete_nats_streams,
    ensure_nats_up,
    nats_url,
    restart_nats,
    schedulers_across_restart,
)

pytestmark = [pytest.mark.nats, pytest.mark.slow]


async def test_schedulers_survive_a_nats_restart() -> None:
    url = nats_url()
    if not can_restart_nats():
        pytest.skip("SKIPPED, NOT TESTED: this nats-server cannot be restarted from here")
    tag = uuid.uuid4().hex[:8]
    try:
        per_job = await schedulers_across_restart(
            lambda: NatsBackend(
                url=url, stream_prefix=f"ANTESTR{tag}", subject_prefix=f"antestr{tag}",
                timeout="1s", retry_for="1s",
            ),
            restart_nats,
        )
        assert all(len(slots) >= 10 for slots in per_job.values()), per_job
    finally:
        await asyncio.to_thread(ensure_nats_up)
        await delete_nats_streams(url, f"ANTESTR{tag}")
