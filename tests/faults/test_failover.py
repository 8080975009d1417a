"""A failover under a running client: a master SIGKILLed and its replica
promoted, a master demoted to a replica, a shard left with no master. The
same ``EchoMQ`` (the same client, as a long-running process holds it) goes
on working once the failover is done, pipelined script calls included; a
worker's result that met the failover is kept and reported later; a
delivery no replica confirmed stays in the outbox."""

from __future__ import annotations

import signal
import threading

import pytest
import redis
from redis.crc import key_slot

from echomq_django import EchoMQ, Flow, JobRef, JobState, Worker, handler
from tests.support import rigs
from tests.support.workerkit import Background, wait_for

pytestmark = pytest.mark.e2e

GATE = threading.Event()  # the handler below finishes once the test opens it
RAN: list[str] = []


@handler("faults.gated")
def gated(job):
    """Records that it ran, waits for the test's fault, returns its id."""
    RAN.append(job.id)
    GATE.wait(30)
    return {"ok": job.id}


def _run_one_job_through(mq, queue: str, fault, heal, caplog) -> Worker:
    """A burst worker runs one ``faults.gated`` job; ``fault()`` strikes
    while the handler runs, the handler returns into it, ``heal()`` ends it
    once the worker has met it (it logged a retry, or a dropped result).
    Returns the worker once it is done."""
    GATE.clear()
    RAN.clear()
    mq.enqueue(queue, "faults.gated", {}, job_id="j1")
    worker = Worker([queue], concurrency=1, mq=mq, poll_interval=0.05)
    run = Background(worker, burst=True)
    wait_for(lambda: RAN == ["j1"], what="the handler to start")
    fault()
    GATE.set()  # the result is reported into the fault
    words = ("retrying in", "refused the result", "result dropped")
    wait_for(
        lambda: any(w in r.getMessage() for r in caplog.records for w in words),
        what="the report to meet the fault",
    )
    heal()
    run.join(60)
    return worker


def _flow(i: int) -> Flow:
    return Flow(
        "orders",
        "fulfil",
        {"n": i},
        job_id=f"o{i}",
        children=[
            Flow("orders", "check", {"n": i}, job_id=f"c{i}"),
        ],
    )


def test_add_flow_works_after_the_queue_master_fails_over(redis_cluster_ha, rch):
    mq = EchoMQ(rch, prefix="emq")
    mq.add_flow(_flow(1))
    rch.wait(1, 1000)  # the replica holds the first flow when its master dies
    key = mq.keys.queue_key("orders", "pending")
    # the client's default node is the master that dies: it was the node
    # redis-py asked for the keys of every pipelined EVALSHA
    rch.set_default_node(rch.get_node_from_key(key))
    dead = redis_cluster_ha.kill_master(key)
    try:
        redis_cluster_ha.wait_promoted(key, dead)
        ref = mq.add_flow(_flow(2))  # pipelined: used to raise RedisUnavailable here
        assert (ref.landed, ref.skipped) == (2, 0)
        assert mq.get_job("orders", "o2").state is JobState.AWAITING_CHILDREN
        assert sorted(mq.job_ids("orders", "pending")) == ["c1", "c2"]
    finally:
        redis_cluster_ha.restart(dead)


def test_a_result_refused_by_a_read_only_server_is_kept_and_retried(caplog):
    # READONLY (a master demoted under the worker) is
    # transient, not a refusal: the result is kept and reported later
    server = rigs.start_server()
    client = redis.Redis(host=rigs.HOST, port=server.port)
    admin = server.client()
    try:
        mq = EchoMQ(client, prefix="emq")
        worker = _run_one_job_through(
            mq,
            "q",
            fault=lambda: admin.replicaof(
                rigs.HOST, rigs.free_port()
            ),  # a master that never answers
            heal=lambda: admin.replicaof("NO", "ONE"),
            caplog=caplog,
        )
        job = mq.get_job("q", "j1")
        assert (job.state, job.result) == (JobState.COMPLETED, {"ok": "j1"})
        assert RAN == ["j1"]  # the handler ran once
        assert worker.stats["lost"] == 0
    finally:
        client.close()
        admin.close()
        server.stop()


