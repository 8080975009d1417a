"""What a flow node costs Redis (docs/explanation/performance.md#memory-per-node):
a leaf row's fields and their short names, its ``MEMORY USAGE`` in the
benchmark's shape, the cross-queue leaves' ``added`` runs, and rows written
with the earlier long field names still read and resolved
(docs/explanation/protocol.md#the-job-row)."""

from __future__ import annotations

import pytest

from echomq_django import EchoMQ, Flow, FlowConflict, JobRef, JobState
from echomq_django.core.events import run_ids
from echomq_django.core.rows import CREATED, LONG_NAMES, PARENT, PARENT_QUEUE, STATE
from tests.support.jobkit import raw_row, sweep
from tests.support.workerkit import T0

# a pending leaf holds no state, and no add time (its `pi` carries it)
LEAF_FIELDS = {"n", "d", "p", "pi"}


def _bench_flow(child_queue: str, n: int) -> Flow:
    """The benchmark's shape (bench/topologies.py): a root on ``bench`` and
    ``n`` leaves of payload ``{"i": i}``, generated ids."""
    kids = [Flow(child_queue, "bench.leaf", {"i": i}) for i in range(n)]
    return Flow("bench", "bench.root", {}, children=kids)


def test_a_leaf_row_holds_four_fields_under_short_names(mq) -> None:
    wide = mq.add_flow(_bench_flow("bench", 3))
    cross = mq.add_flow(_bench_flow("bench2", 3))
    leaf = raw_row(mq, *wide.nodes[-1])
    assert set(leaf) == LEAF_FIELDS
    # the parent's id stored after the 12 characters the flow's ids share,
    # its incarnation the add's time and 6 digits
    assert (leaf["p"], leaf["pi"], leaf["pi"][:-6]) == (
        ":" + wide.parent_id[12:],
        raw_row(mq, "bench", wide.parent_id)["inc"],
        str(mq.get_job("bench", wide.parent_id).created_at),
    )
    other = raw_row(mq, *cross.nodes[-1])
    assert set(other) == LEAF_FIELDS  # its parent's queue in `p`
    assert other["p"] == "bench::0"
    job = mq.get_job(*wide.nodes[-1])
    assert (job.parent, job.state, job.created_at) == (
        wide.parent_id,
        JobState.PENDING,
        int(leaf["pi"][:-6]),
    )
    job = mq.get_job(*cross.nodes[-1])
    assert (job.parent, job.parent_queue, job.state, job.created_at) == (
        cross.parent_id,
        "bench",
        JobState.PENDING,
        int(other["pi"][:-6]),
    )
    (claimed,) = mq.claim("bench2", 1)  # the claim reads them the same way
    assert (claimed.state, claimed.created_at) == (JobState.ACTIVE, job.created_at)


def test_a_benchmark_leaf_row_fits_the_64_byte_listpack_class(r) -> None:
    # MEMORY USAGE of the row: its listpack (58 bytes wide, 69 cross-queue:
    # the 64 and 80 classes) and its key, object and dict entry (88 bytes).
    # With the long names they were 216 and 248; with only `ca`, `pq`, `pp`
    # and `pi` short, 200 and 216; with `s` and `ca` stored, 168 and 184.
    mq = EchoMQ(r, prefix="emq")
    wide = mq.add_flow(_bench_flow("bench", 10))
    cross = mq.add_flow(_bench_flow("bench2", 10))
    assert r.memory_usage(mq.keys.job(*wide.nodes[-1]), samples=0) <= 152
    assert r.memory_usage(mq.keys.job(*cross.nodes[-1]), samples=0) <= 168


