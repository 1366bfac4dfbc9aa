"""Store errors that waiting will not mend: a wrong password, a user or database that does not exist.

A worker waits out an outage (the store is down, restarting, unreachable): it comes back
by itself. A refusal does not: the settings are wrong, and a worker that retried forever
would look alive while running nothing. So the start retries outages and stops at once
on a refusal, which the worker prints in one line and exits non-zero.

The clients are optional extras, so their exception classes are looked up only in modules
already imported (a client that was never imported raised nothing).
"""

from __future__ import annotations

import re
import sys

__all__ = ["is_refusal"]

#: (module, class name) of client exceptions that always mean "refused".
_REFUSING_CLASSES = (
    ("redis.exceptions", "AuthenticationError"),
    ("redis.exceptions", "AuthenticationWrongNumberOfArgsError"),
    ("valkey.exceptions", "AuthenticationError"),
    ("valkey.exceptions", "AuthenticationWrongNumberOfArgsError"),
    ("nats.errors", "AuthorizationError"),
    ("aiormq.exceptions", "ProbableAuthenticationError"),
    ("aiormq.exceptions", "AuthenticationError"),
)
#: MySQL/MariaDB error numbers: access denied to a database (1044), for a user (1045, 1698),
#: unknown database (1049).
_MYSQL_REFUSALS = frozenset({1044, 1045, 1049, 1698})
#: libpq's words (psycopg gives connection errors no SQLSTATE); Redis's, NATS's and
#: RabbitMQ's replies.
_REFUSING_WORDS = re.compile(
    r"password authentication failed|no pg_hba\.conf entry"
    r'|(?:role|database) "[^"]*" does not exist'
    r"|wrongpass|noauth authentication required|invalid username-password pair"
    r"|authorization violation|access_refused",
    re.IGNORECASE,
)


def _refusing_classes() -> tuple[type[BaseException], ...]:
    found = []
    for module_name, class_name in _REFUSING_CLASSES:
        module = sys.modules.get(module_name)
        cls = getattr(module, class_name, None) if module is not None else None
        if isinstance(cls, type) and issubclass(cls, BaseException):
            found.append(cls)
    return tuple(found)


def _refuses(exc: BaseException, classes: tuple[type[BaseException], ...]) -> bool:
    if classes and isinstance(exc, classes):
        return True
    args = getattr(exc, "args", ())
    if args and isinstance(args[0], int) and args[0] in _MYSQL_REFUSALS:
        return type(exc).__name__ == "OperationalError"
    return _REFUSING_WORDS.search(str(exc)) is not None


def is_refusal(exc: BaseException) -> bool:
    """Whether ``exc``, or an exception it was raised from, is the store refusing us."""
    classes = _refusing_classes()
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if _refuses(current, classes):
            return True
        current = current.__cause__ or current.__context__
    return False
