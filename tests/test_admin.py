"""The admin with Django's test client: Jobs page, Run now, history and leases, permissions."""

from __future__ import annotations

import asyncio
import html
import itertools
import re
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urljoin, urlsplit

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import Permission, User
from django.test import Client, override_settings

from django_anarchon import admin_jobs, cron, every
from django_anarchon.backends.base import RunRecord
from django_anarchon.backends.memory import MemoryBackend
from django_anarchon.handler import schedulers
from django_anarchon.models import Run, RunAttempt, RunRequest
from django_anarchon.redact import describe_backend
from django_anarchon.run_requests import claim_requests, run_request

from .support import fresh_registry

pytestmark = pytest.mark.django_db

MEMORY = "django_anarchon.backends.memory.MemoryBackend"
JOBS_URL = "/admin/django_anarchon/scheduledjob/"
RUN_URL = "/admin/django_anarchon/scheduledjob/run/"
TWO_SCHEDULERS = {
    "default": {"BACKEND": MEMORY, "INSTANCE_ID": "web-1"},
    "second": {"BACKEND": "tests.test_admin.SlowHistoryBackend", "INSTANCE_ID": "web-1"},
}


class SlowHistoryBackend(MemoryBackend):
    """A store whose history answers late when asked to; claims stay exact."""

    name = "slow-memory"
    delay_s = 0.0

    async def history(self, job: str, limit: int) -> list[RunRecord]:
        await asyncio.sleep(type(self).delay_s)
        return await super().history(job, limit)


def ok(ctx: Any) -> None:
    """Succeeds."""


def boom(ctx: Any) -> None:
    raise RuntimeError("the report server said no")


@pytest.fixture(autouse=True)
def jobs() -> Iterator[None]:
    """Two schedulers with known jobs; the process-global registry is restored afterwards."""
    with fresh_registry(TWO_SCHEDULERS):
        every("1h", name="reports.daily")(ok)
        every("1h", name="reports.flaky", max_attempts=1)(boom)
        every("10m", name="mail.digest", scheduler="second")(ok)
        try:
            yield
        finally:
            SlowHistoryBackend.delay_s = 0.0


def staff(username: str, *perms: str) -> User:
    user = User.objects.create_user(username, is_staff=True)  # force_login: no password hashing
    for perm in perms:
        app_label, codename = perm.split(".")
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label=app_label, codename=codename)
        )
    return user


VIEW_ALL = ("django_anarchon.view_scheduledjob", "django_anarchon.view_runattempt",
            "django_anarchon.view_run", "django_anarchon.view_runrequest")


@pytest.fixture
def viewer() -> Client:
    client = Client()
    client.force_login(staff("viewer", *VIEW_ALL))
    return client


@pytest.fixture
def runner() -> Client:
    client = Client(enforce_csrf_checks=True)
    client.force_login(staff("runner", *VIEW_ALL, "django_anarchon.run_job"))
    return client


def csrf_post(client: Client, url: str, data: dict[str, str]) -> Any:
    """POST the way a browser does: with the token from the page's form."""
    page = client.get(JOBS_URL)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode())
    assert token, "the Jobs page has no CSRF token for a user who may run jobs"
    return client.post(url, {**data, "csrfmiddlewaretoken": token.group(1)})


# --- who sees what --------------------------------------------------------------------


def test_anonymous_users_are_sent_to_login() -> None:
    for url in (JOBS_URL, RUN_URL, "/admin/django_anarchon/runattempt/",
                "/admin/django_anarchon/run/", f"{JOBS_URL}history/?scheduler=default&job=reports.daily"):
        response = Client().get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith("/admin/login/"), url


def test_staff_without_permissions_see_nothing() -> None:
    client = Client()
    client.force_login(staff("nobody"))
    index = client.get("/admin/").content.decode()
    assert "django_anarchon" not in index and "Jobs" not in index
    for url in (JOBS_URL, "/admin/django_anarchon/runattempt/", "/admin/django_anarchon/run/"):
        assert client.get(url).status_code == 403, url
    assert client.post(RUN_URL, {"scheduler": "default", "job": "reports.daily"}).status_code == 403
    assert not RunRequest.objects.exists()


