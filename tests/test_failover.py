"""Faults on a Cluster failover (issue 17, item 1), on the replica rig.

A master is SIGKILLed and a replica promoted; the same ``EchoMQ`` (the same
``RedisCluster`` client, as a long-running process holds it) must go on
working once the promotion is done, pipelined script calls included."""

from __future__ import annotations

import pytest

from echomq_django import EchoMQ, Flow, JobState

pytestmark = pytest.mark.e2e


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
