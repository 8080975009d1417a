"""Script calls on a Redis Cluster (``protocol/routing.py``): each call packed
onto a pooled connection of its slot's master, and redis-py's
``ClusterPipeline`` for what that cannot serve (no hiredis, a stale slot map).
docs/explanation/performance.md#the-scripts-own-write"""

from __future__ import annotations

import time

import pytest
from redis.crc import key_slot

from echomq_django import EchoMQ, JobState
from echomq_django.protocol import routing

pytestmark = pytest.mark.cluster


def _queues_on_masters(client, count: int) -> list[str]:
    """``count`` queue names whose keys sit on ``count`` different masters."""
    found: dict[str, str] = {}
    for i in range(200):
        q = f"q{i}"
        node = client.nodes_manager.get_node_from_slot(key_slot(f"emq:{{{q}}}:x".encode()))
        found.setdefault(node.name, q)
        if len(found) == count:
            return list(found.values())
    raise AssertionError(f"no {count} masters found")


def _replicas_in_the_map(client, queues: list[str]) -> None:
    """Wait until the slot map names a replica beside each of ``queues``'
    masters: a rig just started reports its replicas after a while."""
    slots = [key_slot(f"emq:{{{q}}}:x".encode()) for q in queues]
    deadline = time.monotonic() + 20
    while True:
        client.nodes_manager.initialize()
        if all(len(client.nodes_manager.slots_cache[s]) == 2 for s in slots):
            return
        assert time.monotonic() < deadline, "the replicas never showed in the slot map"
        time.sleep(0.2)


def _drive(mq: EchoMQ, queues: list[str]) -> list:
    """Calls on two masters, alone and in one batch, refusals among them: what
    each gave back, as plain values."""
    a, b = queues
    mq.enqueue(a, "n", {"v": 1}, job_id="a")
    mq.enqueue(b, "n", {"v": 2}, job_id="b")
    jobs = mq.claim(a, 1, 30_000, token="t1") + mq.claim(b, 1, 30_000, token="t2")
    again = mq.claim(a, 1, 30_000, token="t1")  # the same token: a replay, the same job
    outcomes = mq.complete_many([(jobs[0], "r-a"), (jobs[1], 2.5)])  # two masters, one batch
    twice = mq.complete_many([(jobs[0], "again"), (jobs[1], "again")])  # refused, both
    return [
        [(j.queue, j.id, j.payload, j.attempts) for j in jobs],
        [j.id for j in again],
        [o.state for o in outcomes],
        [type(o).__name__ for o in twice],
        [mq.get_job(q, i).result for q, i in ((a, "a"), (b, "b"))],
    ]


def test_the_own_write_on_a_cluster_gives_what_the_pipeline_gives(rc, monkeypatch) -> None:
    pytest.importorskip("hiredis")  # the dj6 leg installs the [fast] extra
    queues, left = _queues_on_masters(rc, 2), []
    real = routing._written
    monkeypatch.setattr(routing, "_written", lambda *a: left.append(real(*a)) or left[-1])
    fast = _drive(EchoMQ(rc, prefix="emq"), queues)
    assert left and all(got == ([], False) for got in left)  # all by the own write
    rc.flushall(target_nodes=rc.PRIMARIES)
    monkeypatch.setattr(routing, "_pack", None)  # no hiredis: redis-py's ClusterPipeline
    count = len(left)
    slow = _drive(EchoMQ(rc, prefix="emq"), queues)
    assert len(left) == count  # the own write was not tried
    assert (
        fast
        == slow
        == [
            [(queues[0], "a", {"v": 1}, 1), (queues[1], "b", {"v": 2}, 1)],
            ["a"],
            [JobState.COMPLETED, JobState.COMPLETED],
            ["JobNotActive", "JobNotActive"],
            ["r-a", 2.5],
        ]
    )


