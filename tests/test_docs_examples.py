"""Every code block of README.md, docs/*.md and docs/backends/*.md runs, the way it is meant.

The blocks are read from the Markdown each run, so a page that changes is tested as it
now reads. How each kind of block runs:

* ``python`` whose first line names a file (``# settings.py``, ``# shop/jobs.py``,
  ``# myproject/backends.py``, ``# tests/test_my_redis.py``): the page's blocks build a
  small Django project (one per page, in a temporary directory, on a SQLite file):
  ``settings.py`` blocks are appended to a base settings module (an ``...`` in
  ``INSTALLED_APPS`` stands for the project's own apps: contenttypes, auth and the apps
  the page's files create), other files are written where they say (blocks naming the
  same file are joined in order). A ``jobs.py`` block is checked by running every job of
  the project once (``run_now``) in the project's process: each must succeed, and there
  must be as many jobs as the page's decorators. A backend module is imported, and its
  ``BaseBackend`` subclasses must not be abstract. A ``tests/test_*.py`` block is run by
  pytest in a process of its own (with ``tests.docs_contract_probe`` watching the Redis
  keys it writes).
* ``python`` without a file name: a settings snippet. It is executed (``BASE_DIR`` and
  ``DATABASES`` are given, as in a settings module), then ``ANARCHON`` goes through the
  app's system checks with ``override_settings`` (no error or warning allowed), and each
  scheduler on Redis, RabbitMQ or NATS is built against the real local server, with the
  block's ``OPTIONS`` except the prefix (one of this run's own, deleted afterwards), and
  must win a claim and lose a rival's. A ``DATABASES`` snippet must silence
  ``anarchon.W001`` (which fires without it). Every ``python`` block is also checked for
  undefined names with ruff (F821; a settings snippet may use ``BASE_DIR`` and
  ``DATABASES``).
* ``console``: each command line. ``python manage.py ...`` runs in the page's project
  (``anarchon_worker`` until its banner, then SIGTERM: it must exit 0); a synopsis
  (``[--option ...]``) is compared with the command's real parser. ``pip install`` runs
  with ``--dry-run --no-deps`` (the test's virtualenv is not changed), ``pip wheel`` and
  ``mkdocs build`` run for real; these three run in a copy of the checkout, since the
  docs run them from the checkout's directory. ``scripts/...`` must exist, be executable
  and parse (``bash -n``): ``tests/test_example_project.py`` runs ``scripts/demo``, and
  CI runs ``scripts/test``.
* ``ini`` (a systemd unit), ``dockerfile``: parsed, and the worker's arguments in
  ``ExecStart`` / ``CMD`` go through ``anarchon_worker``'s parser and its ``--grace``
  check. ``yaml``, ``json``, ``toml``: parsed; a liveness probe's ``exec`` command runs
  against a fresh and a stale health file.

A block that cannot run as it is says so just before its fence, visibly in the Markdown:
``<!-- example: output -->`` (an output sample or a sketch of a wire format),
``<!-- example: skip reason="..." -->`` (a command that needs what a test cannot have,
such as systemd), or ``<!-- example: collect reason="..." -->`` (a contract example
against a backend that is only a skeleton: collected, not run). Any other block fails
with "no way to run it".

``<!-- example: before -->`` marks what a migration guide shows of another scheduler (a
Celery ``beat_schedule``, an APScheduler command, a crontab): such a block cannot run here
(its library is not a dependency), so a ``python`` one is parsed and checked for undefined
names, and each line of a ``crontab`` one must be a variable or five cron fields that the
project's own parser takes, and a command. ``tests/test_migrating.py`` goes further for
``docs/migrating.md``: every schedule a before block declares must fire when the job of the
same name in its after blocks fires.
"""

from __future__ import annotations

import ast
import asyncio
import configparser
import copy
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import tomllib
import uuid
import warnings
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.conf import settings
from django.core.checks import WARNING, run_checks
from django.core.management import load_command_class
from django.test import override_settings

from django_anarchon.durations import parse_duration

from .support import ROOT, wait_for

