"""A bad decorator found by autodiscovery is a system check error, not a broken django.setup().

Before, a typo in a decorator's cron expression raised inside ``AppConfig.ready()``: every
``manage.py`` command and the web process died on import. Now autodiscovery keeps each
error and goes on, as Django does with model mistakes: the web process serves, ``manage.py
check`` names every mistake (anarchon.E004) and the worker refuses to start. Outside
autodiscovery (a test, a shell) a decorator still raises at once.

The subprocesses use tests/badjobs_settings.py, whose app tests/badjobsapp has the mistakes.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import override_settings

from django_anarchon import cron, every, scheduled
from django_anarchon.backends.memory import MemoryBackend
from django_anarchon.checks import run_all
from django_anarchon.engine import Scheduler
from django_anarchon.exceptions import ConfigurationError
from django_anarchon.registry import registry

from .support import ROOT

ENV = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.badjobs_settings", "PYTHONPATH": str(ROOT)}
#: What `manage.py check` must say about tests/badjobsapp/jobs.py: job, option, value, place.
MISTAKES = [
    ("badjobs.typo", "'expression' = '*/5 * * *'", "tests.badjobsapp.jobs:17"),
    ("badjobs.late", "'max_late' = 'soon'", "tests.badjobsapp.jobs:22"),
    ("reconcile", "'overlap' = 'sometimes'", "tests.badjobsapp.jobs:29 (Billing.reconcile)"),
]


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=ENV, capture_output=True,
                          text=True, timeout=timeout)


def test_django_setup_succeeds_and_the_web_process_serves() -> None:
    script = (
        "from django.core.wsgi import get_wsgi_application\n"
        "application = get_wsgi_application()\n"
        "from django.test import Client\n"
        "from django_anarchon.registry import registry\n"
        "print(Client().get('/admin/login/').status_code)\n"
        "print(sorted(e.name for e in registry.functions_for('default') "
        "if e.name.startswith('badjobs')))\n"
        "print(len(registry.errors()))\n"
    )
    done = run("-c", script)
    assert done.returncode == 0, done.stderr
    status, names, errors = done.stdout.split("\n")[:3]
    assert status == "200"
    assert names == "['badjobs.after', 'badjobs.fine']"  # the module was imported to its end
    assert errors == "3"


def test_check_names_each_job_option_value_and_place() -> None:
    done = run("-m", "django", "check")
    assert done.returncode == 1
    assert "anarchon.E004" in done.stderr
    for job, option_value, place in MISTAKES:
        (line,) = [line for line in done.stderr.splitlines() if line.startswith(f"{job}:")]
        assert f"job '{job}'" in line and f"option {option_value}" in line, line
        assert f"(defined at {place}" in line, line
    assert "System check identified 3 issues" in done.stderr  # no second error for Billing


def test_the_worker_refuses_to_start() -> None:
    done = run("-m", "django", "anarchon_worker", "--grace", "1s")
    assert done.returncode != 0
    assert "Press Ctrl+C" not in done.stdout + done.stderr
    assert "anarchon.E004" in done.stderr and "badjobs.typo" in done.stderr


def test_migrate_still_runs() -> None:
    """A job takes no part in the schema: a typo in one must not stop a deploy's migrate."""
    done = run("-m", "django", "migrate", "--noinput")
    assert done.returncode == 0, done.stderr
    assert "anarchon.E004" not in done.stderr
    assert "Applying django_anarchon.0001_initial... OK" in done.stdout


# -- in this process: what autodiscovery keeps, and what raises at once ----------------


@pytest.fixture
def kept() -> Iterator[list[Any]]:
    """Decorators run as if autodiscovery imported them; the errors they kept."""
    saved = registry._errors
    registry._errors = []
    try:
        with registry.collecting():
            yield registry._errors
    finally:
        registry._errors = saved
        registry.forget("collect")


def handler(ctx: Any) -> None:
    """A job body."""


def test_a_decorator_outside_autodiscovery_raises_at_once() -> None:
    with pytest.raises(ConfigurationError, match="'expression' = '1-0 \\* \\* \\* \\*'"):
        cron("1-0 * * * *", name="now", scheduler="collect")(handler)
    with pytest.raises(ConfigurationError, match="'name'"):
        every("1h", name="")
    assert registry.errors() == []


def test_autodiscovery_keeps_the_error_and_the_function(kept: list[Any]) -> None:
    assert cron("1-0 * * * *", name="backwards", scheduler="collect")(handler) is handler
    assert every("1h", name="", scheduler="collect")(handler) is handler
    assert every("1h", name="fine", scheduler="collect")(handler) is handler
    assert [e.name for e in registry.functions_for("collect")] == ["fine"]
    first, second = kept
    assert (first.error.job, first.error.option, first.error.value, first.alias) == (
        "backwards", "expression", "1-0 * * * *", "collect"
    )
    assert first.origin.startswith(f"{__name__}:")
    assert (second.error.option, second.error.value) == ("name", "")


def test_a_class_whose_job_methods_are_all_bad_is_one_error(kept: list[Any]) -> None:
    @scheduled(prefix="collect.cls", scheduler="collect")
    class Jobs:
        @every("1h", history_size=0)
        def only(self, ctx: Any) -> None: ...

    assert [(e.error.option, e.error.value) for e in kept] == [("history_size", 0)]
    assert registry.classes_for("collect") == []


def test_kept_errors_are_e004_and_logged_when_the_scheduler_is_built(
    kept: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    every("1h", name="late", max_late="soon", scheduler="default")(handler)
    with override_settings(ANARCHON={"default": {
        "BACKEND": "django_anarchon.backends.memory.MemoryBackend"}}):
        errors = [m for m in run_all() if m.id == "anarchon.E004" and m.obj == "late"]
        assert len(errors) == 1
        assert "option 'max_late' = 'soon'" in errors[0].msg
        scheduler = Scheduler(MemoryBackend(), name="default")
        with caplog.at_level(logging.ERROR, logger="django_anarchon"):
            registry.install(scheduler, "default")
    assert "runs without a job that failed to register" in caplog.text
    assert "'late'" in caplog.text
    registry._errors.clear()
