"""The admin's pause and resume, the per-job timeline of the ledger, and backfill.

Django's test client against memory-backend schedulers: the ledger is written through
the store API (results, skipped and missed marks), the pauses and backfills through the
admin's forms with their CSRF token. (tests/test_admin.py holds the pages without the
ledger; this file shares its helpers.)
"""

from __future__ import annotations

import asyncio
import html
import itertools
import re
import sys
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from asgiref.sync import async_to_sync
from django.test import Client, override_settings

from django_anarchon import admin as anarchon_admin
from django_anarchon import admin_actions, admin_jobs, every
from django_anarchon.admin_timeline import MIN_WIDTH
from django_anarchon.backends.base import PauseState, StoredResult, ms_to_datetime
from django_anarchon.backends.memory import MemoryBackend, MemoryRunStore
from django_anarchon.engine import Scheduler
from django_anarchon.handler import schedulers
from django_anarchon.models import BackfillRequest

from .support import fresh_registry
from .test_admin import JOBS_URL, VIEW_ALL, boom, ok, staff

pytestmark = pytest.mark.django_db

MEMORY = "django_anarchon.backends.memory.MemoryBackend"
PAGE_URL = f"{JOBS_URL}history/"
PAUSE_URL = f"{JOBS_URL}pause/"
RESUME_URL = f"{JOBS_URL}resume/"
BACKFILL_URL = f"{JOBS_URL}backfill/"
MINUTELY = "ledger.minutely"
SCHEDULERS = {
    "default": {"BACKEND": MEMORY, "INSTANCE_ID": "web-1"},
    "slow": {"BACKEND": "tests.test_admin_ledger.SlowPausesBackend", "INSTANCE_ID": "web-1"},
    "claimonly": {"BACKEND": "tests.test_engine_support.ClaimOnlyMemoryBackend"},
}
PAUSE = "django_anarchon.pause_job"
BACKFILL = "django_anarchon.backfill_job"


class SlowPausesStore(MemoryRunStore):
    delay_s = 0.0

    async def pauses(self, jobs: Sequence[str]) -> dict[str, PauseState]:
        await asyncio.sleep(type(self).delay_s)
        return await super().pauses(jobs)


class SlowPausesBackend(MemoryBackend):
    """A ledger store whose pauses answer late when asked to."""

    name = "slow-pauses"

    def __init__(self) -> None:
        super().__init__()
        self.runs = SlowPausesStore(self._state)


@pytest.fixture(autouse=True)
def jobs() -> Iterator[None]:
    with fresh_registry(SCHEDULERS):
        every("1h", name="reports.daily")(ok)
        every("1h", name="reports.flaky", max_attempts=1)(boom)
        every("1m", name=MINUTELY)(ok)
        every("10m", name="mail.digest", scheduler="slow")(ok)
        every("10m", name="legacy.sync", scheduler="claimonly")(ok)
        try:
            yield
        finally:
            SlowPausesStore.delay_s = 0.0


def client_of(username: str, *perms: str) -> Client:
    client = Client(enforce_csrf_checks=True)
    client.force_login(staff(username, *VIEW_ALL, *perms))
    return client


@pytest.fixture
def viewer() -> Client:
    return client_of("viewer")


@pytest.fixture
def pauser() -> Client:
    return client_of("pauser", PAUSE)


@pytest.fixture
def filler() -> Client:
    return client_of("filler", BACKFILL)


def page_url(job: str, scheduler: str = "default", **extra: str) -> str:
    query = "&".join(f"{k}={v}" for k, v in extra.items())
    return f"{PAGE_URL}?scheduler={scheduler}&job={job}" + (f"&{query}" if query else "")


def token(client: Client, url: str = JOBS_URL) -> str:
    """The CSRF token a page of ``url`` carries (every admin page has the logout form)."""
    found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"',
                      client.get(url).content.decode())
    assert found, f"{url} has no CSRF token"
    return found.group(1)


def post(client: Client, url: str, data: dict[str, str], page: str = JOBS_URL) -> Any:
    return client.post(url, {**data, "csrfmiddlewaretoken": token(client, page)})