def test_a_call_sent_to_the_wrong_master_runs_once_through_the_pipeline(rc, monkeypatch):
    """A slot map gone stale (a slot moved, a failover): the master answers
    MOVED, the call did not run there, and the pipeline sends it where it
    belongs."""
    pytest.importorskip("hiredis")
    mq, left = EchoMQ(rc, prefix="emq"), []
    mq.enqueue("q", "n", None, job_id="warm")  # scripts loaded, connections made
    real, nodes = routing._written, rc.nodes_manager

    def stale(client, *args):
        right = nodes.get_node_from_slot
        nodes.get_node_from_slot = lambda slot, *a, **k: next(
            n for n in client.get_primaries() if n.name != right(slot, *a, **k).name
        )
        try:
            left.append(real(client, *args))
        finally:
            del nodes.get_node_from_slot  # the class's method again
        return left[-1]

    monkeypatch.setattr(routing, "_written", stale)
    ref = mq.enqueue("q", "n", {"v": 1}, job_id="a")
    assert left == [([0], True)]  # answered MOVED: left to the pipeline, the map refreshed
    assert ref == "a" and mq.get_job("q", "a").state is JobState.PENDING
    assert [j.id for j in mq.claim("q", 5, 30_000)] == ["warm", "a"]  # added once


@pytest.mark.parametrize("packed", [True, False], ids=["own-write", "pipeline"])
def test_a_hand_off_waits_for_a_replica_on_the_masters_it_wrote_to(rch, packed, monkeypatch):
    """``run_many_confirmed``: one ``WAIT`` on each master written to, behind
    its calls on the same connection, none on the master of ``after_key``."""
    if packed:
        pytest.importorskip("hiredis")
    else:
        monkeypatch.setattr(routing, "_pack", None)
    mq = EchoMQ(rch, prefix="emq")
    a, b, c = _queues_on_masters(rch, 3)
    mq.enqueue(c, "n", None)  # scripts loaded
    _replicas_in_the_map(rch, [a, b, c])

    def waits() -> dict[str, int]:
        return {
            q: rch.info("commandstats", target_nodes=rch.nodes_manager.get_node_from_slot(
                key_slot(f"emq:{{{q}}}:x".encode()))).get("cmdstat_wait", {}).get("calls", 0)
            for q in (a, b, c)
        }  # fmt: skip

    before = waits()
    calls = [mq.outbox.lock_call(a, "t1"), mq.outbox.lock_call(b, "t1")]
    replies, confirmed = mq.scripts.run_many_confirmed(calls, after_key=f"emq:{{{c}}}:x")
    assert (replies, confirmed) == ([1, 1], [True, True])
    after = waits()
    assert {q: after[q] - before[q] for q in (a, b, c)} == {a: 1, b: 1, c: 0}


def test_calls_sent_to_a_replica_run_on_their_master_and_its_wait_error_is_no_error(
    rch, monkeypatch
):
    """A slot map that names a replica where the master was (a failover under
    way): the replica answers the calls MOVED and their WAIT with an error;
    the calls go through the pipeline to the master, whose WAIT confirms."""
    pytest.importorskip("hiredis")
    mq = EchoMQ(rch, prefix="emq")
    a, c = _queues_on_masters(rch, 2)
    _replicas_in_the_map(rch, [a, c])
    nodes, real, left = rch.nodes_manager, routing._written, []

    def to_a_replica(client, *args):
        nodes.get_node_from_slot = lambda slot, *a, **k: nodes.slots_cache[slot][1]
        try:
            left.append(real(client, *args))
        finally:
            del nodes.get_node_from_slot
        return left[-1]

    monkeypatch.setattr(routing, "_written", to_a_replica)
    calls = [mq.outbox.lock_call(a, "t1"), mq.outbox.lock_call(a, "t2")]
    replies, confirmed = mq.scripts.run_many_confirmed(calls, after_key=f"emq:{{{c}}}:x")
    assert left == [([0, 1], True)]
    assert (replies, confirmed) == ([1, 0], [True, True])  # t2 refused: t1 holds the lock


