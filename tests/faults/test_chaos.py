"""The fault suite: real ``runworker`` / ``runpump`` processes
SIGKILLed at random while a few hundred flows run (nested, cross-queue,
mixed policies, some children failing), on the replica Cluster with a
master failover in the middle, and on a single server with AOF that is
SIGKILLed and restarted. Each run asserts every node in its predicted end
state, no acknowledged job lost, no parent released twice, no counter
below zero, outboxes drained, and prints those figures (the README's
Reliability section quotes them)."""

from __future__ import annotations

import random
import time

import pytest
import redis
from redis.cluster import RedisCluster

from echomq_django import EchoMQ, EchoMQError
from echomq_django.testing.redis_server import restart
from tests.support import rigs
from tests.support.faultkit import QUEUES, Proc, audit, make_flows, roots_done, wait_until

pytestmark = pytest.mark.e2e

FLOWS = 300
SEED = 17
BUDGET_S = 120.0  # the flows' end, kills included; the rest is start-up and the audit


def start_processes(tmp_path, url: str, cluster: bool) -> tuple[list[Proc], list[Proc]]:
    queues = list(QUEUES)
    worker_args = ("--concurrency", "8", "--max-stalls", "1000", "--verbosity", "0")
    workers = [Proc(tmp_path, url, cluster, "runworker", *queues, *worker_args) for _ in range(2)]
    pump_args = ("--interval", "0.2", "--max-stalls", "1000", "--no-mirror", "--verbosity", "0")
    pumps = [Proc(tmp_path, url, cluster, "runpump", *queues, *pump_args) for _ in range(2)]
    return workers, pumps


def safe(fn, default=0):
    """``fn()``, or ``default`` while Redis is failing over or restarting."""
    try:
        return fn()
    except (redis.RedisError, redis.exceptions.RedisClusterException, ConnectionError):
        return default


class Feed:
    """Adds the flows in batches of ``BATCH``, one every ``EVERY_S`` s, while
    the chaos runs; a batch that meets Redis down is added again (an add is
    idempotent by id). ``wait`` runs after each batch (the Cluster: WAIT for
    a replica, so an acknowledged add survives a failover)."""

    BATCH, EVERY_S = 25, 0.5

    def __init__(self, mq, flows, wait=None) -> None:
        self.mq, self.flows, self.wait = mq, flows, wait
        self.added, self.next_at, self.retries = 0, 0.0, 0

    def __call__(self) -> int:
        if self.added < len(self.flows) and time.monotonic() >= self.next_at:
            try:
                self.mq.add_flows(self.flows[self.added : self.added + self.BATCH])
                if self.wait:
                    self.wait()
            except (EchoMQError, redis.RedisError, redis.exceptions.RedisClusterException):
                self.retries += 1
            else:
                self.added = min(self.added + self.BATCH, len(self.flows))
            self.next_at = time.monotonic() + self.EVERY_S
        return self.added


def chaos(rng, procs: list[Proc], feed: Feed, done, fault) -> dict:
    """SIGKILL a random worker or pump every 0.5-1.5 s (and start it again at
    once) while ``feed`` adds the flows, until every root is done; ``fault()``
    runs once, when a third of the flows are added. Returns what happened."""
    total = len(feed.flows)
    started = time.monotonic()
    next_kill = started + rng.uniform(0.5, 1.5)
    report = {"fault": None}
    while time.monotonic() - started < BUDGET_S:
        added = feed()
        if report["fault"] is None and added >= total // 3:
            report["fault"] = fault()
        if added == total and safe(done) >= total:
            break
        if time.monotonic() >= next_kill:
            victim = rng.choice(procs)
            victim.kill()
            victim.again()
            next_kill = time.monotonic() + rng.uniform(0.5, 1.5)
        time.sleep(0.05)
    report["seconds"] = round(time.monotonic() - started, 1)
    report["add_retries"] = feed.retries
    report["kills"] = {
        "workers": sum(p.kills for p in procs if p.args[0] == "runworker"),
        "pumps": sum(p.kills for p in procs if p.args[0] == "runpump"),
    }
    return report


