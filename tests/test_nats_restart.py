"""NATS restarted under racing claimers and running schedulers: they reconnect, no slot twice.

The server is a private nats-server of the test's own (its own port and JetStream store
on disk), so restarting it disturbs nothing else; its streams come back with it.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from django_anarchon.backends.nats import NatsBackend

from .broker_support import (
    NATS_SERVER,
    PrivateNatsServer,
    race_across_connection_loss,
    schedulers_across_restart,
)
from .support import unavailable

pytestmark = [pytest.mark.nats, pytest.mark.slow, pytest.mark.workers]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[PrivateNatsServer]:
    if not os.path.exists(NATS_SERVER):
        unavailable(f"no {NATS_SERVER} to start a private server with")
    private = PrivateNatsServer(tmp_path / "jetstream").start()
    try:
        yield private
    finally:
        private.stop()


async def test_schedulers_survive_a_nats_restart(server: PrivateNatsServer) -> None:
    tag = uuid.uuid4().hex[:8]
    per_job = await schedulers_across_restart(
        lambda: NatsBackend(
            url=server.url, stream_prefix=f"ANTESTR{tag}", subject_prefix=f"antestr{tag}",
            timeout="1s", retry_for="1s",
        ),
        lambda: server.restart(down_s=1.0),
    )
    assert all(len(slots) >= 10 for slots in per_job.values()), per_job


@pytest.mark.parametrize("kill", [False, True], ids=["sigterm", "sigkill"])
async def test_claims_survive_a_server_restart(server: PrivateNatsServer, kill: bool) -> None:
    """Claims in flight during a 1.5 s outage wait it out; every slot keeps one winner.

    SIGKILL too (a killed process, not a lost machine): what it acknowledged must stay.
    """
    tag = uuid.uuid4().hex[:8]
    backends = [
        NatsBackend(
            url=server.url, stream_prefix=f"ANTESTL{tag}", subject_prefix=f"antestl{tag}",
            timeout="1s", retry_for="30s",
        )
        for _ in range(2)
    ]
    try:
        rounds = await race_across_connection_loss(
            backends, lambda: server.restart(down_s=1.5, kill=kill)
        )
        assert rounds > 10
    finally:
        for backend in backends:
            await backend.close()
