"""settings.ANARCHON: defaults, lazy reading, override_settings, errors naming the setting."""

from __future__ import annotations

import pytest
from django.test import override_settings

from django_anarchon import conf
from django_anarchon.exceptions import ConfigurationError, UnknownSchedulerError
from django_anarchon.handler import build_backend, build_scheduler


def test_default_scheduler_exists_when_setting_is_absent(settings: object) -> None:
    del settings.ANARCHON  # type: ignore[attr-defined]
    config = conf.get_config()
    assert list(config) == ["default"]
    assert config["default"]["BACKEND"] == "django_anarchon.backends.database.DatabaseBackend"
    assert config["default"]["LEASE"] == "30s"
    assert config["default"]["THREADS"] == 10


def test_user_keys_are_merged_over_defaults_and_reread_on_change() -> None:
    with override_settings(ANARCHON={"fast": {"LEASE": "5s"}}):
        config = conf.get_config()
        assert list(config) == ["fast"]
        assert config["fast"]["LEASE"] == "5s"
        assert config["fast"]["BACKEND"] == conf.DEFAULT_BACKEND
    assert "fast" not in conf.get_config()


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        (["default"], "must be a dict of named schedulers"),
        ({"default": "memory"}, "must be a dict of settings"),
        ({"default": {"BAKEND": "x"}}, "unknown key"),
    ],
)
def test_bad_settings_name_the_setting(value: object, fragment: str) -> None:
    with override_settings(ANARCHON=value), pytest.raises(ConfigurationError, match=fragment) as info:
        conf.get_config()
    assert "ANARCHON" in str(info.value)


def test_unknown_backend_path_names_scheduler_and_value() -> None:
    with pytest.raises(ConfigurationError) as info:
        build_backend("fast", {"BACKEND": "nowhere.Backend", "OPTIONS": {}})
    assert "ANARCHON['fast']['BACKEND']" in str(info.value)
    assert "'nowhere.Backend'" in str(info.value)


def test_backend_options_it_does_not_take_name_the_setting() -> None:
    with pytest.raises(ConfigurationError) as info:
        build_backend(
            "default",
            {"BACKEND": "django_anarchon.backends.memory.MemoryBackend", "OPTIONS": {"colour": 1}},
        )
    assert "ANARCHON['default']['OPTIONS']" in str(info.value)


def test_unknown_scheduler_alias() -> None:
    with pytest.raises(UnknownSchedulerError, match="no scheduler 'nope'"):
        build_scheduler("nope")
