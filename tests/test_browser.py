"""The admin in a real browser: login, Run now, pause and resume, the timeline, a backfill
dry run, and every page of the app at 1280 px.

Debian's Chromium driven by Playwright (never a downloaded browser). The web server and
a worker run as subprocesses on one SQLite file, so the run request really travels
from the web process to the worker. The pause, the timeline and the backfill are those of
``ops.sync``, a job of a memory scheduler the web process autostarts (its store keeps a
ledger). The history is seeded as an hour of a shop leaves
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
OPS_JOB = "ops.sync"

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
        ("worker", ["anarchon_worker", "--instance-id", "browser-worker", "--grace", "2s",
                    "--scheduler", "default"]),
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
    # The heartbeat's timeline: its seeded hour, then what the worker ran.
    page.goto(history)
    expect(page.locator("#anarchon-timeline .anarchon-slot").first).to_be_visible()

    # Run attempts: the list, the failures, a failure's page.
    problems += _look(page, f"{admin}/runattempt/", "run-attempts")
    expect(page.locator("#changelist-form .paginator")).to_contain_text("run attempts")
    problems += _look(page, f"{admin}/runattempt/?status__exact=failed", "run-attempts-failed")
    page.locator("#result_list tbody tr th a").first.click()
    problems += _look(page, page.url, "run-attempt")
    expect(page.locator(".object-tools")).to_have_count(0)  # no "History" of a record

    # Run leases, run requests and backfill requests: lists and a row's page.
    for model, name in (("run", "run-leases"), ("runrequest", "run-requests"),
                        ("backfillrequest", "backfill-requests")):
        problems += _look(page, f"{admin}/{model}/", name)
        page.locator("#result_list tbody tr th a").first.click()
        problems += _look(page, page.url, name.removesuffix("s"))
        expect(page.locator(".object-tools")).to_have_count(0)
    assert not problems, "\n".join(problems)


def _reload_until(page: Any, url: str, done: Callable[[], bool], what: str,
                  timeout: float = 30.0) -> None:
    """The pages are read once: load ``url`` again until ``done()``."""
    deadline = time.monotonic() + timeout
    while True:
        page.goto(url)
        if done():
            return
        assert time.monotonic() < deadline, f"gave up after {timeout:.0f}s waiting for {what}"
        time.sleep(0.5)


def test_pause_resume_the_timeline_and_a_backfill_dry_run(site: str, page: Any) -> None:
    from playwright.sync_api import expect

    jobs = f"{site}/admin/django_anarchon/scheduledjob/"
    job_page = f"{jobs}history/?scheduler=ops&job={OPS_JOB}&span=1h"
    slots = page.locator("#anarchon-timeline .anarchon-slot")
    ran = page.locator('#anarchon-timeline .anarchon-slot[data-fate="ran"]')
    _reload_until(page, job_page, lambda: ran.count() >= 2, "two runs on the timeline")
    expect(page.locator("#anarchon-pause")).to_contain_text("Runs on its schedule")

    # Pause from the Jobs page: the menu's note and duration, then the badge.
    page.goto(jobs)
    row = page.locator(f'tr[data-job="{OPS_JOB}"]')
    row.get_by_label(f"Pause {OPS_JOB}…").click()
    row.locator('input[name="note"]').fill("browser test: <deploy> 4.2")
    row.locator('input[name="duration"]').fill("1h")
    page.screenshot(path=str(SCREENSHOTS / "jobs-pause-menu.png"), full_page=True)
    problems = [f"jobs (pause menu open): {p}" for p in page.evaluate(CLIPPING)]
    row.get_by_role("button", name=f"Pause {OPS_JOB}", exact=True).click()
    expect(page.locator("ul.messagelist")).to_contain_text(
        f"Paused: {OPS_JOB} skips its slots on every instance of scheduler 'ops' until 20")
    row = page.locator(f'tr[data-job="{OPS_JOB}"]')
    expect(row.locator(".anarchon-status.anarchon-paused")).to_have_text("paused")
    expect(row.locator(".anarchon-pause-note")).to_contain_text("by admin")
    expect(row.locator(".anarchon-pause-note")).to_contain_text("browser test: <deploy> 4.2")
    expect(row.get_by_role("button", name=f"Resume {OPS_JOB}")).to_be_visible()
    problems += _look(page, jobs, "jobs-paused")

    # The paused slots show on the timeline as skipped, with why.
    skipped = page.locator('#anarchon-timeline .anarchon-slot[data-fate="skipped"]')
    _reload_until(page, job_page, lambda: skipped.count() >= 2, "slots skipped while paused")
    assert "skipped: paused" in (skipped.first.get_attribute("title") or "")
    expect(page.locator("#anarchon-pause")).to_contain_text("browser test: <deploy> 4.2")

    # Resume on the job's page; the job runs again.
    page.get_by_role("button", name="Resume", exact=True).click()
    expect(page.locator("ul.messagelist")).to_contain_text(f"Resumed: {OPS_JOB} runs again")
    expect(page.locator("#anarchon-pause")).to_have_attribute("data-paused", "no")

    def ran_after_the_pause() -> bool:
        fates = [slots.nth(i).get_attribute("data-fate") for i in range(slots.count())]
        return "skipped" in fates and fates[-1] == "ran" and "ran" in fates[
            fates.index("skipped"):]

    _reload_until(page, job_page, ran_after_the_pause, "a run after the resume")
    page.locator("details.anarchon-ledger-table summary").click()
    rows = page.locator("#anarchon-ledger tbody tr")
    expect(rows.first).to_be_visible()
    assert rows.count() == slots.count()
    expect(page.locator('#anarchon-ledger tr[data-fate="skipped"]').first).to_contain_text(
        "skipped: paused")
    problems += _look(page, page.url, "job-timeline")
    # The cells sit on a time axis, in order, within the track.
    boxes = [slots.nth(i).bounding_box() for i in range(slots.count())]
    track = page.locator("#anarchon-timeline .anarchon-track").bounding_box()
    assert all(b is not None and b["x"] >= track["x"] - 1 for b in boxes)
    assert all(b is not None and b["x"] + b["width"] <= track["x"] + track["width"] + 1
               for b in boxes)
    lefts = [b["x"] for b in boxes if b is not None]
    assert lefts == sorted(lefts), "the cells are not in time order"

    # A skipped slot fills the backfill form; the dry run lists what would run.
    skipped.first.click()
    form = page.locator("#anarchon-backfill-form")
    assert form.locator('input[name="start"]').input_value()
    form.get_by_role("button", name="Dry run").click()
    expect(page.locator("ul.messagelist")).to_contain_text(
        f"Dry run: a backfill of {OPS_JOB} would run 1 slot")
    expect(page.locator("ul.messagelist")).to_contain_text("Nothing was filed.")
    expect(page.locator("#anarchon-plan li")).to_have_count(1)
    page.screenshot(path=str(SCREENSHOTS / "job-backfill-dry-run.png"), full_page=True)
    problems += [f"job (dry run): {p}" for p in page.evaluate(CLIPPING)]
    # A range that ends in the future is refused in one line, and nothing is filed.
    form.locator('input[name="end"]').fill("2099-01-01T00:00:00")
    form.get_by_role("button", name="Backfill", exact=True).click()
    error = page.locator("ul.messagelist li.error")
    expect(error).to_contain_text(f"Backfill of {OPS_JOB} refused: to = 2099-01-01 00:00:00")
    expect(error).to_contain_text("the range ends in the future")
    expect(page.locator("#anarchon-backfills")).to_have_count(0)
    assert not problems, "\n".join(problems)