def test_viewer_sees_jobs_but_no_run_now(viewer: Client) -> None:
    index = viewer.get("/admin/").content.decode()
    assert JOBS_URL in index
    page = viewer.get(JOBS_URL).content.decode()
    assert "reports.daily" in page
    assert "Run now" not in page and RUN_URL not in page
    response = viewer.post(RUN_URL, {"scheduler": "default", "job": "reports.daily"})
    assert response.status_code == 403
    assert not RunRequest.objects.exists()


# --- the Jobs page --------------------------------------------------------------------


def test_jobs_page_lists_every_job_of_every_scheduler(viewer: Client) -> None:
    response = viewer.get(JOBS_URL)
    assert response.status_code == 200
    page = response.content.decode()
    for alias in ("default", "second"):
        assert f'id="scheduler-{alias}"' in page
    for name in ("reports.daily", "reports.flaky", "mail.digest"):
        assert f'data-job="{name}"' in page
    assert "every 1h" in page and "every 10m" in page
    for alias in ("default", "second"):  # each scheduler's backend is named
        assert html.escape(describe_backend(schedulers[alias].backend)) in page


def test_status_strip_shows_the_last_runs_oldest_first(viewer: Client) -> None:
    scheduler = schedulers["default"]
    for _ in range(3):
        scheduler.run_now("reports.flaky")
    scheduler.run_now("reports.daily")
    page = viewer.get(JOBS_URL).content.decode()
    flaky = page[page.index('data-job="reports.flaky"'):]
    flaky = flaky[: flaky.index("</tr>")]
    cells = re.findall(r'class="anarchon-cell anarchon-(\w+)" title="([^"]+)"', flaky)
    assert [status for status, _ in cells] == ["failed"] * 3
    assert all("the report server said no" in title and "web-1" in title for _, title in cells)
    assert "manual" in cells[0][1]
    daily = page[page.index('data-job="reports.daily"'):]
    daily = daily[: daily.index("</tr>")]
    assert re.findall(r"anarchon-cell anarchon-(\w+)", daily) == ["success"]
    assert "anarchon-status anarchon-success" in daily  # the last run column


def test_status_strip_is_capped_at_twenty(viewer: Client) -> None:
    scheduler = schedulers["default"]
    for _ in range(23):
        scheduler.run_now("reports.daily")
    page = viewer.get(JOBS_URL).content.decode()
    daily = page[page.index('data-job="reports.daily"'):]
    daily = daily[: daily.index("</tr>")]
    assert len(re.findall(r"anarchon-cell anarchon-success", daily)) == 20


def test_a_slow_store_does_not_hang_the_page(viewer: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admin_jobs, "READ_TIMEOUT_S", 0.3)
    SlowHistoryBackend.delay_s = 2.0
    started = time.monotonic()
    response = viewer.get(JOBS_URL)
    elapsed = time.monotonic() - started
    assert response.status_code == 200
    assert elapsed < 1.5, f"the page waited {elapsed:.2f}s for a slow store"
    page = response.content.decode()
    digest = page[page.index('data-job="mail.digest"'):]
    assert "did not answer in time" in digest[: digest.index("</tr>")]
    # the fast scheduler's jobs are complete all the same
    daily = page[page.index('data-job="reports.daily"'):]
    assert "did not answer" not in daily[: daily.index("</tr>")]


