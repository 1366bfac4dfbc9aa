"""The admin in a real browser: login, Run now, and every page of the app at 1280 px.

Debian's Chromium driven by Playwright (never a downloaded browser). The web server and
a worker run as subprocesses on one SQLite file, so the run request really travels
from the web process to the worker. The history is seeded as an hour of a shop leaves
it (tests/browserapp: an every-5s job with failures, a long job name). Every page is
screenshotted into ``.tmp/screenshots/`` (not committed) and checked for clipped
columns. ``scripts/setup-browser.sh`` installs what it needs; under CI a missing browser
fails the test instead of skipping it.
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
from typing import Any, BinaryIO

import pytest

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = Path(os.environ.get("ANARCHON_TEST_OUTPUT", ROOT / "test-output"))
SCREENSHOTS = Path(os.environ.get("ANARCHON_SCREENSHOTS", ROOT / ".tmp" / "screenshots"))
#: The narrowest common laptop width: every column of every page must fit in it.
WIDTH = 1280
CHROMIUM = os.environ.get("ANARCHON_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
JOB = "testapp.hourly_cleanup"
HEARTBEAT = "shop.heartbeat"
LONG_NAME = "reports.quarterly_revenue_reconciliation_for_every_region_and_currency"

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
        "from tests.browserapp.seed import seed\n"
        "seed()\n"
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


@pytest.fixture
def page(site: str) -> Iterator[Any]:
    """A Chromium page, 1280 px wide, logged in to the admin as a superuser."""
    from playwright.sync_api import sync_playwright

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        profile = OUTPUT / "chromium-profile"
        shutil.rmtree(profile, ignore_errors=True)
        browser = playwright.chromium.launch_persistent_context(
            str(profile), executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True,
            viewport={"width": WIDTH, "height": 900},
        )
        try:
            tab = browser.new_page()
            tab.set_default_timeout(15_000)
            # Anonymous: sent to the login page, then back to the Jobs page.
            tab.goto(f"{site}/admin/django_anarchon/scheduledjob/")
            assert "/admin/login/" in tab.url
            tab.fill("#id_username", "admin")
            tab.fill("#id_password", "browser-pw")
            tab.click("input[type=submit]")
            tab.wait_for_url("**/admin/django_anarchon/scheduledjob/")
            yield tab
        finally:
            browser.close()
            shutil.rmtree(profile, ignore_errors=True)


def test_login_jobs_page_run_now_and_history(site: str, page: Any) -> None:
    from playwright.sync_api import expect

    # The Jobs page: every job of the test app, with schedule and next run.
    row = page.locator(f'tr[data-job="{JOB}"]')
    expect(row).to_contain_text("every 1h")
    for name in ("morning-report", "billing.reconcile", HEARTBEAT):
        expect(page.locator(f'tr[data-job="{name}"]')).to_be_visible()

    # Run now: a POST with the CSRF token, handed to the worker.
    row.get_by_role("button", name=f"Run {JOB} now").click()
    message = page.locator("ul.messagelist")
    expect(message).to_contain_text(f"{JOB} will run on the next worker")  # as typed

    # The job's link leads to its history, which shows the manual run once the worker ran it.
    page.locator(f'tr[data-job="{JOB}"] th a').click()
    expect(page.locator("h1")).to_have_text(f"History of {JOB}")
    history = page.url
    deadline = time.monotonic() + 30
    # the page is read once: reload it until the run has finished (it shows "running" before)
    manual = page.locator("tr.anarchon-reason-manual:has(.anarchon-success)")
    while manual.count() == 0:
        assert time.monotonic() < deadline, "the worker never ran the requested job"
        time.sleep(0.5)
        page.goto(history)
    expect(manual.first).to_contain_text("browser-worker")

    # Back on the Jobs page the strip has the run (the page caches reads for 5 s).
    deadline = time.monotonic() + 15
    cells = page.locator(f'tr[data-job="{JOB}"] .anarchon-cell.anarchon-success[title*="manual"]')
    while True:
        page.goto(f"{site}/admin/django_anarchon/scheduledjob/")
        if cells.count() == 1:
            break
        assert time.monotonic() < deadline, "the Jobs page never showed the manual run"
        time.sleep(0.5)
    expect(row).to_contain_text("ago")


#: What a clipped page looks like, measured in the browser: the page scrolls sideways, a
#: table overflows its box (so its right-hand columns hide behind a scrollbar or the
#: filters), a cell ends beyond the box or the viewport, or the results run under the
#: filter sidebar.
CLIPPING = """() => {
  const viewport = document.documentElement.clientWidth;
  const problems = [];
  const page = document.documentElement.scrollWidth;
  if (page > viewport) problems.push(`the page scrolls sideways: ${page}px > ${viewport}px`);
  for (const table of document.querySelectorAll('#content table')) {
    const box = table.parentElement;
    const name = table.id || table.className || 'table';
    if (box.scrollWidth > box.clientWidth + 1) {
      problems.push(`${name} overflows its box: ${box.scrollWidth}px > ${box.clientWidth}px`);
    }
    const right = Math.min(viewport, box.getBoundingClientRect().right);
    const clipped = [...table.querySelectorAll('th, td')].filter((cell) => {
      const edge = cell.getBoundingClientRect();
      return edge.width > 0 && edge.right > right + 1;
    });
    if (clipped.length) {
      const first = clipped[0], text = first.textContent.trim().slice(0, 40);
      problems.push(`${name}: ${clipped.length} cells clipped, the first "${text}" ends at ` +
                    `${first.getBoundingClientRect().right}px > ${right}px`);
    }
  }
  const filters = document.querySelector('#changelist-filter');
  const results = document.querySelector('#result_list');
  if (filters && results) {
    const f = filters.getBoundingClientRect(), r = results.getBoundingClientRect();
    const beside = f.top < r.bottom && r.top < f.bottom;
    if (beside && r.right > f.left + 1) problems.push(`the results run under the filters`);
  }
  return problems;
}"""


def _look(page: Any, url: str, name: str) -> list[str]:
    """Open ``url``, screenshot it whole, and say what is clipped on it."""
    response = page.goto(url)
    assert response is not None and response.status == 200, (url, response and response.status)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)
    return [f"{name}: {problem}" for problem in page.evaluate(CLIPPING)]


def test_every_admin_page_fits_1280px(site: str, page: Any) -> None:
    from playwright.sync_api import expect

    admin = f"{site}/admin/django_anarchon"
    problems = _look(page, f"{admin}/", "app-index")
    problems += _look(page, f"{admin}/scheduledjob/", "jobs")

    # The every-5s job's history: seconds and zone on each row, one line per failure.
    page.locator(f'tr[data-job="{HEARTBEAT}"] th a').click()
    history = page.url
    problems += _look(page, history, "job-history")
    rows = page.locator("#anarchon-history tbody tr")
    assert rows.count() >= 40
    times = page.locator("#anarchon-history tbody tr td:first-child").all_inner_texts()
    assert all(text.endswith(" UTC") and text.count(":") == 2 for text in times), times[:3]
    assert len(set(times)) == len(times), "two rows of an every-5s job read the same time"
    upcoming = page.locator("#anarchon-upcoming tbody tr td:nth-child(2)").all_inner_texts()
    assert len(upcoming) == 10 and all(text.endswith(" UTC") for text in upcoming), upcoming
    failure = page.locator("details.anarchon-traceback").first
    expect(failure.locator("summary")).to_contain_text("ConnectionError: payment gateway")
    expect(failure.locator("pre")).to_be_hidden()  # one click away
    height = page.locator("#anarchon-history tbody").bounding_box()["height"]
    assert height / rows.count() < 45, f"{rows.count()} rows take {height}px: tracebacks shown?"
    failure.locator("summary").click()
    expect(failure.locator("pre")).to_contain_text("Traceback (most recent call last)")
    page.screenshot(path=str(SCREENSHOTS / "job-history-traceback-open.png"), full_page=True)
    problems += [f"job-history (open): {p}" for p in page.evaluate(CLIPPING)]
    problems += _look(page, f"{admin}/scheduledjob/history/?scheduler=default&job={LONG_NAME}",
                      "job-history-long-name")

    # Run attempts: the list, the failures, a failure's page.
    problems += _look(page, f"{admin}/runattempt/", "run-attempts")
    expect(page.locator("#changelist-form .paginator")).to_contain_text("run attempts")
    problems += _look(page, f"{admin}/runattempt/?status__exact=failed", "run-attempts-failed")
    page.locator("#result_list tbody tr th a").first.click()
    problems += _look(page, page.url, "run-attempt")
    expect(page.locator(".object-tools")).to_have_count(0)  # no "History" of a record

    # Run leases and run requests: lists and a row's page.
    for model, name in (("run", "run-leases"), ("runrequest", "run-requests")):
        problems += _look(page, f"{admin}/{model}/", name)
        page.locator("#result_list tbody tr th a").first.click()
        problems += _look(page, page.url, name.removesuffix("s"))
        expect(page.locator(".object-tools")).to_have_count(0)
    assert not problems, "\n".join(problems)
