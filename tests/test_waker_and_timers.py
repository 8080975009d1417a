"""The Waker and the worker's Timers (runners/wake.py, runners/timers.py), on both rigs: what is
popped, when, and what goes back; the timers promote on the announced run-at
and sweep one worker at a time per queue."""

from __future__ import annotations

import os
import queue as _queue
import signal
import threading
import time

import pytest

from echomq_django import EchoMQ, JobState
from echomq_django.runners.wake import DOWN, UP, Inbox, Timers, Wake, Waker
from tests.support import jobkit
from tests.support.jobkit import T0, claim_one
from tests.support.workerkit import wait_for


def markers(mq, queue: str = "q", key: str = "wake") -> dict[str, int]:
    raw = mq.client.zrange(mq.keys.queue_key(queue, key), 0, -1, withscores=True)
    return {m.decode(): int(s) for m, s in raw}


@pytest.fixture
def waker(mq):
    posted: _queue.SimpleQueue = _queue.SimpleQueue()
    w = Waker(mq, ["q", "r"], "wake", posted.put, block_s=2.0)
    w.posted = posted
    w.start()
    yield w
    w.stop()


def test_an_armed_waker_posts_the_marker_and_disarms(mq, waker) -> None:
    waker.arm()
    mq.enqueue("r", "job", job_id="a")
    assert waker.posted.get(timeout=5) == Wake("r", "0", 0)
    assert not waker.armed, "a pop disarms: the runner re-arms when it can use another"
    assert markers(mq, "r") == {}


def test_a_disarmed_waker_leaves_the_marker_to_others(mq, waker) -> None:
    mq.enqueue("q", "job", job_id="a")
    with pytest.raises(_queue.Empty):
        waker.posted.get(timeout=0.3)
    assert markers(mq) == {"0": 0}
    waker.arm()  # a marker set while it was busy is there when it is free: no lost wake-up
    assert waker.posted.get(timeout=5) == Wake("q", "0", 0)


def test_a_delayed_job_announces_its_run_at(mq, waker) -> None:
    waker.arm()
    mq.enqueue("q", "job", job_id="a", delay_ms=60_000)
    got = waker.posted.get(timeout=5)
    assert (got.queue, got.member) == ("q", "d")
    assert got.score == int(mq.client.zscore(mq.keys.queue_key("q", "delayed"), "a"))


def test_put_back_keeps_the_earliest_run_at(mq, waker) -> None:
    waker.put_back(Wake("q", "d", T0 + 500))
    waker.put_back(Wake("q", "d", T0 + 900))
    waker.put_back(Wake("q", "0", 0))
    assert markers(mq) == {"0": 0, "d": T0 + 500}


def test_the_blocking_timeout_stays_under_the_socket_timeout(mq) -> None:
    """Each group blocks on a private connection whose socket outlives the
    command (to the server, or to the node of the queue's slot)."""
    w = Waker(mq, ["q", "r"], "wake", lambda wake: None, block_s=60.0)
    assert w.block_s == 60.0
    readers = list(w.markers._readers.values())
    assert len(readers) == len(w.groups)
    for reader in readers:
        conn = reader.connection_pool.get_connection()
        assert conn.socket_timeout > w.block_s
        reader.connection_pool.release(conn)


def test_a_cut_reader_refuses_to_block_again(mq) -> None:
    """After ``cut()`` a pop fails at once instead of reconnecting and
    blocking for ``block_s`` (a waker thread that raced past its stop check),
    and the marker stays for other runners."""
    from echomq_django.core.exceptions import RedisUnavailable

    w = Waker(mq, ["q"], "wake", lambda wake: None, block_s=60.0)
    mq.enqueue("q", "job", job_id="a")
    w.markers.cut()
    with pytest.raises(RedisUnavailable, match="the wake-up reader was stopped"):
        w.markers.pop(["q"])
    assert markers(mq) == {"0": 0}


