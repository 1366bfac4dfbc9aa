"""System checks (``manage.py check``) for settings, backends and jobs.

They run the same validation the worker runs at start, but collect every problem with
a stable id instead of stopping at the first one, so a deploy pipeline sees them all
before a worker crashes in production. Ids and fixes are listed in ``docs/checks.md``.

Nothing here connects to a store: backends are constructed (which must not do I/O)
but never initialised. The one exception is tagged ``database`` (anarchon.E007), like
Django's own checks that query a database: it runs only for the databases a command
names (``check --database default``), and looks for the tables ``migrate`` creates.
"""

from __future__ import annotations

import inspect
import logging
import os
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, cast

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.db import DatabaseError, connections
from django.utils.module_loading import import_string

from . import conf
from .backends.base import supports_leases
from .durations import parse_duration, parse_optional_duration
from .exceptions import ConfigurationError
from .handler import construct_backend
from .jobs import (
    COMMON_OPTIONS,
    DEFAULTS,
    LEASE_OPTIONS,
    MAX_THREADS,
    Job,
    JobOptions,
    build_job,
    check_dedupe_window,
    check_instance_id,
    validate_options,
)
from .redact import redact_text
from .registry import JobSpec, registry
from .schedules import Cron

if TYPE_CHECKING:
    from .backends.database import DatabaseBackend

DATABASE_BACKEND = "django_anarchon.backends.database.DatabaseBackend"
SQLITE_ENGINE = "django.db.backends.sqlite3"


def _setting(alias: str, key: str | None = None) -> str:
    return f"ANARCHON[{alias!r}]" + (f"[{key!r}]" if key else "")


def check_settings(config: dict[str, dict[str, Any]]) -> list[CheckMessage]:
    """anarchon.E001 for scheduler keys with a wrong type or value."""
    errors: list[CheckMessage] = []

    def bad(alias: str, key: str, exc: Exception | str) -> None:
        errors.append(Error(
            f"settings.{_setting(alias, key)}: {exc}",
            hint="Fix the value in settings.ANARCHON; docs/options.md lists every key.",
            id="anarchon.E001",
        ))

    for alias, entry in config.items():
        try:
            lease_ms: int | None = parse_duration(
                entry["LEASE"], option=_setting(alias, "LEASE"), allow_zero=False
            )
        except ConfigurationError as exc:
            bad(alias, "LEASE", exc)
            lease_ms = None
        try:
            heartbeat_ms = parse_optional_duration(
                entry["HEARTBEAT"], option=_setting(alias, "HEARTBEAT"), allow_zero=False
            )
        except ConfigurationError as exc:
            bad(alias, "HEARTBEAT", exc)
            heartbeat_ms = None
        if lease_ms is not None and heartbeat_ms is not None and heartbeat_ms >= lease_ms:
            bad(alias, "HEARTBEAT", f"the heartbeat ({heartbeat_ms} ms) must be shorter than LEASE "
                f"({lease_ms} ms), or every lease lapses before it is renewed")
        threads = entry["THREADS"]
        if (isinstance(threads, bool) or not isinstance(threads, int)
                or not 1 <= threads <= MAX_THREADS):
            bad(alias, "THREADS", f"expected a whole number from 1 to {MAX_THREADS:,}, "
                f"got {threads!r}")
        instance_id = entry["INSTANCE_ID"]
        if instance_id is not None:
            try:
                check_instance_id(instance_id, option=_setting(alias, "INSTANCE_ID"))
            except ConfigurationError as exc:
                bad(alias, "INSTANCE_ID", f"{exc.reason} (or None for a generated id), "
                    f"got {instance_id!r}")
        if not isinstance(entry["AUTOSTART"], bool):
            bad(alias, "AUTOSTART", f"expected True or False, got {entry['AUTOSTART']!r}")
        if not isinstance(entry["OPTIONS"], dict):
            bad(alias, "OPTIONS", "expected a dict of the backend's keyword arguments, "
                f"got a {type(entry['OPTIONS']).__name__}")
        if not isinstance(entry["JOB_DEFAULTS"], dict):
            bad(alias, "JOB_DEFAULTS",
                f"expected a dict of job options, got {entry['JOB_DEFAULTS']!r}")
        try:
            conf.spool_directory(entry["SPOOL"])
        except ConfigurationError as exc:
            bad(alias, "SPOOL", f"{exc.reason}, got {entry['SPOOL']!r}")
    return errors


