"""A parent's ``:children`` list holds a flow's generated children as ranges
(docs/explanation/protocol.md#a-parents-keys): 3 to ``RANGE_MAX`` children in
a row whose ids count up in hex are one entry, the parent's row counts them
(``cn``), and every reader, walker and check takes them child by child."""

from __future__ import annotations

import pytest

from echomq_django import DependencyError, Flow, FlowConflict, JobRef, JobState
from echomq_django.core.rows import KIDS, RANGE_MAX, child_entries
from tests.support.jobkit import counter, raw_row, sweep

HEAD = "rangeflow00_"  # 12 characters: the ids below count after them, as generated ones do


def _flow(same: int, other: int = 0, job_id: str | None = None) -> Flow:
    """A root on ``p`` with ``same`` children on ``p`` then ``other`` on
    ``c``; ids generated, or ``HEAD`` and a hex serial when ``job_id``."""
    ids = iter(range(1, same + other + 1))

    def kid(queue: str) -> Flow:
        return Flow(queue, "leaf", {}, job_id=job_id and f"{HEAD}{next(ids):x}")

    kids = [kid("p") for _ in range(same)] + [kid("c") for _ in range(other)]
    return Flow("p", "root", {}, job_id=job_id, children=kids)


def _entries(mq, root: str) -> list[str]:
    return [e.decode() for e in mq.client.lrange(mq.keys.job_part("p", root, "children"), 0, -1)]


def test_runs_of_hex_serials_become_ranges_of_at_most_range_max() -> None:
    pairs = [("p", f"{HEAD}{n:x}") for n in range(1, 251)]
    assert child_entries("p", f"{HEAD}0", pairs) == [":1:64", ":65:c8", ":c9:fa"]
    mixed = [("c", HEAD + "1"), ("c", HEAD + "2"), ("p", HEAD + "3"), ("p", HEAD + "4")]
    mixed += [("p", HEAD + "5"), ("p", "other"), ("p", HEAD + "07"), ("c", HEAD + "8")]
    mixed += [("c", HEAD + "9"), ("c", HEAD + "a"), ("p", HEAD + "zz")]
    # two in a row stay two entries; a leading zero is no serial; queues part runs
    assert child_entries("p", f"{HEAD}0", mixed) == [
        "c::1", "c::2", ":3:5", "other", ":07", "c::8:a", ":zz",
    ]  # fmt: skip
    # an id without the parent's head is itself, whatever it reads as; a run
    # stops at 12 hex digits (the scripts' hex_of)
    whole = [("p", HEAD + "1"), ("p", HEAD + "2"), ("p", HEAD + "3"), ("p", "4"), ("p", "5")]
    assert child_entries("p", f"{HEAD}0", whole) == [":1:3", "4", "5"]
    top = [("p", HEAD + "f" * 11 + "e"), ("p", HEAD + "f" * 12), ("p", HEAD + "1" + "0" * 12)]
    assert child_entries("p", f"{HEAD}0", top) == [":" + t[1][12:] for t in top]
    assert RANGE_MAX == 100


def test_a_generated_fan_out_is_stored_as_ranges_and_read_child_by_child(mq) -> None:
    ref = mq.add_flow(_flow(250, 120))
    root = ref.parent_id
    assert _entries(mq, root) == [":1:64", ":65:c8", ":c9:fa", "c::fb:15e", "c::15f:172"]
    assert (raw_row(mq, "p", root)[KIDS], counter(mq, "p", root)) == ("370", 370)
    kids = [JobRef(q, i) for q, i in ref.nodes[1:]]
    assert [r.id[12:] for r in kids[:3]] == ["1", "2", "3"] and len(kids) == 370
    counts = mq.dependency_counts("p", root)
    assert (counts["children"], counts["unprocessed"], counts["remaining"]) == (370, 370, 370)
    assert sorted(mq.dependencies("p", root).unprocessed) == sorted(kids)
    seen, cursor = [], 0
    while True:  # pages cut through ranges: every child once, in order
        page = mq.dependencies("p", root, cursor=cursor, count=37)
        seen += page.items.unprocessed
        assert page.total == 370
        cursor = page.next_cursor
        if not cursor:
            break
    assert seen == kids
    flow = mq.flow_page("p", root, start=99, count=3, depth=1)
    assert flow["total"] == 370
    assert [c["id"] for c in flow["children"]] == [k.id for k in kids[99:102]]
    assert len(mq.get_flow("p", root, depth=1)["children"]) == 370


def test_a_ranged_fan_out_resolves_its_parent_once_all_its_children_complete(mq) -> None:
    ref = mq.add_flow(_flow(150, 5))
    for queue, n in (("p", 150), ("c", 5)):
        jobs = mq.claim(queue, n)
        assert len(jobs) == n
        for job in jobs[:-1] if queue == "c" else jobs:
            mq.complete(job, job.id[12:])
    sweep(mq, "p", "c")
    assert mq.get_job("p", ref.parent_id).state == JobState.AWAITING_CHILDREN
    assert counter(mq, "p", ref.parent_id) == 1
    mq.complete(jobs[-1], "last")
    sweep(mq, "p", "c")
    assert mq.get_job("p", ref.parent_id).state == JobState.PENDING
    values = mq.children_values("p", ref.parent_id)
    assert len(values) == 155 and values[JobRef("p", ref.nodes[1][1])] == "1"