@pytest.mark.parametrize("child_queue", ["p", "c"])
def test_a_child_taken_under_a_new_incarnation_keeps_its_add_time(tmq, clock, child_queue) -> None:
    # c1 runs when its flow is removed; the flow added again 5 s later
    # takes it under the new incarnation: the time its old `pi` carried is
    # written as its `ca` first (docs/explanation/protocol.md#compact-rows)
    flow = Flow(
        "p", "root", {}, job_id="root", children=[Flow(child_queue, "leaf", {}, job_id="c1")]
    )
    tmq.add_flow(flow)
    assert set(raw_row(tmq, child_queue, "c1")) == {"n", "d", "p", "pi"}
    (job,) = tmq.claim(child_queue, 1)
    tmq.remove("p", "root")
    sweep(tmq, child_queue)
    clock.advance(5_000)
    kids = [Flow(child_queue, "leaf", {}, job_id=i) for i in ("c1", "c2")]
    tmq.add_flow(Flow("p", "root", {}, job_id="root", children=kids))
    inc = raw_row(tmq, "p", "root")["inc"]
    c1, c2 = raw_row(tmq, child_queue, "c1"), raw_row(tmq, child_queue, "c2")
    assert (c1["pi"], c1["ca"], c2["pi"], "ca" in c2) == (inc, str(T0), inc, False)
    got = [tmq.get_job(child_queue, i).created_at for i in ("c1", "c2")]
    assert got == [T0, T0 + 5_000]
    tmq.complete(job, "kept")  # it finishes under the new flow, its time unchanged
    assert tmq.get_job(child_queue, "c1").created_at == T0


def test_cross_queue_leaves_are_announced_in_runs_of_100(mq) -> None:
    ref = mq.add_flow(_bench_flow("bench2", 250))
    stored = [
        f[b"id"].decode()
        for _, f in mq.client.xrange(mq.keys.queue_key("bench2", "events"))
        if f[b"e"] == b"added"
    ]
    entries = [run_ids(text) for text in stored]
    assert [len(ids) for ids in entries] == [100, 100, 50]
    assert [i for ids in entries for i in ids] == [job_id for _, job_id in ref.children]
    # each id after a run's first stored after the 12 characters it shares
    # with the first, the ids counting up in hex as one range
    # (docs/explanation/protocol.md#relative-ids-in-a-run): ids 1..250 in hex
    head = ref.parent_id[:12]
    assert stored == [f"{head}1 ::2:64", f"{head}65 ::66:c8", f"{head}c9 ::ca:fa"]
    # one `added` per job all the same, for a follower and the minute counters
    follow = mq.events("bench2", since="0-0", kinds=["added"], block_s=0.1)
    with follow:
        assert [e.job_id for e in follow] == [job_id for _, job_id in ref.children]
    _, counts = mq.probes.minute_counts(["bench2"], 1)
    assert counts["bench2"][-1]["added"] == 250
    # the root on its own queue is announced by its own entry
    assert [
        f[b"id"].decode() for _, f in mq.client.xrange(mq.keys.queue_key("bench", "events"))
    ] == [ref.parent_id]


# the names the build before the last one wrote long; the last wrote `ca`,
# `pq`, `pp` and `pi` short and the others long
EARLIEST = tuple(LONG_NAMES)
PREVIOUS = ("n", "d", "s", "p")


def _to_long_names(mq, queue: str, job_id: str, names=EARLIEST) -> None:
    """Rewrite a row as an earlier build wrote it: ``names`` (short names)
    under their long names, with the state and add time every row of that
    build holds (this one leaves them out while they can be read elsewhere:
    a pending row's state, a flow child's add time in its ``pi``), and a
    child's parent as its whole id, its queue in ``pq`` when not the child's
    (this one writes both in ``p``)."""
    key = mq.keys.job(queue, job_id)
    job = mq.get_job(queue, job_id)
    defaults = {STATE: job.state.value, CREATED: str(job.created_at)}
    link = {}
    if job.parent:
        link[PARENT] = job.parent
        mq.client.hdel(key, PARENT)
        if job.parent_queue != queue:
            defaults[PARENT_QUEUE] = job.parent_queue
    for short, long in ((n, LONG_NAMES[n]) for n in names):
        value = link.pop(short, None) or mq.client.hget(key, short)
        value = defaults.get(short) if value is None else value
        defaults.pop(short, None)
        if value is not None:
            mq.client.hset(key, long, value)
            mq.client.hdel(key, short)
    for short, value in {**defaults, **link}.items():  # kept under its short name
        if mq.client.hget(key, short) is None:
            mq.client.hset(key, short, value)


