"""A parent's ``:children`` entries (docs/explanation/protocol.md#a-parents-keys):
a child whose id shares the parent's first 12 bytes is stored as ``:`` and
the rest of its id (``<queue>::`` and the rest on another queue), any other
as its id (``<queue>:<id>``); a cut never splits a UTF-8 character. Lists
written before in the earlier forms (whole ids, full keys) still read,
resolve, cancel and remove. Each test runs on both rigs."""

from __future__ import annotations

import pytest

from echomq_django import Flow, FlowConflict, JobRef, JobState
from tests.support.jobkit import assert_state, claim_one, leaf, node, raw_row, sweep

ROOT = "order-2026-12-03"  # a user id: its first 12 bytes are "order-2026-1"
QUEUES = ("p", "c", "p", "c")


def _entries(mq, queue: str, job_id: str) -> list[str]:
    key = mq.keys.job_part(queue, job_id, "children")
    return [e.decode() for e in mq.client.lrange(key, 0, -1)]


def _refs(ids: list[str]) -> list[JobRef]:
    return [JobRef(q, i) for q, i in zip(QUEUES, ids, strict=True)]


def _flow(root: str, kids: list[str]) -> Flow:
    """Root ``root`` on p over leaves ``kids`` on p, c, p, c."""
    leaves = [Flow(q, "leaf", {}, job_id=k) for q, k in zip(QUEUES, kids, strict=True)]
    return Flow("p", "root", {}, job_id=root, children=leaves)


def _finish_all(mq, refs: list[JobRef]) -> None:
    for n, r in enumerate(refs):
        mq.complete(claim_one(mq, r.queue, r.id), n)
    sweep(mq, "p", "c")


def test_a_flow_with_generated_ids_stores_the_rest_of_each_childs_id(mq) -> None:
    ref = mq.add_flow(Flow("p", "root", {}, children=[Flow(q, "leaf", {}) for q in QUEUES]))
    root, ids = ref.parent_id, [i for _, i in ref.children]
    assert all(i[:12] == root[:12] and len(i) == 13 for i in [root, *ids])
    assert _entries(mq, "p", root) == [":1", "c::2", ":3", "c::4"]
    assert mq.probes.same_queue_children("p", [root]) == {ids[0], ids[2]}
    refs = _refs(ids)
    assert list(mq.dependencies("p", root, count=10).items.unprocessed) == refs
    assert [JobRef(c["queue"], c["id"]) for c in mq.get_flow("p", root)["children"]] == sorted(refs)
    _finish_all(mq, refs)
    assert mq.children_values("p", root) == {r: n for n, r in enumerate(refs)}
    assert_state(mq, "p", root, "pending")


@pytest.mark.parametrize(
    ("root", "kids", "stored"),
    [
        ("root", ["k0", "k1", "k2", "k3"], ["k0", "c:k1", "k2", "c:k3"]),  # nothing shared
        (
            ROOT,
            [f"{ROOT}-k{i}" for i in range(4)],
            [":2-03-k0", "c::2-03-k1", ":2-03-k2", "c::2-03-k3"],
        ),
    ],
)
def test_a_flow_with_user_ids_stores_them_whole_or_after_the_shared_bytes(
    mq, root, kids, stored
) -> None:
    flow = _flow(root, kids)
    mq.add_flow(flow)
    assert _entries(mq, "p", root) == stored
    again = mq.add_flow(flow)  # the re-add's gate compares the list with what it sends
    assert (again.landed, again.skipped) == (0, 5)
    refs = _refs(kids)
    assert list(mq.dependencies("p", root, count=10).items.unprocessed) == refs
    _finish_all(mq, refs)
    assert mq.children_values("p", root) == {r: n for n, r in enumerate(refs)}