def test_a_client_set_to_another_encoding_keeps_redis_pys_own_path(redis_cluster, monkeypatch):
    """hiredis packs a ``str`` as UTF-8: a client set to Latin-1 sends through
    redis-py's pipeline, so a job id is the same bytes whichever call wrote it."""
    pytest.importorskip("hiredis")
    from redis.cluster import RedisCluster

    client = RedisCluster(host="127.0.0.1", port=redis_cluster.ports[0], encoding="latin-1")
    client.flushall(target_nodes=RedisCluster.PRIMARIES)
    tried = []
    real = routing._written
    monkeypatch.setattr(routing, "_written", lambda *a: tried.append(1) or real(*a))
    mq = EchoMQ(client, prefix="emq")
    try:
        mq.enqueue("q", "n", {"v": 1}, job_id="café")
        assert tried == []
        key = "emq:{q}:job:café"
        assert [client.exists(key.encode(c)) for c in ("latin-1", "utf-8")] == [1, 0]
    finally:
        client.close()


def _one_by_one(monkeypatch) -> list:
    """A list that grows by one at each call run through redis-py's ``Script``."""
    from redis.commands.core import Script

    calls, real = [], Script.__call__
    monkeypatch.setattr(Script, "__call__", lambda *x, **k: calls.append(1) or real(*x, **k))
    return calls


def _script_stats(client, node) -> tuple[int, int, int]:
    """``node``'s SCRIPT LOAD calls, EVALSHA calls and EVALSHA calls refused."""
    stats = client.info("commandstats", target_nodes=node)
    load = stats.get("cmdstat_script|load", {}).get("calls", 0)
    evalsha = stats.get("cmdstat_evalsha", {"calls": 0, "failed_calls": 0})
    return load, evalsha["calls"], evalsha["failed_calls"]


def test_a_script_is_loaded_on_a_master_with_its_first_call_there(rc, monkeypatch) -> None:
    """A fresh client loads nothing ahead on a Cluster either: a script's
    ``SCRIPT LOAD`` rides ahead of its first call on each master, in the same
    write, once; no call answers NOSCRIPT and no master is sent a script that no
    call ran there. A master that lost its scripts answers NOSCRIPT once, and
    that call is sent again with its load ahead in one more write (not three
    round trips through redis-py's ``Script``).
    docs/explanation/performance.md#a-workers-start"""
    pytest.importorskip("hiredis")
    a, b, c = _queues_on_masters(rc, 3)
    slot_of = {q: key_slot(f"emq:{{{q}}}:x".encode()) for q in (a, b, c)}
    node = {q: rc.nodes_manager.get_node_from_slot(slot) for q, slot in slot_of.items()}
    rc.execute_command("SCRIPT FLUSH", target_nodes=rc.PRIMARIES)
    rc.config_resetstat(target_nodes=rc.PRIMARIES)
    one_by_one = _one_by_one(monkeypatch)
    mq = EchoMQ(rc, prefix="emq")  # a fresh client, as at a worker's start
    for queue in (a, b):
        mq.enqueue(queue, "n", queue, job_id="j1")
    jobs = mq.claim(a, 1, 30_000) + mq.claim(b, 1, 30_000)
    outcomes = mq.complete_many([(job, job.queue) for job in jobs])  # two masters, one batch
    assert [o.state for o in outcomes] == [JobState.COMPLETED] * 2
    # enqueue, claim, complete: loaded once each on the two masters, with their first calls
    assert [_script_stats(rc, node[q]) for q in (a, b, c)] == [(3, 3, 0), (3, 3, 0), (0, 0, 0)]
    assert one_by_one == []

    rc.execute_command("SCRIPT FLUSH", target_nodes=node[a])  # a restart, a failover
    rc.config_resetstat(target_nodes=rc.PRIMARIES)
    mq.enqueue(a, "n", 2, job_id="j2")  # NOSCRIPT, then sent again with its load ahead
    assert _script_stats(rc, node[a]) == (1, 2, 1)
    mq.enqueue(a, "n", 3, job_id="j3")  # loaded again: no load, no NOSCRIPT
    mq.enqueue(b, "n", 3, job_id="j3")  # still loaded there: no load
    assert (_script_stats(rc, node[a]), _script_stats(rc, node[b])) == ((1, 3, 1), (0, 1, 0))
    assert one_by_one == []
    assert [j.id for j in mq.claim(a, 5, 30_000)] == ["j2", "j3"]