def messages(page: str, level: str) -> list[str]:
    return [html.unescape(m) for m in re.findall(rf'<li class="{level}">(.*?)</li>', page, re.S)]


def row(page: str, job: str) -> str:
    at = page.index(f'data-job="{job}"')
    start = page.rfind("<tr", 0, at)
    return page[start : page.index("</tr>", at)]


def minute_floor(ms: int) -> int:
    return ms - ms % 60_000


# --- pause and resume -----------------------------------------------------------------


def test_without_the_permission_there_is_no_pause_button_and_a_forged_post_is_refused(
    viewer: Client,
) -> None:
    jobs_page = viewer.get(JOBS_URL).content.decode()
    assert "Pause…" not in jobs_page and PAUSE_URL not in jobs_page
    job_page = viewer.get(page_url("reports.daily")).content.decode()
    assert PAUSE_URL not in job_page and 'id="anarchon-pause-form"' not in job_page
    for url in (PAUSE_URL, RESUME_URL):
        response = post(viewer, url, {"scheduler": "default", "job": "reports.daily"})
        assert response.status_code == 403, url
    assert schedulers["default"].pauses() == {}


def test_a_pause_without_the_csrf_token_is_refused(pauser: Client) -> None:
    response = pauser.post(PAUSE_URL, {"scheduler": "default", "job": "reports.daily"})
    assert response.status_code == 403
    assert b"CSRF" in response.content
    assert schedulers["default"].pauses() == {}
    assert pauser.get(PAUSE_URL).status_code == 405


def test_a_pause_with_a_note_shows_on_the_jobs_page_until_resumed(pauser: Client) -> None:
    response = post(pauser, PAUSE_URL, {
        "scheduler": "default", "job": "reports.daily", "note": "deploy <4.2> & db move",
        "duration": "2h",
    })
    assert response.status_code == 302 and response["Location"] == JOBS_URL
    state = schedulers["default"].pauses()["reports.daily"]
    assert (state.note, state.by) == ("deploy <4.2> & db move", "pauser")
    assert state.until is not None and abs(state.until - state.at - 7_200_000) < 1000
    page = pauser.get(JOBS_URL).content.decode()
    (message,) = messages(page, "success")
    until = anarchon_admin.format_when(ms_to_datetime(state.until))
    assert message == ("Paused: reports.daily skips its slots on every instance of scheduler "
                       f"'default' until {until}.")
    daily = row(page, "reports.daily")
    assert "anarchon-is-paused" in daily and 'class="anarchon-status anarchon-paused"' in daily
    assert "by pauser" in daily and f"until {until}" in daily
    assert re.search(r"(just now|\d+ seconds? ago)", daily)
    assert "deploy &lt;4.2&gt; &amp; db move" in daily  # the note, escaped
    assert 'aria-label="Resume reports.daily"' in daily and "Pause…" not in daily
    flaky = row(page, "reports.flaky")
    assert "anarchon-paused" not in flaky and 'aria-label="Pause reports.flaky…"' in flaky
    # The per-job page says it too, and offers Resume instead of the pause form.
    job_page = pauser.get(page_url("reports.daily")).content.decode()
    assert 'data-paused="yes"' in job_page and "deploy &lt;4.2&gt; &amp; db move" in job_page
    assert 'id="anarchon-pause-form"' not in job_page and RESUME_URL in job_page

    response = post(pauser, RESUME_URL, {"scheduler": "default", "job": "reports.daily",
                                          "next": "job"})
    assert response.status_code == 302 and response["Location"] == page_url("reports.daily")
    assert schedulers["default"].pauses() == {}
    job_page = pauser.get(response["Location"]).content.decode()
    (message,) = messages(job_page, "success")
    assert message.startswith("Resumed: reports.daily runs again from its next slot (paused by "
                              "pauser, ")
    assert 'data-paused="no"' in job_page and 'id="anarchon-pause-form"' in job_page
    assert "anarchon-is-paused" not in row(pauser.get(JOBS_URL).content.decode(), "reports.daily")
    post(pauser, RESUME_URL, {"scheduler": "default", "job": "reports.daily"})
    assert messages(pauser.get(JOBS_URL).content.decode(), "info") == [
        "Not paused: reports.daily was not paused."]


