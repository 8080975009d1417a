"""Waiting for a job's result (docs/howto/wait.md,
docs/explanation/protocol.md#waiting-for-a-result): the waiter blocks on the
job's done stream, on both rigs; a worker or the test finishes the job."""

from __future__ import annotations

import asyncio
import contextlib
import threading

import pytest
from redis.cluster import RedisCluster

from echomq_django import Flow, JobDead, JobNotFound, JobRef, JobState, Worker
from echomq_django.runners.pump import Pump
from tests.support.workerkit import Background, wait_for

NEVER = 3600.0  # s: a wait no test reaches


class Waiter:
    """``mq.wait(*args, **kwargs)`` on a thread; ``join()`` gives the job or
    re-raises what the wait raised."""

    def __init__(self, mq, *args, **kwargs) -> None:
        self.result = self.error = None
        self.thread = threading.Thread(target=self._run, args=(mq, args, kwargs), daemon=True)
        self.thread.start()

    def _run(self, mq, args, kwargs) -> None:
        try:
            self.result = mq.wait(*args, **kwargs)
        except BaseException as err:  # handed to the test thread
            self.error = err

    def join(self):
        self.thread.join(30)
        assert not self.thread.is_alive(), "the wait never returned"
        if self.error is not None:
            raise self.error
        return self.result


def registered(mq, queue: str, job_id: str, n: int, via=None) -> None:
    """Return once the job's done stream exists and ``n`` connections of
    ``mq``'s own client are blocked in an ``XREAD`` on its node (the first
    waiter made the stream; each after it only reads its last id, so the
    stream's length counts one). Connections are told by their local port:
    the session's Cluster rig may hold another test's blocked reader.
    ``via``: the ``EchoMQ`` to look with (``mq``'s pool may be spent)."""
    done = mq.keys.queue(queue).done(job_id)
    client, lister = mq.client, (via or mq).client
    if isinstance(client, RedisCluster):
        client = client.get_node_from_key(done).redis_connection
        lister = lister.get_node_from_key(done).redis_connection

    def ours() -> set[int]:
        pool = client.connection_pool
        ports = set()
        for conn in [*pool._in_use_connections, *pool._available_connections]:
            with contextlib.suppress(AttributeError, OSError):
                ports.add(conn._sock.getsockname()[1])
        return ports

    def blocked() -> int:
        mine = ours()
        return sum(
            c["cmd"] == "xread" and "b" in c["flags"] and int(c["addr"].rsplit(":", 1)[1]) in mine
            for c in lister.client_list()
        )

    wait_for(
        lambda: (via or mq).client.exists(done) and blocked() >= n, what=f"{n} waiter(s) blocked"
    )


def finish(mq, queue: str, result=None, *, error: str | None = None):
    (job,) = mq.claim(queue)
    if error is None:
        mq.complete(job, result)
    else:
        mq.fail(job, error, dead=True)


def test_a_completed_job_is_returned_with_its_result(mq) -> None:
    mq.enqueue("q", "t.echo", 1, job_id="a")
    waiter = Waiter(mq, "q", "a", NEVER)
    registered(mq, "q", "a", 1)
    finish(mq, "q", {"total": 3})
    job = waiter.join()
    assert (job.state, job.result) == (JobState.COMPLETED, {"total": 3})


def test_a_job_already_finished_is_answered_at_once(mq) -> None:
    mq.enqueue("q", "t.echo", 1, job_id="a")
    finish(mq, "q", 5)
    assert mq.wait(JobRef("q", "a"), timeout_s=0).result == 5
    assert mq.wait("q/a", timeout_s=0).result == 5
    assert mq.wait(JobRef("q", "a"), 0).result == 5  # a ref and the timeout, positional


def test_a_worker_run_job_is_returned(mq) -> None:
    # a short block (not NEVER): a waker thread that the stop races past its
    # cut returns within it, instead of popping later tests' wake markers
    worker = Worker(["q"], mq=mq, block_timeout=0.5, sweep_interval=NEVER)
    bg = Background(worker)
    try:
        mq.enqueue("q", "t.echo", {"n": 7}, job_id="w")
        assert mq.wait("q", "w", timeout_s=30).result == {"n": 7}
    finally:
        worker.stop()
        bg.join()


