"""One hourly job, so that the worker's banner lists a job; it never needs to run."""

from __future__ import annotations

from django_anarchon import JobContext, every


@every("1h", name="secrets.hourly")
def hourly(ctx: JobContext) -> None:
    """Does nothing: the test only reads the banner."""