def test_stop_returns_once_the_blocked_threads_have(mq) -> None:
    """``stop()`` cuts the blocked ``BZPOPMIN`` and joins the threads, so
    what the runner hands back after it cannot be popped by its own waker."""
    w = Waker(mq, ["q", "r", "s"], "wake", lambda wake: None, block_s=60.0)
    w.start()
    w.arm()
    wait_for(lambda: all(t.is_alive() for t in w._threads), what="the waker threads")
    w.stop()
    assert [t.is_alive() for t in w._threads] == [False] * len(w.groups)
    w.put_back(Wake("q", "d", T0 + 500))
    assert markers(mq) == {"d": T0 + 500}


def test_a_cluster_blocks_per_queue_one_server_once(mq) -> None:
    from redis.cluster import RedisCluster

    w = Waker(mq, ["q", "r", "s"], "wake", lambda wake: None)
    if isinstance(mq.client, RedisCluster):
        assert w.groups == [["q"], ["r"], ["s"]]
    else:
        assert w.groups == [["q", "r", "s"]]


def test_a_restart_is_reported_down_then_up() -> None:
    """A dropped blocking connection (the server restarts under it) is
    retried: the runner hears DOWN, then UP, then the next marker."""
    import redis

    from echomq_django.testing import redis_server as devserver

    server = devserver.start_server()
    try:
        mq = EchoMQ(redis.Redis.from_url(server.url), prefix="emq")
        posted: _queue.SimpleQueue = _queue.SimpleQueue()
        w = Waker(mq, ["q"], "wake", posted.put, block_s=2.0)
        w.start()
        w.arm()
        server.proc.kill()
        server.proc.wait()
        assert posted.get(timeout=10) is DOWN
        server = devserver.restart(server)
        assert posted.get(timeout=20) is UP
        mq.enqueue("q", "job", job_id="a")
        assert posted.get(timeout=5) == Wake("q", "0", 0)
        w.stop()
    finally:
        server.stop()


# -- the timers ---------------------------------------------------------------


def test_timers_promote_at_the_announced_run_at(tmq, clock) -> None:
    tmq.enqueue("q", "job", job_id="a", delay_ms=250)
    timers = Timers(tmq, ["q"])
    timers.sweep_at["q"] = float("inf")  # only the run-at timer
    timers.learn("q", markers(tmq)["d"])
    assert timers.due["q"] == T0 + 250
    timers.run()
    jobkit.assert_state(tmq, "q", "a", JobState.DELAYED)
    clock.advance(250)
    assert timers.next_in() == 0
    timers.run()
    assert timers.promoted == 1
    jobkit.assert_state(tmq, "q", "a", JobState.PENDING)
    assert markers(tmq) == {"0": 0, "d": T0 + 250}  # ('d' is stale now: harmless)
    assert timers.due["q"] is None


def test_one_worker_sweeps_a_queue_per_interval(tmq, clock) -> None:
    tmq.enqueue("q", "job", job_id="later", delay_ms=60_000)  # something to watch
    first, second = Timers(tmq, ["q"]), Timers(tmq, ["q"])
    first.run()
    second.run()
    assert (first.sweeps, second.sweeps) == (1, 0)
    lock = tmq.keys.queue_key("q", "timers:lock")
    assert 0 < tmq.client.pttl(lock) <= 10_000
    first.sweep_at["q"] = 0.0  # its next interval, the lock not yet expired: still its own
    first.run()
    assert first.sweeps == 2