def test_a_dead_job_raises_job_dead_with_its_error(mq) -> None:
    mq.enqueue("q", "t.fail", None, job_id="d")
    waiter = Waiter(mq, "q", "d", NEVER)
    registered(mq, "q", "d", 1)
    finish(mq, "q", error="card declined")
    with pytest.raises(JobDead, match="card declined") as caught:
        waiter.join()
    assert (caught.value.error, caught.value.job.state) == ("card declined", JobState.DEAD)


def test_job_dead_headline_is_the_error_s_first_line_with_job_keys_as_refs() -> None:
    from types import SimpleNamespace

    error = "failed by child emq:{shop}:job:charge: CardDeclined: no\nTraceback (most recent...)"
    dead = JobDead(SimpleNamespace(id="r", queue="orders", error=error))
    assert dead.headline == "failed by child shop/charge: CardDeclined: no"
    assert JobDead(SimpleNamespace(id="c", queue="q", error="cancelled")).headline == "cancelled"


def test_a_cancelled_job_raises_job_dead(mq) -> None:
    mq.enqueue("q", "t.echo", None, job_id="c")
    waiter = Waiter(mq, "q", "c", NEVER)
    registered(mq, "q", "c", 1)
    mq.cancel("q", "c")
    with pytest.raises(JobDead) as caught:
        waiter.join()
    assert caught.value.job.state is JobState.DEAD
    assert caught.value.error == "cancelled"


def test_a_wait_that_runs_out_raises_timeout_error(mq) -> None:
    mq.enqueue("q", "t.echo", None, job_id="slow")
    with pytest.raises(TimeoutError, match="'slow' in queue 'q' did not finish in 0.3 s"):
        mq.wait("q", "slow", 0.3)
    assert mq.get_job("q", "slow").state is JobState.PENDING


def test_an_unknown_id_raises_job_not_found_at_once(mq) -> None:
    # NEVER: were it to wait for the timeout, the test would hang
    with pytest.raises(JobNotFound, match="job 'nope' not found in queue 'q'"):
        mq.wait("q", "nope", NEVER)


def test_a_job_removed_while_waited_for_wakes_its_waiters_at_once(mq) -> None:
    mq.enqueue("q", "t.echo", None, job_id="gone")
    waiters = [Waiter(mq, "q", "gone", NEVER) for _ in range(2)]
    registered(mq, "q", "gone", 2)
    mq.remove("q", "gone")  # noted on the done stream: NEVER would hang otherwise
    for waiter in waiters:
        with pytest.raises(JobNotFound, match="job 'gone' in queue 'q' was removed"):
            waiter.join()
    entries = mq.client.xrange(mq.keys.queue("q").done("gone"))
    assert [f[b"e"] for _, f in entries] == [b"wait", b"removed"]  # the first waiter's mark


def test_a_removal_with_nobody_waiting_writes_no_done_stream(mq) -> None:
    mq.enqueue("q", "t.echo", None, job_id="alone")
    mq.remove("q", "alone")
    assert mq.client.exists(mq.keys.queue("q").done("alone")) == 0


def test_a_wait_without_a_timeout_lasts_until_the_job_finishes(mq) -> None:
    mq.enqueue("q", "t.echo", None, job_id="open")
    waiter = Waiter(mq, JobRef("q", "open"))  # wait(ref): no timeout, no end
    registered(mq, "q", "open", 1)
    done = mq.keys.queue("q").done("open")
    assert 3_600_000 < mq.client.pttl(done) <= 3_605_000  # an hour ahead, renewed while waited on
    finish(mq, "q", "late")
    assert waiter.join().result == "late"


def test_a_long_wait_renews_its_stream(mq, monkeypatch) -> None:
    from echomq_django.protocol.live import waits

    monkeypatch.setattr(waits, "STREAM_TTL_MS", 400)  # renewed each 0.2 s
    monkeypatch.setattr(waits, "WAIT_SLACK_MS", 300)
    mq.enqueue("q", "t.echo", None, job_id="kept")
    waiter = Waiter(mq, "q", "kept", 60)
    registered(mq, "q", "kept", 1)
    done = mq.keys.queue("q").done("kept")
    # without the renewal the stream would expire 0.7 s after the mark
    threading.Event().wait(2.0)
    assert mq.client.exists(done) == 1
    finish(mq, "q", "kept")
    assert waiter.join().result == "kept"


