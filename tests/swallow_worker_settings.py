"""Settings of the anarchon_worker subprocess whose handler swallows cancellation."""

from tests.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "tests.swallowapp"]  # noqa: F405
ANARCHON = {"default": {"BACKEND": "django_anarchon.backends.memory.MemoryBackend"}}
