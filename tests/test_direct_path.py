"""The direct path (docs/explanation/no-polling.md#the-direct-path): a
handler thread that completed a job while the reporter had nothing to do
reports it itself and runs the job its completion claimed; failures, and
reports an outage cut, take the batched path through the reporter thread."""

from __future__ import annotations

import threading
import time

import redis

from echomq_django import EchoMQ, Flow, JobState, Worker, handler, signals
from tests.support.workerkit import burst

SIGNALLED: list[str] = []  # the threads job_failed was sent on
CUTS: list[int] = []  # connections the cutting handler killed


@handler("direct.step")
def step(job):
    return f"{job.id} done"


@handler("direct.boom")
def boom(job):
    raise ValueError("no")


@handler("direct.cut")
def cut(job):
    """Hold the server's writes, then cut every connection but the admin's
    while this job's completion waits under the hold."""
    admin = redis.Redis.from_url(job.payload["url"])
    admin.execute_command("CLIENT", "PAUSE", 300, "WRITE")

    def kill() -> None:
        time.sleep(0.1)
        CUTS.append(admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"))
        admin.close()

    threading.Thread(target=kill, daemon=True).start()
    return "cut done"


def flow(first: str, payload=None) -> Flow:
    kids = [Flow("q", first, payload, job_id="c1"), Flow("q", "direct.step", None, job_id="c2")]
    return Flow("q", "direct.step", None, job_id="p", children=kids)


def test_a_flow_on_an_idle_worker_takes_the_direct_path_throughout(mq) -> None:
    mq.add_flow(flow("direct.step"))
    worker, processed = burst(mq, ["q"], concurrency=1)
    assert processed == 3
    states = [(mq.get_job("q", i).state, mq.get_job("q", i).result) for i in ("c1", "c2", "p")]
    assert states == [
        (JobState.COMPLETED, "c1 done"),
        (JobState.COMPLETED, "c2 done"),
        (JobState.COMPLETED, "p done"),
    ]
    # each completed job reported itself, c2 and p claimed by those reports
    assert worker.loop.direct.used == 3
    assert (worker.loop.claimed, worker.stats["completed"], worker.abandoned) == (3, 3, 0)


def test_a_failure_takes_the_batched_path_its_signal_on_the_reporter(mq) -> None:
    def seen(sender, **kw) -> None:
        SIGNALLED.append(threading.current_thread().name)

    SIGNALLED.clear()
    signals.job_failed.connect(seen)
    try:
        mq.enqueue("q", "direct.boom", None, job_id="f", max_attempts=2)
        worker, processed = burst(mq, ["q"], concurrency=1)
    finally:
        signals.job_failed.disconnect(seen)
    assert (processed, worker.stats["failed"], worker.loop.direct.used) == (1, 1, 0)
    assert SIGNALLED == ["echomq-reporter"]
    job = mq.get_job("q", "f")
    assert (job.attempts, job.error.splitlines()[0]) == (1, "ValueError: no")


def test_a_direct_report_cut_by_an_outage_is_reported_by_the_reporter(r, redis_server) -> None:
    mq = EchoMQ(r, prefix="emq")
    CUTS.clear()
    mq.add_flow(flow("direct.cut", {"url": redis_server}))
    worker = Worker(["q"], concurrency=1, mq=mq)
    own, real = [], worker.loop.reporter.report_own

    def report_own(finished) -> bool:
        own.append((finished.job.id, real(finished)))
        return own[-1][1]

    worker.loop.reporter.report_own = report_own
    processed = worker.run(burst=True)
    assert CUTS and CUTS[0] >= 1
    # c1's own report was cut under its completion: the reporter thread sent it
    assert own[0] == ("c1", False)
    assert processed == 3
    assert [mq.get_job("q", i).result for i in ("c1", "c2", "p")] == [
        "cut done",
        "c2 done",
        "p done",
    ]
    assert (worker.stats["completed"], worker.stats["lost"], worker.abandoned) == (3, 0, 0)
    assert worker.loop.direct.used == sum(ok for _, ok in own)
