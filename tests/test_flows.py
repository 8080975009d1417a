"""Same-queue flows on both rigs: a flow lands whole or not at all; the
atomic add, idempotence and conflicts, fan-in, the reads, large flows.
Failure policies and retry-by-id are in test_flow_policies.py."""

from __future__ import annotations

import pytest

from echomq_django import (
    Dependencies,
    DuplicateJob,
    EchoMQ,
    Flow,
    FlowConflict,
    FlowError,
    FlowRef,
    JobNotActive,
    JobNotFound,
    JobState,
    LeaseLost,
    PayloadError,
)
from echomq_django.protocol.scripts import Scripts
from tests.support.jobkit import (
    T0,
    assert_state,
    children,
    claim_one,
    complete,
    counter,
    events,
    hash_of,
    jref,
    kill,
    leaf,
    node,
    ref,
    row,
    score,
    snapshot,
)


def flat() -> Flow:
    return node(
        "p",
        [
            leaf("c1"),
            leaf("c2", ignore_dependency_on_failure=True),
            leaf("c3", remove_dependency_on_failure=True),
        ],
    )


def deep() -> Flow:
    """Depth 3: r -> m1 -> (l1, l2); r -> m2 -> m3 -> l3; r -> l4."""
    return node(
        "r",
        [node("m1", [leaf("l1"), leaf("l2")]), node("m2", [node("m3", [leaf("l3")])]), leaf("l4")],
    )


def test_flat_flow_lands_held_parent_and_claimable_children(tmq) -> None:
    got = tmq.add_flow(flat())
    assert got == FlowRef(
        queue="q",
        parent_id="p",
        child_ids=["c1", "c2", "c3"],
        nodes=[("q", "p"), ("q", "c1"), ("q", "c2"), ("q", "c3")],
        landed=4,
        skipped=0,
    )
    assert_state(tmq, "q", "p", "awaiting_children")
    # compact rows: no attempts before a claim, no settings the queue
    # gives, no parent_queue for a same-queue child, no parent_policy for fp;
    # the flow's incarnation on the parent and its children: the add's time
    # and 6 random digits, one integer (9 bytes in a listpack)
    inc = row(tmq, "q", "p")["inc"]
    assert (inc[:-6], len(inc), str(int(inc)) == inc) == (str(T0), 19, True)
    assert row(tmq, "q", "p") == {
        "n": "node",
        "d": '{"id":"p"}',
        "s": "awaiting_children",
        "ca": str(T0),
        "inc": inc,
    }
    assert score(tmq, "q", "awaiting", "p") == T0
    assert (counter(tmq, "q", "p"), children(tmq, "q", "p")) == (
        3,
        [ref(tmq, "c1"), ref(tmq, "c2"), ref(tmq, "c3")],
    )
    for cid, policy in (("c1", "fp"), ("c2", "id"), ("c3", "rd")):
        r = assert_state(tmq, "q", cid, "pending")
        assert r == {
            "n": "leaf",
            "d": f'{{"id":"{cid}"}}',
            "s": "pending",  # jobkit.row's: the row holds none while pending
            "p": "p",
            "pi": inc,  # and no add time: its incarnation's
            **({} if policy == "fp" else {"pp": policy}),
        }
        job = tmq.get_job("q", cid)
        assert (job.parent, job.parent_queue, job.parent_policy, job.max_attempts) == (
            "p",
            "q",
            policy,
            3,
        )
        assert (job.state, job.created_at) == (JobState.PENDING, T0)
    assert tmq.job_ids("q", "pending") == ["c1", "c2", "c3"]
    claimed = tmq.claim("q", 3)
    assert [(j.id, j.parent, j.parent_queue, j.parent_policy) for j in claimed] == [
        ("c1", "p", "q", "fp"),
        ("c2", "p", "q", "id"),
        ("c3", "p", "q", "rd"),
    ]
    assert tmq.claim("q") == []  # a held parent is never claimable