@pytest.mark.parametrize("child_queue", ["p", "c"])
def test_rows_with_the_earlier_long_names_are_read_and_resolve_their_parent(
    mq, child_queue
) -> None:
    kids = [
        Flow(child_queue, "leaf", {"i": 0}, job_id="k0"),
        Flow(child_queue, "leaf", {"i": 1}, job_id="k1", ignore_dependency_on_failure=True),
    ]
    ref = mq.add_flow(Flow("p", "root", {}, job_id="root", children=kids))
    for _, job_id in ref.children:
        _to_long_names(mq, child_queue, job_id)
    old = raw_row(mq, child_queue, "k1")
    assert "created_at" in old and "ca" not in old and old["parent_policy"] == "id"
    job = mq.get_job(child_queue, "k1")
    assert (job.parent, job.parent_queue, job.parent_policy.value, job.created_at) == (
        "root",
        "p",
        "id",
        int(old["created_at"]),
    )
    assert mq.get_flow("p", "root")["children"][1]["policy"].value == "id"
    claimed = {j.id: j for j in mq.claim(child_queue, 10)}
    assert {i: (j.parent, j.parent_queue) for i, j in claimed.items()} == {
        "k0": ("root", "p"),
        "k1": ("root", "p"),
    }
    mq.complete(claimed["k0"], "zero")
    mq.complete(claimed["k1"], "one")
    sweep(mq, child_queue)  # the cross-queue results travel by the outbox
    assert mq.get_job("p", "root").state == JobState.PENDING
    assert mq.children_values("p", "root") == {
        JobRef(child_queue, "k0"): "zero",
        JobRef(child_queue, "k1"): "one",
    }


@pytest.mark.parametrize("child_queue", ["p", "c"])
def test_rows_of_the_previous_build_finish_and_release_their_parent(mq, child_queue) -> None:
    # the previous build wrote `ca`, `pq`, `pp`, `pi` short and `name`,
    # `payload`, `state`, `parent` long: the parent's row too
    kids = [Flow(child_queue, "leaf", {"i": i}, job_id=f"k{i}") for i in range(3)]
    ref = mq.add_flow(Flow("p", "root", {"r": 1}, job_id="root", children=kids))
    for queue, job_id in [("p", "root"), *ref.children]:
        _to_long_names(mq, queue, job_id, PREVIOUS)
    old = raw_row(mq, child_queue, "k1")
    assert (old["state"], old["parent"], old["payload"], old["name"]) == (
        "pending",
        "root",
        '{"i":1}',
        "leaf",
    )
    assert "ca" in old and "s" not in old and "p" not in old
    assert mq.get_job("p", "root").state == JobState.AWAITING_CHILDREN
    assert mq.probes.states(child_queue, ["k0"]) == {"k0": "pending"}
    claimed = {j.id: j for j in mq.claim(child_queue, 10)}
    assert {i: (j.name, j.payload, j.parent) for i, j in claimed.items()} == {
        f"k{i}": ("leaf", {"i": i}, "root") for i in range(3)
    }
    # a move writes the short state into the old row: that one is read
    assert raw_row(mq, child_queue, "k0")["s"] == "active"
    assert mq.get_job(child_queue, "k0").state == JobState.ACTIVE
    for i in range(3):
        mq.complete(claimed[f"k{i}"], i)
    sweep(mq, child_queue)
    assert mq.get_job("p", "root").state == JobState.PENDING
    (root,) = mq.claim("p", 1)
    assert (root.id, root.name, root.payload) == ("root", "root", {"r": 1})
    mq.complete(root, "all")
    assert mq.get_job("p", "root").state == JobState.COMPLETED
    assert mq.children_values("p", "root") == {JobRef(child_queue, f"k{i}"): i for i in range(3)}