def check_spool(alias: str, entry: dict[str, Any], backend: Any) -> list[CheckMessage]:
    """anarchon.W003: a spool directory this process could not create or write.

    Creates nothing: the directory, or its nearest existing parent, must be writable. A
    store that does not outlive the process (memory) has no spool.
    """
    try:
        directory = conf.spool_directory(entry["SPOOL"])
    except ConfigurationError:
        return []  # E001 already
    if directory is None or backend is None or not getattr(backend, "durable", True):
        return []
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing.is_dir() and os.access(existing, os.W_OK | os.X_OK):
        return []
    problem = "is not a directory" if existing.exists() and not existing.is_dir() else (
        "is not writable by this user")
    where = "it" if existing == directory else f"its parent {existing}"
    return [Warning(
        f"scheduler {alias!r}: the spool directory {directory} cannot be written ({where} "
        f"{problem}): records the store cannot take when it is down are lost",
        hint="Set ANARCHON[...]['SPOOL'] (or anarchon_worker --spool) to a writable directory, "
             "on a volume that outlives the container, or to False for no spool; see "
             "docs/deployment.md.",
        obj=alias, id="anarchon.W003",
    )]


def load_backend(alias: str, entry: dict[str, Any]) -> tuple[Any, list[CheckMessage]]:
    """The backend of one scheduler, or anarchon.E002 (import) / anarchon.E003 (constructor)."""
    path = entry["BACKEND"]
    try:
        if not isinstance(path, str):
            raise ImportError("BACKEND must be a dotted path to a backend class")
        backend_class = import_string(path)
    except ImportError as exc:
        return None, [Error(
            f"settings.{_setting(alias, 'BACKEND')} = {path!r} cannot be imported: {exc}",
            hint="Use the dotted path of a backend class, e.g. "
                 f"{conf.DEFAULT_BACKEND!r}, and install its extra (pip install "
                 "'django-anarchon[redis]' ...).",
            id="anarchon.E002",
        )]
    options = entry["OPTIONS"] if isinstance(entry["OPTIONS"], dict) else {}
    try:
        return construct_backend(alias, backend_class, options), []
    except Exception as exc:  # any constructor error is the user's settings problem
        detail = redact_text(exc)  # never the values of OPTIONS: they hold passwords
        if not detail.startswith("settings."):  # the handler's own errors name the setting
            detail = (f"settings.{_setting(alias, 'OPTIONS')}: the backend {path!r} refused "
                      f"them: {type(exc).__name__}: {detail}")
        return None, [Error(
            detail,
            hint="Pass only keyword arguments the backend accepts (see its page in the docs).",
            id="anarchon.E003",
        )]


def _job_error(alias: str, name: str, exc: Exception, origin: str) -> Error:
    where = f" (defined at {origin})" if origin else ""
    return Error(
        f"scheduler {alias!r}: {exc}{where}",
        hint="Fix the job's schedule or options; docs/options.md lists what each option takes.",
        obj=name, id="anarchon.E004",
    )


def check_registration_errors() -> list[CheckMessage]:
    """anarchon.E004: decorators whose job failed to register while jobs.py was imported.

    Not inside ``migrate``: a typo in a job must not stop a deploy's schema migration,
    which the jobs do not take part in; the worker's own checks still refuse to start.
    """
    if _inside_migrate():
        return []
    messages: list[CheckMessage] = []
    for kept in registry.errors():
        scheduler = f"scheduler {kept.alias!r}: " if kept.alias else ""
        messages.append(Error(
            f"{scheduler}{kept.error} (defined at {kept.origin})",
            hint="The job was left out when its module was imported, and anarchon_worker "
                 "refuses to start until it is fixed; docs/options.md lists what each option "
                 "takes.",
            obj=kept.error.job or kept.origin, id="anarchon.E004",
        ))
    return messages


def _specs(alias: str) -> Iterable[tuple[str, JobSpec, Any, dict[str, Any]]]:
    """(name, spec, handler, extra defaults) of every job registered for ``alias``."""
    for entry in registry.functions_for(alias):
        yield entry.name, entry.job, entry.handler, {}
    for cls_entry in registry.classes_for(alias):
        for attr, value in inspect.getmembers(cls_entry.cls, callable):
            for spec in getattr(value, "_anarchon_jobs", []):
                name = f"{cls_entry.prefix}.{spec.name or attr}"
                yield name, spec, value, dict(cls_entry.defaults)