def test_nested_flow_holds_every_parent(tmq) -> None:
    got = tmq.add_flow(deep())
    assert (got.parent_id, got.child_ids, got.landed) == ("r", ["m1", "m2", "l4"], 8)
    assert got.nodes == [("q", i) for i in ("r", "m1", "m2", "l4", "l1", "l2", "m3", "l3")]
    for pid, kids in (
        ("r", ["l4", "m1", "m2"]),
        ("m1", ["l1", "l2"]),
        ("m2", ["m3"]),
        ("m3", ["l3"]),
    ):
        assert_state(tmq, "q", pid, "awaiting_children")
        assert counter(tmq, "q", pid) == len(kids)
        assert children(tmq, "q", pid) == [ref(tmq, k) for k in kids]
    for cid, parent in (("m1", "r"), ("m2", "r"), ("m3", "m2"), ("l1", "m1"), ("l3", "m3")):
        assert tmq.get_job("q", cid).parent == parent
    assert tmq.job_ids("q", "pending") == ["l4", "l1", "l2", "l3"]  # breadth first
    assert tmq.job_ids("q", "awaiting_children") == ["m1", "m2", "m3", "r"]


def test_re_adding_the_same_flow_writes_nothing(tmq) -> None:
    first = tmq.add_flow(deep())
    complete(tmq, "l4", "four")
    before = snapshot(tmq.client)
    again = tmq.add_flow(deep())
    assert (again.parent_id, again.child_ids, again.nodes) == (
        first.parent_id,
        first.child_ids,
        first.nodes,
    )
    assert (again.landed, again.skipped) == (0, 8)
    assert snapshot(tmq.client) == before


@pytest.mark.parametrize(
    "flow, culprit",
    [
        pytest.param(lambda: node("p", [leaf("c1"), leaf("c9")]), "'p'", id="other-children"),
        pytest.param(lambda: node("p2", [leaf("new"), leaf("c1")]), "'c1'", id="child-of-another"),
        pytest.param(lambda: node("p3", [leaf("solo")]), "'solo'", id="plain-job-id"),
        pytest.param(lambda: Flow("q", "other-name", job_id="p"), "'p'", id="other-name"),
    ],
)
def test_a_different_flow_under_an_existing_id_conflicts(tmq, flow, culprit) -> None:
    tmq.add_flow(node("p", [leaf("c1"), leaf("c2")]))
    tmq.enqueue("q", "leaf", job_id="solo")
    before = snapshot(tmq.client)
    with pytest.raises(FlowConflict) as exc:
        tmq.add_flow(flow())
    assert isinstance(exc.value, DuplicateJob)
    assert str(exc.value).startswith(f"q {culprit.strip(chr(39))} exists")
    assert snapshot(tmq.client) == before


def cyclic() -> Flow:
    a = node("a", [])
    a.children.append(node("b", [leaf("c"), a]))
    return a


@pytest.mark.parametrize(
    "flows, message",
    [
        (
            [node("p", [leaf("c1"), node("m", [leaf("c1")])])],
            "job id 'c1' appears twice in queue 'q' in one flow",
        ),
        (
            [cyclic()],
            r"flow node q/a \(node\) appears twice \(a cycle, or one node under two "
            r"parents\)",
        ),
        (
            [node("p", [leaf("c1")]), node("p2", [leaf("c1")])],
            "job id 'c1' in queue 'q' is in two flows",
        ),
        ([Flow("q", "", job_id="x")], "flow node q/x needs a job name"),
        ([node("p", ["not a flow"])], "a flow's children must be Flow objects, got str"),
        (
            [node("p", [leaf("c1", max_attempts=0)])],
            "q/c1: max_attempts must be a whole number >= 1",
        ),
        (
            [node("p", [leaf("c1", backoff_ms=-1)])],
            r"q/c1: backoff_ms must be a whole number >= 0 \(ms\), got -1",
        ),
        (
            [node("p", [leaf("c1", max_attempts=1.5)])],
            "max_attempts must be a whole number >= 1, got 1.5",
        ),
        ([Flow("q", "p", job_id="p", children=None)], "children of q/p must be a list of Flow"),
        (
            [node("p", [leaf("c1", fail_parent_on_failure=False)])],
            "q/c1: fail_parent_on_failure=False needs ignore_dependency_on_failure",
        ),
        (["not a flow"], "add_flow takes a Flow, got str"),
    ],
    ids=[
        "dup-id",
        "cycle",
        "two-flows",
        "no-name",
        "not-flow-child",
        "max-attempts-0",
        "negative-backoff",
        "float-attempts",
        "children-none",
        "no-policy",
        "not-flow-root",
    ],
)
def test_malformed_flows_are_refused_with_nothing_written(mq, flows, message) -> None:
    with pytest.raises(FlowError, match=message):
        mq.add_flows(flows)
    assert snapshot(mq.client) == {}


