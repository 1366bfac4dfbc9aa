"""What the Redis backends do beyond the contract suite: settings, connections, keys,
expiry, the stream-id ordering, the idmp refusal, and claims whose reply is lost."""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis
import redis.asyncio
from redis.crc import key_slot

from django_anarchon.backends.base import ClaimInput, ClaimOutcome, JobLimits, RunClaim
from django_anarchon.backends.redis import RedisBackend
from django_anarchon.backends.valkey import ValkeyBackend
from django_anarchon.exceptions import ConfigurationError

from .redis_support import DroppingProxy, delete_prefix, redis_url

URL = "redis://127.0.0.1:6379/0"


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# -- settings (no server needed) --------------------------------------------------------


@pytest.mark.parametrize(
    ("strategy", "option", "value"),
    [
        ("leese", "strategy", "leese"),
        (42, "strategy", 42),
        ({"window": "5m"}, "strategy", {"window": "5m"}),
        ({"name": "script", "window": "soon"}, "strategy.window", "soon"),
        ({"name": "script", "window": 0}, "strategy.window", 0),
        ({"name": "script", "windows": "5m"}, "strategy.windows", "5m"),
        ({"name": "idmp", "duration_sec": 0}, "strategy.duration_sec", 0),
        ({"name": "idmp", "duration_sec": 86_401}, "strategy.duration_sec", 86_401),
        ({"name": "idmp", "max_size": 10_001}, "strategy.max_size", 10_001),
        ({"name": "idmp", "max_size": True}, "strategy.max_size", True),
        ({"name": "stream-id", "maxlen": 0}, "strategy.maxlen", 0),
    ],
)
def test_bad_strategy_settings_name_option_and_value(strategy: Any, option: str, value: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        RedisBackend(url=URL, strategy=strategy)
    assert info.value.option == option
    assert info.value.value == value
    assert repr(value) in str(info.value)


def test_strategy_settings_and_windows() -> None:
    assert RedisBackend(url=URL).strategy.name == "lease"
    script = RedisBackend(url=URL, strategy={"name": "script", "window": "1m30s"})
    assert script.dedupe_window_ms == 90_000
    assert script.runs is None
    assert RedisBackend(url=URL, strategy={"name": "script"}).dedupe_window_ms == 300_000
    assert RedisBackend(url=URL, strategy="stream-id").dedupe_window_ms == math.inf
    idmp = RedisBackend(url=URL, strategy={"name": "idmp", "duration_sec": 120, "max_size": 50})
    assert (idmp.strategy.duration_sec, idmp.strategy.max_size) == (120, 50)
    assert idmp.dedupe_window_ms == 120_000
    lease = RedisBackend(url=URL)
    assert lease.runs is not None
    assert lease.dedupe_window_ms == 86_400_000


def test_valkey_refuses_idmp_by_name() -> None:
    with pytest.raises(ConfigurationError, match="idmp") as info:
        ValkeyBackend(url=URL, strategy={"name": "idmp"})
    assert (info.value.option, info.value.value) == ("strategy", "idmp")
    assert "IDMP" in str(info.value)
    assert ValkeyBackend(url=URL, strategy="script").name == "valkey"


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        ({"key_prefix": "a{b}"}, "key_prefix"),
        ({"key_prefix": ""}, "key_prefix"),
        ({"port": 0}, "port"),
        ({"db": -1}, "db"),
        ({"cluster": True, "db": 2}, "db"),
    ],
)
def test_bad_connection_settings(kwargs: dict[str, Any], option: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        RedisBackend(**kwargs)
    assert info.value.option == option


def test_client_and_url_together_are_refused_without_showing_the_password() -> None:
    with pytest.raises(ConfigurationError) as info:
        RedisBackend(url="redis://u:hunter2@127.0.0.1:6379/0", client=object())
    assert "hunter2" not in str(info.value)


def test_describe_never_shows_a_password() -> None:
    by_url = RedisBackend(url="redis://app:hunter2@10.0.0.5:6380/3", strategy="script")
    assert "hunter2" not in by_url.describe()
    assert by_url.describe() == "redis redis://app:***@10.0.0.5:6380/3 (script, window 5m)"
    by_host = RedisBackend(host="10.0.0.5", port=6380, db=1, password="hunter2")
    assert by_host.describe() == "redis 10.0.0.5:6380/1 (lease, window 1d)"
    assert ValkeyBackend(url="valkey://h:1/0", strategy="stream-id").describe() == (
        "valkey valkey://h:1/0 (stream-id)"
    )


def test_missing_client_library_names_the_extra() -> None:
    """Importing the package never needs redis-py; building a backend without it says what
    to install. Run in a fresh interpreter where ``import redis`` fails."""
    code = (
        "import sys; sys.modules['redis'] = None; sys.modules['valkey'] = None\n"
        "import django_anarchon, django_anarchon.backends.redis, django_anarchon.backends.valkey\n"
        "from django_anarchon.exceptions import ConfigurationError\n"
        "for cls, extra in ((django_anarchon.backends.redis.RedisBackend, 'redis'),\n"
        "                   (django_anarchon.backends.valkey.ValkeyBackend, 'valkey')):\n"
        "    try:\n"
        "        cls(url='redis://127.0.0.1:6379/0')\n"
        "    except ConfigurationError as e:\n"
        "        assert f'pip install django-anarchon[{extra}]' in str(e), e\n"
        "    else:\n"
        "        raise SystemExit('no error')\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_idmp_check_job_refuses_a_job_it_would_forget() -> None:
    backend = RedisBackend(url=URL, strategy={"name": "idmp", "duration_sec": 300, "max_size": 10})
    # 10 slots of a 5 s job: claims are remembered for 50 s, less than 60 s of max_late.
    limits = JobLimits(name="app.tick", jitter_ms=0, max_late_ms=60_000, min_gap_ms=5_000,
                       history_size=100)
    with pytest.raises(ConfigurationError) as info:
        backend.check_job(limits)
    assert (info.value.job, info.value.option, info.value.value) == ("app.tick", "max_late", 60_000)
    assert "50000" in str(info.value)
    backend.check_job(JobLimits("app.tick", 0, 30_000, 5_000, 100))
    backend.check_job(JobLimits("app.once", 0, 60_000, math.inf, 100))
    RedisBackend(url=URL, strategy="script").check_job(limits)  # the engine checks the window


# -- against the running Redis -----------------------------------------------------------


@pytest.fixture
def server() -> Iterator[tuple[str, str]]:
    url = redis_url()
    prefix = f"anarchon-test-{uuid.uuid4().hex[:12]}"
    yield url, prefix
    delete_prefix(url, prefix)


def keys_of(url: str, prefix: str) -> list[str]:
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        return sorted(client.scan_iter(match=f"{prefix}:*", count=1000))
    finally:
        client.close()


def pttl(url: str, key: str) -> int:
    client = redis.Redis.from_url(url)
    try:
        return int(client.pttl(key))
    finally:
        client.close()


@pytest.mark.redis
def test_idmp_is_refused_on_a_server_older_than_8_6(server: tuple[str, str]) -> None:
    url, prefix = server
    info = redis.Redis.from_url(url).info("server")
    found = str(info["redis_version"])
    if tuple(int(p) for p in found.split(".")[:2]) >= (8, 6):
        pytest.skip(f"the server runs Redis {found}, which has IDMP")
    backend = RedisBackend(url=url, strategy="idmp", key_prefix=prefix)

    async def main() -> None:
        try:
            await backend.init()
        finally:
            await backend.close()

    with pytest.raises(ConfigurationError) as error:
        asyncio.run(main())
    assert "8.6" in str(error.value)
    assert found in str(error.value)
    assert error.value.option == "strategy"


@pytest.mark.redis
def test_every_key_of_a_job_shares_one_cluster_slot(server: tuple[str, str]) -> None:
    url, prefix = server
    jobs = ["billing.reconcile", "odd {name}", "}x{"]

    async def main() -> None:
        for strategy in ("lease", "script", "stream-id"):
            backend = RedisBackend(url=url, strategy=strategy, key_prefix=prefix)
            for job in jobs:
                assert await backend.claim(ClaimInput(job, 1000, "t", "A"))
                await backend.record_manual_run(ClaimInput(job, 1000, "m", "A"))
                if backend.runs is not None:
                    outcome = await backend.runs.claim(RunClaim(job, 2000, "r", "A"))
                    assert outcome == ClaimOutcome.won(1)
            await backend.close()

    asyncio.run(main())
    keys = keys_of(url, prefix)
    for job in jobs:
        tag = RedisBackend(url=url, key_prefix=prefix).job_key(job)
        mine = [k for k in keys if k.startswith(tag + ":")]
        assert len(mine) >= 8, (job, keys)
        assert len({key_slot(k.encode()) for k in mine}) == 1, mine
    assert "anarchon-test" in keys[0]


@pytest.mark.redis
def test_finished_runs_expire_and_unfinished_ones_never(server: tuple[str, str]) -> None:
    url, prefix = server
    backend = RedisBackend(url=url, key_prefix=prefix)
    job, slot = "app.expiry", now_ms() - 1_000  # past by the server's clock: never early
    run_key = f"{backend.job_key(job)}:r:{slot}"
    assert backend.runs is not None
    runs = backend.runs

    async def main() -> None:
        claim = RunClaim(job, slot, "a", "A", lease_ms=100, keep_ms=120_000)
        assert await runs.claim(claim) == ClaimOutcome.won(1)
        assert pttl(url, run_key) == -1  # running: no expiry, even with the lease lapsed
        assert await runs.finish(job, slot, "a", "success")
        assert 100_000 < pttl(url, run_key) <= 120_000
        # keep_ms below the minimum is raised to it; none given: a day.
        tiny = RunClaim(job, slot + 1, "b", "A", keep_ms=5)
        assert await runs.claim(tiny) == ClaimOutcome.won(1)
        assert await runs.finish(job, slot + 1, "b", "failed")
        assert 5_000 < pttl(url, f"{backend.job_key(job)}:r:{slot + 1}") <= 10_000
        assert await runs.claim(RunClaim(job, slot + 2, "c", "A")) == ClaimOutcome.won(1)
        assert await runs.finish(job, slot + 2, "c", "success")
        assert 86_000_000 < pttl(url, f"{backend.job_key(job)}:r:{slot + 2}") <= 86_400_000
        await backend.close()

    asyncio.run(main())

    script = RedisBackend(url=url, strategy={"name": "script", "window": "90s"}, key_prefix=prefix)

    async def claim_script() -> None:
        assert await script.claim(ClaimInput(job, slot, "t", "A"))
        await script.close()

    asyncio.run(claim_script())
    assert 80_000 < pttl(url, f"{script.job_key(job)}:c:{slot}") <= 90_000


@pytest.mark.redis
def test_history_ttl_sets_expiry_on_history_keys(server: tuple[str, str]) -> None:
    url, prefix = server
    backend = RedisBackend(url=url, strategy="script", key_prefix=prefix)

    async def main() -> None:
        assert await backend.claim(ClaimInput("app.ttl", 1000, "t", "A", history_ttl_ms=60_000))
        await backend.close()

    asyncio.run(main())
    ttl = pttl(url, f"{backend.job_key('app.ttl')}:hc")
    assert 55_000 < ttl <= 61_000


@pytest.mark.redis
def test_stream_id_claims_slots_in_order(server: tuple[str, str]) -> None:
    """A slot older than the newest claimed one is refused, and a winner's retry of a
    slot trimmed from the stream is refused too (the stream only remembers maxlen)."""
    url, prefix = server
    backend = RedisBackend(url=url, strategy={"name": "stream-id", "maxlen": 1}, key_prefix=prefix)

    async def main() -> None:
        job = "app.ordered"
        assert await backend.claim(ClaimInput(job, 5000, "t5", "A"))
        assert await backend.claim(ClaimInput(job, 5000, "t5", "A"))
        assert not await backend.claim(ClaimInput(job, 4000, "t4", "B"))  # late, older slot
        assert await backend.claim(ClaimInput(job, 6000, "t6", "B"))
        for i in range(200):  # enough entries for approximate trimming to act
            assert await backend.claim(ClaimInput(job, 7000 + i, f"x{i}", "C"))
        assert not await backend.claim(ClaimInput(job, 5000, "t5", "A"))  # trimmed away
        assert not await backend.claim(ClaimInput(job, 5000, "other", "D"))
        await backend.close()

    asyncio.run(main())


@pytest.mark.redis
def test_one_backend_on_many_event_loops_and_threads(server: tuple[str, str]) -> None:
    """The sync twins call a backend from a fresh loop each time, maybe from several
    threads at once: each loop gets its own client, and one slot still has one winner."""
    url, prefix = server
    backend = RedisBackend(url=url, key_prefix=prefix)
    job = "app.loops"

    async def claim(slot: int, token: str) -> bool:
        return await backend.claim(ClaimInput(job, slot, token, token))

    for i in range(5):  # one loop after another, as async_to_sync does
        assert asyncio.run(claim(1000 + i, f"seq{i}"))
        assert not asyncio.run(claim(1000 + i, f"other{i}"))

    won: list[bool] = []
    lock = threading.Lock()
    barrier = threading.Barrier(8)

    def worker(n: int) -> None:
        async def body() -> list[bool]:
            results = []
            for slot in range(2000, 2020):
                await asyncio.to_thread(barrier.wait)
                results.append(await claim(slot, f"thread{n}"))
            return results

        results = asyncio.run(body())
        with lock:
            won.extend(results)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sum(won) == 20
    assert len(won) == 160
    asyncio.run(backend.close())


@pytest.mark.redis
def test_close_leaves_a_given_client_open(server: tuple[str, str]) -> None:
    url, prefix = server

    async def main() -> None:
        client = redis.asyncio.Redis.from_url(url, decode_responses=True)
        backend = RedisBackend(client=client, key_prefix=prefix, strategy="script")
        assert backend.describe() == "redis 127.0.0.1:6379/0 (script, window 5m)"
        assert await backend.claim(ClaimInput("app.given", 1, "t", "A"))
        records = await backend.history("app.given", 5)
        assert [(r.slot, r.instance_id, r.status) for r in records] == [(1, "A", "running")]
        await backend.close()
        assert await client.ping()
        await client.aclose()

    asyncio.run(main())


# -- a claim whose reply never arrives ---------------------------------------------------


@pytest.mark.redis
@pytest.mark.parametrize("strategy", ["lease", "stream-id", "script"])
def test_lost_reply_is_retried_with_the_same_token(server: tuple[str, str], strategy: str) -> None:
    """The proxy forwards the claim, the server decides it, and the connection drops before
    the answer: the backend's retry, with the same token, still wins; nobody else does."""
    url, prefix = server

    async def main() -> None:
        target = urlsplit(url)
        proxy = DroppingProxy(target.hostname or "127.0.0.1", target.port or 6379)
        await proxy.start()
        via_proxy = RedisBackend(url=f"redis://127.0.0.1:{proxy.port}/0", strategy=strategy,
                                 key_prefix=prefix)
        others = [RedisBackend(url=url, strategy=strategy, key_prefix=prefix) for _ in range(20)]
        try:
            await via_proxy.init()
            for round_no in range(5):
                job, slot = "app.dropped", 10_000 + round_no
                proxy.drop_next_reply()
                answers = await asyncio.gather(
                    via_proxy.claim(ClaimInput(job, slot, f"p{round_no}", "P")),
                    *(o.claim(ClaimInput(job, slot, f"o{i}-{round_no}", f"O{i}"))
                      for i, o in enumerate(others)),
                )
                assert sum(answers) == 1, answers
                winner = f"p{round_no}" if answers[0] else f"o{answers.index(True) - 1}-{round_no}"
                again = ClaimInput(job, slot, winner, "again")
                assert await via_proxy.claim(again)
            assert proxy.dropped == 5
            if strategy == "lease":
                assert via_proxy.runs is not None
                proxy.drop_next_reply()
                claim = RunClaim("app.dropped-run", now_ms(), "p", "P")
                assert await via_proxy.runs.claim(claim) == ClaimOutcome.won(1)
                assert proxy.dropped == 6
                other = RunClaim("app.dropped-run", claim.slot, "o", "O")
                assert await others[0].runs.claim(other) == ClaimOutcome.running(1)  # type: ignore[union-attr]
        finally:
            await via_proxy.close()
            for o in others:
                await o.close()
            await proxy.close()

    asyncio.run(main())


@pytest.mark.redis
def test_client_kill_between_send_and_reply(server: tuple[str, str]) -> None:
    """CLIENT KILL of the claimer's connection while its claim waits on the server: the
    retried claim is decided once; with 20 rivals there is still exactly one winner."""
    url, prefix = server
    admin = redis.Redis.from_url(url, decode_responses=True)
    name = f"anarchon-victim-{uuid.uuid4().hex[:8]}"

    def victim_waiting() -> dict[str, Any] | None:
        for entry in admin.client_list():
            if entry.get("name") == name and entry.get("cmd") in ("evalsha", "eval"):
                return entry
        return None

    async def main() -> None:
        victim = RedisBackend(url=url, key_prefix=prefix, client_options={"client_name": name})
        rivals = [RedisBackend(url=url, key_prefix=prefix) for _ in range(20)]
        try:
            await victim.init()
            assert victim.runs is not None
            for round_no in range(3):
                job, slot = f"app.killed-{round_no}", now_ms()
                admin.client_pause(3000, all=False)  # WRITE: scripts wait, CLIENT does not
                try:
                    task = asyncio.ensure_future(
                        victim.runs.claim(RunClaim(job, slot, f"v{round_no}", "V"))
                    )
                    deadline = time.monotonic() + 2
                    entry = None
                    while entry is None and time.monotonic() < deadline:
                        await asyncio.sleep(0.01)
                        entry = await asyncio.to_thread(victim_waiting)
                    assert entry is not None, "the victim's claim never reached the server"
                    assert admin.client_kill_filter(_id=entry["id"]) == 1
                finally:
                    admin.client_unpause()
                answers = await asyncio.gather(
                    task,
                    *(r.runs.claim(RunClaim(job, slot, f"r{i}", f"R{i}"))  # type: ignore[union-attr]
                      for i, r in enumerate(rivals)),
                )
                assert sum(a.kind == "won" for a in answers) == 1, answers
                winner = next(i for i, a in enumerate(answers) if a.kind == "won")
                token = f"v{round_no}" if winner == 0 else f"r{winner - 1}"
                again = await victim.runs.claim(RunClaim(job, slot, token, "again"))
                assert again == ClaimOutcome.won(1)
        finally:
            await victim.close()
            for r in rivals:
                await r.close()
            admin.close()

    asyncio.run(main())


async def test_script_calls_beyond_the_pool_wait_for_a_connection() -> None:
    """A burst of runs ending together sent more script calls at once than the client's
    pool holds: each failed with "too many connections" and was retried after a backoff
    (seen in the 1,000-job burst benchmark). They now wait for a connection."""
    from django_anarchon.backends.redis.scripts import Script

    backend = RedisBackend(url=URL, key_prefix=f"t-gate-{uuid.uuid4().hex[:8]}",
                           client_options={"max_connections": 3})
    script = Script("slow", "redis.call('SET', KEYS[1], ARGV[1]) return ARGV[1]")
    errors: list[BaseException] = []
    real_evalsha = backend.client().evalsha

    async def evalsha(*args: Any) -> Any:
        try:
            return await real_evalsha(*args)
        except redis.exceptions.ConnectionError as exc:
            errors.append(exc)
            raise

    backend.client().evalsha = evalsha
    try:
        keys = [f"{backend.key_prefix}:{i}" for i in range(40)]
        answers = await asyncio.gather(
            *(backend.eval(script, [key], [str(i)]) for i, key in enumerate(keys))
        )
        assert [int(a) for a in answers] == list(range(40))
        assert not errors, f"{len(errors)} calls found no connection: {errors[0]!r}"
    finally:
        delete_prefix(URL, backend.key_prefix)
        await backend.close()


def test_a_claims_script_arguments_follow_every_option_of_the_claim() -> None:
    """The parts of a claim's call that a job's slots share are kept encoded per job and
    options: each field of the claim still reaches the script as it did when every call
    was built whole, whatever was claimed before (a cache that missed an option would send
    another claim's)."""
    from dataclasses import fields, replace

    from django_anarchon.backends.base import (
        BUFFER_WAIT_CAP_MS,
        DEFAULT_KEEP_MS,
        MIN_KEEP_MS,
        buffer_hold_ms,
        cancel_reason,
    )

    runs = RedisBackend(url="redis://127.0.0.1:1/0", key_prefix="parts").runs
    assert runs is not None

    def whole(c: RunClaim) -> tuple[list[str], list[str]]:
        base = f"parts:{{{c.job}}}"
        keys = [f"{base}:r:{c.slot}", f"{base}:active", *(f"{base}:{k}" for k in
                ("hc", "hr", "hs", "he", "hm", "b", "m", "mi", "p"))]
        def opt(v: int | None) -> str:
            return "" if v is None else str(v)
        args = [c.slot, c.token, c.instance_id, c.mode, c.reason, c.lease_ms, c.overlap,
                c.max_attempts, opt(c.max_late_ms), opt(c.keep_ms), c.history_size,
                opt(c.history_ttl_ms), f"{base}:r:", DEFAULT_KEEP_MS, MIN_KEEP_MS,
                c.buffer_limit,
                cancel_reason(c.slot, c.instance_id) if c.overlap == "cancel_other" else "",
                buffer_hold_ms(c.lease_ms), BUFFER_WAIT_CAP_MS]
        return keys, [str(a) for a in args]

    def text(values: list[Any]) -> list[str]:
        return [v.decode() if isinstance(v, bytes) else str(v) for v in values]

    base = RunClaim(job="j", slot=1_000, token="t", instance_id="A", keep_ms=5_000)
    changes: dict[str, Any] = {
        "job": "k", "slot": 2_000, "token": "u", "instance_id": "B", "history_size": 7,
        "history_ttl_ms": 9_000, "mode": "takeover", "reason": "catch-up", "lease_ms": 4_000,
        "overlap": "cancel_other", "max_attempts": 3, "max_late_ms": 800, "keep_ms": None,
        "buffer_limit": 2,
    }
    assert set(changes) == {f.name for f in fields(RunClaim)}  # a new field is varied too
    claims = [base, *(replace(base, **{name: value}) for name, value in changes.items())]
    for c in [*claims, *reversed(claims)]:  # each twice: the second time from what was kept
        _, keys, args = runs._claim_call(c)
        assert (text(keys), text(args)) == whole(c), c