def history_url(client: Client, job: str) -> str:
    """The Jobs page's link to ``job``'s history, resolved the way a browser resolves it.

    ``urljoin`` removes ``.`` and ``..`` path segments (RFC 3986), as browsers do.
    """
    page = client.get(JOBS_URL).content.decode()
    row = page[page.index(f'data-job="{html.escape(job)}"'):]
    link = re.search(r'<a href="([^"]+)"', row[: row.index("</tr>")])
    assert link, f"no history link for {job!r}"
    href = html.unescape(link.group(1))
    resolved = urlsplit(urljoin(f"http://testserver{JOBS_URL}", href))
    return f"{resolved.path}?{resolved.query}" if resolved.query else resolved.path


def test_job_history_page_reads_any_backend(viewer: Client) -> None:
    schedulers["second"].run_now("mail.digest")
    page = viewer.get(history_url(viewer, "mail.digest")).content.decode()
    assert "anarchon-reason-manual" in page
    assert "web-1" in page


ODD_NAMES = (".", "..", "a/../b", "b", "a%2Fb", "a/b", "with space", "ünïcødé ☃", "?x=1&y#z")


def test_history_links_lead_to_their_own_job(viewer: Client) -> None:
    """A name is never a path: ".", ".." and "a/../b" would normalise to another page."""
    for name in ODD_NAMES:
        every("1h", name=name)(ok)
    with override_settings(ANARCHON=TWO_SCHEDULERS):  # schedulers rebuilt with these jobs
        for index, name in enumerate(ODD_NAMES):
            for _ in range(index + 1):  # a different number of runs per job tells pages apart
                schedulers["default"].run_now(name)
        for index, name in enumerate(ODD_NAMES):
            url = history_url(viewer, name)
            response = viewer.get(url)
            assert response.status_code == 200, (name, url)
            assert response.context["job"] == name, (name, url)
            assert len(response.context["rows"]) == index + 1, (name, url)
            assert f"History of {html.escape(name)}" in response.content.decode()


def test_history_page_wants_a_known_scheduler_and_a_job(viewer: Client) -> None:
    assert viewer.get(f"{JOBS_URL}history/?scheduler=nightly&job=x").status_code == 404
    assert viewer.get(f"{JOBS_URL}history/?scheduler=default").status_code == 404
    empty = viewer.get(f"{JOBS_URL}history/?scheduler=default&job=never.registered")
    assert empty.status_code == 200 and "No runs recorded yet" in empty.content.decode()


def test_history_page_shows_the_first_line_and_hides_the_traceback(viewer: Client) -> None:
    """Ten failures used to print ten whole tracebacks; each is one click away now."""
    for _ in range(10):
        schedulers["default"].run_now("reports.flaky")
    page = viewer.get(history_url(viewer, "reports.flaky")).content.decode()
    cells = re.findall(
        r'<details class="anarchon-traceback"><summary>(.*?)</summary>'
        r'<pre class="anarchon-error">(.*?)</pre></details>', page, re.S)
    assert len(cells) == 10
    for summary, traceback in cells:
        assert summary == "RuntimeError: the report server said no"
        assert "Traceback (most recent call last)" in traceback and "in boom" in traceback
    assert page.count('<pre class="anarchon-error">') == 10  # none outside a <details>


# --- Run now --------------------------------------------------------------------------


def test_run_now_files_a_request_and_runs_nothing_in_the_request(runner: Client) -> None:
    response = csrf_post(runner, RUN_URL, {"scheduler": "default", "job": "reports.daily"})
    assert response.status_code == 302
    assert response["Location"] == JOBS_URL
    request = RunRequest.objects.get()
    assert (request.scheduler, request.job, request.requested_by) == ("default", "reports.daily",
                                                                       "runner")
    assert request.claimed_at is None
    assert schedulers["default"].history("reports.daily") == []  # nothing ran here
    page = runner.get(JOBS_URL).content.decode()
    assert "will run on the next worker" in page
    assert 'id="anarchon-pending"' in page


def test_run_now_needs_csrf(runner: Client) -> None:
    response = runner.post(RUN_URL, {"scheduler": "default", "job": "reports.daily"})
    assert response.status_code == 403
    assert not RunRequest.objects.exists()


