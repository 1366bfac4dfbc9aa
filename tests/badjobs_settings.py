"""Settings of the subprocesses in tests/test_registration_errors.py: an app with bad jobs."""

from tests.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "tests.badjobsapp"]  # noqa: F405
ALLOWED_HOSTS = ["testserver"]  # the test client's host, for the "web process still serves" test