def test_a_flow_with_a_bad_payload_writes_nothing(mq) -> None:
    with pytest.raises(PayloadError, match="payload is not JSON-serialisable"):
        mq.add_flow(node("p", [leaf("c1"), Flow("q", "leaf", {1, 2}, job_id="c2")]))
    assert snapshot(mq.client) == {}


def test_add_flows_lands_several_trees(tmq) -> None:
    refs = tmq.add_flows([node("a", [leaf("a1"), leaf("a2")]), deep(), leaf("alone")])
    assert [(x.parent_id, x.child_ids, x.landed) for x in refs] == [
        ("a", ["a1", "a2"], 3),
        ("r", ["m1", "m2", "l4"], 8),
        ("alone", [], 1),
    ]
    assert tmq.job_ids("q", "pending") == ["a1", "a2", "l4", "l1", "l2", "l3", "alone"]
    assert tmq.job_ids("q", "awaiting_children") == ["a", "m1", "m2", "m3", "r"]
    with pytest.raises(TypeError, match=r"^add_flows takes a list of Flow objects; for one flow"):
        tmq.add_flows(leaf("one"))  # was: 'Flow' object is not iterable


def test_add_flows_refuses_a_conflicting_tree_whole(tmq) -> None:
    """Each tree lands atomically on its own (one script each, pipelined): a
    conflicting tree writes nothing; the others land, and adding the batch
    again once fixed skips them."""
    tmq.enqueue("q", "leaf", job_id="taken")
    with pytest.raises(FlowConflict, match="q taken exists as job leaf under parent"):
        tmq.add_flows(
            [
                node("a", [leaf("a1")]),
                node("b", [leaf("b1"), leaf("taken")]),
                node("c", [leaf("c1")]),
            ]
        )
    for missing in ("b", "b1"):
        with pytest.raises(JobNotFound):
            tmq.get_job("q", missing)
    assert tmq.job_ids("q", "pending") == ["taken", "a1", "c1"]
    again = tmq.add_flows(
        [node("a", [leaf("a1")]), node("b", [leaf("b1")]), node("c", [leaf("c1")])]
    )
    assert [(x.landed, x.skipped) for x in again] == [(0, 2), (2, 0), (0, 2)]


def test_a_flow_in_several_chunks_is_gated_whole_and_re_added_as_a_no_op(redis_client) -> None:
    mq = EchoMQ(redis_client, flow_chunk=3)  # 1 + 7 nodes: three scripts

    def flow(n: int, pid: str = "p") -> Flow:
        return node(pid, [leaf(f"c{i}") for i in range(n)])

    assert (mq.add_flow(flow(7)).landed, mq.add_flow(flow(7)).skipped) == (8, 8)
    mq.enqueue("q", "leaf", job_id="solo")
    before = snapshot(redis_client)
    with pytest.raises(FlowConflict, match="q p exists with other children"):
        mq.add_flow(flow(8))
    with pytest.raises(FlowConflict, match="q solo exists as job leaf under parent"):
        mq.add_flow(node("p2", [leaf("n1"), leaf("n2"), leaf("n3"), leaf("solo")]))
    assert snapshot(redis_client) == before
    assert (counter(mq, "q", "p"), mq.dependency_counts("q", "p")["children"]) == (7, 7)


def test_fan_in_releases_the_parent_once(tmq) -> None:
    tmq.add_flow(node("p", [leaf("c1"), leaf("c2")]))
    assert complete(tmq, "c1", {"v": 1}).released == []
    assert_state(tmq, "q", "p", "awaiting_children")
    assert (counter(tmq, "q", "p"), hash_of(tmq, ref(tmq, "p") + ":processed")) == (
        1,
        {ref(tmq, "c1"): '{"v":1}'},
    )
    assert complete(tmq, "c2", [2]).released == [("q", "p")]
    assert_state(tmq, "q", "p", "pending")
    assert (counter(tmq, "q", "p"), events(tmq, "q", "released")) == (0, ["p"])
    parent = claim_one(tmq, "q", "p")
    assert parent.children_values() == {jref("c1"): {"v": 1}, jref("c2"): [2]}
    tmq.complete(parent, "all done")
    assert assert_state(tmq, "q", "p", "completed")["result"] == '"all done"'


