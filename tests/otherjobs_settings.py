"""Settings of tests/test_worker.py's check of the recipes for jobs outside jobs.py."""

from tests.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "tests.otherjobsapp"]  # noqa: F405
