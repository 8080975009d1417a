"""Live resharding: a queue's slot moved to another master key by key
(``MIGRATING`` / ``IMPORTING``, ``MIGRATE``, ``SETSLOT NODE``, as ``redis-cli
--cluster reshard`` does) while real ``runworker`` / ``runpump`` processes and
a producer use it. While a slot migrates, Redis refuses every script call on
it (each declares the queue's ``absent`` key), so no script stops midway on a
key already moved; the calls are "not now" and run on the new master once the
slot settles. Every flow ends in its predicted state, every plain job runs
once, nothing is left in an outbox.
docs/explanation/reliability.md#a-slot-moved-under-load"""

from __future__ import annotations

import itertools
import threading
import time

import pytest
import redis
from redis.cluster import RedisCluster

from echomq_django import EchoMQ, EchoMQError, JobState
from tests.support import rigs
from tests.support.faultkit import QUEUES, Proc, audit, make_flows, roots_done, runs, wait_until

pytestmark = pytest.mark.e2e

FLOWS, PLAIN, BATCH = 200, 300, 25
SEED = 23
BUDGET_S = 120.0
ERRORS = (EchoMQError, redis.RedisError, redis.exceptions.RedisClusterException)


@pytest.fixture
def cluster():
    rig = rigs.start_cluster()  # its own: this test moves slots between masters
    try:
        yield rig
    finally:
        rig.stop()


def _feed(mq, flows, plain, run_log, stop, report) -> None:
    """Add the flows and the plain jobs in batches of ``BATCH``, a batch every
    0.1 s; a batch that meets a slot migrating is added again (an add is
    idempotent by id)."""
    flow_batches = [("flows", flows[i : i + BATCH]) for i in range(0, len(flows), BATCH)]
    plain_batches = [("plain", plain[i : i + BATCH]) for i in range(0, len(plain), BATCH)]
    todo = [b for pair in itertools.zip_longest(flow_batches, plain_batches) for b in pair if b]
    while todo and not stop.is_set():
        kind, batch = todo[0]
        try:
            if kind == "flows":
                mq.add_flows(batch)
            else:
                while batch:  # one job at a time: an id already added is not added again
                    queue, job_id, n = batch[0]
                    payload = {"log": str(run_log), "n": n, "ms": 5}
                    mq.enqueue(queue, "fault.once", payload, job_id=job_id)
                    batch.pop(0)
        except ERRORS as err:
            report["add_retries"] += 1
            report["last_add_error"] = repr(err)[:300]
        else:
            todo.pop(0)
            report["batches_added"] += 1
        time.sleep(0.1)


def _other_master(cluster, key: str) -> int:
    home = cluster.master_port(key)
    return next(p for p in cluster.ports if p != home)


def test_flows_and_jobs_survive_their_slots_moving_under_load(cluster, tmp_path, capsys):
    client = RedisCluster(host=rigs.HOST, port=cluster.ports[0])
    mq = EchoMQ(client, prefix="emq")
    flows = make_flows(FLOWS, SEED)
    run_log = tmp_path / "runs.log"
    plain = [(QUEUES[n % 2], f"v{n}", n) for n in range(PLAIN)]
    workers = [
        Proc(tmp_path, cluster.url, True, "runworker", *QUEUES, "--concurrency", "8")
        for _ in range(2)
    ]
    pump = Proc(tmp_path, cluster.url, True, "runpump", *QUEUES, "--interval", "0.2", "--no-mirror")
    procs = [*workers, pump]
    report = {"add_retries": 0, "batches_added": 0, "moves": []}
    stop = threading.Event()
    feeder = threading.Thread(
        target=_feed, args=(mq, flows, plain, run_log, stop, report), daemon=True
    )
    fa, fb = mq.keys.queue("fa").pending, mq.keys.queue("fb").pending
    home = cluster.master_port(fa)
    try:
        feeder.start()
        assert wait_until(lambda: report["batches_added"] >= 3, 30), report
        for key, to in ((fa, _other_master(cluster, fa)), (fb, _other_master(cluster, fb))):
            started = time.monotonic()
            moved = cluster.move_slot(key, to, batch=10, pause_s=0.002)
            report["moves"].append((moved, round(time.monotonic() - started, 2)))
        wait_until(lambda: roots_done(mq, flows) >= FLOWS // 4, 60)
        report["roots_done_before_the_move_back"] = roots_done(mq, flows)
        started = time.monotonic()
        moved = cluster.move_slot(fa, home, batch=10, pause_s=0.002)  # and back, under load
        settled_ms = time.time() * 1000
        report["moves"].append((moved, round(time.monotonic() - started, 2)))
        feeder.join(BUDGET_S)
        assert not feeder.is_alive(), f"the producer never added every batch: {report}"
        wait_until(lambda: roots_done(mq, flows) >= FLOWS, BUDGET_S, 0.2)
        wait_until(lambda: audit(mq, flows).outbox_left == 0, 30, 0.2)
        finished = sum(
            mq.get_job(q, i).state in (JobState.COMPLETED, JobState.DEAD) for q, i, _ in plain
        )
        wait_until(lambda: len(runs(run_log)) >= PLAIN, 30, 0.2)
    finally:
        stop.set()
        for p in procs:
            p.stop()
        feeder.join(10)
    fig = audit(mq, flows)
    [(_, first_ms)] = client.zrangebyscore(
        mq.keys.queue("fa").completed, settled_ms, "+inf", start=0, num=1, withscores=True
    )
    report["first_completion_after_the_move_back_s"] = round((first_ms - settled_ms) / 1000, 3)
    ran = runs(run_log)
    logs = "".join(p.log.read_text(errors="replace") for p in procs)
    with capsys.disabled():
        print(f"\n[fault suite: slots moved under load] {fig.line()}; {report}")
    assert report["roots_done_before_the_move_back"] < FLOWS  # the last move met live work
    assert all(moved > 0 for moved, _ in report["moves"])
    assert (fig.wrong, fig.lost, fig.released_twice, fig.negative_counters) == ([], [], [], [])
    assert (fig.outbox_left, fig.deadlettered) == (0, 0)
    assert fig.in_predicted_state == fig.nodes
    assert finished == PLAIN
    assert [mq.get_job(q, i).result for q, i, _ in plain] == [n for _, _, n in plain]
    assert {i: len(pids) for i, pids in ran.items() if len(pids) != 1} == {}  # each ran once
    assert "non local key" not in logs and "BUSYKEY" not in logs