@pytest.mark.parametrize("miss", ["pipeline", "stale"])
def test_calls_a_master_refused_for_a_lost_script_are_sent_again_with_their_load(
    rc, monkeypatch, miss
) -> None:
    """A master lost its scripts after this client loaded them there. Its
    ``NOSCRIPT`` reached the client through the pipeline (the own write failed
    under the calls, a connection reset: ``pipeline``), or straight from the
    own write, which still counts the script as loaded there (``stale``). Either way the
    call is sent again once, its load ahead, and not through redis-py's
    ``Script`` (three round trips). docs/explanation/performance.md#a-workers-start"""
    pytest.importorskip("hiredis")
    (a,) = _queues_on_masters(rc, 1)
    node = rc.nodes_manager.get_node_from_slot(key_slot(f"emq:{{{a}}}:x".encode()))
    mq = EchoMQ(rc, prefix="emq")
    mq.enqueue(a, "n", 1, job_id="j1")  # enqueue loaded there
    rc.execute_command("SCRIPT FLUSH", target_nodes=node)  # a restart at the same address
    rc.config_resetstat(target_nodes=node)
    if miss == "pipeline":
        real, cut = routing._written, []
        monkeypatch.setattr(
            routing,
            "_written",
            lambda *x: real(*x) if cut else (cut.append(1) or (list(range(len(x[2]))), False)),
        )
    one_by_one = _one_by_one(monkeypatch)
    assert mq.enqueue(a, "n", 2, job_id="j2") == "j2"
    assert (_script_stats(rc, node), one_by_one) == ((1, 2, 1), [])
    assert [j.id for j in mq.claim(a, 5, 30_000)] == ["j1", "j2"]


def test_a_hand_off_run_alone_after_noscript_is_not_confirmed(rch, monkeypatch) -> None:
    """A hand-off call (``after_key``) that a master refused with ``NOSCRIPT`` and
    that then ran alone through redis-py's ``Script`` (the pipeline without
    ``hiredis``) had no ``WAIT`` behind it: it comes back unconfirmed, so the
    caller keeps its record.
    docs/explanation/reliability.md#a-hand-off-between-masters-waits-for-a-replica"""
    monkeypatch.setattr(routing, "_pack", None)
    mq = EchoMQ(rch, prefix="emq")
    a, c = _queues_on_masters(rch, 2)
    _replicas_in_the_map(rch, [a, c])
    after = f"emq:{{{c}}}:x"
    replies, confirmed = mq.scripts.run_many_confirmed([mq.outbox.lock_call(a, "t1")], after)
    assert (replies, confirmed) == ([1], [True])  # its WAIT counted the replica
    node = rch.nodes_manager.get_node_from_slot(key_slot(f"emq:{{{a}}}:x".encode()))
    rch.execute_command("SCRIPT FLUSH", target_nodes=node)
    replies, confirmed = mq.scripts.run_many_confirmed([mq.outbox.lock_call(a, "t1")], after)
    assert (replies, confirmed) == ([1], [False])  # ran (t1 holds the lock), unconfirmed


def _two_masters(rc, monkeypatch, packed: bool):
    """A client writing its own (``packed``, with hiredis) or through redis-py's
    pipeline, and a queue ``a`` on one master: ``(mq, a, slot, source,
    target)``, ``slot`` the queue's, ``source`` a ``redis.Redis`` on its
    master and ``target`` one on another master."""
    import redis

    from tests.support import rigs

    if packed:
        pytest.importorskip("hiredis")
    else:
        monkeypatch.setattr(routing, "_pack", None)
    a, b = _queues_on_masters(rc, 2)
    slot = key_slot(f"emq:{{{a}}}:x".encode())
    source, target = (
        redis.Redis(host=rigs.HOST, port=int(rc.nodes_manager.get_node_from_slot(s).port))
        for s in (slot, key_slot(f"emq:{{{b}}}:x".encode()))
    )
    return EchoMQ(rc, prefix="emq"), a, slot, source, target


def _open(slot: int, source, target) -> None:
    """Start moving ``slot`` from ``source`` to ``target``: IMPORTING, MIGRATING."""
    target.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", source.cluster("myid"))
    source.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", target.cluster("myid"))


