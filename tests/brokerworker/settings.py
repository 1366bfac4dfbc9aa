"""Settings of the anarchon_worker subprocesses of the RabbitMQ and NATS worker tests.

``ANARCHON_TEST_BROKER`` picks the backend; the test passes the URL and a name prefix of
its own in the environment.
"""

import os
from typing import Any

from tests.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "tests.brokerworker"]  # noqa: F405
_TAG = os.environ.get("ANARCHON_TEST_TAG", "worker")
_BACKEND: dict[str, Any]
if os.environ.get("ANARCHON_TEST_BROKER") == "nats":
    _BACKEND = {
        "BACKEND": "django_anarchon.backends.nats.NatsBackend",
        "OPTIONS": {
            "url": os.environ.get("ANARCHON_NATS_URL", "nats://127.0.0.1:4222"),
            "stream_prefix": f"ANTESTW{_TAG}",
            "subject_prefix": f"antestw{_TAG}",
        },
    }
else:
    _BACKEND = {
        "BACKEND": "django_anarchon.backends.rabbitmq.RabbitMQBackend",
        "OPTIONS": {
            "url": os.environ.get("ANARCHON_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/"),
            "prefix": f"antestw-{_TAG}",
            "dedupe_window": "5m",
        },
    }
ANARCHON = {"default": _BACKEND}
