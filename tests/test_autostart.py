"""AUTOSTART: a scheduler runs inside a web process from its first request, and stops at exit."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from django.core.signals import request_started
from django.test import Client, override_settings

from django_anarchon import every
from django_anarchon.autostart import AutoStarter
from django_anarchon.handler import schedulers
from django_anarchon.registry import registry

ALIAS = "autostart-tests"
MEMORY = "django_anarchon.backends.memory.MemoryBackend"
ran = threading.Event()


@pytest.fixture
def autostart_job() -> Iterator[None]:
    @every("100ms", name="autostart-tick", scheduler=ALIAS)
    def tick(ctx: object) -> None:
        ran.set()

    ran.clear()
    yield
    registry.forget(ALIAS)


@pytest.mark.django_db
@pytest.mark.usefixtures("autostart_job")
def test_first_request_starts_the_scheduler_and_exit_stops_it() -> None:
    starter = AutoStarter()
    config = {ALIAS: {"BACKEND": MEMORY, "AUTOSTART": True}}
    with override_settings(ANARCHON=config):
        request_started.connect(starter.on_request_started)
        try:
            assert not starter.started
            Client().get("/admin/login/")
            assert starter.started
            scheduler = schedulers[ALIAS]
            assert scheduler.running
            assert ran.wait(10), "the autostarted job never ran"
            Client().get("/admin/login/")  # later requests start nothing new
            assert schedulers[ALIAS] is scheduler
        finally:
            request_started.disconnect(starter.on_request_started)
            starter.stop(grace=1)
        assert not scheduler.running
        assert not starter.started


@pytest.mark.django_db
@pytest.mark.usefixtures("autostart_job")
def test_schedulers_without_autostart_are_left_alone() -> None:
    starter = AutoStarter()
    with override_settings(ANARCHON={ALIAS: {"BACKEND": MEMORY}}):
        request_started.connect(starter.on_request_started)
        try:
            Client().get("/admin/login/")
        finally:
            request_started.disconnect(starter.on_request_started)
        assert not schedulers[ALIAS].running
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            assert not ran.is_set()
            time.sleep(0.05)