def test_a_cross_queue_child_of_the_previous_form_and_a_leftover_pq_read_right(mq) -> None:
    # the build before wrote `p` as `:<rest>` and the queue as `pq`; a queue
    # named in `p` wins over a `pq` a row still holds
    ref = mq.add_flow(_bench_flow("bench2", 2))
    (_, old), (_, new) = ref.children
    mq.client.hset(mq.keys.job("bench2", old), mapping={"p": ":0", "pq": "bench"})
    mq.client.hset(mq.keys.job("bench2", new), "pq", "elsewhere")
    assert raw_row(mq, "bench2", new)["p"] == "bench::0"
    for job_id in (old, new):
        job = mq.get_job("bench2", job_id)
        assert (job.parent, job.parent_queue) == (ref.parent_id, "bench")
    for job in mq.claim("bench2", 2):
        assert (job.parent, job.parent_queue) == (ref.parent_id, "bench")
        mq.complete(job, job.id)
    sweep(mq, "bench2")
    assert mq.get_job("bench", ref.parent_id).state == JobState.PENDING
    assert mq.children_values("bench", ref.parent_id) == {
        JobRef("bench2", old): old,
        JobRef("bench2", new): new,
    }


@pytest.mark.parametrize("child_queue", ["p", "c"])
def test_a_long_named_parent_inc_still_guards_the_parent(mq, child_queue) -> None:
    # a child of another incarnation of its parent (as `parent_inc` of the
    # earlier build says) resolves nothing (docs/explanation/protocol.md#incarnations)
    ref = mq.add_flow(Flow("p", "root", {}, job_id="root", children=[
        Flow(child_queue, "leaf", {}, job_id="k0")]))  # fmt: skip
    _to_long_names(mq, child_queue, "k0")
    inc = int(raw_row(mq, "p", "root")["inc"])
    mq.client.hset(mq.keys.job(child_queue, "k0"), "parent_inc", str(inc % (2**31 - 1) + 1))
    (job,) = mq.claim(child_queue, 1)
    mq.complete(job, "late")
    sweep(mq, child_queue)
    assert mq.get_job("p", "root").state == JobState.AWAITING_CHILDREN
    assert mq.children_values("p", "root") == {}
    assert ref.children == [("c" if child_queue == "c" else "p", "k0")]


def _kids() -> list[Flow]:
    return [Flow(q, "leaf", {}, job_id=f"k{i}") for i, q in enumerate(("p", "c", "p", "c"))]


def test_a_parents_children_list_holds_ids_and_queue_id_refs(mq) -> None:
    mq.add_flow(Flow("p", "root", {}, job_id="root", children=_kids()))
    stored = mq.client.lrange(mq.keys.job_part("p", "root", "children"), 0, -1)
    assert [e.decode() for e in stored] == ["k0", "c:k1", "k2", "c:k3"]
    refs = [JobRef("p", "k0"), JobRef("c", "k1"), JobRef("p", "k2"), JobRef("c", "k3")]
    assert [(c["queue"], c["id"]) for c in mq.get_flow("p", "root")["children"]] == sorted(
        (r.queue, r.id) for r in refs
    )
    assert list(mq.dependencies("p", "root", count=10).items.unprocessed) == refs
    assert sorted(mq.dependencies("p", "root").unprocessed) == sorted(refs)


@pytest.mark.parametrize("how", ["cancel", "remove"])
def test_a_children_list_of_full_keys_from_before_is_read_as_ever(mq, how) -> None:
    mq.add_flow(Flow("p", "root", {}, job_id="root", children=_kids()))
    kids = mq.keys.job_part("p", "root", "children")
    refs = [JobRef("p", "k0"), JobRef("c", "k1"), JobRef("p", "k2"), JobRef("c", "k3")]
    mq.client.delete(kids)
    mq.client.rpush(kids, *(mq.keys.job(r.queue, r.id) for r in refs))  # as written before
    assert list(mq.dependencies("p", "root", count=10).items.unprocessed) == refs
    assert mq.child_results("p", "root") == [None] * 4
    mq.remove_child_dependency("p", "root", JobRef("c", "k3"))
    assert mq.dependency_counts("p", "root")["remaining"] == 3
    getattr(mq, how)("p", "root")
    sweep(mq, "p", "c")
    gone = [mq.client.exists(mq.keys.job(r.queue, r.id)) for r in refs]
    if how == "remove":  # the parent and its subtree go, on both queues
        assert gone == [0, 0, 0, 0] and not mq.client.exists(mq.keys.job("p", "root"))
    else:  # every queued child is cancelled: dead, on both queues
        assert [mq.get_job(r.queue, r.id).state for r in refs] == [JobState.DEAD] * 4