def test_duplicate_completion_with_a_stale_lease_does_not_decrement(tmq, clock) -> None:
    tmq.add_flow(node("p", [leaf("c1"), leaf("c2")]))
    stale = claim_one(tmq, "q", "c1", lease_ms=100)
    clock.advance(101)
    assert tmq.timers.recover_stalled("q", max_stalls=3).recovered == 1
    claim_one(tmq, "q", "c2")  # c2 is now at the head; c1 was re-queued behind it
    fresh = claim_one(tmq, "q", "c1")
    with pytest.raises(LeaseLost):
        tmq.complete(stale, "stale")
    assert counter(tmq, "q", "p") == 2
    tmq.complete(fresh, "fresh")
    with pytest.raises(JobNotActive, match="is completed"):
        tmq.complete(stale, "stale")
    assert counter(tmq, "q", "p") == 1
    assert hash_of(tmq, ref(tmq, "p") + ":processed") == {ref(tmq, "c1"): '"fresh"'}


def test_redelivered_completion_is_a_no_op(tmq) -> None:
    tmq.add_flow(node("p", [leaf("c1")]))
    complete(tmq, "c1", 1)
    entry = {"k": "done", "c": ref(tmq, "c1"), "p": "p", "q": "q", "v": "99"}
    flags, outcome = tmq.outbox.deliver([entry, entry])
    assert (flags, outcome.released) == ([True, True], [])
    assert (counter(tmq, "q", "p"), events(tmq, "q", "released")) == (0, ["p"])
    assert hash_of(tmq, ref(tmq, "p") + ":processed") == {ref(tmq, "c1"): "1"}
    assert tmq.job_ids("q", "pending") == ["p"]


def test_intermediate_node_runs_then_fans_into_the_root(tmq) -> None:
    tmq.add_flow(deep())
    for leaf_id in ("l4", "l1"):
        assert complete(tmq, leaf_id, leaf_id).released == []
    assert complete(tmq, "l2", "l2").released == [("q", "m1")]
    assert complete(tmq, "m1", "m1").released == []  # a released parent goes first
    assert complete(tmq, "l3", "l3").released == [("q", "m3")]
    m3 = claim_one(tmq, "q", "m3")
    assert m3.children_values() == {jref("l3"): "l3"}
    assert tmq.complete(m3, "m3").released == [("q", "m2")]
    assert complete(tmq, "m2", "m2").released == [("q", "r")]
    assert_state(tmq, "q", "r", "pending")
    assert tmq.children_values("q", "r") == {jref(k): k for k in ("m1", "m2", "l4")}
    assert events(tmq, "q", "released") == ["m1", "m3", "m2", "r"]


def mixed(mq) -> None:
    """p -> c1 done, c2 ignored (id, dead), c3 removed (rd, dead), c4 pending."""
    mq.add_flow(
        node(
            "p",
            [
                leaf("c1"),
                leaf("c2", ignore_dependency_on_failure=True),
                leaf("c3", remove_dependency_on_failure=True),
                leaf("c4"),
            ],
        )
    )
    complete(mq, "c1", {"n": 1})
    for cid in ("c2", "c3"):
        kill(mq, cid, f"{cid} broke")


def test_reads_of_a_parent(tmq) -> None:
    mixed(tmq)
    c = {i: jref(i) for i in ("c1", "c2", "c3", "c4")}
    assert tmq.children_values("q", "p") == {c["c1"]: {"n": 1}}
    assert tmq.ignored_failures("q", "p") == {c["c2"]: "c2 broke"}
    assert tmq.dependencies("q", "p") == Dependencies(
        processed={c["c1"]: {"n": 1}},
        unprocessed=[c["c4"]],
        failed={},
        ignored={c["c2"]: "c2 broke"},
        removed={c["c3"]: "c3 broke"},
        remaining=1,
    )
    assert tmq.dependency_counts("q", "p") == {
        "processed": 1,
        "unprocessed": 1,
        "failed": 0,
        "ignored": 1,
        "removed": 1,
        "remaining": 1,
        "children": 4,
    }