def job_defaults(alias: str, entry: dict[str, Any]) -> tuple[JobOptions, list[CheckMessage]]:
    """``JOB_DEFAULTS`` validated the way the scheduler does it, or anarchon.E001."""
    raw = entry["JOB_DEFAULTS"]
    if not isinstance(raw, dict) or not raw:
        return DEFAULTS, []  # a wrong type is reported by check_settings

    def bad(message: str) -> tuple[JobOptions, list[CheckMessage]]:
        return DEFAULTS, [Error(
            f"settings.{_setting(alias, 'JOB_DEFAULTS')}: {message}",
            hint="JOB_DEFAULTS takes the options every job accepts; docs/options.md lists them.",
            id="anarchon.E001",
        )]

    for option, value in raw.items():
        if option not in COMMON_OPTIONS:
            return bad(f"unknown option {option!r} = {value!r}; known options: "
                       f"{', '.join(sorted(COMMON_OPTIONS))}")
    try:
        return validate_options(f"<JOB_DEFAULTS of {alias}>", "every", raw)[0], []
    except ConfigurationError as exc:
        return bad(str(exc))


def check_jobs(
    alias: str, entry: dict[str, Any], backend: Any, now_ms: int | None = None
) -> list[CheckMessage]:
    """E004 (invalid job), E005 (the backend cannot honour it), W002 (a one-off that never
    runs), W004 (a cron job that meets a DST gap or fold within a year)."""
    defaults, messages = job_defaults(alias, entry)
    if messages:
        return messages
    timezone = getattr(settings, "TIME_ZONE", None) or "UTC"
    for name, spec, handler, class_defaults in _specs(alias):
        options = {**class_defaults, **spec.options}
        try:
            job = build_job(name, spec.kind, spec.spec, handler, options, defaults=defaults,
                            default_timezone=timezone, origin=spec.origin)
        except ConfigurationError as exc:
            messages.append(_job_error(alias, name, exc, spec.origin))
            continue
        if backend is not None:
            messages.extend(_check_backend_honours(alias, job, backend))
        if job.is_expired(now_ms):
            messages.append(Warning(
                f"scheduler {alias!r}: the one-off job {name!r} was due at "
                f"{job.schedule.describe().removeprefix('at ')}, longer ago than its catch_up "
                f"({job.options.catch_up_window_ms} ms) plus max_late ({job.options.max_late_ms} ms) "
                "allow: it will never run",
                hint="Move the instant into the future, raise catch_up, or delete the job.",
                obj=name, id="anarchon.W002",
            ))
        if isinstance(job.schedule, Cron):
            messages.extend(check_dst(alias, job.name, job.schedule, options, now_ms))
    return messages


_YEAR_MS = 365 * 86_400_000
_GAP_RULES = {"shift": "fires once, at the end of the gap", "skip": "does not fire that day"}
_FOLD_RULES = {"first": "fires at the first occurrence", "second": "fires at the second occurrence",
               "both": "fires at both occurrences"}


def check_dst(
    alias: str, name: str, cron: Cron, options: dict[str, Any], now_ms: int | None = None
) -> list[CheckMessage]:
    """anarchon.W004: matching wall-clock times that a DST change skips or repeats this year.

    Silent for every-hour expressions (they keep elapsed time) and for a kind of change
    whose policy the job set itself: naming ``dst_gap`` or ``dst_fold`` is the choice made.
    """
    now = int(time.time() * 1000) if now_ms is None else now_ms
    found = []
    for event in cron.dst_events(now, now + _YEAR_MS):
        option = "dst_gap" if event.kind == "gap" else "dst_fold"
        if option in options:
            continue
        policy = cron.dst_gap if event.kind == "gap" else cron.dst_fold
        rule = (_GAP_RULES if event.kind == "gap" else _FOLD_RULES)[policy]
        times = event.first_wall.strftime("%H:%M")
        if event.last_wall != event.first_wall:
            times += event.last_wall.strftime(" to %H:%M")
        kind = "does not exist" if event.kind == "gap" else "happens twice"
        found.append(f"{event.first_wall:%Y-%m-%d} ({times} {kind}; {option}={policy!r} "
                     f"{rule})")
    if not found:
        return []
    return [Warning(
        f"scheduler {alias!r}: the cron job {name!r} ({cron.describe()}) meets daylight-saving "
        f"changes within a year: {'; '.join(found)}",
        hint="If that is what you want, say so by setting dst_gap ('shift' or 'skip') or "
             "dst_fold ('first', 'second' or 'both') on the job, which silences this; or move "
             "the time out of the changing hours. See docs/concepts.md.",
        obj=name, id="anarchon.W004",
    )]


