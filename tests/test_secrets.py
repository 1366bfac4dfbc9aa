"""No password or token reaches a description, the admin, the worker banner or an error.

Every backend is built with one distinctive secret in its URL (as a password, a token, an
empty user's password, a query parameter) or in ``DATABASES``; the secret must appear in
none of ``describe()``, the admin's Jobs page, the ``anarchon_worker`` banner, the
errors of a settings mistake and ``manage.py check``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.core.checks import run_checks
from django.test import Client, override_settings

from django_anarchon import every
from django_anarchon.backends.database import DatabaseBackend
from django_anarchon.backends.redis import RedisBackend
from django_anarchon.backends.valkey import ValkeyBackend
from django_anarchon.exceptions import ConfigurationError
from django_anarchon.handler import build_backend, schedulers

from .conftest import databases
from .support import fresh_registry, reachable, unavailable, wait_for, worker_group

SECRET = "s3cr3t-TOKEN-xyz"
REDIS = "django_anarchon.backends.redis.RedisBackend"
VALKEY = "django_anarchon.backends.valkey.ValkeyBackend"
NATS = "django_anarchon.backends.nats.NatsBackend"
RABBITMQ = "django_anarchon.backends.rabbitmq.RabbitMQBackend"
DATABASE = "django_anarchon.backends.database.DatabaseBackend"
JOBS_URL = "/admin/django_anarchon/scheduledjob/"

#: Backends whose server is not there (port 1): built and described, never reached.
UNREACHED: list[tuple[str, dict[str, Any]]] = [
    (REDIS, {"url": f"redis://app:{SECRET}@127.0.0.1:1/0"}),
    (REDIS, {"url": f"redis://:{SECRET}@127.0.0.1:1/0"}),
    (REDIS, {"url": f"redis://127.0.0.1:1/0?password={SECRET}"}),
    (REDIS, {"url": f"rediss://u:{SECRET}@[::1]:1/0", "cluster": True}),
    (REDIS, {"url": f"unix://:{SECRET}@/tmp/no-such-redis.sock?db=0"}),
    (REDIS, {"host": "127.0.0.1", "port": 1, "password": SECRET}),
    (VALKEY, {"url": f"valkey://:{SECRET}@127.0.0.1:1/0"}),
    (VALKEY, {"url": f"valkeys://u:{SECRET}@127.0.0.1:1/0?PASSWORD={SECRET}"}),
    (NATS, {"url": f"nats://{SECRET}@127.0.0.1:1", "timeout": "1s"}),
    (NATS, {"url": f"tls://:{SECRET}@127.0.0.1:1", "timeout": "1s"}),
    (NATS, {"servers": [f"nats://u:{SECRET}@127.0.0.1:1", f"ws://{SECRET}@127.0.0.1:1"],
            "timeout": "1s"}),
    (NATS, {"url": f"nats://127.0.0.1:1?token={SECRET}", "timeout": "1s"}),
    (RABBITMQ, {"url": f"amqp://:{SECRET}@127.0.0.1:1/", "timeout": "1s", "retry_for": "0s"}),
    (RABBITMQ, {"url": f"amqps://u:{SECRET}@127.0.0.1:1/v", "timeout": "1s", "retry_for": "0s"}),
    (RABBITMQ, {"url": f"amqp://guest:guest@127.0.0.1:1/?auth={SECRET}", "timeout": "1s",
                "retry_for": "0s"}),
]


def _id(case: tuple[str, dict[str, Any]]) -> str:
    return case[0].rsplit(".", 1)[1] + ":" + "/".join(map(str, case[1].values()))[:40]


@pytest.mark.parametrize("case", UNREACHED, ids=[_id(c) for c in UNREACHED])
def test_describe_hides_the_secret(case: tuple[str, dict[str, Any]]) -> None:
    backend = build_backend("default", {"BACKEND": case[0], "OPTIONS": case[1]})
    text = backend.describe()
    assert SECRET not in text
    assert "127.0.0.1" in text or "::1" in text or "/tmp/no-such-redis.sock" in text, text


def test_database_describe_hides_the_password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(databases()["postgres"], "PASSWORD", SECRET)
    text = DatabaseBackend(using="postgres").describe()
    assert SECRET not in text and "postgres" in text


# --- settings mistakes ----------------------------------------------------------------


@pytest.mark.parametrize("backend", [REDIS, VALKEY])
def test_a_typo_in_options_names_the_keys_and_never_the_values(backend: str) -> None:
    options = {"urll": f"redis://:{SECRET}@h:6379/0", "strategy": "lease", "pasword": SECRET}
    with pytest.raises(ConfigurationError) as info:
        build_backend("default", {"BACKEND": backend, "OPTIONS": options})
    message = str(info.value)
    assert SECRET not in message
    assert "settings.ANARCHON['default']['OPTIONS']: unknown key(s) 'pasword', 'urll'" in message
    assert "it accepts client, client_options, cluster, db, host" in message and " url," in message
    assert info.value.option == "ANARCHON['default']['OPTIONS']"


def test_options_that_are_not_a_dict_are_not_printed() -> None:
    with pytest.raises(ConfigurationError) as info:
        build_backend("default", {"BACKEND": REDIS, "OPTIONS": [f"redis://:{SECRET}@h"]})
    assert SECRET not in str(info.value) and "not a list" in str(info.value)


@pytest.mark.parametrize(
    ("backend", "options"),
    [
        (NATS, {"url": f"nats://{SECRET}@h", "servers": [f"nats://{SECRET}@h"]}),
        (NATS, {"servers": [f"nats://{SECRET}@h", 5]}),
        (RABBITMQ, {"url": f"http://:{SECRET}@h"}),
        (RABBITMQ, {"url": f"amqp://:{SECRET}@h", "connection": object()}),
        (REDIS, {"url": f"redis://:{SECRET}@h", "client": object()}),
        (REDIS, {"url": f"http://:{SECRET}@h"}),
        (VALKEY, {"url": f"rediss+x://u:{SECRET}@h"}),
    ],
)
def test_errors_about_a_url_redact_it(backend: str, options: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError) as info:
        build_backend("default", {"BACKEND": backend, "OPTIONS": options})
    assert SECRET not in str(info.value)
    assert SECRET not in repr(info.value.value)
    assert "***" in str(info.value)


@pytest.mark.parametrize(
    ("backend", "url", "schemes"),
    [
        (RedisBackend, 5, "redis://, rediss://, unix://"),
        (RedisBackend, "http://x", "redis://, rediss://, unix://"),
        (RedisBackend, f"nats://u:{SECRET}@h", "redis://, rediss://, unix://"),
        (RedisBackend, f"redis://u:{SECRET}@h:port/0", "redis://, rediss://, unix://"),
        (RedisBackend, f"redis://u:a/{SECRET}@h/0", "redis://, rediss://, unix://"),
        (ValkeyBackend, "http://x", "valkey://, valkeys://, redis://, rediss://, unix://"),
        (ValkeyBackend, ["redis://h"], "valkey://, valkeys://, redis://, rediss://, unix://"),
    ],
)
def test_redis_refuses_a_url_it_cannot_use(backend: type[Any], url: Any, schemes: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        backend(url=url)
    assert info.value.option == "url"
    assert f"a URL with one of the schemes {schemes}" in str(info.value)
    assert SECRET not in str(info.value)
    if isinstance(url, str) and SECRET not in url:
        assert info.value.value == url


def test_redis_accepts_each_scheme_it_can_use() -> None:
    for url in ("redis://h", "rediss://h:6380/1", "unix:///tmp/r.sock", "REDIS://h"):
        RedisBackend(url=url)
    for url in ("valkey://h", "valkeys://h", "redis://h", "unix:///tmp/r.sock"):
        ValkeyBackend(url=url)


@pytest.mark.parametrize(
    "options",
    [
        {"urll": f"redis://:{SECRET}@h:6379/0"},
        {"url": f"redis://:{SECRET}@h:6379/0", "strategy": "nope"},
        {"url": f"http://:{SECRET}@h"},
        {"url": 5, "password": SECRET},
    ],
)
def test_manage_py_check_names_the_problem_without_the_secret(options: dict[str, Any]) -> None:
    with override_settings(ANARCHON={"default": {"BACKEND": REDIS, "OPTIONS": options}}):
        errors = [m for m in run_checks(tags=["anarchon"], databases=[]) if m.id == "anarchon.E003"]
    assert len(errors) == 1, errors
    text = f"{errors[0].msg} {errors[0].hint}"
    assert SECRET not in text
    assert "OPTIONS" in text


# --- the admin ------------------------------------------------------------------------


def _staff() -> Client:
    user = User.objects.create_user("secrets-viewer", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(
        content_type__app_label="django_anarchon", codename__startswith="view_"
    ))
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def one_job() -> Iterator[None]:
    """One job on the default scheduler; the process-global registry is restored afterwards."""
    with fresh_registry():
        every("1h", name="secrets.hourly")(lambda ctx: None)
        try:
            yield
        finally:
            schedulers.reset()


@pytest.mark.django_db
@pytest.mark.usefixtures("one_job")
@pytest.mark.parametrize("case", UNREACHED, ids=[_id(c) for c in UNREACHED])
def test_the_admin_jobs_page_hides_the_secret_of_a_store_that_is_down(
    case: tuple[str, dict[str, Any]],
) -> None:
    config = {"default": {"BACKEND": case[0], "OPTIONS": case[1]}}
    with override_settings(ANARCHON=config):
        page = _staff().get(JOBS_URL)
    assert page.status_code == 200
    html = page.content.decode()
    assert "secrets.hourly" in html
    assert SECRET not in html


# --- on the real servers, with a URL whose secret the server accepts --------------------

#: name -> (backend, OPTIONS, host and port); each server here accepts any password or token.
REACHED: dict[str, tuple[str, dict[str, Any], tuple[str, int]]] = {
    "redis": (REDIS, {
        "url": f"redis://default:{SECRET}@127.0.0.1:6379/0?password={SECRET}",
        "key_prefix": "anarchon-test-secrets",
    }, ("127.0.0.1", 6379)),
    "valkey": (VALKEY, {
        "url": f"valkey://default:{SECRET}@127.0.0.1:6379/0",
        "key_prefix": "anarchon-test-secrets-v",
    }, ("127.0.0.1", 6379)),
    "nats": (NATS, {
        "url": f"nats://{SECRET}@127.0.0.1:4222",
        "stream_prefix": "ANTESTSECRETS", "subject_prefix": "antestsecrets",
    }, ("127.0.0.1", 4222)),
    "rabbitmq": (RABBITMQ, {
        "url": f"amqp://guest:guest@127.0.0.1:5672/?auth_token={SECRET}",
        "prefix": "antest-secrets",
    }, ("127.0.0.1", 5672)),
}
MARKS = {"redis": pytest.mark.redis, "valkey": pytest.mark.redis, "nats": pytest.mark.nats,
         "rabbitmq": pytest.mark.rabbitmq}


def _reached(name: str) -> tuple[str, dict[str, Any]]:
    backend, options, (host, port) = REACHED[name]
    if not reachable(host, port):
        unavailable(f"no {name} server at {host}:{port}")
    return backend, options


@pytest.mark.django_db
@pytest.mark.usefixtures("one_job")
@pytest.mark.parametrize("name", [pytest.param(n, marks=MARKS[n]) for n in REACHED])
def test_the_admin_jobs_page_hides_the_secret(name: str) -> None:
    backend, options = _reached(name)
    with override_settings(ANARCHON={"default": {"BACKEND": backend, "OPTIONS": options}}):
        page = _staff().get(JOBS_URL)
    html = page.content.decode()
    assert page.status_code == 200 and "secrets.hourly" in html
    assert SECRET not in html
    assert "127.0.0.1" in html


def _banner(tmp_path: Any, env: dict[str, str]) -> str:
    """The output of a worker of tests/secretworker up to its banner (then stopped)."""
    with worker_group(tmp_path, {"DJANGO_SETTINGS_MODULE": "tests.secretworker.settings",
                                 **env}) as group:
        group.start("secrets-w1")
        group.wait_started()
        group.stop_all()
        return group.output("secrets-w1")


@pytest.mark.slow
@pytest.mark.workers
@pytest.mark.parametrize("name", [pytest.param(n, marks=MARKS[n]) for n in REACHED])
def test_the_worker_banner_hides_the_secret(name: str, tmp_path: Any) -> None:
    backend, options = _reached(name)
    out = _banner(tmp_path, {
        "ANARCHON_SECRET_BACKEND": backend, "ANARCHON_SECRET_OPTIONS": json.dumps(options),
    })
    assert "anarchon worker: scheduler 'default', backend " in out and "secrets.hourly" in out
    assert SECRET not in out
    assert "***" in out


@pytest.mark.slow
@pytest.mark.workers
@pytest.mark.postgres
@pytest.mark.usefixtures("postgres_database")
def test_the_worker_banner_hides_the_database_password(tmp_path: Any) -> None:
    out = _banner(tmp_path, {
        "ANARCHON_SECRET_BACKEND": DATABASE,
        "ANARCHON_SECRET_OPTIONS": json.dumps({"using": "postgres"}),
        "ANARCHON_PG_PASSWORD": SECRET,
    })
    assert "backend database (postgresql, alias 'postgres')" in out
    assert SECRET not in out


DOWN = {
    "redis-empty-user": (REDIS, {"url": f"redis://:{SECRET}@127.0.0.1:1/0"}),
    "nats-token": (NATS, {"url": f"nats://{SECRET}@127.0.0.1:1", "timeout": "1s"}),
    "rabbitmq-empty-user": (RABBITMQ, {"url": f"amqp://:{SECRET}@127.0.0.1:1/", "timeout": "1s"}),
}


@pytest.mark.slow
@pytest.mark.workers
@pytest.mark.parametrize("name", list(DOWN))
def test_a_worker_whose_store_is_down_hides_the_secret(name: str, tmp_path: Any) -> None:
    backend, options = DOWN[name]
    env = {"DJANGO_SETTINGS_MODULE": "tests.secretworker.settings",
           "ANARCHON_SECRET_BACKEND": backend, "ANARCHON_SECRET_OPTIONS": json.dumps(options)}
    with worker_group(tmp_path, env) as group:
        group.start("secrets-w1")
        # The worker retries its store and logs each failure: where a secret would show.
        wait_for(lambda: "retry 2 " in group.output("secrets-w1")
                 or group.procs["secrets-w1"].poll() is not None, 60, "two failed inits")
        out = group.output("secrets-w1")
    assert "failed" in out
    assert SECRET not in out
