"""plan() and steps(): a flow's siblings become runs sharing one script
header, every distinct setting is still checked, and a step never holds more
than the chunk (docs/explanation/performance.md#the-adds-python)."""

from __future__ import annotations

import gc
import tracemalloc

import pytest

from echomq_django import EchoMQ, Flow, FlowError, JobRef, PayloadError
from echomq_django.core import flows as _flows
from echomq_django.core.jobs import to_json
from echomq_django.core.landing import steps
from tests.support.jobkit import leaf, node, row, snapshot


def test_siblings_sharing_a_header_are_one_run_and_a_change_starts_another() -> None:
    kids = [leaf(f"a{i}") for i in range(3)]
    kids += [leaf("b0", ignore_dependency_on_failure=True), leaf("b1", max_attempts=4)]
    kids += [Flow("q", "other", {}, job_id="c0"), node("d0", [leaf("d1")])]
    plan = _flows.plan(node("p", kids), to_json)
    assert [(g.name, g.ids, g.policy, g.max_attempts, g.inc != "") for g in plan.groups] == [
        ("node", ["p"], "fp", "", True),
        ("leaf", ["a0", "a1", "a2"], "fp", "", False),
        ("leaf", ["b0"], "id", "", False),
        ("leaf", ["b1"], "fp", "4", False),
        ("other", ["c0"], "fp", "", False),
        ("node", ["d0"], "fp", "", True),
        ("leaf", ["d1"], "fp", "", False),
    ]
    assert plan.root == (
        "q",
        "p",
        [("q", f"a{i}") for i in range(3)]
        + [
            ("q", "b0"),
            ("q", "b1"),
            ("q", "c0"),
            ("q", "d0"),
        ],
    )
    assert [tuple(r) for r in plan.refs()] == [
        ("q", x) for x in ("p", "a0", "a1", "a2", "b0", "b1", "c0", "d0", "d1")
    ]
    assert len(plan.gated) == 9


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"max_attempts": 0}, "q/x: max_attempts must be a whole number"),
        ({"backoff_ms": -1}, "q/x: backoff_ms must be a whole number"),
        ({"fail_parent_on_failure": False}, "q/x: fail_parent_on_failure=False needs"),
        (
            {"continue_parent_on_failure": True, "ignore_dependency_on_failure": True},
            "q/x: continue_parent_on_failure cannot be combined",
        ),
        ({"priority": 1.5}, "q/x: priority must be a whole number"),
        ({"max_attempts": True}, "q/x: max_attempts must be a whole number"),
        ({"max_attempts": 3.0}, "q/x: max_attempts must be a whole number"),
        # a string is true: "false" made the child's death ignored
        (
            {"ignore_dependency_on_failure": "false"},
            "q/x: ignore_dependency_on_failure must be True or False, got 'false'",
        ),
        ({"fail_parent_on_failure": "no"}, "q/x: fail_parent_on_failure must be True or False"),
        ({"fail_parent_on_failure": None}, "q/x: fail_parent_on_failure must be True or False"),
        ({"remove_dependency_on_failure": 1}, "q/x: remove_dependency_on_failure must be True or"),
    ],
)
def test_a_bad_sibling_after_many_good_ones_is_still_refused(mq, bad, message) -> None:
    # siblings with max_attempts 1 and 3: equal to True and 3.0, yet those are refused
    kids = [leaf(f"c{i}", max_attempts=1 + 2 * (i % 2)) for i in range(50)] + [leaf("x", **bad)]
    before = snapshot(mq.client)
    with pytest.raises(FlowError, match=message):
        mq.add_flow(node("p", kids))
    assert snapshot(mq.client) == before


def test_a_dedup_key_twice_among_equal_siblings_is_refused() -> None:
    kids = [leaf("a", dedup_key="k"), leaf("b", dedup_key="k")]
    with pytest.raises(FlowError, match="q/b: dedup_key 'k' is used twice in one flow"):
        _flows.plan(node("p", kids), to_json)


