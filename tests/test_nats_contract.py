"""The public contract suite on the running NATS server (JetStream), and the NATS specifics.

Every module run uses its own stream and subject prefix, and deletes its streams at the end.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator

import pytest

from django_anarchon.backends.nats import NatsBackend
from django_anarchon.testing import BackendContract, BackendFactory

from .broker_support import delete_nats_streams, nats_url

pytestmark = pytest.mark.nats

#: 50 x 1,000 by default; ANARCHON_BROKER_RACE_ROUNDS overrides it (for a quicker local run).
RACE_ROUNDS = int(os.environ.get("ANARCHON_BROKER_RACE_ROUNDS", "1000"))


_TAG_VAR = "ANARCHON_TEST_NATS_TAG"  # inherited by the spawned claimer processes


def _names(tag: str) -> tuple[str, str]:
    return f"ANTEST{tag}", f"antest{tag}"


def process_backend() -> NatsBackend:
    """The factory of the race across OS processes (imported in each spawned process)."""
    stream_prefix, subject_prefix = _names(os.environ[_TAG_VAR])
    return NatsBackend(url=nats_url(), stream_prefix=stream_prefix, subject_prefix=subject_prefix)


@pytest.fixture(scope="module")
def nats_names() -> Iterator[tuple[str, str, str]]:
    url = nats_url()
    tag = uuid.uuid4().hex[:8]
    os.environ[_TAG_VAR] = tag
    stream_prefix, subject_prefix = _names(tag)
    yield url, stream_prefix, subject_prefix
    asyncio.run(delete_nats_streams(url, stream_prefix))


class TestNatsContract(BackendContract):
    supports_leases = False
    supports_claim_many = False
    race_claimers = 50
    race_rounds = RACE_ROUNDS
    process_factory = "tests.test_nats_contract:process_backend"

    @pytest.fixture(autouse=True)
    def _names_set(self, nats_names: tuple[str, str, str]) -> None:
        """The process race reads the prefixes from the environment this fixture sets."""

    @pytest.fixture
    def make_backend(self, nats_names: tuple[str, str, str]) -> BackendFactory:
        url, stream_prefix, subject_prefix = nats_names
        return lambda: NatsBackend(
            url=url, stream_prefix=stream_prefix, subject_prefix=subject_prefix
        )
