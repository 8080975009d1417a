"""A cross-queue flow's add under races and re-adds, and the worker that runs
it: on one server its steps are pipelined, each checking that its parent's
step landed (docs/explanation/protocol.md#cross-queue-scripts-on-one-server);
step by step elsewhere. Each test runs on both rigs and asserts what each must
do."""

from __future__ import annotations

import threading

import pytest
from redis.cluster import RedisCluster

from echomq_django import EchoMQ, Flow, FlowConflict
from echomq_django.runners.reporter import Finished, Reporter
from tests.support.jobkit import (
    assert_state,
    claim_one,
    complete,
    jref,
    leaf,
    node,
    raw_row,
    sweep,
)
from tests.support.workerkit import burst


def on_one_server(mq: EchoMQ) -> bool:
    return not isinstance(mq.client, RedisCluster)


def taken_before_the_writes(mq: EchoMQ, monkeypatch, queue: str, job_id: str) -> None:
    """After the add's read-only gates, another client takes ``job_id`` on
    ``queue`` (as job ``other``)."""
    run_many = mq.scripts.run_many_confirmed

    def then_taken(calls, after=None):
        out = run_many(calls, after)
        if not mq.client.exists(mq.keys.job(queue, job_id)):
            mq.enqueue(queue, "other", {}, job_id=job_id)
        return out

    monkeypatch.setattr(mq.scripts, "run_many_confirmed", then_taken)


def test_a_refused_parent_lands_no_child_on_its_own_queue(mq, monkeypatch) -> None:
    """p's step is refused: m, its child on p's own queue (a later step), and
    x under m land nothing, not even pipelined (m would be a child of the
    other job named p)."""
    flow = node("p", [node("m", [leaf("x", queue="r")])], queue="q")
    flow.children.append(leaf("y", queue="r"))
    taken_before_the_writes(mq, monkeypatch, "q", "p")
    with pytest.raises(FlowConflict, match="^q p exists as job other"):
        mq.add_flow(flow)
    monkeypatch.undo()
    assert raw_row(mq, "q", "p")["n"] == "other"  # the row's name (docs: short field names)
    assert (raw_row(mq, "q", "m"), raw_row(mq, "r", "x"), raw_row(mq, "r", "y")) == ({}, {}, {})
    assert mq.counts("q")["pending"] == 1  # the other job only


def test_a_refused_parent_lands_none_of_its_chunks(redis_client, monkeypatch) -> None:
    """A wide group cut in chunks (each a step of its own) under a refused
    parent: no chunk lands."""
    mq = EchoMQ(redis_client, prefix="emq", flow_chunk=2)
    flow = node("p", [leaf(f"k{i}") for i in range(5)] + [leaf("z", queue="o")])
    taken_before_the_writes(mq, monkeypatch, "q", "p")
    with pytest.raises(FlowConflict):
        mq.add_flow(flow)
    monkeypatch.undo()
    assert [raw_row(mq, "q", f"k{i}") for i in range(5)] == [{}] * 5
    assert raw_row(mq, "o", "z") == {}
    mq.remove("q", "p")
    ref = mq.add_flow(flow)
    assert (ref.landed, ref.skipped) == (7, 0)
    assert_state(mq, "q", "p", "awaiting_children")


def test_turning_the_setting_on_has_no_effect_on_a_cluster(mq) -> None:
    """As ``cross_queue_scripts=True`` given to the constructor: on a Cluster
    a script reaching another slot's keys would be refused."""
    mq.cross_queue_scripts = True
    assert mq.cross_queue_scripts is on_one_server(mq)
    mq.add_flow(node("p", [leaf("a", queue="o")]))
    assert complete(mq, "a", 1, queue="o").released == ([jref("p")] if on_one_server(mq) else [])