def test_idle_queues_cost_one_look_and_no_sweep(tmq, clock) -> None:
    """Queues with nothing to watch are not swept (no lock, no reads, no
    prune) and get no lease timer: the next look comes within a lease."""
    timers = Timers(tmq, ["q", "r", "s"], leases={"q": 1000, "r": 30_000, "s": 30_000})
    timers.run()
    assert (timers.sweeps, timers.looks, timers.prunes) == (0, 3, 0)
    assert not tmq.client.exists(tmq.keys.queue_key("q", "timers:lock"))
    assert timers.lease_at == {"q": None, "r": None, "s": None}
    assert 0.9 < timers.next_in() <= 1.0  # q's lease, below sweep_s
    tmq.enqueue("r", "job", job_id="a")
    tmq.client.delete(tmq.keys.queue_key("r", "wake"))  # popped by a worker killed then
    timers.sweep_at.update(dict.fromkeys(timers.queues, 0.0))
    timers.run()
    assert (timers.sweeps, timers.looks, timers.prunes) == (1, 5, 0)  # r swept, re-woken
    assert markers(tmq, "r") == {"0": 0}


def test_a_worker_prunes_a_queue_where_it_finished_jobs(tmq, clock) -> None:
    """Retention runs in the sweep after this worker finished jobs on the
    queue (the pump prunes on every sweep), not on an idle queue's."""
    jobkit.set_keep(tmq, "q", 1)
    for i in range(3):
        tmq.enqueue("q", "job", job_id=f"j{i}")
        tmq.complete(claim_one(tmq, "q", f"j{i}"), i)
    timers = Timers(tmq, ["q"])
    timers.run()
    assert (timers.sweeps, timers.prunes, tmq.job_ids("q", "completed")) == (
        0,
        0,
        ["j0", "j1", "j2"],
    )
    timers.finished("q")
    timers.sweep_at["q"] = 0.0
    timers.run()
    assert (timers.sweeps, timers.prunes, tmq.job_ids("q", "completed")) == (1, 1, ["j2"])
    assert timers.unpruned == set()


def test_a_sweep_recovers_expired_leases_and_learns_the_next_run_at(tmq, clock, caplog) -> None:
    tmq.enqueue("q", "job", job_id="a")
    tmq.enqueue("q", "job", job_id="later", delay_ms=5000)
    claim_one(tmq, "q", "a", lease_ms=100)
    clock.advance(101)
    timers = Timers(tmq, ["q"])
    with caplog.at_level("WARNING", logger="echomq_django.wake"):
        timers.run()
    assert timers.recovered == 1
    jobkit.assert_state(tmq, "q", "a", JobState.PENDING)
    assert timers.due["q"] == T0 + 5000
    # said at the default verbosity: a recovery means a worker died or lost Redis
    said = [r for r in caplog.records if r.name == "echomq_django.wake"]
    assert [r.getMessage().split(" (")[0] for r in said] == [
        "queue q: 1 job(s) whose lease expired taken back to run again, 0 job(s) dead in the "
        "recovery"
    ]


def test_a_pump_sweep_that_recovers_a_lease_says_so(tmq, clock, caplog) -> None:
    from echomq_django.runners.pump import Pump

    tmq.enqueue("q", "job", job_id="a")
    claim_one(tmq, "q", "a", lease_ms=100)
    clock.advance(101)
    with caplog.at_level("WARNING", logger="echomq_django.pump"):
        assert Pump(["q"], mq=tmq, register=False).sweep()["q"]["recovered"] == 1
    said = [r for r in caplog.records if r.name == "echomq_django.pump"]
    assert [(r.levelname, r.getMessage().split(" (")[0]) for r in said] == [
        ("WARNING",
         "queue q: 1 job(s) whose lease expired taken back to run again, 0 job(s) dead in the "
         "recovery"),
    ]  # fmt: skip


@pytest.mark.parametrize("priority", [0, 3])  # 3: waiting in P:{q}:prioritized
def test_a_sweep_rewakes_a_queue_whose_marker_was_lost(tmq, priority) -> None:
    tmq.enqueue("q", "job", job_id="a", priority=priority)
    tmq.client.delete(tmq.keys.queue_key("q", "wake"))  # popped by a worker killed then
    Timers(tmq, ["q"]).run()
    assert markers(tmq) == {"0": 0}