def settle(mq, flows, procs: list[Proc]):
    """Let the last cross-queue deliveries land, stop every process, audit."""
    wait_until(lambda: safe(lambda: audit(mq, flows).outbox_left == 0, False), 30, 0.2)
    wait_until(lambda: safe(lambda: not audit(mq, flows).wrong, False), 30, 0.2)
    for p in procs:
        p.stop()
    return audit(mq, flows)


def check(fig, report, label: str, capsys) -> None:
    with capsys.disabled():
        print(f"\n[fault suite: {label}] {fig.line()}; {report}")
    assert fig.wrong == []
    assert fig.lost == []
    assert fig.released_twice == []
    assert fig.negative_counters == []
    assert (fig.outbox_left, fig.deadlettered) == (0, 0)
    assert fig.in_predicted_state == fig.nodes


def test_flows_survive_kills_and_a_master_failover(redis_cluster_ha, rch, tmp_path, capsys):
    mq = EchoMQ(rch, prefix="emq")
    flows = make_flows(FLOWS, SEED)
    # acknowledged means on a replica too: a failover must not take it back
    feed = Feed(
        mq, flows, lambda: rch.execute_command("WAIT", 1, 2000, target_nodes=RedisCluster.PRIMARIES)
    )
    url = redis_cluster_ha.live()[0].url
    workers, pumps = start_processes(tmp_path, url, cluster=True)
    procs = workers + pumps
    rng = random.Random(SEED)
    cluster = redis_cluster_ha

    def failover() -> dict:
        key = mq.keys.queue("fb").pending
        completed = mq.keys.queue("fb").completed
        before = safe(lambda: rch.zcard(completed))
        killed_at = time.monotonic()
        dead = cluster.kill_master(key)
        cluster.wait_promoted(key, dead)
        promoted_at = time.monotonic()
        wait_until(lambda: safe(lambda: rch.zcard(completed)) > before, 30)
        recovered_at = time.monotonic()
        cluster.restart(dead)
        return {
            "promoted_s": round(promoted_at - killed_at, 2),
            "first_completion_after_promotion_s": round(recovered_at - promoted_at, 2),
        }

    try:
        report = chaos(rng, procs, feed, lambda: roots_done(mq, flows), failover)
        fig = settle(mq, flows, procs)
    finally:
        for p in procs:
            p.kill()
    check(fig, report, "cluster, kills + failover", capsys)
    assert report["fault"] is not None  # the failover happened


def test_flows_survive_kills_and_a_redis_restart_with_aof(tmp_path, capsys):
    server = rigs.start_server(options={"appendonly": "yes", "appendfsync": "always"})
    client = redis.Redis(host=rigs.HOST, port=server.port)
    try:
        mq = EchoMQ(client, prefix="emq")
        flows = make_flows(FLOWS, SEED + 1)
        feed = Feed(mq, flows)
        workers, pumps = start_processes(tmp_path, server.url, cluster=False)
        procs = workers + pumps
        rng = random.Random(SEED + 1)

        def restart_redis() -> dict:
            nonlocal server
            killed_at = time.monotonic()
            server.proc.kill()
            server.proc.wait()
            time.sleep(1.0)  # down for a second, as a crash and a supervisor's restart
            server = restart(server)
            back_at = time.monotonic()
            before = safe(lambda: client.zcard(mq.keys.queue("fb").completed))
            wait_until(
                lambda: safe(lambda: client.zcard(mq.keys.queue("fb").completed)) > before, 30
            )
            return {
                "down_s": round(back_at - killed_at, 2),
                "first_completion_after_restart_s": round(time.monotonic() - back_at, 2),
            }

        try:
            report = chaos(rng, procs, feed, lambda: roots_done(mq, flows), restart_redis)
            fig = settle(mq, flows, procs)
        finally:
            for p in procs:
                p.kill()
        check(fig, report, "single server with AOF, kills + restart", capsys)
        assert report["fault"] is not None
    finally:
        client.close()
        server.stop()