def test_a_parent_claimed_with_its_child_s_completion_starts_when_it_finished(redis_client):
    """The claim riding the last child's completion reads the clock once with
    it: the parent's start is not before the child's finish (a clock read
    per call put it 1 ms earlier)."""
    ticks = iter(range(1_000, 2_000))
    mq = EchoMQ(redis_client, prefix="emq", clock=lambda: next(ticks))
    mq.add_flow(node("p", [leaf("a", queue="o")]))
    taken = []

    def fetch(q, yields_to=None, last=False):
        return (1, 5000, "t1") if q == "q" else None

    reporter = Reporter(mq, None, lambda *j: None, lambda q: None, lambda: None,
                        fetch=fetch, taken=lambda *got: taken.append(got))  # fmt: skip
    reporter.report([Finished(claim_one(mq, "o", "a"), 1)])
    [(_, _, [parent])] = taken  # on a Cluster the claim rides the outbox's delivery
    child, row = raw_row(mq, "o", "a"), raw_row(mq, "q", "p")
    assert (parent.id, row["s"]) == ("p", "active")
    assert int(row["started_at"]) >= int(child["finished_at"])


def test_a_half_landed_add_over_a_children_list_of_full_keys_completes(mq) -> None:
    """The parent's :children was written before, as full keys: a same-queue
    child of a later step (m) and its cross-queue child (x), never landed,
    land when the flow is added again (m is found in the list in that form)."""
    flow = node("root", [node("m", [leaf("x", queue="c")], queue="p"), leaf("k", queue="c")])
    flow.queue = "p"
    mq.add_flow(flow)
    kids = mq.keys.job_part("p", "root", "children")
    full = [mq.keys.job("p", "m"), mq.keys.job("c", "k")]
    mq.client.delete(kids)
    mq.client.rpush(kids, *full)  # as written before
    m, x = mq.keys.job("p", "m"), mq.keys.job("c", "x")
    mq.client.delete(m, f"{m}:children", f"{m}:dependencies", x)
    mq.client.zrem(mq.keys.queue_key("p", "awaiting"), "m")
    mq.client.lrem(mq.keys.queue_key("c", "pending"), 0, "x")
    ref = mq.add_flow(flow)
    assert (ref.landed, ref.skipped) == (2, 2)
    assert [e.decode() for e in mq.client.lrange(kids, 0, -1)] == full  # left as it was
    assert raw_row(mq, "c", "x")["pi"] == raw_row(mq, "p", "m")["inc"]
    assert raw_row(mq, "c", "k")["pi"] == raw_row(mq, "p", "root")["inc"]
    assert_state(mq, "p", "m", "awaiting_children")
    assert_state(mq, "c", "x", "pending")


def three_queues(i: int = 0) -> Flow:
    """R on q; M on o under it, with three leaves on r and one on q under
    M; S on r under R. R's result is 3 * 1 + 10 + 100."""
    leaves = [Flow("r", "t.echo", 1, job_id=f"L{i}-{j}") for j in range(3)]
    mid = Flow(
        "o",
        "t.sum_children",
        job_id=f"M{i}",
        children=[*leaves, Flow("q", "t.echo", 10, job_id=f"Q{i}")],
    )
    return Flow(
        "q",
        "t.sum_children",
        job_id=f"R{i}",
        children=[mid, Flow("r", "t.echo", 100, job_id=f"S{i}")],
    )