def test_steps_cut_runs_at_the_chunk_and_keep_landing_order() -> None:
    kids = [leaf(f"a{i}") for i in range(5)] + [leaf(f"b{i}", max_attempts=2) for i in range(4)]
    plan = _flows.plan(node("p", kids), to_json)
    cut = steps(plan, 4)
    assert [[(g.name, g.max_attempts, g.ids) for g in gs] for _, gs in cut] == [
        [("node", "", ["p"]), ("leaf", "", ["a0", "a1", "a2"])],
        [("leaf", "", ["a3", "a4"]), ("leaf", "2", ["b0", "b1"])],
        [("leaf", "2", ["b2", "b3"])],
    ]


def test_mixed_siblings_in_small_chunks_land_with_their_own_settings(redis_client) -> None:
    mq = EchoMQ(redis_client, prefix="emq", flow_chunk=2)
    kids = [leaf("a0"), leaf("a1"), leaf("b0", remove_dependency_on_failure=True)]
    kids += [leaf("b1", max_attempts=5, backoff_ms=7), node("m", [leaf("m0"), leaf("m1")])]
    ref = mq.add_flow(node("p", kids))
    assert (ref.landed, ref.skipped) == (8, 0)
    got = {i: row(mq, "q", i) for i in ("a1", "b0", "b1", "m", "m0")}
    assert [got["a1"].get("pp"), got["b0"]["pp"]] == [None, "rd"]
    assert (got["b1"]["max_attempts"], got["b1"]["backoff_ms"]) == ("5", "7")
    assert (got["m"]["s"], got["m0"]["p"], got["m0"]["s"]) == (
        "awaiting_children",
        "m",
        "pending",
    )
    assert got["m0"]["pi"] == got["m"]["inc"] == row(mq, "q", "p")["inc"]
    assert mq.add_flow(node("p", kids)).skipped == 8


def plain(n: int, queue: str = "q", name: str = "leaf") -> list[Flow]:
    return [Flow(queue, name, {"i": i}) for i in range(n)]


def test_a_fan_out_of_plain_leaves_is_one_run_with_serial_ids() -> None:
    middle = Flow("q", "m", children=plain(20))
    plan = _flows.plan(Flow("q", "root", children=[middle, Flow("q2", "other")]), to_json)
    root, m, other, leaves = plan.groups
    prefix = root.ids[0][:-1]
    assert [root.ids, m.ids, other.ids] == [[f"{prefix}0"], [f"{prefix}1"], [f"{prefix}2"]]
    assert leaves.ids == [f"{prefix}{i:x}" for i in range(3, 23)]
    assert (leaves.payloads[:2], leaves.children[0], leaves.policy, leaves.gate) == (
        ['{"i":0}', '{"i":1}'],
        (),
        "fp",
        False,
    )
    assert (leaves.parent_id, leaves.parent_queue, leaves.parent_inc, leaves.depth) == (
        m.ids[0],
        "q",
        "",
        2,
    )
    assert m.children[0] == [("q", i) for i in leaves.ids] and m.inc == root.inc != ""
    assert other.parent_inc == root.inc
    assert [tuple(r) for r in plan.refs()][3:] == [("q", i) for i in leaves.ids]


def test_planning_a_plain_fan_out_leaves_nothing_on_its_nodes() -> None:
    # its leaves are compared field by field, not through vars(): CPython 3.11+
    # makes an instance's __dict__ only when asked, and kept one per leaf (about
    # 64 bytes each, before this test) once planning had asked
    kids = plain(2000)
    flow = Flow("q", "root", children=kids)
    mine = [tracemalloc.Filter(True, _flows.__file__)]  # what plan()'s own lines allocated
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot().filter_traces(mine)
        plan = _flows.plan(flow, to_json)
        assert len(plan.groups[1].ids) == 2000  # one run: the fan-out's path
        del plan
        gc.collect()
        after = tracemalloc.take_snapshot().filter_traces(mine)
    finally:
        tracemalloc.stop()
    kept = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    assert kept < 2000 * 8  # bytes: none per leaf (64 per leaf before)