def test_a_lease_taken_after_the_last_look_is_recovered_at_its_deadline(tmq, clock) -> None:
    """The gap a sweep alone left (recovery 6-16 s late): a job leased after
    the worker's last look at the active set expires no sooner than a lease
    from that look, so the next look comes then and finds its deadline.
    docs/explanation/reliability.md#leases-and-recovery"""
    tmq.enqueue("q", "job", job_id="later", delay_ms=60_000)  # the queue is not idle
    timers = Timers(tmq, ["q"], leases={"q": 1000})
    timers.run()  # the first sweep: nothing active
    assert (timers.sweeps, timers.lease_at["q"]) == (1, T0 + 1000)
    clock.advance(500)
    tmq.enqueue("q", "job", job_id="s")
    dead = claim_one(tmq, "q", "s", lease_ms=1000)  # a worker that died holding it
    clock.advance(500)
    assert timers.next_in() == 0
    timers.run()  # the look: nothing expired yet, the deadline learnt
    assert (timers.recovered, timers.lease_at["q"]) == (0, dead.lease_deadline + 1)
    clock.advance(dead.lease_deadline - clock.now)
    assert timers.next_in() > 0  # due only once the deadline has passed
    clock.advance(1)
    timers.run()
    assert (timers.recovered, timers.sweeps) == (1, 1)  # by the lease timer, not a sweep
    jobkit.assert_state(tmq, "q", "s", JobState.PENDING)
    assert timers.lease_at["q"] == clock.now + 1000  # nothing active: a lease from now


def test_the_workers_own_past_leases_wait_for_its_heartbeat_not_the_recovery(tmq, clock) -> None:
    """An outage longer than a lease leaves the jobs a worker holds past
    their deadline; its timers hold their recovery off (looking every
    OWN_LOOK_MS) until the heartbeat extends them, so the worker does not
    take back and run again a job whose result it holds; a third of a lease
    at most, so another worker's expired job is not kept waiting for ever."""
    from echomq_django.runners.timers import OWN_LOOK_MS

    for job_id in ("mine", "theirs"):
        tmq.enqueue("q", "job", job_id=job_id)
    mine = claim_one(tmq, "q", "mine", lease_ms=3000)
    claim_one(tmq, "q", "theirs", lease_ms=3000)
    held = [mine]  # what this worker holds: ``theirs`` is a dead worker's
    own_past = lambda q: any(j.lease_deadline < tmq.clock() for j in held)  # noqa: E731
    timers = Timers(tmq, ["q"], leases={"q": 3000}, own_past=own_past)
    clock.advance(3001)  # the outage outlasted both leases
    timers.run()
    assert (timers.recovered, timers.lease_at["q"]) == (0, clock.now + OWN_LOOK_MS)
    jobkit.assert_state(tmq, "q", "mine", JobState.ACTIVE)
    tmq.extend_lease(mine, 3000)  # the heartbeat, once Redis answers
    clock.advance(OWN_LOOK_MS)
    timers.run()
    assert timers.recovered == 1  # the other worker's job only
    jobkit.assert_state(tmq, "q", "theirs", JobState.PENDING)
    jobkit.assert_state(tmq, "q", "mine", JobState.ACTIVE)
    # a heartbeat that never comes: the recovery goes on after a third of a lease
    clock.advance(3001)
    timers.run()
    assert timers.recovered == 1
    clock.advance(1000)
    timers.run()
    assert timers.recovered == 2
    jobkit.assert_state(tmq, "q", "mine", JobState.PENDING)


def test_own_past_reads_the_jobs_a_worker_holds(tmq, clock) -> None:
    """``wake.own_past``, the worker's ``Timers.own_past``: a held job of the
    queue, running or unreported, whose lease deadline has passed."""
    from types import SimpleNamespace

    from echomq_django.core.claims import Claims
    from echomq_django.runners.wake import own_past

    tmq.enqueue("q", "job", job_id="h")
    held = claim_one(tmq, "q", "h", lease_ms=1000)
    loop = SimpleNamespace(mq=tmq, claims=Claims())
    loop.claims.add([held])
    assert (own_past(loop, "q"), own_past(loop, "r")) == (False, False)
    clock.advance(1001)
    assert (own_past(loop, "q"), own_past(loop, "r")) == (True, False)
    held.lease_deadline = None  # refused by the heartbeat: lost, no longer ours to keep
    assert own_past(loop, "q") is False