def test_a_flow_added_again_over_a_children_list_of_full_keys_is_the_same_flow(mq) -> None:
    # enqueue_flow takes the list's short form; a list written before holds
    # full keys, and gating a re-add compares it in the short form
    mq.add_flow(Flow("p", "root", {}, job_id="root", children=_kids()))
    kids = mq.keys.job_part("p", "root", "children")
    full = [mq.keys.job("p", "k0"), mq.keys.job("c", "k1"), mq.keys.job("p", "k2"), "c:k3"]
    mq.client.delete(kids)
    mq.client.rpush(kids, *full)
    again = mq.add_flow(Flow("p", "root", {}, job_id="root", children=_kids()))
    assert (again.landed, again.skipped) == (0, 5)
    assert [e.decode() for e in mq.client.lrange(kids, 0, -1)] == full  # left as it was
    other = [*_kids()[:3], Flow("c", "leaf", {}, job_id="k9")]
    with pytest.raises(FlowConflict, match="exists with other children"):
        mq.add_flow(Flow("p", "root", {}, job_id="root", children=other))


@pytest.mark.parametrize("child_queue", ["p", "c"])
def test_a_short_name_written_into_an_earlier_row_wins(mq, child_queue) -> None:
    # a flow added again writes `pi` into a child row of the earlier build,
    # whose `parent_inc` is the removed flow's: `pi` is the one read
    mq.add_flow(Flow("p", "root", {}, job_id="root", children=[
        Flow(child_queue, "leaf", {}, job_id="k0")]))  # fmt: skip
    _to_long_names(mq, child_queue, "k0")
    inc = int(raw_row(mq, "p", "root")["inc"])
    key = mq.keys.job(child_queue, "k0")
    mq.client.hset(key, mapping={"parent_inc": str(inc % (2**31 - 1) + 1), "pi": str(inc)})
    (job,) = mq.claim(child_queue, 1)
    mq.complete(job, "counted")
    sweep(mq, child_queue)
    assert mq.get_job("p", "root").state == JobState.PENDING
    assert mq.children_values("p", "root") == {JobRef(child_queue, "k0"): "counted"}


@pytest.mark.parametrize("child_queue", ["p", "c"])
@pytest.mark.parametrize(
    ("root", "kid", "stored"),
    [
        ("order-2026-12-03", "order-2026-12-03-a", ":2-03"),  # 12 characters shared
        ("éééééé-root", "éééééé-k", ":-root"),  # 12 bytes: 6 characters
        ("aééééééroot", "aéééééé-k", "aééééééroot"),  # a cut would split an é
        ("short", "short-k", "short"),
    ],
)
def test_a_parent_id_is_stored_after_the_bytes_it_shares_with_the_childs(
    mq, child_queue, root, kid, stored
) -> None:
    ref = mq.add_flow(Flow("p", "root", {}, job_id=root, children=[
        Flow(child_queue, "leaf", {}, job_id=kid)]))  # fmt: skip
    # on another queue, `p` names it first (`p:` and the same forms)
    assert raw_row(mq, child_queue, kid)["p"] == ("" if child_queue == "p" else "p:") + stored
    assert mq.get_job(child_queue, kid).parent_ref == JobRef("p", root)
    assert mq.get_flow("p", root)["children"][0]["id"] == kid
    again = mq.add_flow(Flow("p", "root", {}, job_id=root, children=[
        Flow(child_queue, "leaf", {}, job_id=kid)]))  # fmt: skip
    assert (again.landed, again.skipped) == (0, 2)
    (job,) = mq.claim(child_queue, 1)
    assert job.parent == root
    mq.complete(job, "done")
    sweep(mq, child_queue)
    assert mq.get_job("p", root).state == JobState.PENDING
    assert mq.children_values("p", root) == {JobRef(child_queue, kid): "done"}
    assert ref.children == [(child_queue, kid)]
