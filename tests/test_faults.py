"""Faults found by testing (issue 17), the quick ones: routing on a Cluster,
transient errors, replays, the retry of an ignored child, bad input."""

from __future__ import annotations

import redis

from echomq_django import EchoMQ, Flow
from tests import rigs


def _getkeys_calls(cluster: rigs.Cluster) -> int:
    total = 0
    for port in cluster.ports:
        node = redis.Redis(host=rigs.HOST, port=port)
        try:
            stats = node.info("commandstats")
        finally:
            node.close()
        total += stats.get("cmdstat_command|getkeys", {}).get("calls", 0)
    return total


def test_cluster_pipelines_route_on_the_host_without_command_getkeys(redis_cluster, rc):
    mq = EchoMQ(rc, prefix="emq")
    flows = [Flow(f"q{i}", "parent", {}, children=[Flow(f"q{i}", "child", {})]) for i in range(6)]
    mq.add_flows(flows[:1])  # scripts loaded, connections made
    before = _getkeys_calls(redis_cluster)
    refs = mq.add_flows(flows[1:])  # six queues over three masters, one pipeline
    assert [r.landed for r in refs] == [2] * 5
    assert _getkeys_calls(redis_cluster) == before