@pytest.mark.parametrize("api", ["EchoMQ", "module"])
def test_a_cancelled_wait_ends_at_its_next_block(r, api, monkeypatch) -> None:
    """``cancel`` (a ``threading.Event``) ends ``EchoMQ.wait`` and the
    module API's ``wait`` alike (docs/howto/wait.md#what-a-wait-costs)."""
    import redis

    import echomq_django as emq
    from echomq_django import EchoMQ
    from echomq_django.api import calls

    kw = r.connection_pool.connection_kwargs
    mq = EchoMQ(redis.Redis(host=kw["host"], port=kw["port"], socket_timeout=1.0), prefix="emq")
    monkeypatch.setattr(calls, "get_mq", lambda: mq)
    mq.enqueue("q", "t.echo", None, job_id="stop")
    cancel = threading.Event()
    waiter = Waiter(mq if api == "EchoMQ" else emq, "q", "stop", NEVER, cancel=cancel)
    registered(mq, "q", "stop", 1)
    cancel.set()  # blocks last 0.5 s on this client (half its socket timeout)
    with pytest.raises(TimeoutError, match="the wait for job 'stop' in queue 'q' was cancelled"):
        waiter.join()
    assert mq.get_job("q", "stop").state is JobState.PENDING


def test_a_job_finished_and_removed_before_the_wait_read_it_says_so(mq) -> None:
    """The order retention can produce: the finish is noted, then the row
    is dropped before the woken waiter reads it (both done by hand here)."""
    mq.enqueue("q", "t.echo", None, job_id="brief")
    waiter = Waiter(mq, "q", "brief", NEVER)
    registered(mq, "q", "brief", 1)
    k = mq.keys.queue("q")
    mq.client.delete(k.job("brief"))
    mq.client.xadd(k.done("brief"), {"e": "completed"})
    with pytest.raises(JobNotFound, match="'brief' in queue 'q' finished and was removed"):
        waiter.join()


def test_three_waiters_on_one_job_all_get_the_result(mq) -> None:
    mq.enqueue("q", "t.echo", None, job_id="m")
    waiters = [Waiter(mq, "q", "m", NEVER) for _ in range(3)]
    registered(mq, "q", "m", 3)
    finish(mq, "q", "shared")
    assert [w.join().result for w in waiters] == ["shared"] * 3


def test_waits_arriving_on_one_job_do_not_wake_the_waits_before_them(mq) -> None:
    # the first wait makes the done stream; each after it only reads its last
    # id, so a wait already blocked stays blocked: about two XREADs a wait in
    # all (its block, its wake), where each arrival woke every wait before it
    # (n(n+1)/2 reads: 465 for 30 waits)
    n = 30
    mq.enqueue("q", "t.echo", None, job_id="many")
    node = mq.client
    if isinstance(node, RedisCluster):
        node = node.get_node_from_key(mq.keys.queue("q").done("many")).redis_connection
    node.config_resetstat()
    waiters = []
    for i in range(n):
        waiters.append(Waiter(mq, "q", "many", NEVER))
        registered(mq, "q", "many", i + 1)
    finish(mq, "q", "all")
    assert [w.join().result for w in waiters] == ["all"] * n
    calls = node.info("commandstats")["cmdstat_xread"]["calls"]
    assert n <= calls <= 2 * n
    assert mq.client.xlen(mq.keys.queue("q").done("many")) == 2  # the first mark, the finish


def test_a_flow_root_across_queues_is_waited_for(mq) -> None:
    children = [Flow("a", "t.echo", 1, job_id="c1"), Flow("b", "t.echo", 2, job_id="c2")]
    flow = Flow("root", "t.sum_children", job_id="r", children=children)
    ref = mq.add_flow(flow)
    waiter = Waiter(mq, ref.ref, timeout_s=NEVER)
    by_flow = Waiter(mq, ref, timeout_s=NEVER)  # the FlowRef itself: its root
    registered(mq, "root", "r", 2)
    finish(mq, "a", 1)
    finish(mq, "b", 2)
    Pump(["root", "a", "b"], mq=mq).sweep()  # the fan-in across slots
    (root,) = mq.claim("root")
    mq.complete(root, sum(root.children_values().values()))
    assert waiter.join().result == 3
    assert (by_flow.join().id, by_flow.join().result) == ("r", 3)


@pytest.mark.parametrize(
    "timeout_s", [-1, "5", True, float("nan"), float("inf"), 365 * 86_400 + 1, 1e18]
)
def test_a_bad_timeout_is_refused_before_any_redis_io(mq, timeout_s) -> None:
    rule = r"a wait is None \(until the job finishes\) or a number of s from 0 to 31,536,000"
    with pytest.raises(ValueError, match=f"invalid timeout_s .*: {rule}"):
        mq.wait("q", "never-written", timeout_s)
    assert mq.client.exists(mq.keys.queue("q").done("never-written")) == 0