def test_the_same_flow_added_from_several_threads_lands_once(mq) -> None:
    """Six clients add the same flow (ids given) at once: each node lands
    once, every child carries the incarnation its parent's row holds, and
    the flow runs to its end once."""
    barrier, refs, errors = threading.Barrier(6), [], []

    def add() -> None:
        other = EchoMQ(mq.client, prefix="emq")
        barrier.wait()
        try:
            refs.append(other.add_flow(three_queues()))
        except Exception as err:  # collected: the assertion below names it
            errors.append(err)

    threads = [threading.Thread(target=add) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sum(r.landed for r in refs) == 7 and sum(r.skipped for r in refs) == 6 * 7 - 7
    for queue, job_id, pq, parent in LINKS:
        assert raw_row(mq, queue, job_id)["pi"] == raw_row(mq, pq, parent)["inc"]
    assert mq.dependency_counts("o", "M0")["remaining"] == 4
    worker, processed = burst(mq, ["q", "o", "r"], concurrency=4)
    assert (processed, mq.get_job("q", "R0").result, worker.loop.fetching) == (7, 113, 0)


LINKS = [("o", "M0", "q", "R0"), ("r", "S0", "q", "R0"), ("q", "Q0", "o", "M0")] + [
    ("r", f"L0-{j}", "o", "M0") for j in range(3)
]


CLOCK_SLACK_MS = 20


@pytest.mark.parametrize(("pool", "concurrency"), [("thread", 1), ("thread", 4), ("process", 2)])
def test_a_worker_runs_each_flow_once_and_each_parent_after_its_children(mq, pool, concurrency):
    """Serving the three queues: every job runs once, a parent runs after
    its last child finished (it sums every child's result, on its first
    attempt), no outbox entry is left and no slot stays held for a claim.

    The times agree up to ``CLOCK_SLACK_MS``: each is the worker's clock
    read before its call, and one process's threads (the GIL's switch
    interval is 5 ms) can send two calls in the other order than they read
    it, so a parent's ``started_at`` was once seen 1 ms before its child's
    ``finished_at`` although its claim ran after that child's completion."""
    mq.add_flows([three_queues(i) for i in range(6)])
    worker, processed = burst(mq, ["q", "o", "r"], concurrency=concurrency, pool=pool)
    assert (processed, worker.loop.fetching) == (6 * 7, 0)
    for i in range(6):
        root, mid = raw_row(mq, "q", f"R{i}"), raw_row(mq, "o", f"M{i}")
        leaves = [raw_row(mq, "r", f"L{i}-{j}") for j in range(3)] + [raw_row(mq, "q", f"Q{i}")]
        assert (root["result"], root["attempts"]) == ("113", "1")
        assert (mid["result"], mid["attempts"]) == ("13", "1")
        assert int(mid["started_at"]) >= max(int(k["finished_at"]) for k in leaves) - CLOCK_SLACK_MS
        last = max(int(mid["finished_at"]), int(raw_row(mq, "r", f"S{i}")["finished_at"]))
        assert int(root["started_at"]) >= last - CLOCK_SLACK_MS
    assert [mq.counts(q)["completed"] for q in "qor"] == [12, 6, 24]
    assert [mq.counts(q)["outbox"] for q in "qor"] == [0, 0, 0]


def test_a_wide_flow_cut_in_chunks_links_every_chunk_to_its_parent(redis_client) -> None:
    """Chunks of two nodes: each chunk's children carry the incarnation of
    the parent they are under, and the flow added again lands nothing."""
    mq = EchoMQ(redis_client, prefix="emq", flow_chunk=2)
    mids = [
        node(f"m{j}", [leaf(f"m{j}-{i}", queue="o") for i in range(3)], queue="m") for j in range(3)
    ]
    flow = node("p", [leaf(f"k{i}", queue="o" if i % 2 else "r") for i in range(5)] + mids)
    assert mq.add_flow(flow).landed == 1 + 5 + 3 + 9
    inc = raw_row(mq, "q", "p")["inc"]
    assert {raw_row(mq, "o" if i % 2 else "r", f"k{i}")["pi"] for i in range(5)} == {inc}
    for j in range(3):
        assert raw_row(mq, "m", f"m{j}")["pi"] == inc
        m_inc = raw_row(mq, "m", f"m{j}")["inc"]
        assert {raw_row(mq, "o", f"m{j}-{i}")["pi"] for i in range(3)} == {m_inc}
        assert mq.dependency_counts("m", f"m{j}")["remaining"] == 3
    assert mq.dependency_counts("q", "p")["remaining"] == 8
    again = mq.add_flow(flow)
    assert (again.landed, again.skipped) == (0, 18)


def test_a_finished_child_met_again_resolves_its_parent_here_on_one_server(mq) -> None:
    """The flow added again while it runs: a's completion, announced again,
    is a no-op the parent guards; on one server it is resolved in the add
    (no outbox entry), so b's completion, later, still releases p at once."""
    flow = node("p", [leaf("a", queue="o"), leaf("b", queue="o")])
    mq.add_flow(flow)
    complete(mq, "a", 1, queue="o")
    # a Cluster: a's entry and its announce again, both on o's outbox
    assert (mq.add_flow(flow).landed, mq.counts("o")["outbox"]) == (
        0,
        0 if on_one_server(mq) else 2,
    )
    last = complete(mq, "b", 2, queue="o")
    assert last.released == ([jref("p")] if on_one_server(mq) else [])
    if not on_one_server(mq):
        sweep(mq, "o")
    assert mq.children_values("q", "p") == {jref("a", "o"): 1, jref("b", "o"): 2}
    assert_state(mq, "q", "p", "pending")
