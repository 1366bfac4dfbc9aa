"""One job for tests/test_command_errors.py: the commands need a job to list, run and show."""

from __future__ import annotations

from typing import Any

from django_anarchon import every


@every("1h", name="nightly.report")
def report(ctx: Any) -> None:
    """Never reached in those tests: the store is down before any run."""