PAGES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "docs" / "backends").glob("*.md")),
]
BIN = Path(sys.executable).parent
_FENCE = re.compile(r"^(`{3,}|~{3,})\s*([\w+-]*)\s*$")
_MARKER = re.compile(
    r'^<!--\s*example:\s*(output|skip|collect|before)(?:\s+reason="([^"]+)")?\s*-->$'
)
_HEADER = re.compile(r"^#\s*([\w./-]+\.py)\b")
_DECORATOR = re.compile(r"^\s*@(every|cron|at)\(", re.MULTILINE)
#: Names a settings snippet may use: a settings module defines them above the snippet.
_SETTINGS_NAMES = {"BASE_DIR", "DATABASES"}
#: The databases a settings snippet starts from: the page projects' (SQLite, as W001 asks).
_DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": ":memory:",
        "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 20},
    }
}


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    lang: str
    text: str
    marker: str | None
    reason: str | None

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def file(self) -> str | None:
        """The file a ``python`` block says it is (its first line, ``# path.py``)."""
        match = _HEADER.match(self.text.split("\n", 1)[0])
        return match.group(1) if match and self.lang == "python" else None


def read_blocks(page: Path) -> list[Block]:
    """The fenced blocks of ``page``, each with the marker of the line before it."""
    lines = page.read_text().split("\n")
    blocks, i = [], 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        fence, lang, start = match.group(1), match.group(2).lower(), i
        i += 1
        while not lines[i].startswith(fence):
            i += 1
        before = next((line.strip() for line in reversed(lines[:start]) if line.strip()), "")
        marker = _MARKER.match(before)
        blocks.append(
            Block(
                page=str(page.relative_to(ROOT)), line=start + 1, lang=lang,
                text="\n".join(lines[start + 1 : i]) + "\n",
                marker=marker.group(1) if marker else None,
                reason=marker.group(2) if marker else None,
            )
        )
        i += 1
    return blocks


BLOCKS = [block for page in PAGES for block in read_blocks(page)]
_SLOW_COMMANDS = ("pip ", "mkdocs ")


def _params() -> list[Any]:
    params = []
    for block in BLOCKS:
        slow = block.lang == "console" and any(
            line.strip().startswith(_SLOW_COMMANDS) for line in block.text.splitlines()
        )
        marks = [pytest.mark.slow] if slow else []
        if block.file and block.file.startswith("tests/"):
            marks.append(pytest.mark.slow)  # the whole contract suite: about 20 s
        if "redis" in block.text.lower():
            marks.append(pytest.mark.redis)
        params.append(pytest.param(block, id=block.id, marks=marks))
    return params


# -- the page projects ---------------------------------------------------------------------

_BASE_SETTINGS = '''\
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent
SECRET_KEY = "docs-examples-only"
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = [...]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": BASE_DIR / "db.sqlite3",
        "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 20},
    }
}
'''

_MANAGE_PY = '''\
import os
import sys

if __name__ == "__main__":
    os.environ["DJANGO_SETTINGS_MODULE"] = "settings"
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
'''

# Runs every job of every scheduler once, in the project: prints {job: status}.
_RUN_EVERY_JOB = '''\
import json
from django_anarchon import schedulers
statuses = {}
for alias in schedulers:
    scheduler = schedulers[alias]
    for info in scheduler.jobs():
        record = scheduler.run_now(info.name)
        statuses[info.name] = [record.status, record.error]
print("STATUSES " + json.dumps(statuses))
'''


