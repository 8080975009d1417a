"""A worker whose free slots are held for claims riding its completions
(docs/explanation/no-polling.md#a-released-parent-starts-at-once) while jobs
come to its other queues: they run on a wake-up, never on a blocking
timeout or a sweep (both far longer than any test waits). Flows on the
worker's queue and across queues (with and without the fan-in on one
server), jobs added and delayed jobs coming due on another queue while
the flows drain, on each pool and with one to three handlers, with its
connections killed again and again, and with a riding claim whose job does
not decode; the worker ends up blocked on the wake keys again, and
``max_jobs`` and a stop end it."""

from __future__ import annotations

import threading
import time

import pytest

from echomq_django import Flow, JobState, Worker
from tests.support.workerkit import Background, wait_for

NEVER = 3600.0  # s: a blocking timeout and a sweep interval no test waits for
KIDS = 60


def idle_worker(mq, queues, **kw) -> Worker:
    options = {"block_timeout": NEVER, "sweep_interval": NEVER, "register": False, **kw}
    return Worker(list(queues), mq=mq, **options)


def state(mq, queue, job_id):
    return mq.get_job(queue, job_id).state


def add_flows(mq, parent_queue: str, rounds: int, first: int = 0) -> list[tuple[str, str]]:
    """``rounds`` flows of a parent on ``parent_queue`` and ``KIDS`` children
    on "q", the parents ``p<first>`` on."""
    parents = []
    for n in range(first, first + rounds):
        kids = [Flow("q", "t.echo", i) for i in range(KIDS)]
        mq.add_flow(Flow(parent_queue, "t.echo", n, job_id=f"p{n}", children=kids))
        parents.append((parent_queue, f"p{n}"))
    return parents


def drive(mq, worker, parent_queue: str) -> None:
    """Flows drain on "q" while jobs and delayed jobs come to "r" (and delayed
    jobs to "q"); every job
    completes, and the worker blocks on its queues again."""
    bg = Background(worker)
    try:
        wait_for(lambda: worker.waiting, timeout=30, what="the worker blocking")
        others, parents = [], []
        for n in range(4):
            parents += add_flows(mq, parent_queue, 1, first=n)
            for k in range(5):
                mq.enqueue("r", "t.echo", k, job_id=f"r{n}-{k}")
                others.append(("r", f"r{n}-{k}"))
                time.sleep(0.002)
            mq.enqueue("r", "t.echo", n, job_id=f"d{n}", delay_ms=30 + 20 * n)
            mq.enqueue("q", "t.echo", n, job_id=f"e{n}", delay_ms=40 + 20 * n)
            others += [("r", f"d{n}"), ("q", f"e{n}")]
        every = parents + others
        left = lambda: [j for j in every if state(mq, *j) is not JobState.COMPLETED]  # noqa: E731
        try:
            wait_for(lambda: not left(), timeout=60, what="every job")
        except AssertionError:
            raise AssertionError(f"left: {left()[:10]}; wakeups {worker.wakeups}") from None
        wait_for(lambda: worker.waiting, timeout=30, what="the worker blocking again")
    finally:
        worker.stop()
        bg.join(60)


POOLS = [
    pytest.param("thread", 1, id="thread-1"),
    pytest.param("thread", 3, id="thread-3"),
    pytest.param("async", 1, id="async-1"),
    pytest.param("async", 3, id="async-3"),
    pytest.param("process", 1, id="process-1"),
    pytest.param("process", 2, id="process-2"),
]


@pytest.mark.parametrize(("pool", "concurrency"), POOLS)
def test_jobs_on_another_queue_run_while_a_flow_drains_on_its_own_claims(
    mq, pool, concurrency
) -> None:
    drive(mq, idle_worker(mq, ("q", "r"), pool=pool, concurrency=concurrency), "q")


@pytest.mark.parametrize(("pool", "concurrency"), POOLS)
@pytest.mark.parametrize("across", [True, False], ids=["one-server-fan-in", "outbox"])
def test_jobs_on_another_queue_run_while_a_cross_queue_flow_drains(
    redis_client, pool, concurrency, across
) -> None:
    from echomq_django import EchoMQ

    mq = EchoMQ(redis_client, prefix="emq", cross_queue_scripts=across)
    worker = idle_worker(mq, ("q", "p", "r"), pool=pool, concurrency=concurrency)
    drive(mq, worker, "p")


@pytest.mark.parametrize("concurrency", [1, 3])
def test_max_jobs_ends_a_worker_whose_slots_ride_its_claims(mq, concurrency) -> None:
    add_flows(mq, "q", 1)
    worker = idle_worker(mq, ("q", "r"), concurrency=concurrency)
    bg = Background(worker, max_jobs=KIDS + 1)
    assert bg.join(60) == KIDS + 1
    assert state(mq, "q", "p0") is JobState.COMPLETED
    assert mq.counts("q")["active"] == 0