def test_a_result_reported_while_the_cluster_is_down_is_kept_and_retried(
    redis_cluster_ha, rch, caplog
):
    # CLUSTERDOWN (a shard with no master) is transient: the
    # worker used to log "Redis refused the result: ClusterDownError" and drop it
    mq = EchoMQ(rch, prefix="emq")
    cluster = redis_cluster_ha
    mine = cluster.shard_ports(mq.keys.queue("q").pending)
    other = next(f"x{i}" for i in range(100) if cluster.shard_ports(f"{{x{i}}}")[0] != mine[0])
    dead: list = []

    def fault():
        dead.extend(cluster.kill_shard(f"{{{other}}}"))
        live = [node.client(socket_timeout=1) for node in cluster.live()]
        try:
            wait_for(
                lambda: all(rigs.cluster_state(c) == "fail" for c in live),
                what="every live node to answer CLUSTERDOWN",
            )
        finally:
            for c in live:
                c.close()

    def heal():
        for node in dead:  # the master first: it takes its slots back
            cluster.restart(node)

    worker = _run_one_job_through(mq, "q", fault, heal, caplog)
    job = mq.get_job("q", "j1")
    assert (job.state, job.result) == (JobState.COMPLETED, {"ok": "j1"})
    assert RAN == ["j1"]
    assert worker.stats["lost"] == 0


def _queues_on_two_masters(cluster, mq) -> tuple[str, str]:
    """A parent queue and a child queue whose slots two different masters serve."""
    parent = "fa"
    home = cluster.master_port(mq.keys.queue(parent).pending)
    for child in ("fb", "fc", "fd", "fe", "ff", "fg", "fh"):
        if cluster.master_port(mq.keys.queue(child).pending) != home:
            return parent, child
    raise AssertionError("every queue name tried hashed to one master")


def test_a_delivery_no_replica_confirmed_stays_in_the_outbox(redis_cluster_ha, rch):
    """A failover takes back the writes its master had not sent to a replica
    yet. The outbox entry of a delivery that did not reach the parent's
    replica must stay: trimmed, a failover in that moment would leave the
    parent waiting for a child whose result is gone from both sides. With
    that replica stopped, the sweep delivers, the WAIT counts no replica and
    the entry stays; once it answers, the next sweep trims it, and the parent
    is released once."""
    from echomq_django.runners.pump import deliver_outbox

    mq = EchoMQ(rch, prefix="emq")
    parent_q, child_q = _queues_on_two_masters(redis_cluster_ha, mq)
    slot = key_slot(mq.keys.queue(parent_q).pending.encode())

    def replica_in_the_map() -> bool:  # a node an earlier test restarted may still be joining
        rch.nodes_manager.initialize()
        return len(rch.nodes_manager.slots_cache.get(slot) or ()) > 1

    wait_for(replica_in_the_map, what="the parent's master to list its replica")
    mq.add_flow(Flow(parent_q, "p", {}, job_id="P", children=[Flow(child_q, "c", {}, job_id="C")]))
    [job] = mq.claim(child_q, 1)
    mq.complete(job, {"v": 1})
    assert rch.llen(mq.keys.queue(child_q).outbox) == 1
    _master, *replicas = redis_cluster_ha.shard_ports(mq.keys.queue(parent_q).pending)
    replica = replicas[0]
    stopped = [n for n in redis_cluster_ha.nodes if n.port in replicas]  # every one of them
    for node in stopped:
        node.proc.send_signal(signal.SIGSTOP)
    try:
        first = deliver_outbox(mq, child_q)
    finally:
        for node in stopped:
            node.proc.send_signal(signal.SIGCONT)
    assert (first.delivered, first.unreplicated) == (0, 1)
    assert rch.llen(mq.keys.queue(child_q).outbox) == 1  # kept: not on a replica yet
    assert mq.get_job(parent_q, "P").state is JobState.PENDING  # on the master it landed
    wait_for(lambda: deliver_outbox(mq, child_q).delivered == 1, what="a confirmed delivery")
    assert rch.llen(mq.keys.queue(child_q).outbox) == 0
    assert mq.job_ids(parent_q, "pending") == ["P"]  # released once, not twice
    assert mq.children_values(parent_q, "P") == {JobRef(child_q, "C"): {"v": 1}}
    peer = redis.Redis(host=rigs.HOST, port=replica)  # what the master confirmed, it holds
    try:
        peer.execute_command("READONLY")
        assert peer.hget(mq.keys.job(parent_q, "P"), "s") == b"pending"
    finally:
        peer.close()