def test_a_pause_until_a_local_time_is_read_in_the_current_time_zone(pauser: Client) -> None:
    with override_settings(TIME_ZONE="Europe/Athens"):  # (new schedulers, in and out)
        post(pauser, PAUSE_URL, {"scheduler": "default", "job": "reports.daily",
                                 "until": "2099-07-01T10:30", "next": "job"})
        page = pauser.get(page_url("reports.daily")).content.decode()
        state = schedulers["default"].pauses()["reports.daily"]
    assert state.until == int(datetime(2099, 7, 1, 10, 30, tzinfo=ZoneInfo("Europe/Athens"))
                              .timestamp() * 1000)
    assert "until 2099-07-01 10:30:00 EEST" in page and state.note == ""


def test_a_pause_until_a_time_a_clock_change_skips_is_refused(pauser: Client) -> None:
    """03:30 on 2099-03-29 never happens in Athens (the clocks go from 03:00 to 04:00)."""
    with override_settings(TIME_ZONE="Europe/Athens"):
        post(pauser, PAUSE_URL, {"scheduler": "default", "job": "reports.daily",
                                 "until": "2099-03-29T03:30"})
        (message,) = messages(pauser.get(JOBS_URL).content.decode(), "error")
        assert message.startswith("Pause of reports.daily refused: until: 2099-03-29 03:30:00 "
                                  "couldn\u2019t be interpreted in time zone Europe/Athens"), message
        assert schedulers["default"].pauses() == {}


@pytest.mark.parametrize(("fields", "says"), [
    ({"until": "2001-01-01T00:00"},
     "until = 2001-01-01 00:00:00 UTC: is not in the future (2001-01-01T00:00:00+00:00)"),
    ({"duration": "soon"}, "until = 'soon'"),
    ({"until": "next tuesday"}, "until: Enter a valid date/time."),
    ({"until": "2099-01-01T00:00", "duration": "1h"}, "give an end time or a duration, not both"),
], ids=["past", "bad-duration", "bad-time", "both"])
def test_a_refused_pause_says_why_in_one_line(pauser: Client, fields: dict[str, str], says: str
                                              ) -> None:
    response = post(pauser, PAUSE_URL, {"scheduler": "default", "job": "reports.daily",
                                        "next": "job", **fields})
    assert response.status_code == 302
    page = pauser.get(response["Location"]).content.decode()
    (message,) = messages(page, "error")
    assert message.startswith("Pause of reports.daily refused: ") and says in message, message
    assert "\n" not in message and "Traceback" not in message
    assert schedulers["default"].pauses() == {}