class Project:
    """The Django project a page's blocks describe, in a directory of its own."""

    def __init__(self, page: str, root: Path) -> None:
        self.page = page
        self.root = root
        blocks = [b for b in BLOCKS if b.page == page and b.file and b.marker is None]
        files: dict[str, str] = {}
        for block in blocks:
            if block.file is not None and not block.file.startswith("tests/"):
                files[block.file] = files.get(block.file, "") + block.text
        settings_text = files.pop("settings.py", "")
        apps = sorted({path.split("/")[0] for path in files if "/" in path})
        for path, text in files.items():
            target = root / path
            target.parent.mkdir(parents=True, exist_ok=True)
            (target.parent / "__init__.py").touch()
            target.write_text(text)
        yours = ["django.contrib.contenttypes", "django.contrib.auth", *apps]
        epilogue = (
            f"\n_YOUR_APPS = {yours!r}\n"
            "INSTALLED_APPS = [app for item in INSTALLED_APPS\n"
            "                  for app in (_YOUR_APPS if item is Ellipsis else [item])]\n"
            "if 'django_anarchon' not in INSTALLED_APPS:\n"
            "    INSTALLED_APPS.append('django_anarchon')\n"
        )
        (root / "settings.py").write_text(_BASE_SETTINGS + "\n" + settings_text + epilogue)
        (root / "manage.py").write_text(_MANAGE_PY)
        self.decorators = sum(len(_DECORATOR.findall(b.text)) for b in blocks)
        self.statuses: dict[str, list[str | None]] | None = None
        self.manage("migrate", "-v0")

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO_")}
        return {**env, "DJANGO_SETTINGS_MODULE": "settings", "PYTHONPATH": str(ROOT)}

    def manage(self, *args: str, timeout: float = 60) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args], cwd=self.root, env=self.env,
            capture_output=True, text=True, timeout=timeout,
        )
        output = done.stdout + done.stderr
        assert done.returncode == 0, f"{self.page}: manage.py {shlex.join(args)}:\n{output}"
        return output

    def worker(self, *args: str) -> None:
        """``anarchon_worker`` until its banner, then SIGTERM: a graceful stop, exit 0."""
        log = self.root / f"worker-{uuid.uuid4().hex[:6]}.log"
        with log.open("w") as sink:
            proc = subprocess.Popen(
                [sys.executable, "manage.py", "anarchon_worker", *args], cwd=self.root,
                env=self.env, stdout=sink, stderr=subprocess.STDOUT,
            )
        try:
            def banner() -> bool:
                assert proc.poll() is None, f"the worker exited early:\n{log.read_text()}"
                return "Press Ctrl+C" in log.read_text()

            wait_for(banner, 60, f"{self.page}: the worker's banner")
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0, log.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


@pytest.fixture(scope="module")
def projects() -> dict[str, Project]:
    """The page projects made so far: one per page, shared by the page's blocks."""
    return {}


def project_for(page: str, projects: dict[str, Project], tmp: pytest.TempPathFactory) -> Project:
    """The page's project, made (and migrated) on first use."""
    if page not in projects:
        projects[page] = Project(page, tmp.mktemp("docs-project"))
    return projects[page]


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the checkout, where commands documented to run "from the checkout" run."""
    target = tmp_path_factory.mktemp("checkout") / "django-anarchon"
    ignore = shutil.ignore_patterns(
        ".git", ".venv*", ".tmp", ".mypy_cache", ".ruff_cache", "__pycache__", "site", "dist",
        "test-output", "*.sqlite3*",
    )
    shutil.copytree(ROOT, target, ignore=ignore, symlinks=True)
    return target


# -- the test --------------------------------------------------------------------------------


def test_the_pages_have_blocks() -> None:
    """The extraction itself works: each kind the docs use is found, and markers stay few."""
    langs = {block.lang for block in BLOCKS}
    assert {"python", "console", "ini", "yaml"} <= langs, langs
    assert len(BLOCKS) >= 40, len(BLOCKS)
    # Blocks of another scheduler ("before") are checked (parsed), not left out: not counted.
    markers = [block for block in BLOCKS if block.marker and block.marker != "before"]
    assert len(markers) <= 10, [b.id for b in markers]
    assert all(b.marker == "output" or b.reason for b in markers), [b.id for b in markers]


@pytest.mark.parametrize("block", _params())
def test_block(
    block: Block,
    projects: dict[str, Project],
    tmp_path_factory: pytest.TempPathFactory,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    if block.marker in ("output", "skip"):
        return
    if block.marker == "before":
        _before_block(block)
        return
    if block.lang == "python":
        _ruff_names(block)
        if block.marker == "collect":
            _run_contract(block, tmp_path, collect_only=True)
        elif block.file is None:
            _settings_snippet(block, tmp_path, projects, tmp_path_factory)
        elif block.file.startswith("tests/"):
            _run_contract(block, tmp_path, collect_only=False)
        elif block.file == "settings.py":
            project = project_for(block.page, projects, tmp_path_factory)
            project.manage("check", "--fail-level", "WARNING")
            _settings_snippet(block, tmp_path, projects, tmp_path_factory)
        else:
            project = project_for(block.page, projects, tmp_path_factory)
            _import_module(block, project)
            if project.decorators:
                _run_every_job(project)
    elif block.lang == "console":
        for line in _command_lines(block):
            _run_command(block, line, projects, tmp_path_factory, request)
    elif block.lang == "ini":
        _systemd_unit(block)
    elif block.lang == "dockerfile":
        _dockerfile(block)
    elif block.lang == "yaml":
        _yaml(block, tmp_path)
    elif block.lang == "json":
        json.loads(block.text)
    elif block.lang == "toml":
        tomllib.loads(block.text)
    else:
        pytest.fail(
            f"{block.id}: a ```{block.lang} block has no way to run it; make it runnable, or "
            'mark an output sample with <!-- example: output --> just before it'
        )


# -- another scheduler's configuration (migration guides) ---------------------------------------


def _before_block(block: Block) -> None:
    """What a guide shows of the scheduler one moves from: it parses, as that scheduler reads it."""
    if block.lang == "python":
        ast.parse(block.text, filename=block.id)
        _ruff_names(block)
    elif block.lang == "crontab":
        crontab_entries(block)
    else:
        pytest.fail(f"{block.id}: a before block is python or crontab, not {block.lang!r}")


@dataclass(frozen=True)
class CrontabEntry:
    line: int
    expression: str
    command: str


def crontab_entries(block: Block) -> list[CrontabEntry]:
    """The jobs of a crontab block; each expression must be one the project's parser takes."""
    from django_anarchon.schedules import Cron

    entries = []
    for number, raw in enumerate(block.text.splitlines(), start=block.line + 1):
        line = raw.strip()
        if not line or line.startswith("#") or _CRONTAB_VARIABLE.match(line):
            continue
        fields = line.split(None, 5)
        assert len(fields) == 6, f"{block.id}: line {number} is not five fields and a command"
        expression = " ".join(fields[:5])
        try:
            Cron(expression, "UTC")
        except ValueError as exc:
            pytest.fail(f"{block.id}: line {number}: {expression!r}: {exc}")
        entries.append(CrontabEntry(line=number, expression=expression, command=fields[5]))
    assert entries, f"{block.id}: a crontab block without a job"
    return entries


