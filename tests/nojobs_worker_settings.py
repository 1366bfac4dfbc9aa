"""Settings of tests/test_worker.py's worker with a scheduler that has no jobs ("empty")."""

from tests.worker_settings import *  # noqa: F403

ANARCHON = {
    "default": {"BACKEND": "django_anarchon.backends.memory.MemoryBackend"},
    "empty": {"BACKEND": "django_anarchon.backends.memory.MemoryBackend"},
}
