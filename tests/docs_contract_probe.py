"""A pytest plugin for tests/test_docs_examples.py: what a docs contract example left behind.

The docs' Redis contract example runs in a pytest of its own, with this plugin loaded
(``-p tests.docs_contract_probe``). The plugin notes the value of the example's
``key_prefix`` fixture and, before each test's teardown (so before the fixture deletes
its keys), how many keys the Redis at ``REDIS_URL`` holds under it; it writes both to
the JSON file named by ``ANARCHON_DOCS_PROBE``. The docs test then checks that keys were
written (the count is the witness that the prefix is the one in use) and that none is
left once the example's own clean-up ran.
"""

from __future__ import annotations

import json
import os
from collections.abc import Generator
from typing import Any

import pytest

_seen: dict[str, Any] = {"prefix": None, "max_keys": 0}


def _count_keys(prefix: str) -> int:
    import redis

    client = redis.Redis.from_url(os.environ["REDIS_URL"])
    try:
        return sum(1 for _ in client.scan_iter(match=f"{prefix}:*", count=1000))
    finally:
        client.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef: Any, request: Any) -> Generator[None, Any, None]:
    outcome = yield
    if fixturedef.argname == "key_prefix" and outcome.excinfo is None:
        _seen["prefix"] = outcome.get_result()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if _seen["prefix"] is not None:
        _seen["max_keys"] = max(_seen["max_keys"], _count_keys(_seen["prefix"]))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    with open(os.environ["ANARCHON_DOCS_PROBE"], "w") as out:
        json.dump(_seen, out)