_CRONTAB_VARIABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\s*=")


# -- python ----------------------------------------------------------------------------------


def _ruff_names(block: Block) -> None:
    """No undefined name (F821): the NameError of a block that was never run."""
    done = subprocess.run(
        [str(BIN / "ruff"), "check", "--select", "F821", "--output-format", "json",
         "--stdin-filename", "block.py", "-"],
        input=block.text, capture_output=True, text=True, timeout=30,
    )
    allowed = _SETTINGS_NAMES if block.file in (None, "settings.py") else set()
    undefined = [
        f"line {d['location']['row']}: {d['message']}"
        for d in json.loads(done.stdout or "[]")
        if d["message"].split("`")[1] not in allowed
    ]
    assert not undefined, f"{block.id}: undefined names: {undefined}"


def _settings_snippet(
    block: Block, tmp_path: Path, projects: dict[str, Project], tmp: pytest.TempPathFactory
) -> None:
    names: dict[str, Any] = {
        "BASE_DIR": tmp_path,
        "DATABASES": copy.deepcopy(_DATABASES),
        "INSTALLED_APPS": list(settings.INSTALLED_APPS),
    }
    exec(compile(block.text, block.id, "exec"), names)
    with _page_modules(block.page, projects, tmp):
        if "ANARCHON" in names:
            _check_anarchon(block, names["ANARCHON"], names["DATABASES"])
    if names["DATABASES"] != _DATABASES:
        _check_databases(block, names["DATABASES"])


@contextmanager
def _page_modules(page: str, projects: dict[str, Project], tmp: pytest.TempPathFactory) -> Iterator[None]:
    """The modules the page's blocks write (a backend of its own), importable meanwhile."""
    if not any(b.page == page and b.file and "/" in b.file and not b.file.endswith("jobs.py")
               and not b.file.startswith("tests/") for b in BLOCKS):
        yield
        return
    root = str(project_for(page, projects, tmp).root)
    sys.path.insert(0, root)
    try:
        yield
    finally:
        sys.path.remove(root)
        for name, module in list(sys.modules.items()):
            if (getattr(module, "__file__", None) or "").startswith(root):
                del sys.modules[name]


