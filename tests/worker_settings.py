"""Settings of the anarchon_worker subprocesses in tests/test_worker.py (memory backend)."""

from tests.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "tests.workerapp"]  # noqa: F405
ANARCHON = {"default": {"BACKEND": "django_anarchon.backends.memory.MemoryBackend"}}
