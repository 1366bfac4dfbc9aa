"""``django_anarchon.redact``: every way a store URL or an error can carry a secret."""

from __future__ import annotations

import pytest

from django_anarchon.redact import redact_text, redact_url, redact_value

SECRET = "s3cr3t-TOKEN-xyz"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        # user and password: the user stays
        (f"redis://app:{SECRET}@10.0.0.5:6380/3", "redis://app:***@10.0.0.5:6380/3"),
        (f"rediss://default:{SECRET}@h:6379/0", "rediss://default:***@h:6379/0"),
        (f"amqps://user:{SECRET}@h/vhost", "amqps://user:***@h/vhost"),
        (f"postgres://u:{SECRET}@db:5432/app", "postgres://u:***@db:5432/app"),
        (f"ws://u:{SECRET}@h:8080", "ws://u:***@h:8080"),
        # an empty user with a password
        (f"amqp://:{SECRET}@h:5672/", "amqp://:***@h:5672/"),
        (f"tls://:{SECRET}@h:4222", "tls://:***@h:4222"),
        (f"redis://:{SECRET}@h:6379/0", "redis://:***@h:6379/0"),
        # a token alone
        (f"nats://{SECRET}@h:4222", "nats://***@h:4222"),
        (f"wss://{SECRET}@h", "wss://***@h"),
        # secret query parameters, any case; others stay
        (f"redis://h:6379/0?password={SECRET}&db=1", "redis://h:6379/0?password=***&db=1"),
        (f"redis://h/0?PASSWORD={SECRET}", "redis://h/0?PASSWORD=***"),
        (f"nats://h?token={SECRET}", "nats://h?token=***"),
        (f"amqp://h/?auth={SECRET}&heartbeat=30", "amqp://h/?auth=***&heartbeat=30"),
        (f"x://h?client_secret={SECRET}", "x://h?client_secret=***"),
        (f"x://h?Api_Key={SECRET}&access-key={SECRET}&key={SECRET}&key_prefix=p",
         "x://h?Api_Key=***&access-key=***&key=***&key_prefix=p"),
        (f"postgres://db/app?sslpassword={SECRET}", "postgres://db/app?sslpassword=***"),
        (f"wss://u:{SECRET}@h#token={SECRET}", "wss://u:***@h#token=***"),
        # unix sockets
        (f"unix://:{SECRET}@/tmp/redis.sock?db=0", "unix://:***@/tmp/redis.sock?db=0"),
        (f"unix:///tmp/redis.sock?password={SECRET}", "unix:///tmp/redis.sock?password=***"),
        # several servers, in one netloc or comma-separated URLs
        (f"postgres://u:{SECRET}@h1:5432,h2:5432/db", "postgres://u:***@h1:5432,h2:5432/db"),
        (f"nats://u:{SECRET}@a:4222,nats://{SECRET}@b:4222", "nats://u:***@a:4222,nats://***@b:4222"),
        (f"nats://a:4222, tls://:{SECRET}@b:4222", "nats://a:4222, tls://:***@b:4222"),
        # IPv6
        (f"redis://u:{SECRET}@[::1]:6379/0", "redis://u:***@[::1]:6379/0"),
        (f"redis://u:{SECRET}@[::1", "redis://u:***@[::1"),
        # a password with an unescaped '/' or '@', and an escaped one
        (f"redis://u:a/{SECRET}@h:1/2", "redis://u:***@h:1/2"),
        (f"redis://u:a@{SECRET}@h", "redis://u:***@h"),
        (f"redis://u:a%40{SECRET}@h", "redis://u:***@h"),
        # nothing to hide: unchanged
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("valkey://h:1/0", "valkey://h:1/0"),
        ("unix:///tmp/redis.sock", "unix:///tmp/redis.sock"),
        ("redis://h:notaport/0", "redis://h:notaport/0"),
        ("http://x", "http://x"),
        ("garbage", "garbage"),
        ("", ""),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


@pytest.mark.parametrize("garbage", [5, None, b"redis://:pw@h", ["x"], object(), "://@", "[::1]@"])
def test_redact_url_never_raises(garbage: object) -> None:
    assert isinstance(redact_url(garbage), str)
    assert isinstance(redact_text(garbage), str)


def test_redact_url_masks_bytes_and_other_objects_by_their_repr() -> None:
    assert redact_url(f"redis://:{SECRET}@h".encode()) == "b'redis://:***@h'"


def test_redact_text_hides_urls_and_password_pairs_in_free_text() -> None:
    text = (
        f"ConnectionError('nats://{SECRET}@h:4222 refused'), "
        f"Connection(host=h, password='{SECRET}') token={SECRET} "
        f"{{'password': \"{SECRET}\"}} at amqp://:{SECRET}@h/."
    )
    shown = redact_text(text)
    assert SECRET not in shown
    assert "nats://***@h:4222 refused" in shown
    assert "password='***'" in shown and "token=***" in shown
    assert "'password': \"***\"" in shown and "amqp://:***@h/." in shown
    assert "Connection(host=h," in shown


@pytest.mark.parametrize("text", [
    "Error 111 connecting to 127.0.0.1:6379. Connection refused. (db=0, port=6379)",
    "AuthenticationError: invalid username-password pair or user is disabled.",
    "option 'key_prefix' = 'a{b}': a non-empty string without braces",
])
def test_redact_text_leaves_ordinary_text_alone(text: str) -> None:
    assert redact_text(text) == text


def test_redact_value_keeps_numbers_and_masks_secret_keys() -> None:
    assert redact_value(5) == 5
    assert redact_value(None) is None
    assert redact_value([f"nats://{SECRET}@h", 2]) == ["nats://***@h", 2]
    assert redact_value({"password": SECRET, "url": f"redis://:{SECRET}@h", "db": 1}) == {
        "password": "***", "url": "redis://:***@h", "db": 1,
    }
    assert redact_value(Client()) == "Client(url='redis://:***@h', password='***')"


class Client:
    def __repr__(self) -> str:
        return f"Client(url='redis://:{SECRET}@h', password='{SECRET}')"
