"""Self-test of the Redis rigs in conftest.py: if these fail, nothing else means much."""

from __future__ import annotations

import os

import pytest
import redis
from redis.cluster import RedisCluster

from tests.support import rigs


def test_single_server_is_private(redis_server: str, r: redis.Redis) -> None:
    assert r.ping() is True
    port = r.connection_pool.connection_kwargs["port"]
    assert port != 6379
    assert redis_server == f"redis://127.0.0.1:{port}/0"
    assert os.environ["ECHOMQ_URL"] == redis_server


def test_single_server_is_flushed_per_test(r: redis.Redis) -> None:
    # Runs after the test above (and on a re-run): the keyspace starts empty.
    assert r.dbsize() == 0
    r.set("leftover", "1")


def test_django_cache_points_at_private_server(redis_server: str, r: redis.Redis) -> None:
    from django.conf import settings
    from django.core.cache import cache

    assert settings.CACHES["default"]["LOCATION"] == redis_server
    cache.set("rig-probe", 1)
    assert any(b"rig-probe" in key for key in r.keys("*"))


def test_cluster_has_three_masters_and_is_ok(redis_cluster: rigs.Cluster, rc: RedisCluster) -> None:
    assert len(redis_cluster.ports) == 3
    assert 6379 not in redis_cluster.ports
    assert redis_cluster.url == f"redis://127.0.0.1:{redis_cluster.ports[0]}/0"
    assert len(rc.get_primaries()) == 3
    for port in redis_cluster.ports:
        node = redis.Redis(host="127.0.0.1", port=port)
        try:
            assert rigs.cluster_state(node) == "ok"
        finally:
            node.close()


def test_cluster_hash_tags_map_to_different_slots(rc: RedisCluster) -> None:
    a = rc.execute_command("CLUSTER KEYSLOT", "{a}x")
    b = rc.execute_command("CLUSTER KEYSLOT", "{b}x")
    assert a != b
    assert rc.execute_command("CLUSTER KEYSLOT", "{a}y") == a


def _assert_crossslot(exc: BaseException) -> None:
    # redis-py turns the server's "CROSSSLOT Keys in request don't hash to the
    # same slot" into ClusterCrossSlotError and drops the code from the text.
    assert isinstance(exc, redis.exceptions.ResponseError)
    assert isinstance(exc, redis.exceptions.ClusterCrossSlotError) or "CROSSSLOT" in str(exc)


def test_cluster_rejects_cross_slot_multi_key_command(rc: RedisCluster) -> None:
    # target_nodes skips redis-py's own slot check, so the server answers.
    node = rc.get_node_from_key("{a}x")
    with pytest.raises(redis.exceptions.ResponseError) as excinfo:
        rc.execute_command("MSET", "{a}x", "1", "{b}x", "2", target_nodes=node)
    _assert_crossslot(excinfo.value)
    assert rc.exists("{a}x", "{b}x") == 0  # nothing was written


def test_cluster_rejects_cross_slot_lua(rc: RedisCluster) -> None:
    node = rc.get_node_from_key("{a}x")
    with pytest.raises(redis.exceptions.ResponseError) as excinfo:
        rc.execute_command("EVAL", "return 1", 2, "{a}x", "{b}x", target_nodes=node)
    _assert_crossslot(excinfo.value)


def test_redis_client_runs_on_both_rigs(request: pytest.FixtureRequest, redis_client) -> None:
    rig = request.node.callspec.params["redis_client"]
    expected = RedisCluster if rig == "cluster" else redis.Redis
    assert isinstance(redis_client, expected)
    assert redis_client.dbsize() == 0
    redis_client.set("{q}probe", "1")
    assert redis_client.get("{q}probe") == b"1"


@pytest.mark.e2e
def test_replica_rig_fails_over_and_heals(
    redis_cluster_ha: rigs.Cluster, rch: RedisCluster
) -> None:
    assert len(redis_cluster_ha.ports) == 6
    assert len(rch.get_primaries()) == 3  # the other three are their replicas
    rch.set("{a}x", "1")
    rch.wait(1, 1000)  # the replica has it before its master dies
    dead = redis_cluster_ha.kill_master("{a}x")
    port = redis_cluster_ha.wait_promoted("{a}x", dead)
    assert port != dead.port
    promoted = redis.Redis(host=rigs.HOST, port=port)
    try:
        assert promoted.get("{a}x") == b"1"
    finally:
        promoted.close()
    redis_cluster_ha.restart(dead)
    assert len(redis_cluster_ha.live()) == 6