@pytest.mark.parametrize("concurrency", [1, 3])
def test_a_stop_while_the_flow_drains_leaves_nothing_active(mq, concurrency) -> None:
    add_flows(mq, "q", 3)
    worker = idle_worker(mq, ("q", "r"), concurrency=concurrency)
    bg = Background(worker)
    wait_for(lambda: worker.processed >= 20, timeout=30, what="some jobs")
    worker.stop()
    bg.join(60)
    assert mq.counts("q")["active"] == 0
    rest = idle_worker(mq, ("q", "r"), concurrency=concurrency)
    bg = Background(rest)
    try:
        wait_for(lambda: all(state(mq, "q", f"p{n}") is JobState.COMPLETED for n in range(3)),
                 timeout=60, what="the parents")  # fmt: skip
    finally:
        rest.stop()
        bg.join(60)


@pytest.mark.parametrize("concurrency", [1, 3])
def test_connections_killed_while_a_flow_drains_on_its_own_claims_lose_no_wake_up(
    redis_server, concurrency, caplog
) -> None:
    """Every client connection of the worker is killed again and again while
    its completions carry claims (some raise, some lose their reply): every
    flow and every job added to its other queue meanwhile completes, well
    within a lease (every claim lost, several on one queue at once, is sent
    again: none waits its lease out), and it blocks on its queues again.
    Rounds go on until ten claims were lost (at most ten rounds: a fast
    machine's drain may outrun the kills), and at least one kill must have
    reached a claim or a report."""
    import redis

    from echomq_django import EchoMQ
    from echomq_django.core.exceptions import RedisUnavailable

    client, killer = redis.Redis.from_url(redis_server), redis.Redis.from_url(redis_server)
    client.flushall()
    mq = EchoMQ(client, prefix="emq")
    worker = idle_worker(mq, ("q", "r"), concurrency=concurrency)
    lost, take = [], worker.loop._take

    def spy(queue, token, claimed):  # a claim riding a completion raised
        lost.extend([token] if isinstance(claimed, RedisUnavailable) else [])
        take(queue, token, claimed)

    worker.loop._take = spy
    bg = Background(worker)

    def kill() -> None:
        # the two killing threads share `killer`'s pool: each kills the other's
        # connection too (skipme spares only its own), so a kill may meet a
        # closed connection; the next one reconnects
        try:
            killer.client_kill_filter(_type="normal", skipme=True)
        except redis.ConnectionError:
            pass

    def reached() -> bool:  # a kill reached the worker's claims or reports
        return bool(lost) or any("Redis unreachable" in r.getMessage() for r in caplog.records)

    try:
        wait_for(lambda: worker.waiting, timeout=30, what="the worker blocking")

        def left(jobs):
            return [j for j in jobs if state(mq, *j) is not JobState.COMPLETED]

        for rnd in range(10):  # a round's jobs (retention may remove earlier rounds')
            jobs = add_flows(mq, "q", 4, first=4 * rnd)

            def keep_killing():  # every 20 ms for 0.5 s: a fast drain outruns the kills below
                for _ in range(25):
                    time.sleep(0.02)
                    kill()

            kills = threading.Thread(target=keep_killing, daemon=True)
            kills.start()
            for n in range(8):
                kill()
                time.sleep(0.01 * (n % 3))
                for _ in range(20):  # this client's connection was killed too
                    try:
                        mq.enqueue("r", "t.echo", n, job_id=f"r{rnd}-{n}")
                        break
                    except Exception:
                        time.sleep(0.05)
                jobs.append(("r", f"r{rnd}-{n}"))
            kills.join(30)

            try:
                # well within LEASE_MS (30 s): no job waits for its lease to run out
                wait_for(lambda jobs=jobs: not left(jobs), timeout=20, what="every job")
            except AssertionError:
                raise AssertionError(f"left: {left(jobs)[:10]}; wakeups {worker.wakeups}") from None
            wait_for(lambda: worker.waiting, timeout=30, what="the worker blocking again")
            assert mq.counts("q")["active"] == mq.counts("r")["active"] == 0
            if len(lost) >= 10:  # enough claims lost and sent again
                break
        assert reached(), "no kill reached the worker's claims or reports in 10 rounds"
    finally:
        worker.stop()
        bg.join(60)
        killer.close()
        client.close()


def test_a_claim_riding_a_delivery_whose_job_does_not_decode_frees_its_slot(
    redis_client,
) -> None:
    """The worker delivers a cross-queue child's outbox entry itself with a claim
    of the parent's queue riding it; the parent it claims holds a payload that
    is not JSON (a row written by something else): the claim's error frees
    the slot held for it, so the worker claims and blocks again, and a stop
    returns at once."""
    from echomq_django import EchoMQ

    mq = EchoMQ(redis_client, prefix="emq", cross_queue_scripts=False)
    kid = Flow("q", "t.echo", 1, job_id="c")
    mq.add_flow(Flow("p", "t.echo", "x", job_id="p0", children=[kid]))
    mq.client.hset(mq.keys.job("p", "p0"), "d", "not json{")  # the payload
    worker = idle_worker(mq, ("q", "p"), concurrency=1, shutdown_timeout=NEVER)
    bg = Background(worker)
    try:
        wait_for(lambda: state(mq, "q", "c") is JobState.COMPLETED, what="the child")
        mq.enqueue("q", "t.echo", 2, job_id="after")
        wait_for(lambda: state(mq, "q", "after") is JobState.COMPLETED, what="the next job")
        wait_for(lambda: worker.waiting, what="the worker blocking again")
    finally:
        worker.stop()
        bg.join(30)