@pytest.mark.parametrize("child_queue", ["p", "c"])
@pytest.mark.parametrize(
    ("root", "kid", "rest"),
    [
        ("éééééé-root", "éééééé-k", "-k"),  # 12 bytes: 6 characters
        ("aééééééroot", "aéééééé-k", None),  # the 12th byte starts an é: stored whole
        ("abcdefghijkl", "abcdefghijkl-x", "-x"),  # the parent is its 12 bytes
        ("abcdefghijklm", "abcdefghijkl", None),  # nothing after them: whole
    ],
)
def test_a_child_id_is_cut_after_12_bytes_only_between_characters(
    mq, child_queue, root, kid, rest
) -> None:
    flow = Flow("p", "root", {}, job_id=root, children=[Flow(child_queue, "leaf", {}, job_id=kid)])
    ref = mq.add_flow(flow)
    there = "" if child_queue == "p" else "c:"
    assert _entries(mq, "p", root) == [there + (kid if rest is None else ":" + rest)]
    assert mq.get_flow("p", root)["children"][0]["id"] == kid
    assert mq.add_flow(flow).skipped == 2
    mq.complete(claim_one(mq, child_queue, kid), "done")
    sweep(mq, child_queue)
    assert mq.children_values("p", root) == {JobRef(child_queue, kid): "done"}
    assert ref.children == [(child_queue, kid)]


def _old_forms(mq, kids: list[str]) -> list[str]:
    """Rewrite ROOT's list as earlier versions wrote it: whole ids (same
    queue, ``c:<id>``) and full keys. Returns the entries written."""
    key = mq.keys.job_part("p", ROOT, "children")
    old = [kids[0], f"c:{kids[1]}", mq.keys.job("p", kids[2]), mq.keys.job("c", kids[3])]
    mq.client.delete(key)
    mq.client.rpush(key, *old)
    return old


@pytest.mark.parametrize("how", ["cancel", "remove"])
def test_a_list_written_in_the_old_forms_reads_resolves_and_goes(mq, how) -> None:
    kids = [f"{ROOT}-k{i}" for i in range(4)]
    flow = _flow(ROOT, kids)
    mq.add_flow(flow)
    old, refs = _old_forms(mq, kids), _refs(kids)
    assert mq.probes.same_queue_children("p", [ROOT]) == {kids[0], kids[2]}
    assert list(mq.dependencies("p", ROOT, count=10).items.unprocessed) == refs
    assert sorted(mq.dependencies("p", ROOT).unprocessed) == sorted(refs)
    assert [JobRef(c["queue"], c["id"]) for c in mq.get_flow("p", ROOT)["children"]] == sorted(refs)
    assert mq.flow_page("p", ROOT, count=10)["children"][1]["id"] == kids[1]
    again = mq.add_flow(flow)
    assert (again.landed, again.skipped) == (0, 5)
    assert _entries(mq, "p", ROOT) == old  # left as it was
    with pytest.raises(FlowConflict, match="exists with other children"):
        mq.add_flow(_flow(ROOT, [k + "x" for k in kids]))
    mq.complete(claim_one(mq, "p", kids[0]), "done")
    mq.remove_child_dependency("p", ROOT, refs[1])  # `c:<id>`
    mq.remove_child_dependency("p", ROOT, refs[3])  # a full key
    assert mq.dependency_counts("p", ROOT)["remaining"] == 1
    assert mq.children_values("p", ROOT) == {refs[0]: "done"}
    assert mq.child_results("p", ROOT) == ["done", None, None, None]
    getattr(mq, how)("p", ROOT)
    sweep(mq, "p", "c")
    if how == "remove":  # the parent and its subtree go, on both queues
        assert [mq.client.exists(mq.keys.job(r.queue, r.id)) for r in refs] == [0] * 4
        assert not mq.client.exists(mq.keys.job("p", ROOT))
    else:  # every queued child is cancelled, on both queues
        assert [mq.get_job(r.queue, r.id).state for r in refs] == [
            JobState.COMPLETED, *[JobState.DEAD] * 3]  # fmt: skip


def test_a_completed_list_of_old_forms_releases_its_parent_with_every_value(mq) -> None:
    kids = [f"{ROOT}-k{i}" for i in range(4)]
    mq.add_flow(_flow(ROOT, kids))
    _old_forms(mq, kids)
    refs = _refs(kids)
    _finish_all(mq, refs)
    assert mq.children_values("p", ROOT) == {r: n for n, r in enumerate(refs)}
    assert mq.child_results("p", ROOT) == [0, 1, 2, 3]
    assert_state(mq, "p", ROOT, "pending")