def test_run_now_is_post_only(runner: Client) -> None:
    assert runner.get(RUN_URL).status_code == 405


def test_run_now_refuses_unknown_jobs_and_schedulers(runner: Client) -> None:
    csrf_post(runner, RUN_URL, {"scheduler": "default", "job": "mail.digest"})
    assert "Scheduler &#x27;default&#x27; has no job" in runner.get(JOBS_URL).content.decode()
    csrf_post(runner, RUN_URL, {"scheduler": "nightly", "job": "reports.daily"})
    assert "There is no scheduler" in runner.get(JOBS_URL).content.decode()
    assert not RunRequest.objects.exists()


def test_run_now_takes_json_data(runner: Client) -> None:
    csrf_post(runner, RUN_URL, {"scheduler": "second", "job": "mail.digest", "data": '{"full": true}'})
    assert RunRequest.objects.get().data == {"full": True}
    csrf_post(runner, RUN_URL, {"scheduler": "second", "job": "mail.digest", "data": "{nope"})
    assert RunRequest.objects.count() == 1
    assert "not valid JSON" in runner.get(JOBS_URL).content.decode()


@pytest.mark.parametrize(("data", "says"), [
    ("NaN", "NaN is not standard JSON"),
    ("Infinity", "Infinity is not standard JSON"),
    ('{"ratio": -Infinity}', "-Infinity is not standard JSON"),
    ("[" * 5000 + "]" * 5000, "data nests deeper than 64 levels"),
    ('{"a": ' * 5000 + "1" + "}" * 5000, "data nests deeper than 64 levels"),
], ids=["nan", "infinity", "nested-minus-infinity", "5000-brackets", "5000-braces"])
def test_run_now_refuses_data_that_is_not_standard_json(runner: Client, data: str, says: str
                                                        ) -> None:
    """These answered HTTP 500 (or filed a request no worker could read back)."""
    response = csrf_post(runner, RUN_URL, {"scheduler": "default", "job": "reports.daily",
                                           "data": data})
    assert response.status_code == 302 and response["Location"] == JOBS_URL
    page = runner.get(JOBS_URL).content.decode()
    (message,) = re.findall(r'<li class="error">(.*?)</li>', page, re.S)
    assert html.unescape(message).startswith(f"Run now of reports.daily refused: {says}")
    assert not RunRequest.objects.exists()


def test_the_success_message_shows_the_name_as_typed(runner: Client) -> None:
    """The admin capitalises a message's first letter: the job name must not come first."""
    every("1h", name="shop.heartbeat")(ok)
    with override_settings(ANARCHON=TWO_SCHEDULERS):
        csrf_post(runner, RUN_URL, {"scheduler": "default", "job": "shop.heartbeat"})
        page = runner.get(JOBS_URL).content.decode()
    (message,) = re.findall(r'<li class="success">(.*?)</li>', page, re.S)
    assert "shop.heartbeat will run on the next worker" in message
    assert "Shop.heartbeat" not in page


# --- run history and leases (the database backend's tables) ---------------------------


def attempt(job: str, status: str, instance: str, *, minutes_ago: int, reason: str = "scheduled",
            error: str | None = None) -> RunAttempt:
    started = datetime.now(UTC) - timedelta(minutes=minutes_ago)
    return RunAttempt.objects.create(
        job=job, slot=int(started.timestamp() * 1000), scheduled_at=started, instance_id=instance,
        manual=reason == "manual", attempt=1, reason=reason, status=status, started_at=started,
        finished_at=started + timedelta(seconds=2), duration_ms=2000, error=error,
    )


