"""The public contract suite on the running RabbitMQ server, and the RabbitMQ specifics.

Every module run uses its own name prefix and deletes its history streams at the end
(claim queues delete themselves: ``x-expires``).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from django_anarchon.backends.rabbitmq import RabbitMQBackend
from django_anarchon.testing import BackendContract, BackendFactory

from .broker_support import delete_queues, rabbitmq_url

pytestmark = pytest.mark.rabbitmq

#: 50 x 300 by default (a round is a publish with confirms per claimer: 1,000 rounds took
#: two minutes); ANARCHON_BROKER_RACE_ROUNDS overrides it.
RACE_ROUNDS = int(os.environ.get("ANARCHON_BROKER_RACE_ROUNDS", "300"))
_TAG_VAR = "ANARCHON_TEST_RABBITMQ_TAG"  # inherited by the spawned claimer processes


def _prefix(tag: str) -> str:
    return f"antest-{tag}"


def process_backend() -> RabbitMQBackend:
    """The factory of the race across OS processes (imported in each spawned process)."""
    return RabbitMQBackend(rabbitmq_url(), prefix=_prefix(os.environ[_TAG_VAR]), dedupe_window="5m")


@pytest.fixture(scope="module")
def rabbitmq_prefix() -> Iterator[tuple[str, str]]:
    url = rabbitmq_url()
    tag = uuid.uuid4().hex[:8]
    os.environ[_TAG_VAR] = tag
    yield url, _prefix(tag)
    delete_queues(url, _prefix(tag) + ".history.")


class TestRabbitMQContract(BackendContract):
    supports_leases = False
    supports_claim_many = False
    race_claimers = 50
    race_rounds = RACE_ROUNDS
    process_factory = "tests.test_rabbitmq_contract:process_backend"

    @pytest.fixture
    def make_backend(self, rabbitmq_prefix: tuple[str, str]) -> BackendFactory:
        url, prefix = rabbitmq_prefix
        # A short window: the race leaves a queue per slot, gone 5 minutes after.
        return lambda: RabbitMQBackend(url, prefix=prefix, dedupe_window="5m")
