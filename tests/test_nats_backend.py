"""NatsBackend beyond the contract: names, the read-back path, lost answers, loops, options."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator

import pytest

from django_anarchon.backends.base import ClaimInput, JobLimits
from django_anarchon.backends.nats import NatsBackend
from django_anarchon.exceptions import ConfigurationError

from .broker_support import (
    CuttingProxy,
    closed_port,
    delete_nats_streams,
    init_fails_in_time,
    nats_url,
    race_one_shared_backend,
)

pytestmark = pytest.mark.nats

TRICKY_NAMES = [
    "billing.reconcile", "billing reconcile", "billing_reconcile", "billing-reconcile",
    "billing.*", "billing.>", "billing.#", "*", ">", "#", ".", "..", " ", "a.b.c",
    "Ωμέγα.αναφορά", "ωμέγα.αναφορά", "Ωμεγα.αναφορα", "報告", "e\u0301", "\u00e9",
    "tab\there", "new\nline", "x" * 300,
]


def _input(job: str, slot: int, token: str, instance: str = "A") -> ClaimInput:
    return ClaimInput(job=job, slot=slot, token=token, instance_id=instance)


@pytest.fixture
async def names() -> AsyncIterator[tuple[str, str, str]]:
    url = nats_url()
    tag = uuid.uuid4().hex[:8]
    yield url, f"ANTESTB{tag}", f"antestb{tag}"
    await delete_nats_streams(url, f"ANTESTB{tag}")


def _backend(names: tuple[str, str, str], **options: object) -> NatsBackend:
    url, stream_prefix, subject_prefix = names
    options.setdefault("url", url)
    return NatsBackend(stream_prefix=stream_prefix, subject_prefix=subject_prefix, **options)  # type: ignore[arg-type]


async def test_tricky_job_names_never_collide_and_route(names: tuple[str, str, str]) -> None:
    backend = _backend(names)
    try:
        await backend.init()
        slot = int(time.time() * 1000)
        for job in TRICKY_NAMES:
            await backend.prepare_job(job, 5)
        # Every name has its own claim: the first token wins each, a second loses each.
        for job in TRICKY_NAMES:
            assert await backend.claim(_input(job, slot, f"first-{job}")) is True, job
        for job in TRICKY_NAMES:
            assert await backend.claim(_input(job, slot, "second")) is False, job
            assert await backend.claim(_input(job, slot, f"first-{job}")) is True, job
        # Histories do not leak into each other either (wildcards, dots, accents).
        for i, job in enumerate(TRICKY_NAMES):
            await backend.record_claim(_input(job, slot + i, f"h-{i}", instance=f"I{i}"))
        for i, job in enumerate(TRICKY_NAMES):
            records = await backend.history(job, 10)
            assert [(r.slot, r.instance_id) for r in records] == [(slot + i, f"I{i}")], job
    finally:
        await backend.close()


async def test_read_back_when_the_duplicate_window_is_over(names: tuple[str, str, str]) -> None:
    """A holder stored without our Msg-Id (as after the duplicate window): compare tokens."""
    import nats

    backend = _backend(names)
    nc = await nats.connect(names[0])
    try:
        await backend.init()
        job, slot = "read-back", int(time.time() * 1000)
        holder = {"v": 1, "token": "tok-a", "by": "A", "at": slot}
        await nc.jetstream().publish(
            backend.claim_subject(job, slot), json.dumps(holder).encode(),
            stream=backend.claims_stream,
        )
        assert await backend.claim(_input(job, slot, "tok-a")) is True
        assert await backend.claim(_input(job, slot, "tok-b", "B")) is False
    finally:
        await nc.close()
        await backend.close()


async def test_answer_lost_between_publish_and_ack(names: tuple[str, str, str]) -> None:
    """The server stores the claim, the client never hears; its retry still wins, alone."""
    import nats

    url = names[0]
    proxy = await CuttingProxy("127.0.0.1", 4222).start()
    winner = _backend(names, url=f"nats://127.0.0.1:{proxy.port}", timeout="1s", retry_for="20s")
    rival = _backend(names)
    nc = await nats.connect(url)
    try:
        await winner.init()
        await rival.init()
        job, slot = "cut", int(time.time() * 1000)
        subject = winner.claim_subject(job, slot)
        proxy.swallow()
        claim = asyncio.create_task(winner.claim(_input(job, slot, "tok-winner")))
        deadline = time.monotonic() + 10
        while True:  # until the server has stored the claim the client cannot hear about
            try:
                held = await nc.jetstream().get_last_msg(winner.claims_stream, subject)
                break
            except nats.js.errors.NotFoundError:
                assert time.monotonic() < deadline, "the claim never reached the server"
                await asyncio.sleep(0.02)
        assert json.loads(held.data or b"{}")["token"] == "tok-winner"
        assert not claim.done()
        assert await rival.claim(_input(job, slot, "tok-rival", "B")) is False
        await proxy.cut()
        assert await asyncio.wait_for(claim, 30) is True
        assert await rival.claim(_input(job, slot, "tok-rival", "B")) is False
        assert await winner.claim(_input(job, slot, "tok-winner")) is True
    finally:
        await nc.close()
        await winner.close()
        await rival.close()
        await proxy.close()


def test_one_backend_many_loops_and_threads(names: tuple[str, str, str]) -> None:
    """Sync twins run each call on a new loop, maybe in several threads: one backend serves all."""
    backend = _backend(names)
    job, slot = "loops", int(time.time() * 1000)
    asyncio.run(backend.init())
    assert asyncio.run(backend.claim(_input(job, slot, "t0"))) is True
    assert asyncio.run(backend.claim(_input(job, slot, "t1"))) is False
    answers: list[bool] = []
    lock = threading.Lock()

    def claimer(i: int) -> None:
        won = asyncio.run(backend.claim(_input(job, slot + 1, f"thread-{i}")))
        with lock:
            answers.append(won)

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(answers) == [False] * 7 + [True]
    asyncio.run(backend.close())


async def test_given_connection_is_used_and_left_open(names: tuple[str, str, str]) -> None:
    import nats

    nc = await nats.connect(names[0])
    try:
        backend = _backend(names, url=None, connection=nc)
        await backend.init()
        assert await backend.claim(_input("given", 1_000, "t")) is True
        await backend.close()
        assert nc.is_connected
    finally:
        await nc.close()


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({"dedupe_window": "soon"}, "dedupe_window"),
        ({"dedupe_window": 0}, "dedupe_window"),
        ({"stream_prefix": "A.B"}, "stream_prefix"),
        ({"subject_prefix": "a.*"}, "subject_prefix"),
        ({"storage": "disk"}, "storage"),
        ({"replicas": 0}, "replicas"),
        ({"servers": []}, "servers"),
        ({"servers": "nats://x", "url": "nats://y"}, "url"),
    ],
)
def test_bad_options_name_the_option(options: dict[str, object], option: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        NatsBackend(**options)  # type: ignore[arg-type]
    assert info.value.option == option
    assert repr(info.value.value) in str(info.value)


def test_check_job_refuses_what_the_window_cannot_cover() -> None:
    backend = NatsBackend(dedupe_window="2m")
    assert backend.dedupe_window_ms == 120_000
    backend.check_job(JobLimits("fits", 30_000, 60_000, 10_000, 100))
    with pytest.raises(ConfigurationError) as info:
        backend.check_job(JobLimits("too-late", 30_000, 90_000, 10_000, 100))
    assert (info.value.job, info.value.option, info.value.value) == ("too-late", "max_late", 90_000)


def test_missing_client_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "nats", None)
    with pytest.raises(ConfigurationError, match=r"django-anarchon\[nats\]"):
        NatsBackend()


def test_lease_options_are_refused_naming_the_job() -> None:
    from django_anarchon.engine import Scheduler

    scheduler = Scheduler(NatsBackend(), instance_id="A")
    assert scheduler.backend.runs is None
    with pytest.raises(ConfigurationError) as info:
        scheduler.every("needs-leases", "1m", lambda ctx: None, max_attempts=3)
    assert info.value.job == "needs-leases" or "needs-leases" in str(info.value)
    assert "max_attempts" in str(info.value)


def test_describe_hides_the_password() -> None:
    text = NatsBackend(servers=["nats://user:secret@10.0.0.1:4222", "nats://10.0.0.2:4222"]).describe()
    assert "secret" not in text
    assert "nats://user:***@10.0.0.1:4222" in text and "10.0.0.2" in text


def test_job_keys_are_distinct_safe_and_stable() -> None:
    import re

    from django_anarchon.backends.naming import job_key

    keys = [job_key(name) for name in TRICKY_NAMES]
    assert len(set(keys)) == len(keys), keys
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{1,40}-[0-9a-f]{16}", key) for key in keys), keys
    assert job_key("billing.reconcile").startswith("billing_reconcile-")
    assert job_key("Ωμέγα.αναφορά") != job_key("ωμέγα.αναφορά")
    assert job_key("café") == job_key("café")  # the same name always maps the same way
    assert job_key("cafe\u0301") != job_key("caf\u00e9")  # the exact name, not a look-alike


async def test_fifty_claimers_share_one_backend_object(names: tuple[str, str, str]) -> None:
    """One connection, many coroutines: exactly one winner per slot, no retry to hide behind."""
    backend = _backend(names, retry_for="0s")
    try:
        await race_one_shared_backend(backend, claimers=50, rounds=40)
    finally:
        await backend.close()


@pytest.mark.parametrize(
    ("userinfo", "shown", "timeout_option", "within"),
    [("user:s3cret@", "user:***@", "1s", 4.0), ("s3cret@", "***@", "5s", 8.0), ("", "", "1s", 4.0)],
)
async def test_init_fails_in_time_when_nothing_listens(
    userinfo: str, shown: str, timeout_option: str, within: float
) -> None:
    """nats-py retries a first connect forever when it may reconnect: init() must not hang."""
    port = closed_port()
    backend = NatsBackend(url=f"nats://{userinfo}127.0.0.1:{port}", timeout=timeout_option, retry_for="1s")
    text = await init_fails_in_time(backend, within)
    assert f"nats://{shown}127.0.0.1:{port}" in text
    assert "s3cret" not in text


def test_describe_hides_a_token() -> None:
    text = NatsBackend("nats://s3cret@10.0.0.1:4222").describe()
    assert "s3cret" not in text
    assert "nats://***@10.0.0.1:4222" in text