def test_a_lease_taken_after_an_idle_look_is_recovered_at_its_deadline(tmq, clock) -> None:
    """The same from an idle queue: the look found nothing, the next comes
    within a lease, finds the job and learns its deadline."""
    timers = Timers(tmq, ["q"], leases={"q": 1000})
    timers.run()
    assert (timers.sweeps, timers.looks, timers.lease_at["q"]) == (0, 1, None)
    tmq.enqueue("q", "job", job_id="s")
    dead = claim_one(tmq, "q", "s", lease_ms=1000)  # a worker that died holding it
    assert timers.next_in() <= 1.0  # the next look within a lease
    clock.advance(500)
    timers.sweep_at["q"] = 0.0  # the look comes
    timers.run()
    assert (timers.sweeps, timers.lease_at["q"]) == (1, dead.lease_deadline + 1)
    clock.advance(dead.lease_deadline + 1 - clock.now)
    timers.run()
    assert timers.recovered == 1
    jobkit.assert_state(tmq, "q", "s", JobState.PENDING)


def test_a_worker_expires_a_parent_at_its_children_deadline(tmq, clock) -> None:
    """``children_timeout_ms`` without a pump: the worker's sweep learns the
    earliest deadline and its timer fires then
    (docs/howto/priorities-rate-limits.md#flow-control)."""
    tmq.add_flow(jobkit.node("p", [jobkit.leaf("c", queue="kids")], children_timeout_ms=2000))
    timers = Timers(tmq, ["q"])
    timers.run()
    assert timers.expire_at["q"] == T0 + 2000
    clock.advance(1999)
    timers.run()
    assert timers.expired == 0
    clock.advance(1)
    assert timers.next_in() == 0
    timers.run()
    assert (timers.expired, timers.sweeps, timers.expire_at["q"]) == (1, 1, None)
    assert tmq.get_job("q", "p").error == "children timed out"


def test_a_worker_locked_out_of_the_sweep_still_keeps_the_deadlines(tmq, clock) -> None:
    """A restarted worker finds the timers lock held by the one that died:
    it still learns the lease and children deadlines and fires them."""
    tmq.add_flow(jobkit.node("p", [jobkit.leaf("c", queue="kids")], children_timeout_ms=2000))
    tmq.client.set(tmq.keys.queue("q").timers_lock, "the-dead-worker", px=60_000)
    timers = Timers(tmq, ["q"], leases={"q": 1000})
    timers.run()
    assert (timers.sweeps, timers.expire_at["q"], timers.lease_at["q"]) == (0, T0 + 2000, T0 + 1000)
    clock.advance(2000)
    timers.run()
    assert (timers.expired, timers.sweeps) == (1, 0)
    assert tmq.get_job("q", "p").error == "children timed out"


# -- a worker restart ------------------------------------------------------------


def test_a_stopping_worker_hands_back_the_delayed_run_at_it_learnt(mq):
    """The worker that popped a queue's ``'d'`` marker stops before the job
    is due: the marker goes back, so the next worker promotes the job at its
    run-at, not at its first sweep (the stopped worker's timers lock holds
    sweeps off for ``sweep_s``)."""
    from echomq_django import Worker
    from tests.support.workerkit import Background

    first = Worker(["q"], mq=mq, register=False)
    running = Background(first)
    wait_for(lambda: first.waiting, what="an idle worker")
    mq.enqueue("q", "t.echo", "late", job_id="j", delay_ms=60_000)
    run_at = mq.timers.next_run_at("q")
    wait_for(lambda: first.timers.due["q"] == run_at, what="the marker popped")
    assert markers(mq) == {}  # the first worker holds what it learnt
    first.stop()
    running.join()
    assert markers(mq) == {"d": run_at}  # handed back for the next worker