def test_history_admin_filters_searches_and_is_read_only(viewer: Client) -> None:
    attempt("reports.daily", "success", "web-1", minutes_ago=30)
    attempt("reports.daily", "failed", "web-2", minutes_ago=20,
            error='Traceback (most recent call last):\n  File "x.py"\nValueError: <bad> & worse')
    attempt("mail.digest", "success", "web-2", minutes_ago=10, reason="manual")
    url = "/admin/django_anarchon/runattempt/"
    page = viewer.get(url).content.decode()
    assert page.count('class="field-job"') == 3 or page.count("reports.daily") >= 2
    for query, expected in (("status__exact=failed", 1), ("instance_id=web-2", 2),
                            ("reason__exact=manual", 1), ("job=reports.daily", 2),
                            ("q=ValueError", 1)):
        response = viewer.get(f"{url}?{query}")
        assert response.status_code == 200, query
        assert response.context["cl"].result_count == expected, query
    today = datetime.now(UTC)
    response = viewer.get(f"{url}?started_at__year={today.year}")
    assert response.context["cl"].result_count == 3
    assert viewer.get(f"{url}add/").status_code == 403
    failed = RunAttempt.objects.get(status="failed")
    detail = viewer.get(f"{url}{failed.pk}/change/").content.decode()
    assert '<pre class="anarchon-error">Traceback' in detail
    assert "ValueError: &lt;bad&gt; &amp; worse" in detail  # escaped, line breaks kept
    assert 'name="_save"' not in detail
    assert viewer.post(f"{url}{failed.pk}/delete/", {"post": "yes"}).status_code == 403


def result_row(page: str, text: str) -> str:
    """The change list's row that mentions ``text`` (the filter sidebar mentions it too)."""
    rows: list[str] = [row for row in re.findall(r"<tr[^>]*>.*?</tr>", page, re.S)
                       if "field-" in row]
    (row,) = [row for row in rows if text in row]
    return row


def test_leases_admin_tells_alive_from_lapsed(viewer: Client) -> None:
    now = int(time.time() * 1000)
    common = {"attempt": 1, "token": "t", "state": "running", "reason": "scheduled",
              "started_at_ms": now - 5000}
    Run.objects.create(job="reports.daily", slot=now - 5000, instance_id="web-1",
                       lease_until_ms=now + 600_000, **common)
    Run.objects.create(job="reports.flaky", slot=now - 6000, instance_id="web-2",
                       lease_until_ms=now - 120_000, **{**common, "attempt": 2})
    url = "/admin/django_anarchon/run/"
    page = viewer.get(url).content.decode()
    alive_row = result_row(page, "reports.daily")
    assert "anarchon-alive" in alive_row and "web-1" in alive_row
    assert re.search(r"field-expires_in\">(9m\d+s|10m)", alive_row), alive_row
    lapsed_row = result_row(page, "reports.flaky")
    assert "anarchon-lapsed" in lapsed_row and "web-2" in lapsed_row and "lapsed 2m" in lapsed_row
    assert viewer.get(f"{url}?lease=alive").context["cl"].result_count == 1
    assert viewer.get(f"{url}?lease=lapsed").context["cl"].result_count == 1
    assert viewer.get(f"{url}add/").status_code == 403


@pytest.mark.django_db(transaction=True)
def test_a_worker_runs_the_request_and_history_shows_the_manual_run(runner: Client) -> None:
    csrf_post(runner, RUN_URL, {"scheduler": "second", "job": "mail.digest"})
    scheduler = schedulers["second"]
    (request,) = claim_requests("second", "worker-7")
    assert claim_requests("second", "worker-8") == []  # one worker wins each request
    async_to_sync(run_request)(scheduler, request)
    request.refresh_from_db()
    assert request.claimed_by == "worker-7" and request.slot is not None
    page = runner.get(history_url(runner, "mail.digest")).content.decode()
    assert "anarchon-reason-manual" in page and "anarchon-status anarchon-success" in page
    jobs_page = runner.get(JOBS_URL).content.decode()
    assert 'id="anarchon-pending"' not in jobs_page
    digest = jobs_page[jobs_page.index('data-job="mail.digest"'):]
    assert "anarchon-cell anarchon-success" in digest[: digest.index("</tr>")]


