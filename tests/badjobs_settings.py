"""Settings of the subprocesses in tests/test_registration_errors.py: an app with bad jobs."""

from tests.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "tests.badjobsapp"]  # noqa: F405
ALLOWED_HOSTS = ["testserver"]  # the test client's host, for the "web process still serves" test
# Only the in-memory default: Django 6's `check` reads the server version of every alias,
# and the test settings' server aliases name placeholder databases.
DATABASES = {"default": DATABASES["default"]}  # noqa: F405
