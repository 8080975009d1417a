"""Outages at the edges, with real ``runworker`` / ``runpump`` processes and
a committing view (a ``manage.py shell`` process adding jobs in
``transaction.atomic()``, through the commit outbox):

* Redis down when everything starts: the runners wait for it (one WARNING
  line per backoff step, one recovery line), the view's commits stand, and
  every job runs once Redis is started;
* a whole Cluster down (every master SIGKILLed, restarted with its
  append-only file): the runners wait and recover, a pump stopped meanwhile
  exits cleanly, the view's commits stand and its other ``on_commit`` hooks
  run (a view process started meanwhile too), nothing is lost;
* a worker stopped (SIGTERM) before its delayed jobs are due: the next
  worker starts each of them, once.

(docs/explanation/reliability.md,
docs/howto/durable-enqueue.md#outside-a-transaction-too-enqueue_when_down)
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest
from redis.cluster import RedisCluster

from echomq_django import EchoMQ, JobState
from echomq_django.testing.redis_server import restart
from tests.support import rigs
from tests.support.faultkit import Committer, Proc, migrate, runs, wait_until

pytestmark = pytest.mark.e2e

PUMP_ARGS = ("--interval", "0.2", "--no-mirror")


def outbox_rows(logs: Path) -> int:
    with sqlite3.connect(logs / "db.sqlite3") as db:
        return db.execute("SELECT count(*) FROM echomq_django_outboxentry").fetchone()[0]


def committed(start: int, count: int) -> list[str]:
    """What the view prints when each commit stood and its own hook ran."""
    return [f"committed v{n} hooks [{n}]" for n in range(start, start + count)]


def stop_all(procs: list[Proc]) -> list[int | None]:
    for p in procs:
        p.stop()
    return [p.proc.returncode for p in procs]


def test_runners_and_a_view_started_before_redis_come_up_with_it(tmp_path):
    server = rigs.start_server(options={"appendonly": "yes"})
    server.proc.kill()  # its port and directory stay: Redis is down until restart()
    server.proc.wait()
    url, run_log = server.url, tmp_path / "runs.log"
    migrate(tmp_path, url, False)
    worker = Proc(tmp_path, url, False, "runworker", "fa")
    pump = Proc(tmp_path, url, False, "runpump", "fa", *PUMP_ARGS)
    view = Committer(tmp_path, url, False, run_log)
    try:
        assert view.commit(0, 10) == committed(0, 10)  # the commits stand
        assert outbox_rows(tmp_path) == 10
        tried = wait_until(
            lambda: all(p.log.read_text().count("Redis unreachable") >= 3 for p in (worker, pump)),
            30,
        )
        assert tried, worker.log.read_text() + pump.log.read_text()
        server = restart(server)
        done = wait_until(lambda: len(runs(run_log)) == 10, 30)
        assert done, worker.log.read_text() + pump.log.read_text()
        # the worker's drainer may push and run every job while the pump is
        # still in a backoff wait (up to 30 s): it meets Redis at its next try
        back = wait_until(
            lambda: all("reachable again" in p.log.read_text() for p in (worker, pump)), 45
        )
        assert back, worker.log.read_text() + pump.log.read_text()
        assert view.stop() == 0
        assert stop_all([worker, pump]) == [0, 0]
    finally:
        for p in (worker, pump):
            p.kill()
        view.proc.kill()
        server.stop()
    assert runs(run_log) == {f"v{n}": [worker.proc.pid] for n in range(10)}  # each once
    assert outbox_rows(tmp_path) == 0
    for proc in (worker, pump):
        lines = proc.log.read_text().splitlines()
        waits = [
            float(re.search(r"retrying in ([\d.]+)s$", line).group(1))
            for line in lines
            if line.startswith("Redis unreachable at ")
        ]
        assert len(waits) >= 3
        assert waits == [min(0.5 * 2**i, 2.0) for i in range(len(waits))], lines
        assert [line for line in lines if "reachable again" in line] == [
            f"Redis reachable again at {url}"
        ], lines


def test_a_whole_cluster_outage_loses_nothing(tmp_path):
    cluster = rigs.start_cluster(options={"appendonly": "yes", "appendfsync": "always"})
    url, run_log = cluster.url, tmp_path / "runs.log"
    procs: list[Proc] = []
    try:
        migrate(tmp_path, url, True)
        worker = Proc(tmp_path, url, True, "runworker", "fa", "--concurrency", "2")
        pumps = [Proc(tmp_path, url, True, "runpump", "fa", *PUMP_ARGS) for _ in range(2)]
        procs = [worker, *pumps]
        view = Committer(tmp_path, url, True, run_log)
        assert view.commit(0, 10) == committed(0, 10)
        assert wait_until(lambda: len(runs(run_log)) == 10, 30)
        cluster.kill_all()  # no node answers
        assert view.commit(10, 10) == committed(10, 10)  # no error reached the view
        assert "stays in the commit outbox" in view.log.read_text()
        # a view process that starts now builds its client while no node answers
        late = Committer(tmp_path, url, True, run_log)
        assert late.commit(100, 5) == committed(100, 5), late.log.read_text()
        # a pump stopped while no node answers leaves cleanly (its registry
        # entry expires with the heartbeat it could not delete)
        pumps[1].proc.terminate()
        assert pumps[1].proc.wait(20) == 0, pumps[1].log.read_text()
        assert [p.proc.poll() for p in (worker, pumps[0])] == [None, None]
        cluster.restart_all()
        assert view.commit(20, 10) == committed(20, 10)
        done = wait_until(lambda: len(runs(run_log)) == 35, 45)
        assert done, worker.log.read_text() + pumps[0].log.read_text()
        assert late.commit(105, 5) == committed(105, 5)  # its client works now
        assert wait_until(lambda: len(runs(run_log)) == 40, 30)
        assert (view.stop(), late.stop()) == (0, 0)
        assert stop_all([worker, pumps[0]]) == [0, 0]
        client = RedisCluster(host=rigs.HOST, port=cluster.ports[0])
        try:
            mq = EchoMQ(client, prefix="emq")
            ids = [*range(30), *range(100, 110)]
            states = {mq.get_job("fa", f"v{n}").state for n in ids}
        finally:
            client.close()
    finally:
        for p in procs:
            p.kill()
        cluster.stop()
    assert states == {JobState.COMPLETED}  # the jobs done before the outage kept too
    assert set(runs(run_log)) == {f"v{n}" for n in ids}
    assert outbox_rows(tmp_path) == 0


def test_delayed_jobs_due_after_a_worker_stops_run_once_on_the_next(tmp_path, redis_server, r):
    run_log = tmp_path / "runs.log"
    migrate(tmp_path, redis_server, False)
    mq = EchoMQ(r, prefix="emq")
    first = Proc(tmp_path, redis_server, False, "runworker", "fa")
    second = None
    try:
        assert wait_until(lambda: mq.presence.live_processes(), 30), first.log.read_text()
        payload = {"log": str(run_log)}
        for n in range(20):
            mq.enqueue("fa", "fault.once", {**payload, "n": n}, job_id=f"d{n}", delay_ms=1000)
        first.proc.terminate()
        assert first.proc.wait(20) == 0
        assert runs(run_log) == {}  # none was due while it ran
        second = Proc(tmp_path, redis_server, False, "runworker", "fa")
        done = wait_until(lambda: len(runs(run_log)) == 20, 30)
        assert done, second.log.read_text()
        assert stop_all([second]) == [0]
    finally:
        for p in (first, second):
            if p is not None:
                p.kill()
    assert runs(run_log) == {f"d{n}": [second.proc.pid] for n in range(20)}
    assert {mq.get_job("fa", f"d{n}").state for n in range(20)} == {JobState.COMPLETED}