class _ThisThreadOnly(logging.Filter):
    """Drops the scheduler's own log lines while a check builds it (the check reports them)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.thread != threading.get_ident()


def check_build(alias: str) -> list[CheckMessage]:
    """anarchon.E004: building the scheduler and registering its jobs fails all the same.

    A last net for what only the engine sees, e.g. a ``@scheduled`` class whose
    constructor needs arguments. Only run when the finer checks found no error.
    """
    from .handler import build_scheduler

    logger = logging.getLogger("django_anarchon")
    quiet = _ThisThreadOnly()
    logger.addFilter(quiet)
    try:
        build_scheduler(alias)
    except Exception as exc:  # whatever stops a worker from starting is an error here
        job = getattr(exc, "job", None)
        return [Error(
            f"scheduler {alias!r} cannot be built: {type(exc).__name__}: {exc}",
            hint="anarchon_worker would fail the same way at start; fix the job or setting "
                 "named in the message.",
            obj=job, id="anarchon.E004",
        )]
    finally:
        logger.removeFilter(quiet)
    return []


def _check_backend_honours(alias: str, job: Job, backend: Any) -> list[CheckMessage]:
    messages: list[CheckMessage] = []
    backend_name = getattr(backend, "name", type(backend).__name__)
    if not supports_leases(backend):
        for option in sorted(job.options.lease_options_asked & LEASE_OPTIONS):
            messages.append(Error(
                f"scheduler {alias!r}: job {job.name!r} sets {option!r}, which needs leases, and "
                f"the {backend_name} backend has none",
                hint="Remove the option, or use a backend with leases (the database backend, "
                     "or Redis with the 'lease' strategy).",
                obj=job.name, id="anarchon.E005",
            ))
    refusals: list[ConfigurationError] = []
    try:
        check_dedupe_window(job, float(getattr(backend, "dedupe_window_ms", float("inf"))),
                            backend_name)
    except ConfigurationError as exc:
        refusals.append(exc)
    check_job = getattr(backend, "check_job", None)
    if callable(check_job):
        try:
            check_job(job.limits())
        except ConfigurationError as exc:
            refusals.append(exc)
    for refusal in refusals:
        messages.append(Error(
            f"scheduler {alias!r}: the {backend_name} backend cannot run job {job.name!r} "
            f"safely: {refusal}",
            hint="Change the job's options, or the backend's (a longer window, another strategy).",
            obj=job.name, id="anarchon.E005",
        ))
    return messages


def check_unknown_aliases(config: dict[str, dict[str, Any]]) -> list[CheckMessage]:
    """anarchon.E006: jobs registered for a scheduler alias that settings do not define."""
    messages: list[CheckMessage] = []
    for alias in sorted(registry.aliases() - set(config)):
        names = [name for name, *_ in _specs(alias)]
        messages.append(Error(
            f"jobs {', '.join(repr(n) for n in names)} use scheduler {alias!r}, which is not in "
            f"settings.ANARCHON (configured: {', '.join(config) or 'none'})",
            hint=f"Add {alias!r} to settings.ANARCHON or change the jobs' scheduler=... argument.",
            obj=alias, id="anarchon.E006",
        ))
    return messages


def check_sqlite(alias: str, entry: dict[str, Any], backend: Any) -> list[CheckMessage]:
    """anarchon.W001: SQLite shared by several processes without IMMEDIATE transactions.

    SQLite's default DEFERRED transactions upgrade to a write lock halfway through a
    claim; a second process then gets "database is locked" at once instead of waiting.
    """
    if backend is None or not _is_database_backend(backend):
        return []
    try:
        using = str(backend.using)
    except ConfigurationError as exc:
        return [Error(
            f"settings.{_setting(alias, 'OPTIONS')}: {exc}",
            hint="Name a database of settings.DATABASES in OPTIONS['using'].",
            id="anarchon.E003",
        )]
    database = cast(dict[str, dict[str, Any]], settings.DATABASES).get(using)
    if database is None or database.get("ENGINE") != SQLITE_ENGINE:
        return []
    db_options: dict[str, Any] = database.get("OPTIONS") or {}
    problems = []
    if str(db_options.get("transaction_mode", "")).upper() != "IMMEDIATE":
        problems.append("without \"transaction_mode\": \"IMMEDIATE\"")
    if "timeout" not in db_options:
        problems.append("without a \"timeout\" (SQLite's default is 5 s)")
    if not problems:
        return []
    return [Warning(
        f"scheduler {alias!r} keeps its runs in the SQLite database {using!r}, which is "
        f"configured {' and '.join(problems)}; with several worker processes, claims fail "
        "with \"database is locked\"",
        hint=f"Set DATABASES[{using!r}]['OPTIONS'] = {{\"transaction_mode\": \"IMMEDIATE\", "
             "\"timeout\": 20, \"init_command\": \"PRAGMA journal_mode=WAL;\"}, or use PostgreSQL.",
        obj=using, id="anarchon.W001",
    )]


def _is_database_backend(backend: Any) -> bool:
    for klass in type(backend).__mro__:
        if f"{klass.__module__}.{klass.__qualname__}" == DATABASE_BACKEND:
            return True
    return False


def _runs_database(alias: str, entry: dict[str, Any]) -> str | None:
    """The database a scheduler keeps its runs in, if its backend is the database one.

    ``None`` too when the backend cannot be built: E002/E003 report that.
    """
    backend, _ = load_backend(alias, entry)
    if backend is None or not _is_database_backend(backend):
        return None
    try:
        return str(cast("DatabaseBackend", backend).using)
    except ConfigurationError:
        return None


def scheduler_databases(aliases: Iterable[str] | None = None) -> list[str]:
    """The database aliases the database-backed schedulers among ``aliases`` keep runs in.

    Pass them as ``databases`` to the system checks (as ``migrate`` passes its own) to
    run anarchon.E007 for them, e.g. from a command that is about to use those tables.
    """
    try:
        config = conf.get_config()
    except ConfigurationError:
        return []
    found: list[str] = []
    for alias in config if aliases is None else aliases:
        using = _runs_database(alias, config[alias]) if alias in config else None
        if using is not None and using not in found:
            found.append(using)
    return found


def _inside_migrate() -> bool:
    """Whether ``migrate`` is the command running these checks: the tables are its to make.

    ``migrate`` runs the database checks for the database it migrates, before it creates
    anything; E007 there would make the fix impossible (without --skip-checks).
    """
    from django.core.management.commands.migrate import Command as Migrate

    frame = sys._getframe(1)
    while frame is not None:
        if isinstance(frame.f_locals.get("self"), Migrate):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def check_tables(databases: Sequence[str]) -> list[CheckMessage]:
    """anarchon.E007: a database-backed scheduler's database lacks the app's tables."""
    from django.apps import apps

    if _inside_migrate():
        return []
    try:
        config = conf.get_config()
    except ConfigurationError:
        return []  # E001
    models = [m for m in apps.get_app_config("django_anarchon").get_models()
              if m._meta.managed and not m._meta.proxy]
    messages: list[CheckMessage] = []
    for alias, entry in config.items():
        using = _runs_database(alias, entry)
        if using is None or using not in databases:
            continue
        try:
            existing = set(connections[using].introspection.table_names())
        except DatabaseError:
            continue  # an unreachable database is the command's to report, not a check's
        missing = [m._meta.db_table for m in models if m._meta.db_table not in existing]
        if missing:
            flag = "" if using == "default" else f" --database {using}"
            messages.append(Error(
                f"scheduler {alias!r} keeps its runs in the database {using!r}, which has no "
                f"{', '.join(missing)} table{'s' if len(missing) > 1 else ''}: migrate has not "
                "run there, and every claim would fail",
                hint=f"Run `python manage.py migrate{flag}`.",
                obj=using, id="anarchon.E007",
            ))
    return messages


def run_all(now_ms: int | None = None) -> list[CheckMessage]:
    """Every anarchon check, in id order per scheduler."""
    try:
        config = conf.get_config()
    except ConfigurationError as exc:
        return [Error(f"settings.ANARCHON: {exc}",
                      hint="settings.ANARCHON is a dict of named schedulers, like CACHES; "
                           "see docs/options.md.",
                      id="anarchon.E001")]
    messages = [*check_registration_errors(), *check_settings(config)]
    for alias, entry in config.items():
        backend, found = load_backend(alias, entry)
        found.extend(check_jobs(alias, entry, backend, now_ms))
        found.extend(check_sqlite(alias, entry, backend))
        found.extend(check_spool(alias, entry, backend))
        if not any(m.is_serious() for m in [*messages, *found]):
            found.extend(check_build(alias))
        messages.extend(found)
    messages.extend(check_unknown_aliases(config))
    return messages


@register("anarchon")
def anarchon_check(app_configs: Sequence[Any] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """The ``django.core.checks`` entry point; runs when the app is installed."""
    if app_configs is not None and not any(c.name == "django_anarchon" for c in app_configs):
        return []
    return run_all(int(time.time() * 1000))


@register("anarchon", Tags.database)
def anarchon_database_check(
    app_configs: Sequence[Any] | None = None, databases: Sequence[str] | None = None,
    **kwargs: Any,
) -> list[CheckMessage]:
    """Runs only for the databases a command names, as Django's own database checks do."""
    if not databases:
        return []
    if app_configs is not None and not any(c.name == "django_anarchon" for c in app_configs):
        return []
    return check_tables(databases)