def test_a_store_that_fails_or_hangs_on_a_pause_is_said_in_one_redacted_line(
    pauser: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def down(self: MemoryRunStore, *args: Any) -> PauseState:
        raise ConnectionError("redis://ops:hunter2@cache:6379 refused\nTraceback: x")

    monkeypatch.setattr(MemoryRunStore, "pause", down)
    post(pauser, PAUSE_URL, {"scheduler": "default", "job": "reports.daily", "note": "x"})
    page = pauser.get(JOBS_URL).content.decode()
    assert messages(page, "error") == [
        "Pause of reports.daily refused: ConnectionError: redis://ops:***@cache:6379 refused "
        "Traceback: x"]
    assert "hunter2" not in page

    async def hangs(self: MemoryRunStore, *args: Any) -> PauseState:
        await asyncio.sleep(2)
        raise AssertionError("the admin waited for it")

    monkeypatch.setattr(MemoryRunStore, "pause", hangs)
    monkeypatch.setattr(admin_actions, "ACTION_TIMEOUT_S", 0.2)
    started = time.monotonic()
    post(pauser, PAUSE_URL, {"scheduler": "default", "job": "reports.daily"})
    assert time.monotonic() - started < 1.5
    assert messages(pauser.get(JOBS_URL).content.decode(), "warning") == [
        "Pause of reports.daily not confirmed: the store did not answer within 0.2s; reload "
        "the page to see whether it took effect"]


def test_a_store_without_a_ledger_offers_no_pause_and_refuses_one(pauser: Client) -> None:
    page = pauser.get(JOBS_URL).content.decode()
    assert "Pause…" not in row(page, "legacy.sync")
    job_page = pauser.get(page_url("legacy.sync", "claimonly")).content.decode()
    assert "keeps no ledger" in job_page and 'id="anarchon-pause-form"' not in job_page
    assert 'id="anarchon-backfill"' not in job_page
    post(pauser, PAUSE_URL, {"scheduler": "claimonly", "job": "legacy.sync"})
    (message,) = messages(pauser.get(JOBS_URL).content.decode(), "error")
    assert message.startswith("Pause of legacy.sync refused: pause needs a store with leases")


def test_a_pause_of_an_unknown_job_or_scheduler_is_refused(pauser: Client) -> None:
    post(pauser, PAUSE_URL, {"scheduler": "default", "job": "mail.digest"})
    assert messages(pauser.get(JOBS_URL).content.decode(), "error") == [
        "Scheduler 'default' has no job 'mail.digest'."]
    post(pauser, PAUSE_URL, {"scheduler": "nightly", "job": "reports.daily"})
    assert messages(pauser.get(JOBS_URL).content.decode(), "error") == [
        "There is no scheduler 'nightly'."]


def test_the_jobs_page_reads_the_pauses_once_per_scheduler(
    viewer: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One ``pauses()`` per scheduler, and each row's job looked up once by the page."""
    schedulers["default"].pause("reports.flaky", note="flaky upstream", by="ops")
    reads: list[tuple[int, tuple[str, ...]]] = []
    original = MemoryRunStore.pauses

    async def counted(self: MemoryRunStore, jobs: Sequence[str]) -> dict[str, PauseState]:
        reads.append((id(self), tuple(jobs)))
        return await original(self, jobs)

    lookups: list[str] = []
    get_job = Scheduler.get_job

    def counted_get_job(self: Scheduler, name: str) -> Any:
        if sys._getframe(1).f_globals["__name__"].startswith("django_anarchon.admin"):
            lookups.append(name)
        return get_job(self, name)

    monkeypatch.setattr(MemoryRunStore, "pauses", counted)
    monkeypatch.setattr(Scheduler, "get_job", counted_get_job)
    page = viewer.get(JOBS_URL).content.decode()
    stores = {id(schedulers[alias].backend.runs): alias for alias in ("default", "slow")}
    by_store = sorted(stores[store] for store, _ in reads if store in stores)
    assert by_store == ["default", "slow"], reads
    (default_jobs,) = [jobs for store, jobs in reads if stores.get(store) == "default"]
    assert set(default_jobs) == {"reports.daily", "reports.flaky", MINUTELY}
    assert sorted(lookups) == sorted(
        ["reports.daily", "reports.flaky", MINUTELY, "mail.digest", "legacy.sync"])
    assert "flaky upstream" in row(page, "reports.flaky")
    # within the cache's few seconds, a second page load reads nothing again
    viewer.get(JOBS_URL)
    assert len(reads) == 2


def test_a_slow_pauses_read_does_not_hang_the_page(
    pauser: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(admin_jobs, "READ_TIMEOUT_S", 0.3)
    SlowPausesStore.delay_s = 2.0
    started = time.monotonic()
    response = pauser.get(JOBS_URL)
    elapsed = time.monotonic() - started
    assert response.status_code == 200 and elapsed < 1.5, elapsed
    page = response.content.decode()
    section = page[page.index('id="scheduler-slow"'):]
    section = section[: section.index("</table>")]
    assert "Pauses unknown: the store did not answer in time" in section
    assert "Pause…" not in row(section, "mail.digest")  # not offered while unknown
    assert "Pauses unknown" not in page[page.index('id="scheduler-default"'):
                                        page.index('id="scheduler-slow"')]


def test_a_failing_pauses_read_is_shown_redacted(
    viewer: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def down(self: MemoryRunStore, jobs: Sequence[str]) -> dict[str, PauseState]:
        raise ConnectionError("redis://ops:hunter2@cache:6379 refused the connection")

    monkeypatch.setattr(SlowPausesStore, "pauses", down)
    page = viewer.get(JOBS_URL).content.decode()
    assert "Pauses unknown: ConnectionError: redis://ops:***@cache:6379" in page
    assert "hunter2" not in page


# --- the timeline ---------------------------------------------------------------------


CELL = re.compile(
    r'<(?:a|span) class="anarchon-slot ([^"]+)" style="left:([\d.]+)%;width:([\d.]+)%" '
    r'title="([^"]+)" data-fate="(\w+)" data-count="(\d+)"(?: href="([^"]+)")?'
)


def write_ledger(job: str = MINUTELY) -> int:
    """Eight minutes of a minutely job: ran, failed, skipped, 3 missed, ran, paused.

    The first slot, 20 minutes ago.
    """
    scheduler = schedulers["default"]
    backend = scheduler.backend
    runs = backend.runs
    base = minute_floor(int(time.time() * 1000)) - 20 * 60_000

    def ran(slot: int, status: str, by: str, error: str | None = None) -> None:
        result = StoredResult(slot=slot, by=by, attempt=1, status=status,  # type: ignore[arg-type]
                              started_at=slot + 40, finished_at=slot + 120, duration_ms=80,
                              error=error)
        async_to_sync(backend.save_result)(job, result, 100)

    ran(base, "success", "web-1")
    ran(base + 60_000, "failed", "web-2", "RuntimeError: the report server said no\n  File x")
    async_to_sync(runs.mark_skipped)(job, base + 120_000, "overlap", "web-1", 100, None)
    async_to_sync(runs.mark_missed)(
        job, [(base + 180_000, base + 300_000, 3)], "web-3", 100, None)
    ran(base + 360_000, "success", "web-1")
    async_to_sync(runs.mark_skipped)(job, base + 420_000, "paused", "web-2", 100, None)
    return base


def cells(page: str) -> list[dict[str, Any]]:
    found = [
        {"css": css, "left": float(left), "width": float(width), "title": html.unescape(title),
         "fate": fate, "count": int(count), "href": html.unescape(href) if href else None}
        for css, left, width, title, fate, count, href in CELL.findall(page)
    ]
    assert found, "no timeline cells on the page"
    return found


def test_the_timeline_shows_every_fate_on_a_time_axis(viewer: Client) -> None:
    base = write_ledger()
    page = viewer.get(page_url(MINUTELY, span="1h")).content.decode()
    found = cells(page)
    assert [c["fate"] for c in found] == ["ran", "ran", "skipped", "missed", "ran", "skipped"]
    ok_cell, failed, overlap, missed, _later, paused = found
    assert "anarchon-success" in ok_cell["css"] and "anarchon-failed" in failed["css"]
    assert "anarchon-fate-skipped" in overlap["css"] and "anarchon-fate-missed" in missed["css"]
    when = anarchon_admin.format_when
    assert ok_cell["title"].startswith(f"{when(ms_to_datetime(base))} · ran · success")
    assert "web-1" in ok_cell["title"]
    assert "RuntimeError: the report server said no" in failed["title"]
    assert "skipped: overlap · the previous run was still going · noted by web-1" in (
        overlap["title"])
    assert "skipped: paused · the job was paused" in paused["title"]
    assert missed["count"] == 3 and missed["title"] == (
        f"{when(ms_to_datetime(base + 180_000))} to {when(ms_to_datetime(base + 300_000))}"
        " · 3 slots missed · nobody claimed them · noted by web-3")
    # On the axis, from the oldest entry to now: each slot as wide as its minute, a
    # missed range as wide as its three, consecutive slots touching, and the 12 minutes
    # since the last slot empty track.
    minute = ok_cell["width"]
    assert 100 / 21 < minute <= 100 / 20 and ok_cell["left"] == 0
    assert all(c["width"] == pytest.approx(minute, abs=0.01) for c in found if c is not missed)
    assert missed["width"] == pytest.approx(3 * minute, abs=0.01)
    for one, two in itertools.pairwise(found):
        assert one["left"] + one["width"] == pytest.approx(two["left"], abs=0.01)
    assert paused["left"] + paused["width"] == pytest.approx(8 * minute, abs=0.01)
    assert f"Since {when(ms_to_datetime(base))}: 3 slots ran, 2 skipped, 3 missed." in page
    # The compact table below: one row per entry, newest first.
    table = page[page.index('id="anarchon-ledger"'):]
    table = table[: table.index("</table>")]
    fates = re.findall(r'class="anarchon-ledger-row" data-fate="(\w+)"', table)
    assert fates == ["skipped", "ran", "missed", "skipped", "ran", "ran"]
    assert "3 slots missed" in table and "skipped: overlap" in table
    # A viewer cannot backfill: the cells link nowhere.
    assert all(c["href"] is None for c in found)
    # A slot missed 23 hours ago: outside the last hour, at the left edge of the last 24
    # hours, the recent slots at the right edge (as narrow as a cell gets), nothing between.
    async_to_sync(schedulers["default"].backend.runs.mark_missed)(
        MINUTELY, [(base - 23 * 3_600_000, base - 23 * 3_600_000, 1)], "web-3", 100, None)
    assert [c["fate"] for c in cells(viewer.get(page_url(MINUTELY, span="1h")).content.decode())
            ] == [c["fate"] for c in found]
    day = cells(viewer.get(page_url(MINUTELY)).content.decode())
    assert [c["fate"] for c in day] == ["missed", *(c["fate"] for c in found)]
    assert day[0]["left"] == 0 and day[1]["left"] > 98
    assert {c["width"] for c in day if c["count"] == 1} == {MIN_WIDTH}


def test_a_busy_job_shows_its_newest_entries(viewer: Client) -> None:
    every("5s", name="shop.heartbeat")(ok)
    with override_settings(ANARCHON=SCHEDULERS):
        backend = schedulers["default"].backend
        now = int(time.time() * 1000)
        last = now - now % 5000 - 5000
        for index in range(130):
            slot = last - index * 5000
            async_to_sync(backend.save_result)("shop.heartbeat", StoredResult(
                slot=slot, by="web-1", attempt=1, status="success", started_at=slot,
                finished_at=slot + 10, duration_ms=10), 200)
        page = viewer.get(page_url("shop.heartbeat")).content.decode()
    found = cells(page)
    assert len(found) == 100
    assert found[0]["left"] == pytest.approx(0, abs=0.01)  # the window starts at the oldest
    assert "(the newest 100 entries)" in page


def test_skipped_and_missed_cells_fill_the_backfill_form(filler: Client) -> None:
    base = write_ledger()
    found = cells(filler.get(page_url(MINUTELY, span="1h")).content.decode())
    assert [c["href"] is not None for c in found] == [False, False, True, True, False, True]
    missed = found[3]
    page = filler.get(missed["href"]).content.decode()
    start = datetime.fromtimestamp((base + 180_000) / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    end = datetime.fromtimestamp((base + 300_000) / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    assert f'name="start" step="1" value="{start}"' in page
    assert f'name="end" step="1" value="{end}"' in page
    assert "#anarchon-backfill" in missed["href"] and "span=1h" in missed["href"]


def test_a_ledger_read_that_fails_is_said_and_the_rest_of_the_page_stands(
    viewer: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_ledger()

    async def down(self: MemoryRunStore, *args: Any) -> list[Any]:
        raise ConnectionError("nats://s3cr3t-token@nats:4222 is gone")

    monkeypatch.setattr(MemoryRunStore, "marks", down)
    page = viewer.get(page_url(MINUTELY)).content.decode()
    assert "Ledger unavailable: ConnectionError: nats://***@nats:4222 is gone" in page
    assert "s3cr3t" not in page
    assert 'id="anarchon-history"' in page and "anarchon-status anarchon-failed" in page


# --- backfill -------------------------------------------------------------------------


def local(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S")


def test_without_the_permission_there_is_no_backfill_form_and_a_post_is_refused(
    pauser: Client,
) -> None:
    base = write_ledger()
    page = pauser.get(page_url(MINUTELY)).content.decode()
    assert 'id="anarchon-backfill-form"' not in page and BACKFILL_URL not in page
    data = {"scheduler": "default", "job": MINUTELY, "start": local(base),
            "end": local(base + 420_000), "max": "100", "overlap": "skip", "file": "Backfill"}
    assert post(pauser, BACKFILL_URL, data).status_code == 403
    assert not BackfillRequest.objects.exists()


def test_a_backfill_without_the_csrf_token_is_refused(filler: Client) -> None:
    base = write_ledger()
    response = filler.post(BACKFILL_URL, {
        "scheduler": "default", "job": MINUTELY, "start": local(base),
        "end": local(base + 420_000), "file": "Backfill"})
    assert response.status_code == 403 and b"CSRF" in response.content
    assert not BackfillRequest.objects.exists()
    assert filler.get(BACKFILL_URL).status_code == 405


def test_a_dry_run_lists_the_slots_it_would_run(filler: Client) -> None:
    base = write_ledger()
    response = post(filler, BACKFILL_URL, {
        "scheduler": "default", "job": MINUTELY, "start": local(base),
        "end": local(base + 420_000), "max": "100", "overlap": "skip", "dry_run": "Dry run",
        "span": "1h"}, page=page_url(MINUTELY))
    assert response.status_code == 200
    page = response.content.decode()
    (message,) = messages(page, "info")
    assert message == (f"Dry run: a backfill of {MINUTELY} would run 5 slots (3 of the range "
                       "ran already). Nothing was filed.")
    plan = page[page.index('id="anarchon-plan"'):]
    plan = plan[: plan.index("</div>")]
    listed = re.findall(r'<li class="anarchon-when">([^<]+)</li>', plan)
    expected = [base + 120_000, base + 180_000, base + 240_000, base + 300_000, base + 420_000]
    assert listed == [anarchon_admin.format_when(ms_to_datetime(s)) for s in expected]
    # the form keeps what was typed, and the timeline its window
    assert f'value="{local(base)}"' in page and "<strong>1h</strong>" in page
    assert not BackfillRequest.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_backfill_files_a_request_the_page_follows(filler: Client) -> None:
    base = write_ledger()
    response = post(filler, BACKFILL_URL, {
        "scheduler": "default", "job": MINUTELY, "start": local(base + 120_000),
        "end": local(base + 300_000), "max": "10", "overlap": "allow", "file": "Backfill"})
    assert response.status_code == 302 and response["Location"] == page_url(MINUTELY)
    request = BackfillRequest.objects.get()
    assert (request.scheduler, request.job, request.requested_by, request.overlap) == (
        "default", MINUTELY, "filler", "allow")
    assert request.slots == [base + 120_000, base + 180_000, base + 240_000, base + 300_000]
    page = filler.get(response["Location"]).content.decode()
    (message,) = messages(page, "success")
    assert message == (f"Backfill filed: request #{request.pk}, 4 slots of {MINUTELY}; a worker "
                       "of scheduler 'default' runs them one at a time, oldest first.")
    listed = page[page.index(f'data-request="{request.pk}"'):]
    listed = listed[: listed.index("</tr>")]
    assert "filler" in listed and "0/4" in listed and "waiting for a worker" in listed
    BackfillRequest.objects.filter(pk=request.pk).update(
        done=2, claimed_by="worker-7", claimed_at=datetime.now(UTC))
    listed = filler.get(page_url(MINUTELY)).content.decode()
    assert re.search(rf'data-request="{request.pk}".*?2/4.*?running on worker-7 \(last noted ', listed, re.S)
    BackfillRequest.objects.filter(pk=request.pk).update(done=4, finished_at=datetime.now(UTC))
    listed = filler.get(page_url(MINUTELY)).content.decode()
    assert re.search(rf'data-request="{request.pk}".*?4/4.*?finished 20', listed, re.S)


@pytest.mark.parametrize(("fields", "says"), [
    ({"end": "+1h"}, "to = {end}: the range ends in the future"),
    ({"max": "2"}, "max = 2: the range holds 5 slots that never ran, more than max=2"),
    ({"start": "yesterday"}, "from: Enter a valid date/time."),
    ({"max": "0"}, "max: Ensure this value is greater than or equal to 1."),
    ({"end": "-30m"}, "to = {end}: the range ends ({iso}) before it starts"),
], ids=["future", "over-max", "bad-time", "zero-max", "reversed"])
def test_a_refused_backfill_says_why_in_one_line(filler: Client, fields: dict[str, str],
                                                 says: str) -> None:
    base = write_ledger()
    data = {"scheduler": "default", "job": MINUTELY, "start": local(base),
            "end": local(base + 420_000), "max": "100", "overlap": "skip", "file": "Backfill"}
    data.update(fields)
    end_ms = None
    if data["end"].startswith(("+", "-")):
        sign = 1 if data["end"][0] == "+" else -1
        delta = timedelta(hours=1) if data["end"].endswith("h") else timedelta(minutes=30)
        end_ms = base + sign * int(delta.total_seconds() * 1000)
        if sign > 0:
            end_ms = minute_floor(int(time.time() * 1000)) + 3_600_000
        data["end"] = local(end_ms)
    response = post(filler, BACKFILL_URL, data, page=page_url(MINUTELY))
    assert response.status_code == 200
    page = response.content.decode()
    (message,) = messages(page, "error")
    if end_ms is not None:
        from django_anarchon.logtime import iso

        says = says.format(end=anarchon_admin.format_when(ms_to_datetime(end_ms)),
                           iso=iso(end_ms))
    assert message.startswith(f"Backfill of {MINUTELY} refused: ") and says in message, message
    assert "\n" not in message and "Traceback" not in message
    assert not BackfillRequest.objects.exists()


def test_a_paused_job_is_not_backfilled(filler: Client) -> None:
    base = write_ledger()
    schedulers["default"].pause(MINUTELY, by="ops")
    response = post(filler, BACKFILL_URL, {
        "scheduler": "default", "job": MINUTELY, "start": local(base),
        "end": local(base + 420_000), "dry_run": "Dry run"}, page=page_url(MINUTELY))
    (message,) = messages(response.content.decode(), "error")
    assert message == f"Backfill of {MINUTELY} refused: is paused: resume it before a backfill"


def test_the_backfill_requests_admin_lists_them(filler: Client) -> None:
    request = BackfillRequest.objects.create(
        scheduler="default", job=MINUTELY, start_ms=1_800_000_000_000,
        end_ms=1_800_000_180_000, slots=[1_800_000_000_000 + i * 60_000 for i in range(4)],
        requested_by="filler", done=1)
    superuser = Client()
    from django.contrib.auth.models import User

    superuser.force_login(User.objects.create_superuser("root"))
    page = superuser.get("/admin/django_anarchon/backfillrequest/").content.decode()
    assert "1/4 (25%)" in page and "waiting for a worker" in page and "filler" in page
    detail = superuser.get(
        f"/admin/django_anarchon/backfillrequest/{request.pk}/change/").content.decode()
    assert "2027-01-15 08:00:00 UTC" in detail and 'name="_save"' not in detail
    # the job's page links each request to it for users who may view them
    assert f"/admin/django_anarchon/backfillrequest/{request.pk}/change/" in superuser.get(
        page_url(MINUTELY)).content.decode()
    assert "/admin/django_anarchon/backfillrequest/" not in filler.get(
        page_url(MINUTELY)).content.decode()