@contextmanager
def _databases(databases: dict[str, Any]) -> Iterator[None]:
    """``DATABASES`` as the snippet sets it, for the checks only (no connection is made).

    Django warns that overriding ``DATABASES`` does not reach open connections; the checks
    read the setting itself, which is all this needs.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Overriding setting DATABASES", UserWarning)
        with override_settings(DATABASES=databases):
            yield


def _serious(messages: list[Any]) -> list[str]:
    return [f"{m.id}: {m.msg}" for m in messages if m.level >= WARNING]


def _check_anarchon(block: Block, anarchon: dict[str, Any], databases: dict[str, Any]) -> None:
    with _databases(databases), override_settings(ANARCHON=anarchon):
        problems = _serious(run_checks(tags=["anarchon"], databases=[]))
    assert not problems, f"{block.id}: manage.py check says: {problems}"
    for alias, entry in anarchon.items():
        _build_live(block, alias, entry)


def _check_databases(block: Block, databases: dict[str, Any]) -> None:
    """The snippet silences anarchon.W001, which a bare SQLite database raises."""
    anarchon = {"default": {"BACKEND": "django_anarchon.backends.database.DatabaseBackend"}}
    bare = copy.deepcopy(databases)
    bare["default"].pop("OPTIONS", None)
    with _databases(bare), override_settings(ANARCHON=anarchon):
        before = [m.id for m in run_checks(tags=["anarchon"], databases=[])]
    with _databases(databases), override_settings(ANARCHON=anarchon):
        after = _serious(run_checks(tags=["anarchon"], databases=[]))
    assert "anarchon.W001" in before, before
    assert not after, f"{block.id}: manage.py check says: {after}"


#: The option of each backend that every name it writes starts with.
_PREFIX_OPTIONS = {
    "django_anarchon.backends.redis.RedisBackend": ["key_prefix"],
    "django_anarchon.backends.rabbitmq.RabbitMQBackend": ["prefix"],
    "django_anarchon.backends.nats.NatsBackend": ["stream_prefix", "subject_prefix"],
}


def _build_live(block: Block, alias: str, entry: dict[str, Any]) -> None:
    """Build the scheduler's backend against the real local server: one claim won, one lost."""
    from django.utils.module_loading import import_string

    from django_anarchon import ClaimInput

    path = entry.get("BACKEND", "django_anarchon.backends.database.DatabaseBackend")
    if path not in _PREFIX_OPTIONS:
        return  # the database backend runs for real in the README's project
    own = f"docsx{uuid.uuid4().hex[:10]}"
    options = {**entry.get("OPTIONS", {}), **{key: own for key in _PREFIX_OPTIONS[path]}}
    _require_server(path)
    job, slot = f"docs.{own}", int(time.time()) * 1000

    async def claim_twice() -> tuple[bool, bool]:
        backend = import_string(path)(**options)
        try:
            await backend.init()
            await backend.prepare_job(job, 10)
            won = await backend.claim(ClaimInput(job=job, slot=slot, token="a", instance_id="A"))
            lost = await backend.claim(ClaimInput(job=job, slot=slot, token="b", instance_id="B"))
            return won, lost
        finally:
            await backend.close()

    try:
        assert asyncio.run(claim_twice()) == (True, False), f"{block.id}: scheduler {alias!r}"
    finally:
        _delete_prefix(path, options, own)


def _require_server(path: str) -> None:
    from . import broker_support, redis_support

    if path.endswith("RedisBackend"):
        redis_support.redis_url()
    elif path.endswith("RabbitMQBackend"):
        broker_support.rabbitmq_url()
    else:
        broker_support.nats_url()


def _delete_prefix(path: str, options: dict[str, Any], prefix: str) -> None:
    from . import broker_support, redis_support

    if path.endswith("RedisBackend"):
        redis_support.delete_prefix(options["url"], prefix)
    elif path.endswith("RabbitMQBackend"):
        broker_support.delete_queues(options["url"], prefix)
    else:
        asyncio.run(broker_support.delete_nats_streams(options["servers"], prefix))


def _run_every_job(project: Project) -> None:
    """Every job the page declares is registered (however its module is found) and runs."""
    if project.statuses is None:
        output = project.manage("shell", "-c", _RUN_EVERY_JOB)
        project.statuses = json.loads(output.split("STATUSES ", 1)[1].splitlines()[0])
        _drop_celery_queue(project)
    statuses = project.statuses
    assert len(statuses) == project.decorators, (project.decorators, statuses)
    failed = {name: s for name, s in statuses.items() if s[0] != "success"}
    assert not failed, f"{project.page}: jobs that failed: {failed}"


