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
    assert left and all(got == [] for got in left)  # every call went by the own write
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
    assert left == [[0]]  # answered MOVED: left to the pipeline
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
    slots = [key_slot(f"emq:{{{q}}}:x".encode()) for q in (a, b, c)]
    deadline = time.monotonic() + 20
    while True:  # a rig just started: the masters report their replicas after a while
        rch.nodes_manager.initialize()
        if [len(rch.nodes_manager.slots_cache[s]) for s in slots] == [2, 2, 2]:
            break
        assert time.monotonic() < deadline, "the replicas never showed in the slot map"
        time.sleep(0.2)

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