def test_the_done_stream_expires_and_nothing_is_written_without_a_waiter(mq) -> None:
    mq.enqueue("q", "t.echo", None, job_id="x")
    with pytest.raises(TimeoutError):
        mq.wait("q", "x", 0.3)
    done = mq.keys.queue("q").done("x")
    assert 0 < mq.client.pttl(done) <= 5300
    # the bound: 100 jobs finished with nobody waiting leave no done stream
    ids = mq.enqueue_many("q", [{"name": "t.echo", "payload": i} for i in range(100)])
    for job in mq.claim("q", 101):
        mq.complete(job, job.payload)
    assert all(mq.get_job("q", i).state is JobState.COMPLETED for i in ids)
    assert [i for i in ids if mq.client.exists(mq.keys.queue("q").done(i))] == []


def test_await_result_does_not_block_the_event_loop(mq, monkeypatch) -> None:
    import echomq_django as emq
    from echomq_django.api import calls as api

    monkeypatch.setattr(api, "get_mq", lambda: mq)
    mq.enqueue("q", "t.echo", None, job_id="aw")

    async def both():
        waiting = asyncio.create_task(emq.await_result("q", "aw", NEVER))
        # the loop runs on while the wait blocks on its thread
        await asyncio.to_thread(registered, mq, "q", "aw", 1)
        await asyncio.to_thread(finish, mq, "q", "async")
        return await waiting

    assert asyncio.run(both()).result == "async"


def test_a_resp3_client_waits_too(r) -> None:
    """XREAD answers a dict over RESP3 (``protocol=3``), a list over RESP2."""
    import redis

    from echomq_django import EchoMQ

    kw = r.connection_pool.connection_kwargs
    mq = EchoMQ(redis.Redis(host=kw["host"], port=kw["port"], protocol=3), prefix="emq")
    mq.enqueue("q", "t.echo", None, job_id="r3")
    waiter = Waiter(mq, "q", "r3", NEVER)
    registered(mq, "q", "r3", 1)
    finish(mq, "q", "three")
    assert waiter.join().result == "three"


def test_await_result_is_not_held_up_by_a_full_shared_executor(mq, monkeypatch) -> None:
    """Each await blocks on a thread of its own: the loop's default executor
    (here one thread, held by a blocking call) does not hold up the wait."""
    import concurrent.futures

    import echomq_django as emq
    from echomq_django.api import calls as api

    monkeypatch.setattr(api, "get_mq", lambda: mq)
    mq.enqueue("q", "t.echo", None, job_id="free")
    release = threading.Event()

    async def run():
        loop = asyncio.get_running_loop()
        loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(1))
        busy = loop.run_in_executor(None, release.wait, 30)  # the executor's only thread
        waiting = asyncio.create_task(emq.await_result("q", "free", NEVER))
        finisher = threading.Thread(
            target=lambda: (registered(mq, "q", "free", 1), finish(mq, "q", "mine"))
        )
        finisher.start()
        try:
            return (await asyncio.wait_for(waiting, 20)).result
        finally:
            release.set()
            await busy
            finisher.join()

    assert asyncio.run(run()) == "mine"


def test_a_cancelled_await_result_ends_its_wait(r, monkeypatch) -> None:
    import redis

    import echomq_django as emq
    from echomq_django import EchoMQ
    from echomq_django.api import calls as api

    kw = r.connection_pool.connection_kwargs
    mq = EchoMQ(redis.Redis(host=kw["host"], port=kw["port"], socket_timeout=1.0), prefix="emq")
    monkeypatch.setattr(api, "get_mq", lambda: mq)
    mq.enqueue("q", "t.echo", None, job_id="left")

    async def run():
        waiting = asyncio.create_task(emq.await_result("q", "left", NEVER))
        await asyncio.to_thread(registered, mq, "q", "left", 1)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting

    asyncio.run(run())
    # its thread ends at the next block (0.5 s on this client)
    wait_for(
        lambda: not [t for t in threading.enumerate() if t.name == "echomq-wait"],
        what="the cancelled wait's thread ended",
    )