def _drop_celery_queue(project: Project) -> None:
    """A page whose jobs send Celery tasks (docs/celery.md) sent them to its Redis broker,
    where no worker reads them: the queue must hold them; then it goes, with kombu's
    bindings of it."""
    text = (project.root / "settings.py").read_text()
    broker = re.search(r'^CELERY_BROKER_URL = "(redis://[^"]+)"', text, re.MULTILINE)
    queue = re.search(r'^CELERY_TASK_DEFAULT_QUEUE = "([^"]+)"', text, re.MULTILINE)
    if broker is None or queue is None:
        return
    import redis

    client = redis.Redis.from_url(broker.group(1))
    try:
        sent = client.llen(queue.group(1))
        keys = [*client.scan_iter(match=f"{queue.group(1)}*", count=1000),
                *client.scan_iter(match=f"_kombu.binding*.{queue.group(1)}", count=1000)]
        if keys:
            client.delete(*keys)
    finally:
        client.close()
    assert sent >= 1, f"{project.page}: no task reached the queue {queue.group(1)!r}"


def _import_module(block: Block, project: Project) -> None:
    """A module block imports in its project; a backend it defines is not abstract."""
    assert block.file is not None
    module = block.file.removesuffix(".py").replace("/", ".")
    script = f"import importlib\nmodule = importlib.import_module({module!r})\n"
    if "BaseBackend" in block.text:
        script += (
            "import inspect\n"
            "from django_anarchon import BaseBackend\n"
            "found = [c for c in vars(module).values() if inspect.isclass(c)\n"
            "         and issubclass(c, BaseBackend) and c is not BaseBackend]\n"
            "assert found or 'backend' not in module, 'no backend class'\n"
            "abstract = [c.__name__ for c in found if inspect.isabstract(c)]\n"
            "assert not abstract, f'abstract: {abstract}'\n"
        )
    project.manage("shell", "-c", script)


def _run_contract(block: Block, tmp_path: Path, *, collect_only: bool) -> None:
    """The contract example in a pytest of its own; on Redis, no key of it is left."""
    from .redis_support import delete_prefix, redis_url

    files = {b.file: b.text for b in BLOCKS if b.page == block.page and b.file}
    for path, text in files.items():
        target = tmp_path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    test_file = tmp_path / (block.file or "tests/test_docs_contract.py")
    if block.file is None:
        test_file.parent.mkdir(parents=True, exist_ok=True)
        test_file.write_text(block.text)
    probe = tmp_path / "probe.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PYTEST_"))}
    env.update(PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}", ANARCHON_DOCS_PROBE=str(probe))
    uses_redis = "RedisBackend" in block.text
    if uses_redis:
        env["REDIS_URL"] = redis_url()
    args = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:django",
            "-p", "tests.docs_contract_probe", "-q", "--rootdir", str(tmp_path), str(test_file)]
    if collect_only:
        args.append("--collect-only")
    else:  # it waits 10 s of the store's clock; the project's own contract tests run it
        args += ["-k", "not test_lease_keep_never_shrinks"]
    done = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=240)
    output = done.stdout + done.stderr
    assert probe.is_file(), f"{block.id}: pytest did not run:\n{output[-6000:]}"
    seen = json.loads(probe.read_text())
    left = 0
    if seen["prefix"] is not None:
        left = _keys_under(env["REDIS_URL"], seen["prefix"])  # after the example's clean-up
        delete_prefix(env["REDIS_URL"], seen["prefix"])  # whatever it left, not to keep it
    assert done.returncode == 0, f"{block.id}:\n{output[-6000:]}"
    if collect_only:
        assert re.search(r"\b(\d{2,}) tests? collected", output), output[-2000:]
        return
    assert uses_redis, f"{block.id}: only Redis contract examples are watched for keys"
    assert seen["prefix"], f"{block.id}: no key_prefix fixture was used"
    assert seen["max_keys"] > 100, f"{block.id}: {seen}"  # the prefix is the one in use
    assert left == 0, f"{block.id}: {left} keys left under {seen['prefix']!r}"