def test_get_flow_to_a_depth(tmq) -> None:
    tmq.add_flow(deep())
    complete(tmq, "l4", {"x": 4})

    def at(job_id, state, remaining=None, kids=(), result=None, policy="fp"):
        return {
            "queue": "q",
            "id": job_id,
            "ref": jref(job_id),
            "name": "node" if kids or remaining is not None else "leaf",
            "state": state,
            "result": result,
            "error": None,
            "policy": policy,
            "remaining": remaining,
            "children": list(kids),
        }

    l4 = at("l4", "completed", result={"x": 4})
    m3 = at("m3", "awaiting_children", 1, [at("l3", "pending")])
    m1 = at("m1", "awaiting_children", 2, [at("l1", "pending"), at("l2", "pending")])
    m2 = at("m2", "awaiting_children", 1, [m3])
    full = at("r", "awaiting_children", 2, [l4, m1, m2], policy=None)
    full["children"].sort(key=lambda n: n["ref"])
    assert tmq.get_flow("q", "r") == full
    shallow = tmq.get_flow("q", "r", depth=1)
    assert [n["id"] for n in shallow["children"]] == ["l4", "m1", "m2"]
    assert all(n["children"] == [] for n in shallow["children"])
    assert tmq.get_flow("q", "r", depth=0)["children"] == []
    for bad in ("x", -1, 1.5, True):  # "x" was a raw TypeError, -1 was taken
        with pytest.raises(ValueError, match=f"^depth must be a whole number >= 0, got {bad!r}$"):
            tmq.get_flow("q", "r", depth=bad)


READS = ("children_values", "ignored_failures", "dependencies", "dependency_counts", "get_flow")


@pytest.mark.parametrize("read", READS)
def test_reads_refuse_an_unknown_id(mq, read) -> None:
    with pytest.raises(JobNotFound, match="^job 'nope' not found in queue 'q'$"):
        getattr(mq, read)("q", "nope")


def test_reads_of_a_job_that_is_not_a_parent(tmq) -> None:
    tmq.enqueue("q", "n", job_id="solo")
    before = snapshot(tmq.client)
    assert tmq.children_values("q", "solo") == {}
    assert tmq.ignored_failures("q", "solo") == {}
    assert tmq.dependencies("q", "solo") == Dependencies()
    assert tmq.dependency_counts("q", "solo") == {
        "processed": 0,
        "unprocessed": 0,
        "failed": 0,
        "ignored": 0,
        "removed": 0,
        "remaining": 0,
        "children": 0,
    }
    assert tmq.get_flow("q", "solo")["children"] == []
    assert snapshot(tmq.client) == before  # reads never write


def test_job_children_values_is_lazy_and_cached(tmq, monkeypatch) -> None:
    tmq.add_flow(node("p", [leaf("c1")]))
    complete(tmq, "c1", "one")
    parent = claim_one(tmq, "q", "p")
    sent = []
    real = tmq.client.execute_command

    def counting(*args, **kwargs):
        sent.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(tmq.client, "execute_command", counting)
    assert (parent.id, parent.payload, parent.state, parent.ref) == (
        "p",
        {"id": "p"},
        JobState.ACTIVE,
        jref("p"),
    )
    assert sent == []  # claiming and reading the job's fields cost nothing
    values = parent.children_values()
    assert values == {jref("c1"): "one"} and len(sent) > 0
    issued = len(sent)
    assert parent.children_values() is values
    assert len(sent) == issued  # cached: no second read


def test_a_flow_larger_than_one_chunk_lands_completely(tmq, monkeypatch) -> None:
    modes = []
    original = Scripts.check_call

    def record(self, name, keys, args):
        if name == "enqueue_flow":
            modes.append(args[3])
        return original(self, name, keys, args)

    monkeypatch.setattr(Scripts, "check_call", record)
    n = 12_000  # FLOW_CHUNK = 5000 nodes per script: 3 chunks, parent first
    got = tmq.add_flow(
        Flow(
            "q",
            "big",
            job_id="p",
            children=[Flow("q", "leaf", i, job_id=f"c{i}") for i in range(n)],
        )
    )
    assert modes == ["check"] * 3 + ["write"] * 3
    assert (got.landed, got.skipped, len(got.child_ids)) == (n + 1, 0, n)
    assert_state(tmq, "q", "p", "awaiting_children")
    assert counter(tmq, "q", "p") == n
    assert tmq.dependency_counts("q", "p")["children"] == n
    assert tmq.client.llen(tmq.keys.queue_key("q", "pending")) == n
    assert tmq.get_job("q", f"c{n - 1}").parent == "p"
    assert tmq.claim("q", 2)[1].id == "c1"