@pytest.mark.redis
def test_jobs_page_reads_a_redis_scheduler_too(viewer: Client) -> None:
    """Whatever the backend: the page goes through Scheduler.history(), here on real Redis."""
    from tests.redis_support import delete_prefix, redis_url

    url = redis_url()
    prefix = f"anarchon-admin-{uuid.uuid4().hex[:8]}"
    every("1h", name="redis.report", scheduler="redis")(boom)
    config = {**TWO_SCHEDULERS, "redis": {
        "BACKEND": "django_anarchon.backends.redis.RedisBackend",
        "OPTIONS": {"url": url, "key_prefix": prefix}, "INSTANCE_ID": "web-9",
    }}
    try:
        with override_settings(ANARCHON=config):
            schedulers["redis"].run_now("redis.report")
            page = viewer.get(JOBS_URL).content.decode()
            row = page[page.index('data-job="redis.report"'):]
            row = row[: row.index("</tr>")]
            assert 'id="scheduler-redis"' in page
            (title,) = re.findall(r'class="anarchon-cell anarchon-failed" title="([^"]+)"', row)
            assert "web-9" in title and "the report server said no" in title
    finally:
        delete_prefix(url, prefix)


# --- how the pages read ---------------------------------------------------------------


def test_history_list_shows_seconds_zone_and_plural_counts(viewer: Client) -> None:
    """Rows of an every-5s job differ in their seconds; the count reads "3 run attempts"."""
    base = datetime(2026, 12, 1, 8, 5, 0, tzinfo=UTC)
    for seconds in (0, 5, 10):
        at = base + timedelta(seconds=seconds)
        RunAttempt.objects.create(
            job="shop.heartbeat", slot=int(at.timestamp() * 1000), scheduled_at=at,
            instance_id="web-1", attempt=1, reason="scheduled", status="success", started_at=at,
            finished_at=at, duration_ms=12,
        )
    page = viewer.get("/admin/django_anarchon/runattempt/").content.decode()
    for second in ("00", "05", "10"):
        assert f"2026-12-01 08:05:{second} UTC" in page
    assert "a.m." not in page
    assert re.search(r"3\s+run attempts", page), "the count is not plural"
    assert "run history" not in page.lower().replace("browse the full run history", "")
    with override_settings(TIME_ZONE="Europe/Athens"):
        athens = viewer.get("/admin/django_anarchon/runattempt/").content.decode()
    assert "2026-12-01 10:05:05 EET" in athens


def test_lease_times_are_rounded(viewer: Client) -> None:
    """ "alive 20s816ms" read like a stopwatch: whole seconds from ten seconds up."""
    now = int(time.time() * 1000)
    Run.objects.create(job="shop.heartbeat", slot=now, attempt=1, token="t", instance_id="web-1",
                       lease_until_ms=now + 20_816, state="running", reason="scheduled",
                       started_at_ms=now)
    page = viewer.get("/admin/django_anarchon/run/").content.decode()
    row = result_row(page, "shop.heartbeat")
    expires = re.search(r'field-expires_in">([^<]*)<', row)
    assert expires and expires.group(1) in ("20s", "21s"), row


def test_read_only_pages_have_no_history_button(viewer: Client) -> None:
    """Nobody edits these rows in the admin, so there is no change history to show."""
    failed = attempt("reports.flaky", "failed", "web-1", minutes_ago=1, error="RuntimeError: x")
    now = int(time.time() * 1000)
    lease = Run.objects.create(job="reports.daily", slot=now, attempt=1, token="secret-token",
                               instance_id="web-1", lease_until_ms=now + 10_000, state="running",
                               reason="scheduled", started_at_ms=now)
    request = RunRequest.objects.create(scheduler="default", job="reports.daily")
    for url in (f"/admin/django_anarchon/runattempt/{failed.pk}/change/",
                f"/admin/django_anarchon/run/{lease.pk}/change/",
                f"/admin/django_anarchon/runrequest/{request.pk}/change/"):
        response = viewer.get(url)
        assert response.status_code == 200, url
        page = response.content.decode()
        assert "historylink" not in page and "/history/" not in page, url
        assert "a.m." not in page and " UTC" in page, url
    lease_page = viewer.get(f"/admin/django_anarchon/run/{lease.pk}/change/").content.decode()
    assert "secret-token" not in lease_page
    assert str(lease.lease_until_ms) not in lease_page  # a time, not epoch milliseconds