@pytest.mark.parametrize("how", ["cancel", "remove"])
def test_a_ranged_fan_out_is_cancelled_or_removed_a_budget_at_a_time(mq, monkeypatch, how) -> None:
    ref = mq.add_flow(_flow(250, 30))
    root, budget = ref.parent_id, 10
    monkeypatch.setattr(type(mq.lifecycle), "_follow_up", lambda *a, **kw: None)
    getattr(mq, how)("p", root, budget=budget)
    monkeypatch.undo()
    if how == "remove":
        touched = 280 - sum(mq.client.exists(mq.keys.job(q, i)) for q, i in ref.nodes[1:])
    else:
        touched = sum(mq.get_job(q, i).state == JobState.DEAD for q, i in ref.nodes[1:])
    # a step takes whole entries: it overruns its budget by less than one range
    assert 0 < touched < budget + RANGE_MAX
    mq.lifecycle.prune("p")
    mq.lifecycle.prune("c")
    sweep(mq, "p", "c")
    if how == "remove":
        assert [mq.client.exists(mq.keys.job(q, i)) for q, i in ref.nodes] == [0] * 281
    else:
        states = {mq.get_job(q, i).state for q, i in ref.nodes}
        assert states == {JobState.DEAD}
        assert mq.get_job("c", ref.nodes[-1][1]).error == "cancelled"


def test_a_child_inside_a_range_is_found_by_its_id(mq) -> None:
    ref = mq.add_flow(_flow(120, 5))
    root = ref.parent_id
    inside, across = JobRef(*ref.nodes[80]), JobRef(*ref.nodes[-2])
    assert mq.remove_child_dependency("p", root, inside).released == []
    assert mq.remove_child_dependency("p", root, across).released == []
    assert counter(mq, "p", root) == 123
    stranger = JobRef("p", root[:12] + "fff")  # serial past every range
    with pytest.raises(DependencyError, match="is not a child of this parent"):
        mq.remove_child_dependency("p", root, stranger)
    with pytest.raises(DependencyError, match="has resolved its parent already"):
        mq.remove_child_dependency("p", root, inside)
    assert counter(mq, "p", root) == 123


def test_the_same_ranged_flow_added_again_is_met_and_other_children_conflict(mq) -> None:
    root = f"{HEAD}0"
    mq.add_flow(_flow(40, 4, job_id=root))
    assert _entries(mq, root) == [":1:28", "c::29:2c"]
    again = mq.add_flow(_flow(40, 4, job_id=root))  # the same ids, the same children
    assert again.parent_id == root and counter(mq, "p", root) == 44
    with pytest.raises(FlowConflict, match="exists with other children"):
        mq.add_flow(_flow(41, 3, job_id=root))  # one child on another queue
    assert _entries(mq, root) == [":1:28", "c::29:2c"]


def test_children_added_to_a_ranged_parent_are_counted_with_it(mq) -> None:
    ref = mq.add_flow(_flow(5))
    root = ref.parent_id
    for job in mq.claim("p", 5):
        mq.complete(job, 1)
    sweep(mq, "p")
    job = mq.claim("p", 1)[0]
    assert job.id == root
    refs = job.add_children([Flow("p", "leaf", {}, job_id="k1"), Flow("c", "leaf", {})])
    job.add_children([Flow("p", "leaf", {}, job_id="k1")])  # listed already: not again
    assert _entries(mq, root)[0] == ":1:5" and len(_entries(mq, root)) == 3
    assert (raw_row(mq, "p", root)[KIDS], counter(mq, "p", root)) == ("7", 2)
    counts = mq.dependency_counts("p", root)
    assert (counts["children"], counts["processed"], counts["unprocessed"]) == (7, 5, 2)
    assert mq.dependencies("p", root, cursor=4, count=3).items.unprocessed == refs


@pytest.mark.parametrize("child_queue", ["p", "c"])
def test_a_child_whose_whole_id_reads_as_the_next_serial_is_listed_as_itself(
    mq, child_queue
) -> None:
    kids = [Flow(child_queue, "leaf", {}) for _ in range(3)]
    kids.append(Flow(child_queue, "user", {}, job_id="4"))
    ref = mq.add_flow(Flow("p", "root", {}, children=kids))
    lead = "" if child_queue == "p" else f"{child_queue}:"
    assert _entries(mq, ref.parent_id) == [f"{lead}:1:3", f"{lead}4"]
    assert JobRef(child_queue, "4") in mq.dependencies("p", ref.parent_id).unprocessed
    mq.cancel("p", ref.parent_id)
    sweep(mq, "p", "c")
    assert mq.get_job(child_queue, "4").state == JobState.DEAD