@pytest.mark.parametrize(
    ("kids", "error", "message"),
    [
        (lambda: [leaf := Flow("q", "leaf"), leaf], FlowError, "appears twice"),
        (lambda: plain(5, name="bad\x00name"), FlowError, "invalid job name"),
        (lambda: plain(5, name=""), FlowError, "needs a job name"),
        (lambda: plain(5, queue="bad queue"), ValueError, "invalid queue name"),
        (lambda: [*plain(3), Flow("q", "leaf", {1, 2}), *plain(3)], ValueError, "payload"),
    ],
)
def test_a_plain_fan_out_is_checked_like_any_other(mq, kids, error, message) -> None:
    before = snapshot(mq.client)
    with pytest.raises(error, match=message):
        mq.add_flow(Flow("q", "root", children=kids()))
    assert snapshot(mq.client) == before


def test_a_leaf_under_two_parents_is_refused_even_in_a_plain_fan_out() -> None:
    shared = plain(3)
    flow = Flow(
        "q", "root", children=[Flow("q", "a", children=shared), Flow("q", "b", children=shared)]
    )
    with pytest.raises(FlowError, match="appears twice"):
        _flows.plan(flow, to_json)


def test_a_plain_fan_out_on_another_queue_carries_the_parents_incarnation(mq) -> None:
    ref = mq.add_flow(Flow("p", "root", children=plain(5, queue="c")))
    assert (ref.landed, ref.skipped) == (6, 0)
    inc = row(mq, "p", ref.parent_id)["inc"]
    kids = [row(mq, "c", job_id) for _, job_id in ref.children]
    assert [(k["p"], k.get("pq"), k["pi"], k["s"]) for k in kids] == [
        ("p::" + ref.parent_id[12:], None, inc, "pending")  # the ids' shared prefix left out
    ] * 5
    assert [k["d"] for k in kids] == [f'{{"i":{i}}}' for i in range(5)]


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (float("nan"), "payload is not JSON-serialisable: Out of range float values"),
        ({"x": object()}, "payload is not JSON-serialisable: Object of type object"),
        ({"big": "x" * 200}, "payload is 210 bytes of JSON; the limit is 100 bytes"),
    ],
)
def test_a_fan_outs_payloads_are_refused_as_one_payload_is(redis_client, payload, message) -> None:
    mq = EchoMQ(redis_client, prefix="emq", max_payload_bytes=100)
    with pytest.raises(PayloadError) as one:
        mq.encode(payload)
    assert str(one.value).startswith(message)
    kids = [*plain(40), Flow("q", "leaf", payload), *plain(40)]
    before = snapshot(mq.client)
    with pytest.raises(PayloadError) as many:
        mq.add_flow(Flow("q", "root", children=kids))
    assert str(many.value) == str(one.value)
    assert snapshot(mq.client) == before


def test_a_fan_outs_payloads_are_stored_as_encode_writes_them(mq) -> None:
    payloads = [{"ref": {JobRef("q", "a"): 1}}, [1.5, None], "text", 7, None, {"i": 0}]
    ref = mq.add_flow(Flow("q", "root", children=[Flow("q", "leaf", p) for p in payloads]))
    stored = [row(mq, "q", job_id)["d"] for _, job_id in ref.children]
    assert stored == [mq.encode(p) for p in payloads]
    assert stored[0] == '{"ref":{"q/a":1}}'


def test_one_leaf_with_a_setting_in_a_plain_fan_out_keeps_it(mq) -> None:
    kids = plain(30)
    kids[17] = Flow("q", "leaf", {"i": 17}, priority=5)
    kids[23] = Flow("q", "leaf", {"i": 23}, children=[Flow("q", "sub", {})])
    ref = mq.add_flow(Flow("q", "root", children=kids))
    assert (ref.landed, len(ref.child_ids)) == (32, 30)
    rows = [row(mq, "q", job_id) for job_id in ref.child_ids]
    assert [i for i, r in enumerate(rows) if r.get("priority")] == [17]
    assert rows[17]["priority"] == "5"
    assert [(i, r["s"]) for i, r in enumerate(rows) if r["s"] != "pending"] == [
        (23, "awaiting_children")
    ]