@pytest.mark.parametrize("form", ["now", "whole ids", "full keys"])
def test_a_half_landed_add_finds_its_parents_entry_in_any_form(mq, form) -> None:
    """The parent's step landed (its list in ``form``); a same-queue child
    of a later step (m) and its cross-queue child (x) never did: they land
    when the flow is added again (on one server, m's step looks for m in
    its parent's list)."""
    m_id, x_id, k_id = f"{ROOT}-m", f"{ROOT}-x", f"{ROOT}-k"
    flow = node(ROOT, [node(m_id, [leaf(x_id, queue="c")], queue="p"), leaf(k_id, queue="c")])
    flow.queue = "p"
    mq.add_flow(flow)
    kids = mq.keys.job_part("p", ROOT, "children")
    assert _entries(mq, "p", ROOT) == [":2-03-m", "c::2-03-k"]
    assert _entries(mq, "p", m_id) == ["c::2-03-x"]
    old = {
        "whole ids": [m_id, f"c:{k_id}"],
        "full keys": [mq.keys.job("p", m_id), mq.keys.job("c", k_id)],
    }
    if form in old:
        mq.client.delete(kids)
        mq.client.rpush(kids, *old[form])
    m, x = mq.keys.job("p", m_id), mq.keys.job("c", x_id)
    mq.client.delete(m, f"{m}:children", f"{m}:dependencies", x)
    mq.client.zrem(mq.keys.queue_key("p", "awaiting"), m_id)
    mq.client.lrem(mq.keys.queue_key("c", "pending"), 0, x_id)
    ref = mq.add_flow(flow)
    assert (ref.landed, ref.skipped) == (2, 2)
    assert raw_row(mq, "c", x_id)["pi"] == raw_row(mq, "p", m_id)["inc"]
    assert_state(mq, "p", m_id, "awaiting_children")
    assert_state(mq, "c", x_id, "pending")
    assert _entries(mq, "p", m_id) == ["c::2-03-x"]


def test_add_children_writes_the_same_entries_and_counts_an_old_one_once(mq) -> None:
    mq.enqueue("p", "step", {}, job_id=ROOT)
    (job,) = mq.claim("p")
    kids = [
        Flow("p", "t.echo", 1, job_id=f"{ROOT}-k0"),
        Flow("c", "t.echo", 2, job_id=f"{ROOT}-k1"),
    ]
    job.add_children(kids)
    assert _entries(mq, "p", ROOT) == [":2-03-k0", "c::2-03-k1"]
    key = mq.keys.job_part("p", ROOT, "children")
    mq.client.delete(key)
    mq.client.rpush(key, f"{ROOT}-k0", mq.keys.job("c", f"{ROOT}-k1"))  # as written before
    job.add_children([*kids, Flow("c", "t.echo", 3, job_id="k2")])  # the same two again, one new
    assert _entries(mq, "p", ROOT) == [f"{ROOT}-k0", mq.keys.job("c", f"{ROOT}-k1"), "c:k2"]
    assert int(mq.client.get(mq.keys.job_part("p", ROOT, "dependencies"))) == 3
    assert sorted(mq.dependencies("p", ROOT).unprocessed) == [
        JobRef("c", "k2"), JobRef("c", f"{ROOT}-k1"), JobRef("p", f"{ROOT}-k0")]  # fmt: skip


@pytest.mark.parametrize("written", ["now", "before"])
def test_remove_unprocessed_children_finds_every_child_in_either_form(mq, written) -> None:
    kids = [f"{ROOT}-k{i}" for i in range(4)]
    mq.add_flow(_flow(ROOT, kids))
    if written == "before":
        _old_forms(mq, kids)
    mq.complete(claim_one(mq, "p", kids[0]), "done")
    deleted, outcome = mq.remove_unprocessed_children("p", ROOT)
    assert sorted(deleted) == sorted(_refs(kids)[1:])
    assert outcome.released == [JobRef("p", ROOT)]
    assert [mq.client.exists(mq.keys.job(r.queue, r.id)) for r in _refs(kids)] == [1, 0, 0, 0]
    assert mq.children_values("p", ROOT) == {JobRef("p", kids[0]): "done"}
