"""A wait's long block (protocol/live/blocking.py ``long_block``,
docs/howto/wait.md#what-a-wait-costs) under what a hostile deployment does to
it: a slot migrated away, a killed connection, a cancel at each edge of the
block, many waiters at once. Each wait still gets the job's result (or its
own cancel), and the client's pool is left whole: no connection leaked, none
handed back with a reply still owed on it."""

from __future__ import annotations

import redis
from redis.cluster import RedisCluster

from echomq_django import EchoMQ
from tests.support import rigs
from tests.support.workerkit import wait_for
from tests.test_wait import NEVER, Waiter, finish, registered


def _blocked(client: redis.Redis) -> list[dict]:
    """The server's clients blocked in an XREAD (CLIENT LIST)."""
    return [c for c in client.client_list() if c["cmd"] == "xread" and "b" in c["flags"]]


def _node(cluster: RedisCluster, port: int):
    return next(n for n in cluster.get_primaries() if n.port == port)


def _move_slot(cluster: RedisCluster, slot: int, source: int, target: int) -> None:
    """Migrate ``slot`` with its keys from the master on port ``source`` to
    the one on ``target`` (CLUSTER SETSLOT IMPORTING / MIGRATING, MIGRATE,
    SETSLOT NODE on every master)."""
    src = _node(cluster, source).redis_connection
    dst = _node(cluster, target).redis_connection
    src_id, dst_id = src.cluster("MYID"), dst.cluster("MYID")
    dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", src_id)
    src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", dst_id)
    keys = src.execute_command("CLUSTER GETKEYSINSLOT", slot, 1000)
    if keys:
        src.execute_command("MIGRATE", rigs.HOST, target, "", 0, 5000, "KEYS", *keys)
    for node in cluster.get_primaries():
        node.redis_connection.execute_command("CLUSTER SETSLOT", slot, "NODE", dst_id)


def test_a_slot_migrated_away_from_a_blocked_wait_is_followed(rc, redis_cluster) -> None:
    # Redis answers a client blocked on a key of a migrated slot -MOVED
    # (redis-py: MovedError, its message without the word); the wait sends
    # its next block the ordinary way, which follows the slot
    mq = EchoMQ(rc, prefix="emq")
    done = mq.keys.queue("q").done("mv")
    slot = rc.keyslot(done)
    source = redis_cluster.master_port(done)
    target = next(p for p in redis_cluster.ports if p != source)
    mq.enqueue("q", "t.echo", None, job_id="mv")
    waiter = Waiter(mq, "q", "mv", NEVER)
    registered(mq, "q", "mv", 1)
    src = _node(rc, source).redis_connection
    wait_for(lambda: len(_blocked(src)) == 1, what="the wait blocked")
    _move_slot(rc, slot, source, target)
    try:
        dst = _node(rc, target).redis_connection
        moved = lambda: len(_blocked(dst)) == 1 or not waiter.thread.is_alive()  # noqa: E731
        wait_for(moved, what="the wait blocked on the slot's new master")
        assert waiter.error is None
        assert _blocked(src) == []
        finish(mq, "q", "moved")
        assert waiter.join().result == "moved"
    finally:
        _move_slot(rc, slot, target, source)  # the session's rig as it was