def test_a_second_burst_runs_a_job_that_came_due_while_the_timers_lock_is_held(mq):
    """A burst runs what is pending or due: the first burst swept the queue
    (and holds its timers lock for ``sweep_s``); the job comes due after it
    exits; the second burst promotes and runs it."""
    import time

    from tests.support.workerkit import burst

    due = time.monotonic() + 1.0  # room for a slow machine's first burst to end before it
    mq.enqueue("q", "t.echo", "soon", job_id="j", delay_ms=1000)
    _, processed = burst(mq, ["q"], register=False)
    assert processed == 0
    assert mq.client.exists(mq.keys.queue("q").timers_lock)
    time.sleep(max(0.0, due - time.monotonic()) + 0.05)  # due now; the lock still held
    _, processed = burst(mq, ["q"], register=False)
    assert processed == 1
    assert mq.get_job("q", "j").state is JobState.COMPLETED


def test_an_inbox_wait_keeps_its_timeout_while_signal_handlers_run():
    """The main thread waits 50 ms at a time while a SIGUSR1 handler that
    takes 2 ms runs every 3 ms: each wait ends (``queue.Empty``) near its
    timeout, and an item put from another thread is taken at once."""
    inbox = Inbox()
    before = signal.signal(signal.SIGUSR1, lambda signum, frame: time.sleep(0.002))
    done = threading.Event()

    def storm() -> None:
        end = time.monotonic() + 5
        while not done.is_set() and time.monotonic() < end:
            os.kill(os.getpid(), signal.SIGUSR1)
            time.sleep(0.003)
        inbox.put("unblock")  # a wait that lost its timeout ends here, and the test fails

    thread = threading.Thread(target=storm, daemon=True)
    thread.start()
    longest = 0.0
    try:
        for _ in range(20):
            started = time.monotonic()
            with pytest.raises(_queue.Empty):
                inbox.get(timeout=0.05)
            longest = max(longest, time.monotonic() - started)
        threading.Timer(0.02, inbox.put, ("item",)).start()
        assert inbox.get(timeout=5) == "item"
    finally:
        done.set()
        thread.join()
        signal.signal(signal.SIGUSR1, before)
    assert longest < 1.0
    assert (inbox.get_nowait(), inbox.empty()) == ("unblock", True)


def test_the_inbox_hears_every_put_from_many_threads() -> None:
    """Three threads put 2,000 items each, in bursts and alone, while the
    loop waits: every item is taken, each thread's in order, no wait runs
    out (a ring lost between the loop's look and its wait would leave an
    item unheard for the whole timeout), and a ring left over from a put
    the loop did not need only makes the next wait look again."""
    inbox, per_thread = Inbox(), 2_000

    def producer(name: str) -> None:
        for i in range(per_thread):
            inbox.put((name, i))
            if i % 7 == 0:
                time.sleep(0.0001)

    threads = [threading.Thread(target=producer, args=(n,)) for n in "abc"]
    for thread in threads:
        thread.start()
    got: dict[str, list[int]] = {n: [] for n in "abc"}
    longest = 0.0
    for _ in range(3 * per_thread):
        started = time.monotonic()
        name, i = inbox.get(timeout=5)
        longest = max(longest, time.monotonic() - started)
        got[name].append(i)
    for thread in threads:
        thread.join()
    assert got == {n: list(range(per_thread)) for n in "abc"}
    assert longest < 1.0  # a put rang: no item waited for the wait's timeout
    inbox.put("late")  # the loop is not waiting: no ring
    assert inbox.get(timeout=0) == "late"
    with pytest.raises(_queue.Empty):
        inbox.get(timeout=0.05)  # a ring left over, if any, ends in a look and a wait
