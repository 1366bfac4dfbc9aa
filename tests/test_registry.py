"""The decorators, autodiscovery of jobs.py, and registration errors."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from django_anarchon import at, cron, every, scheduled
from django_anarchon.exceptions import ConfigurationError, DuplicateJobError
from django_anarchon.registry import registry


@pytest.fixture
def alias() -> Iterator[str]:
    """A scheduler alias of the test's own, so declared jobs never leak into others."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    yield name
    registry.forget(name)


def names(alias: str) -> set[str]:
    functions = {entry.name for entry in registry.functions_for(alias)}
    return functions | {entry.prefix for entry in registry.classes_for(alias)}


def test_jobs_py_of_installed_apps_is_autodiscovered() -> None:
    assert {"testapp.hourly_cleanup", "morning-report"} <= names("default")
    assert "billing" in names("default")


def test_default_name_is_app_label_and_function(alias: str) -> None:
    @every("10s", scheduler=alias)
    def sync_inventory(ctx: object) -> None: ...

    # Defined in a test module outside any app: the module path stands in for the label.
    assert names(alias) == {"tests.test_registry.sync_inventory"}


def test_duplicate_name_names_both_places(alias: str) -> None:
    @every("10s", name="dup", scheduler=alias)
    def first(ctx: object) -> None: ...

    with pytest.raises(DuplicateJobError) as info:

        @cron("* * * * *", name="dup", scheduler=alias)
        def second(ctx: object) -> None: ...

    message = str(info.value)
    assert "'dup'" in message
    assert "first" in message and "second" in message
    assert message.count("tests.test_registry") == 2


def test_the_same_place_registering_again_is_not_a_duplicate(alias: str) -> None:
    def handler(ctx: object) -> None: ...

    for _ in range(2):
        every("10s", name="again", scheduler=alias)(handler)
    assert names(alias) == {"again"}


def test_scheduled_class_names_methods_with_prefix(alias: str) -> None:
    @scheduled(prefix="shop", scheduler=alias)
    class ShopJobs:
        @every("1h")
        def restock(self, ctx: object) -> None: ...

        @cron("0 3 * * *", name="nightly")
        def rebuild_index(self, ctx: object) -> None: ...

        def not_a_job(self) -> None: ...

    [entry] = registry.classes_for(alias)
    assert entry.cls is ShopJobs and entry.prefix == "shop"
    with pytest.raises(DuplicateJobError, match=r"shop\.restock"):

        @every("1m", name="shop.restock", scheduler=alias)
        def clash(ctx: object) -> None: ...


def test_scheduled_class_without_jobs_is_refused(alias: str) -> None:
    with pytest.raises(ConfigurationError, match="no methods decorated"):

        @scheduled(scheduler=alias)
        class Empty:
            def nothing(self) -> None: ...


@pytest.mark.parametrize(
    ("decorate", "option", "value"),
    [
        (lambda: every("-5s", name="j"), "interval", "-5s"),
        (lambda: every("0s", name="j"), "interval", "0s"),
        (lambda: every("soon", name="j"), "interval", "soon"),
        (lambda: every(True, name="j"), "interval", True),
        (lambda: every("1s", name="j", jitter="-1s"), "jitter", "-1s"),
        (lambda: every("1s", name="j", max_late=[1]), "max_late", [1]),
        (lambda: every("1s", name="j", history_size=0), "history_size", 0),
        (lambda: every("1s", name="j", history_size="10"), "history_size", "10"),
        (lambda: every("1s", name="j", history_ttl="0s"), "history_ttl", "0s"),
        (lambda: every("1s", name="j", timeout="later"), "timeout", "later"),
        (lambda: every("1s", name="j", overlap="never"), "overlap", "never"),
        (lambda: every("1s", name="j", max_attempts=0), "max_attempts", 0),
        (lambda: every("1s", name="j", max_attempts=1.5), "max_attempts", 1.5),
        (lambda: every("1s", name="j", catch_up="yesterday"), "catch_up", "yesterday"),
        (lambda: every("1s", name="j", offset="-1s"), "offset", "-1s"),
        (lambda: every("1s", name="j", data=object()), "data", None),
        (lambda: every("1s", name="j", timezone="UTC"), "timezone", "UTC"),
        (lambda: every("1s", name="j", colour="blue"), "colour", "blue"),
        (lambda: cron("* * * * *", name="j", timezone="Mars/Olympus"), "timezone", "Mars/Olympus"),
        (lambda: cron("* * * * *", name="j", offset="1s"), "offset", "1s"),
        (lambda: at("2027-01-01T00:00:00", name="j"), "when", "2027-01-01T00:00:00"),
        (lambda: at("new year", name="j"), "when", "new year"),
        (lambda: at("2027-01-01T00:00:00+00:00", name="j", overlap="allow"), "overlap", "allow"),
    ],
)
def test_bad_options_name_job_option_and_value(
    alias: str, decorate: object, option: str, value: object
) -> None:
    with pytest.raises(ConfigurationError) as info:
        decorate()(lambda ctx: None)  # type: ignore[operator]
    error = info.value
    assert error.job == "j"
    assert error.option == option
    message = str(error)
    assert "'j'" in message and repr(option) in message
    if value is not None:
        assert repr(value) in message


def test_bad_cron_expression_names_job_and_expression() -> None:
    with pytest.raises(ConfigurationError) as info:
        cron("61 * * * *", name="bad-cron")(lambda ctx: None)
    assert info.value.job == "bad-cron"
    assert info.value.option == "expression"
    assert "'61 * * * *'" in str(info.value)


def test_empty_name_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="non-empty"):
        every("1s", name="  ")
