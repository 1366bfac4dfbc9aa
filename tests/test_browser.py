"""The admin in a real browser: login, the Jobs page, Run now, and the manual run in history.

Debian's Chromium driven by Playwright (never a downloaded browser). The web server and
a worker run as subprocesses on one SQLite file, so the run request really travels
from the web process to the worker. ``scripts/setup-browser.sh`` installs what it needs;
under CI a missing browser fails the test instead of skipping it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

import pytest

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = Path(os.environ.get("ANARCHON_TEST_OUTPUT", ROOT / "test-output"))
CHROMIUM = os.environ.get("ANARCHON_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
JOB = "testapp.hourly_cleanup"

pytestmark = pytest.mark.slow


def _missing(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}; run scripts/setup-browser.sh")
    pytest.skip(f"BROWSER TEST NOT RUN: {reason}; run scripts/setup-browser.sh")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"gave up after {timeout:.0f}s waiting for {what}")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A migrated SQLite file, a demo user, ``runserver`` and one ``anarchon_worker``."""
    if not Path(CHROMIUM).exists():
        _missing(f"{CHROMIUM} is not installed")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        _missing("Playwright for Python is not installed")
    work = tmp_path_factory.mktemp("browser")
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.browser_settings",
        "ANARCHON_BROWSER_DB": str(work / "site.sqlite3"),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    setup = (
        "import django; django.setup()\n"
        "from django.core.management import call_command\n"
        "call_command('migrate', verbosity=0)\n"
        "from django.contrib.auth.models import User\n"
        "User.objects.create_superuser('admin', 'admin@example.com', 'browser-pw')\n"
    )
    subprocess.run([sys.executable, "-c", setup], env=env, cwd=ROOT, check=True, timeout=60)
    port = _free_port()
    processes: list[tuple[subprocess.Popen[bytes], BinaryIO]] = []
    for name, args in (
        ("server", ["runserver", f"127.0.0.1:{port}", "--noreload", "--skip-checks"]),
        ("worker", ["anarchon_worker", "--instance-id", "browser-worker", "--grace", "2s"]),
    ):
        log = open(work / f"{name}.log", "wb")  # noqa: SIM115 (closed below)
        processes.append((
            subprocess.Popen([sys.executable, "-m", "django", *args], env=env, cwd=ROOT,
                             stdout=log, stderr=subprocess.STDOUT),
            log,
        ))
    base = f"http://127.0.0.1:{port}"

    def server_up() -> bool:
        try:
            with urllib.request.urlopen(f"{base}/admin/login/", timeout=1) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    try:
        _wait_until(server_up, "runserver to answer")
        _wait_until(lambda: b"anarchon worker" in (work / "worker.log").read_bytes(),
                    "the worker's banner")
        yield base
    finally:
        for process, _log in processes:
            process.send_signal(signal.SIGTERM)
        for process, stream in processes:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
            stream.close()
        OUTPUT.mkdir(parents=True, exist_ok=True)
        for name in ("server", "worker"):
            shutil.copy(work / f"{name}.log", OUTPUT / f"browser-{name}.log")


def test_login_jobs_page_run_now_and_history(site: str) -> None:
    from playwright.sync_api import expect, sync_playwright

    OUTPUT.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        profile = OUTPUT / "chromium-profile"
        shutil.rmtree(profile, ignore_errors=True)
        browser = playwright.chromium.launch_persistent_context(
            str(profile), executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True,
            viewport={"width": 1400, "height": 900},
        )
        try:
            page = browser.new_page()
            page.set_default_timeout(15_000)

            # Anonymous: sent to the login page, then back to the Jobs page.
            page.goto(f"{site}/admin/django_anarchon/scheduledjob/")
            assert "/admin/login/" in page.url
            page.fill("#id_username", "admin")
            page.fill("#id_password", "browser-pw")
            page.click("input[type=submit]")
            page.wait_for_url("**/admin/django_anarchon/scheduledjob/")

            # The Jobs page: every job of the test app, with schedule and next run.
            row = page.locator(f'tr[data-job="{JOB}"]')
            expect(row).to_contain_text("every 1h")
            for name in ("morning-report", "billing.reconcile"):
                expect(page.locator(f'tr[data-job="{name}"]')).to_be_visible()
            page.screenshot(path=str(OUTPUT / "admin-jobs-page.png"), full_page=True)

            # Run now: a POST with the CSRF token, handed to the worker.
            row.get_by_role("button", name=f"Run {JOB} now").click()
            expect(page.locator("ul.messagelist")).to_contain_text("will run on the next worker")

            # The history page shows the manual run once the worker has run it.
            history = f"{site}/admin/django_anarchon/scheduledjob/default/{JOB}/history/"
            deadline = time.monotonic() + 30
            manual = page.locator("tr.anarchon-reason-manual")
            while True:
                page.goto(history)
                if manual.count() > 0:
                    break
                assert time.monotonic() < deadline, "the worker never ran the requested job"
                time.sleep(0.5)
            expect(manual.first).to_contain_text("browser-worker")
            expect(manual.first.locator(".anarchon-status")).to_have_text("success")
            page.screenshot(path=str(OUTPUT / "admin-job-history.png"), full_page=True)

            # Back on the Jobs page the strip has the run (the page caches reads for 5 s).
            deadline = time.monotonic() + 15
            cells = page.locator(
                f'tr[data-job="{JOB}"] .anarchon-cell.anarchon-success[title*="manual"]'
            )
            while True:
                page.goto(f"{site}/admin/django_anarchon/scheduledjob/")
                if cells.count() == 1:
                    break
                assert time.monotonic() < deadline, "the Jobs page never showed the manual run"
                time.sleep(0.5)
            page.screenshot(path=str(OUTPUT / "admin-jobs-page-after-run.png"), full_page=True)
        finally:
            browser.close()
            shutil.rmtree(profile, ignore_errors=True)
