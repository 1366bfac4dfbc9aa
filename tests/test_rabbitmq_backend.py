"""RabbitMQBackend beyond the contract: names, a lost declare-ok, loops, options, self-check."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from django_anarchon.backends.base import ClaimInput, JobLimits
from django_anarchon.backends.rabbitmq import RabbitMQBackend
from django_anarchon.exceptions import ConfigurationError

from .broker_support import (
    CuttingProxy,
    closed_port,
    delete_queues,
    init_fails_in_time,
    rabbitmq_url,
    race_one_shared_backend,
)
from .test_nats_backend import TRICKY_NAMES

pytestmark = pytest.mark.rabbitmq


def _input(job: str, slot: int, token: str, instance: str = "A") -> ClaimInput:
    return ClaimInput(job=job, slot=slot, token=token, instance_id=instance)


@pytest.fixture(scope="module")
def prefix() -> Iterator[tuple[str, str]]:
    url = rabbitmq_url()
    name = f"antestb-{uuid.uuid4().hex[:8]}"
    yield url, name
    delete_queues(url, f"{name}.history.")


def _backend(prefix: tuple[str, str], **options: object) -> RabbitMQBackend:
    url, name = prefix
    options.setdefault("url", url)
    options.setdefault("dedupe_window", "5m")
    return RabbitMQBackend(prefix=name, **options)  # type: ignore[arg-type]


async def _queue_exists(url: str, name: str) -> bool:
    import aio_pika
    import aiormq.exceptions

    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel()
        try:
            await channel.declare_queue(name, passive=True)
            return True
        except aiormq.exceptions.ChannelNotFoundEntity:
            return False
    finally:
        await connection.close()


async def test_tricky_job_names_never_collide_and_route(prefix: tuple[str, str]) -> None:
    backend = _backend(prefix)
    try:
        await backend.init()
        slot = int(time.time() * 1000)
        names = TRICKY_NAMES[:12] + TRICKY_NAMES[14:]  # keep the history streams few
        for job in names:
            assert await backend.claim(_input(job, slot, f"first-{job}")) is True, job
        for job in names:
            assert await backend.claim(_input(job, slot, "second")) is False, job
            assert await backend.claim(_input(job, slot, f"first-{job}")) is True, job
        for i, job in enumerate(names):
            await backend.record_claim(_input(job, slot + i, f"h-{i}", instance=f"I{i}"))
        for i, job in enumerate(names):
            records = await backend.history(job, 10)
            assert [(r.slot, r.instance_id) for r in records] == [(slot + i, f"I{i}")], job
    finally:
        await backend.close()


async def test_answer_lost_between_declare_and_ok(prefix: tuple[str, str]) -> None:
    """The broker creates the claim queue, the client never hears; its retry wins, alone."""
    url = prefix[0]
    proxy = await CuttingProxy("127.0.0.1", 5672).start()
    winner = _backend(
        prefix, url=f"amqp://guest:guest@127.0.0.1:{proxy.port}/", timeout="2s", retry_for="20s"
    )
    rival = _backend(prefix)
    try:
        await winner.init()
        await rival.init()
        job, slot = "cut", int(time.time() * 1000)
        queue = winner.claim_queue(job, slot)
        proxy.swallow()
        claim = asyncio.create_task(winner.claim(_input(job, slot, "tok-winner")))
        deadline = time.monotonic() + 10
        while not await _queue_exists(url, queue):
            assert time.monotonic() < deadline, "the claim never reached the broker"
            await asyncio.sleep(0.02)
        assert not claim.done()
        assert await rival.claim(_input(job, slot, "tok-rival", "B")) is False
        await proxy.cut()
        assert await asyncio.wait_for(claim, 30) is True
        assert await rival.claim(_input(job, slot, "tok-rival", "B")) is False
        assert await winner.claim(_input(job, slot, "tok-winner")) is True
    finally:
        await winner.close()
        await rival.close()
        await proxy.close()


def test_one_backend_many_loops_and_threads(prefix: tuple[str, str]) -> None:
    backend = _backend(prefix)
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


async def test_given_connection_is_used_and_left_open(prefix: tuple[str, str]) -> None:
    import aio_pika

    connection = await aio_pika.connect(prefix[0])
    try:
        backend = _backend(prefix, url=None, connection=connection)
        await backend.init()
        assert await backend.claim(_input("given", int(time.time() * 1000), "t")) is True
        await backend.close()
        assert not connection.is_closed
    finally:
        await connection.close()


async def test_claim_queue_holds_the_token_and_expires(prefix: tuple[str, str]) -> None:
    """What the broker keeps: a queue per slot that empties itself and goes away."""
    backend = _backend(prefix, dedupe_window="300ms")
    try:
        await backend.init()
        job, slot = "expires", int(time.time() * 1000)
        assert await backend.claim(_input(job, slot, "a")) is True
        assert await _queue_exists(prefix[0], backend.claim_queue(job, slot))
        deadline = time.monotonic() + 15
        # A passive declare counts as a use and renews x-expires: look less often than that.
        while await _queue_exists(prefix[0], backend.claim_queue(job, slot)):
            assert time.monotonic() < deadline, "the claim queue did not expire"
            await asyncio.sleep(0.6)
        # Past the window the slot is forgotten: that is what dedupe_window_ms promises.
        assert await backend.claim(_input(job, slot, "b")) is True
    finally:
        await backend.close()


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({"dedupe_window": "soon"}, "dedupe_window"),
        ({"dedupe_window": "60d"}, "dedupe_window"),
        ({"prefix": "a b"}, "prefix"),
        ({"prefix": "a.#"}, "prefix"),
        ({"url": "redis://x"}, "url"),
        ({"history_max_age": "30 days"}, "history_max_age"),
        ({"url": "amqp://x", "connection": object()}, "url"),
    ],
)
def test_bad_options_name_the_option(options: dict[str, object], option: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        RabbitMQBackend(**options)  # type: ignore[arg-type]
    assert info.value.option == option
    assert repr(info.value.value) in str(info.value)


def test_check_job_refuses_what_the_window_cannot_cover() -> None:
    backend = RabbitMQBackend(dedupe_window="2m")
    assert backend.dedupe_window_ms == 120_000
    backend.check_job(JobLimits("fits", 30_000, 60_000, 10_000, 100))
    with pytest.raises(ConfigurationError) as info:
        backend.check_job(JobLimits("too-late", 30_000, 90_000, 10_000, 100))
    assert (info.value.job, info.value.option, info.value.value) == ("too-late", "max_late", 90_000)


def test_missing_client_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "aio_pika", None)
    with pytest.raises(ConfigurationError, match=r"django-anarchon\[rabbitmq\]"):
        RabbitMQBackend()


def test_lease_options_are_refused_naming_the_job() -> None:
    from django_anarchon.engine import Scheduler

    scheduler = Scheduler(RabbitMQBackend(), instance_id="A")
    assert scheduler.backend.runs is None
    with pytest.raises(ConfigurationError) as info:
        scheduler.every("needs-leases", "1m", lambda ctx: None, max_attempts=3)
    assert info.value.job == "needs-leases" or "needs-leases" in str(info.value)
    assert "max_attempts" in str(info.value)


def test_describe_hides_the_password() -> None:
    text = RabbitMQBackend("amqp://user:secret@10.0.0.1:5672/vhost").describe()
    assert "secret" not in text
    assert "amqp://user:***@10.0.0.1:5672/vhost" in text


async def test_fifty_claimers_share_one_backend_object(prefix: tuple[str, str]) -> None:
    """Lost claims close channels under concurrent claims: the connection must survive it.

    aiormq drops the close-ok of a channel the broker closed when its frame queue is full,
    and the broker then ends the connection ("second 'channel.open' seen"). With no retry,
    any such break fails the race.
    """
    backend = _backend(prefix, retry_for="0s")
    try:
        await race_one_shared_backend(backend, claimers=50, rounds=40)
    finally:
        await backend.close()


@pytest.mark.parametrize(("timeout_option", "retry_for", "within"), [("1s", "1s", 4.0), ("5s", "5s", 8.0)])
async def test_init_fails_in_time_when_nothing_listens(
    timeout_option: str, retry_for: str, within: float
) -> None:
    """A worker started while the broker is down gets a clear error, not a hang."""
    port = closed_port()
    backend = RabbitMQBackend(
        f"amqp://guest:s3cret@127.0.0.1:{port}/", timeout=timeout_option, retry_for=retry_for
    )
    text = await init_fails_in_time(backend, within)
    assert f"amqp://guest:***@127.0.0.1:{port}/" in text
    assert "s3cret" not in text


async def test_a_closed_given_connection_fails_calls_and_stays_closed(prefix: tuple[str, str]) -> None:
    """A connection of the caller's that closed cannot be replaced: calls fail, never hang."""
    import aio_pika

    connection = await aio_pika.connect(prefix[0])
    backend = _backend(prefix, url=None, connection=connection, retry_for="0s")
    await backend.init()
    await connection.close()
    with pytest.raises(ConnectionError, match="given"):
        await asyncio.wait_for(backend.claim(_input("given-closed", 1, "t")), 10)
    await backend.close()