def _keys_under(url: str, prefix: str) -> int:
    import redis

    client = redis.Redis.from_url(url)
    try:
        return sum(1 for _ in client.scan_iter(match=f"{prefix}:*", count=1000))
    finally:
        client.close()


# -- console -----------------------------------------------------------------------------------


def _command_lines(block: Block) -> list[list[str]]:
    lines = [shlex.split(line, comments=True) for line in block.text.splitlines()]
    lines = [words for words in lines if words]
    assert lines, f"{block.id}: a console block without a command"
    return lines


def _run_command(
    block: Block,
    words: list[str],
    projects: dict[str, Project],
    tmp: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> None:
    where = f"{block.id}: {shlex.join(words)}"
    if words[:2] == ["python", "manage.py"]:
        if any(w.startswith("[") for w in words):
            _synopsis(where, words[2:])
        elif words[2] == "anarchon_worker":
            project_for(block.page, projects, tmp).worker(*words[3:])
        else:
            project_for(block.page, projects, tmp).manage(*words[2:])
    elif words[0] == "pip":
        checkout = request.getfixturevalue("checkout")
        if words[1] == "install":
            _pip_install(where, words[2:], checkout)
        elif words[1] == "wheel":
            _pip_wheel(where, words[2:], checkout)
        else:
            pytest.fail(f"{where}: no way to run pip {words[1]}")
    elif words[0] == "mkdocs":
        checkout = request.getfixturevalue("checkout")
        assert words[1] == "build", f"{where}: only mkdocs build runs in a test"
        done = subprocess.run([str(BIN / "mkdocs"), *words[1:], "--quiet"], cwd=checkout,
                              capture_output=True, text=True, timeout=120,
                              env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
        assert done.returncode == 0, f"{where}:\n{done.stdout}{done.stderr}"
        assert (checkout / "site" / "index.html").is_file()
    elif words[0].startswith("scripts/"):
        script = ROOT / words[0]
        assert script.is_file() and os.access(script, os.X_OK), f"{where}: not an executable"
        done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert done.returncode == 0, f"{where}: {done.stderr}"
    else:
        pytest.fail(f"{where}: no way to run this command in a test; mark the block "
                    '<!-- example: skip reason="..." --> if it cannot run anywhere here')


def _synopsis(where: str, words: list[str]) -> None:
    """A usage line: its command exists and takes every option it shows."""
    command = load_command_class("django_anarchon", words[0])
    parser = command.create_parser("manage.py", words[0])
    known = {option for action in parser._actions for option in action.option_strings}
    shown = {w.strip("[]") for w in words[1:] if w.strip("[]").startswith("--")}
    assert shown <= known, f"{where}: options the command does not take: {shown - known}"


def _pip_install(where: str, args: list[str], checkout: Path) -> None:
    """A dry run: pip resolves and builds what the line names; the extras exist."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = extras["optional-dependencies"]
    for arg in args:
        named = re.search(r"\[([\w,-]+)\]$", arg)
        unknown = set(named.group(1).split(",")) - set(extras) if named else set()
        assert not unknown, f"{where}: no such extra: {unknown}"
    # pip's dry run with --no-deps ignores extras (checked above): one run per target.
    target = tuple(re.sub(r"\[[\w,-]+\]$", "", arg) for arg in args)
    if target in _PIP_DONE:  # the same target on another line or page, already run
        return
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", *args],
        cwd=checkout, capture_output=True, text=True, timeout=180,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{where}:\n{output}"
    assert "Would install django-anarchon-0.1.0" in output, f"{where}:\n{output}"
    _PIP_DONE.add(target)


#: pip targets already run in this session (README and the docs share their lines).
_PIP_DONE: set[tuple[str, ...]] = set()


def _pip_wheel(where: str, args: list[str], checkout: Path) -> None:
    wheel_dir = checkout / args[args.index("--wheel-dir") + 1]
    if ("wheel", *args) not in _PIP_DONE:  # README and the docs' index share the line
        for old in wheel_dir.glob("django_anarchon-*.whl"):
            old.unlink()
        done = subprocess.run([sys.executable, "-m", "pip", "wheel", *args], cwd=checkout,
                              capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, f"{where}:\n{done.stdout}{done.stderr}"
        _PIP_DONE.add(("wheel", *args))
    wheels = list(wheel_dir.glob("django_anarchon-*.whl"))
    assert len(wheels) == 1, wheels
    names = set(zipfile.ZipFile(wheels[0]).namelist())
    for name in ("django_anarchon/__init__.py", "django_anarchon/py.typed",
                 "django_anarchon/migrations/0001_initial.py"):
        assert name in names, f"{where}: the wheel lacks {name}"
    assert not any(n.startswith("tests/") for n in names), "the wheel ships the tests"


# -- deployment files ----------------------------------------------------------------------------


def _worker_args(where: str, argv: list[str]) -> None:
    """``... manage.py anarchon_worker ARGS``: the worker's parser takes ARGS."""
    assert argv[1:3] == ["manage.py", "anarchon_worker"], f"{where}: {argv}"
    command = load_command_class("django_anarchon", "anarchon_worker")
    options = command.create_parser("manage.py", "anarchon_worker").parse_args(argv[3:])
    parse_duration(options.grace, option="--grace")


def _systemd_unit(block: Block) -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read_string(block.text)
    assert {"Unit", "Service", "Install"} <= set(unit.sections()), unit.sections()
    service = unit["Service"]
    _worker_args(block.id, shlex.split(service["ExecStart"]))
    grace_s = parse_duration(shlex.split(service["ExecStart"])[-1], option="--grace") / 1000
    assert float(service["TimeoutStopSec"]) > grace_s, "systemd would kill a stopping worker"


def _dockerfile(block: Block) -> None:
    (line,) = [line for line in block.text.splitlines() if line.startswith("CMD ")]
    _worker_args(block.id, json.loads(line.removeprefix("CMD ")))


def _yaml(block: Block, tmp_path: Path) -> None:
    document = yaml.safe_load(block.text)
    probe = document.get("livenessProbe") if isinstance(document, dict) else None
    if probe is None:
        return
    health = tmp_path / "alive"
    docker = next(b for b in BLOCKS if b.lang == "dockerfile" and b.page == block.page)
    path = json.loads(docker.text.split("CMD ", 1)[1])[-1]  # the --health-file of the CMD
    command = [part.replace(path, str(health)) for part in probe["exec"]["command"]]
    health.touch()
    assert subprocess.run(command, timeout=10).returncode == 0, "a fresh file fails the probe"
    stale = time.time() - 60
    os.utime(health, (stale, stale))
    assert subprocess.run(command, timeout=10).returncode != 0, "a stale file passes the probe"


# -- what the docs say about Redis' history keys ------------------------------------------------


@pytest.mark.redis
@pytest.mark.parametrize("ttl_ms", [None, 60_000])
def test_redis_history_keys_expire_only_with_history_ttl(ttl_ms: int | None) -> None:
    """docs/backends/redis.md: the history keys expire (ttl + 1 s) only with history_ttl."""
    from django_anarchon import ClaimInput, StoredResult
    from django_anarchon.backends.redis import RedisBackend

    from .redis_support import delete_prefix, redis_url

    url, prefix = redis_url(), f"docsx{uuid.uuid4().hex[:10]}"
    job, slot = "docs.history", int(time.time()) * 1000

    async def write_and_read_ttls() -> list[int]:
        backend = RedisBackend(url=url, key_prefix=prefix, strategy="script")
        try:
            await backend.init()
            await backend.prepare_job(job, 10)
            claim = ClaimInput(job=job, slot=slot, token="t", instance_id="A",
                               history_ttl_ms=ttl_ms)
            assert await backend.claim(claim)
            result = StoredResult(slot=slot, by="A", attempt=1, status="success",
                                  started_at=slot, finished_at=slot + 5, duration_ms=5)
            await backend.save_result(job, result, 10, ttl_ms)
            client = backend.client()
            # Read by name: a SCAN of a server holding many keys took over a second.
            ttls = [await client.pttl(k) for k in backend.history_keys(job)]
            return [ttl for ttl in ttls if ttl != -2]  # -2: no such key
        finally:
            await backend.close()

    try:
        ttls = asyncio.run(write_and_read_ttls())
    finally:
        delete_prefix(url, prefix)
    assert len(ttls) >= 3, ttls
    if ttl_ms is None:
        assert ttls == [-1] * len(ttls), ttls  # no expiry at all
    else:
        assert all(ttl_ms < t <= ttl_ms + 1000 for t in ttls), ttls