def test_a_request_says_who_claimed_it_and_how_soon(viewer: Client) -> None:
    request = RunRequest.objects.create(scheduler="default", job="reports.daily")
    RunRequest.objects.create(scheduler="default", job="reports.flaky")
    RunRequest.objects.filter(pk=request.pk).update(
        claimed_by="worker-7", claimed_at=request.requested_at + timedelta(milliseconds=800))
    page = viewer.get("/admin/django_anarchon/runrequest/").content.decode()
    assert "worker-7, 800ms later" in result_row(page, "reports.daily")
    assert "waiting for a worker" in result_row(page, "reports.flaky")
    assert re.search(r"2\s+run requests", page)


def test_the_last_run_of_a_few_seconds_ago_says_so(viewer: Client) -> None:
    schedulers["default"].run_now("reports.daily")
    page = viewer.get(JOBS_URL).content.decode()
    daily = page[page.index('data-job="reports.daily"'):]
    daily = daily[: daily.index("</tr>")]
    assert re.search(r">(just now|\d+ seconds? ago)</span>", daily), daily
    assert "0\xa0minutes" not in daily and "0 minutes" not in daily


def test_job_page_lists_the_next_fire_times_marked_for_dst(viewer: Client) -> None:
    # Any 10 March Sundays in New York hold a second Sunday of March (the spring-forward).
    cron("30 2 * 3 0", timezone="America/New_York", name="march.skip", dst_gap="skip")(ok)
    with override_settings(ANARCHON=TWO_SCHEDULERS):
        response = viewer.get(f"{JOBS_URL}history/?scheduler=default&job=march.skip")
        page = response.content.decode()
        fires = response.context["upcoming"]
        assert len([f for f in fires if f.at_ms is not None]) == 10
        skipped = [f for f in fires if f.mark == "skipped"]
        assert skipped and all(f.label() == "skipped 02:30" for f in skipped)
        assert html.escape('cron "30 2 * 3 0" (America/New_York, dst_gap=skip)') in page
        table = page[page.index('id="anarchon-upcoming"'):page.index('id="anarchon-history"')]
        assert table.count('<tr class="anarchon-fire') == len(fires)
        assert table.count("anarchon-dst") == len(skipped)
        assert "skipped 02:30" in table and "(not on the clock)" in table and " EDT" in table


def test_job_page_shows_the_overlap_and_catch_up_policies(viewer: Client) -> None:
    every("1m", name="reports.buffered", overlap="buffer_one", catch_up="2h")(ok)
    page = viewer.get(f"{JOBS_URL}history/?scheduler=default&job=reports.buffered")
    assert "Policies: overlap=buffer_one, catch_up=2h" in page.content.decode()
    plain = viewer.get(f"{JOBS_URL}history/?scheduler=default&job=reports.daily")
    assert "anarchon-policies" not in plain.content.decode()


def test_job_page_of_an_every_job_and_of_an_unknown_job(viewer: Client) -> None:
    response = viewer.get(f"{JOBS_URL}history/?scheduler=default&job=reports.daily")
    fires = response.context["upcoming"]
    assert len(fires) == 10 and {f.label() for f in fires} == {""}
    assert [b - a for a, b in itertools.pairwise(f.at_ms for f in fires)] == [3_600_000] * 9
    unknown = viewer.get(f"{JOBS_URL}history/?scheduler=default&job=never.registered")
    assert unknown.context["upcoming"] == [] and 'id="anarchon-upcoming"' not in (
        unknown.content.decode())