@pytest.mark.parametrize("packed", [True, False], ids=["own-write", "pipeline"])
def test_a_call_whose_slot_is_migrating_is_not_now_and_runs_once_it_settles(
    rc, monkeypatch, packed
) -> None:
    """A slot migrating between masters (``CLUSTER SETSLOT ... MIGRATING`` /
    ``IMPORTING``), the call's keys not on the source: redis-py's pipeline
    answers it ``ClusterError('TTL exhausted.')`` once its redirections run
    out. The call never ran, so it is "not now" (``RedisUnavailable``, which
    a worker or a pump waits out), not a reply; once the slot is stable again
    the same call runs. docs/explanation/reliability.md#not-now-is-not-no"""
    from echomq_django import RedisUnavailable

    mq, a, slot, source, target = _two_masters(rc, monkeypatch, packed)
    mq.enqueue(a, "n", 1, job_id="j1")  # loaded, connected
    _open(slot, source, target)
    try:
        with pytest.raises(RedisUnavailable, match="TTL exhausted"):
            mq.scripts.run_many([mq.outbox.lock_call(a, "t1")])  # its keys absent: ASK
    finally:
        for node in (source, target):
            node.execute_command("CLUSTER SETSLOT", slot, "STABLE")
            node.close()
    assert mq.scripts.run_many([mq.outbox.lock_call(a, "t1")]) == [1]


@pytest.mark.parametrize("packed", [True, False], ids=["own-write", "pipeline"])
def test_no_script_starts_while_its_slot_migrates(redis_cluster, rc, monkeypatch, packed) -> None:
    """A slot resharded key by key: the parent's row already moved to the
    importing master, its child's keys still on the source. Completing the
    child would begin on the source and stop at the parent's row ("Script
    attempted to access a non local key"), its first writes kept: the child
    completed, the parent never told. Each call declares its queue's
    ``absent`` key, so Redis refuses it before it begins: "not now", nothing
    written; once the slot settles on the new master the same completion
    runs there and releases the parent.
    docs/explanation/reliability.md#a-slot-moved-under-load"""
    from echomq_django import Flow, RedisUnavailable
    from tests.support import rigs

    mq, a, slot, source, target = _two_masters(rc, monkeypatch, packed)
    mq.enqueue(a, "n", {}, job_id="x")
    mq.complete(mq.claim(a, 1)[0], "done")  # the queue's completed zset exists
    mq.add_flow(Flow(a, "p", {}, job_id="P", children=[Flow(a, "c", {}, job_id="C")]))
    [job] = mq.claim(a, 1)
    keys = mq.keys.queue(a)
    home, away = (
        source.connection_pool.connection_kwargs["port"],
        target.connection_pool.connection_kwargs["port"],
    )
    _open(slot, source, target)
    try:
        source.migrate(rigs.HOST, away, [mq.keys.job(a, "P")], 0, 5000)
        with pytest.raises(RedisUnavailable):
            mq.complete(job, {"v": 1})
        assert source.hget(mq.keys.job(a, "C"), "s") == b"active"  # nothing written
        assert source.zscore(keys.active, "C") is not None
        assert redis_cluster.move_slot(keys.pending, away) > 0  # the rest, then SETSLOT NODE
        rc.nodes_manager.initialize()
        mq.complete(job, {"v": 1})
        assert mq.get_job(a, "C").state is JobState.COMPLETED
        assert mq.get_job(a, "P").state is JobState.PENDING  # released, on the new master
        assert mq.job_ids(a, "pending") == ["P"]
        assert target.hget(mq.keys.job(a, "P"), "s") == b"pending"
    finally:
        if redis_cluster.master_port(keys.pending) != home:
            redis_cluster.move_slot(keys.pending, home)  # the session's rig as it was
        else:  # failed before the move: the slot stable on its master again
            for node in (source, target):
                node.execute_command("CLUSTER SETSLOT", slot, "NODE", source.cluster("myid"))
        rc.nodes_manager.initialize()
        source.close()
        target.close()