def test_a_spent_connection_pool_is_named_not_called_unreachable(r) -> None:
    import redis

    from echomq_django import EchoMQ, RedisUnavailable

    kw = r.connection_pool.connection_kwargs
    mq = EchoMQ(redis.Redis(host=kw["host"], port=kw["port"], max_connections=2), prefix="emq")
    other = EchoMQ(r, prefix="emq")  # the test's own client, on its own pool
    other.enqueue("q", "t.echo", None, job_id="busy")
    waiters = [Waiter(mq, "q", "busy", NEVER) for _ in range(2)]  # each holds a connection
    registered(mq, "q", "busy", 2, via=other)
    with pytest.raises(
        RedisUnavailable, match="has no free connection: all 2 of its pool are in use"
    ):
        mq.wait("q", "busy", 1)
    finish(other, "q", "both")
    assert [w.join().result for w in waiters] == ["both", "both"]


def _calls(client, command: str) -> int:
    """How many times the server ran ``command`` (INFO commandstats) since
    the test's ``CONFIG RESETSTAT`` (the test's own server). Redis 7 counts
    a blocking XREAD as it blocks, Valkey 8 as it returns: an XREAD blocked
    now counts once on both."""
    calls = client.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0)
    if command == "xread" and client.info("server").get("server_name") == "valkey":
        calls += len(_blocked_xreads(client))
    return calls


def _blocked_xreads(client) -> list[int]:
    """The ids of the server's clients blocked in an XREAD now (CLIENT LIST)."""
    return [c["id"] for c in client.client_list() if c["cmd"] == "xread" and "b" in c["flags"]]


def test_a_blocked_wait_outlasts_the_socket_timeout_without_sending_again(r) -> None:
    import redis

    from echomq_django import EchoMQ

    kw = r.connection_pool.connection_kwargs
    mq = EchoMQ(redis.Redis(host=kw["host"], port=kw["port"], socket_timeout=0.5), prefix="emq")
    r.config_resetstat()
    mq.enqueue("q", "t.echo", None, job_id="slow")
    waiter = Waiter(mq, "q", "slow", NEVER)
    registered(mq, "q", "slow", 1)
    wait_for(lambda: _calls(r, "xread") == 1, what="the wait blocked")
    # cut in slices of the socket timeout, this would be 4 more XREADs
    threading.Event().wait(2.0)
    assert (_calls(r, "xread"), _calls(r, "hgetall")) == (1, 0)
    finish(mq, "q", "outlasted")
    assert waiter.join().result == "outlasted"
    assert (_calls(r, "xread"), _calls(r, "hgetall")) == (1, 1)  # the wake's own round trip


def test_a_wait_whose_connection_is_killed_goes_on(r) -> None:
    from echomq_django import EchoMQ

    mq = EchoMQ(r, prefix="emq")
    r.config_resetstat()
    mq.enqueue("q", "t.echo", None, job_id="cut")
    waiter = Waiter(mq, "q", "cut", NEVER)
    registered(mq, "q", "cut", 1)
    wait_for(lambda: len(_blocked_xreads(r)) == 1, what="the wait blocked")
    (killed,) = _blocked_xreads(r)
    r.client_kill_filter(_id=killed)
    wait_for(  # on a new connection
        lambda: (ids := _blocked_xreads(r)) and killed not in ids, what="the wait blocked again"
    )
    assert len(_blocked_xreads(r)) == 1
    finish(mq, "q", "on")
    assert waiter.join().result == "on"


def test_a_cancel_cuts_the_block_it_is_in(r) -> None:
    import redis

    from echomq_django import EchoMQ
    from echomq_django.protocol.live.blocking import Cancel

    kw = r.connection_pool.connection_kwargs
    client = redis.Redis(host=kw["host"], port=kw["port"], socket_timeout=None)
    mq = EchoMQ(client, prefix="emq")
    r.config_resetstat()
    mq.enqueue("q", "t.echo", None, job_id="cut")
    cancel = Cancel()
    waiter = Waiter(mq, "q", "cut", NEVER, cancel=cancel)
    registered(mq, "q", "cut", 1)
    wait_for(lambda: _calls(r, "xread") == 1, what="the wait blocked")
    cancel.set()  # without the cut this block would last LONG_BLOCK_S (300 s)
    waiter.thread.join(5)
    assert not waiter.thread.is_alive()
    with pytest.raises(TimeoutError, match="the wait for job 'cut' in queue 'q' was cancelled"):
        waiter.join()
    finish(mq, "q", "after")  # the pool serves on after the dropped connection
    assert mq.wait("q", "cut", 5).result == "after"
