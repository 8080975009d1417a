"""A queue's ``pending`` list holds a flow's generated leaves as ranges
(docs/explanation/protocol.md#ranges-in-pending): 3 to 100 ids in a row
whose serials count up in hex are one entry ``<first id>:<last serial>``,
the counter ``pending:ranged`` holds the ids they stand for beyond one entry
each, and every claim, removal, count and listing takes them id by id."""

from __future__ import annotations

import random

import pytest

from echomq_django import Flow, JobState
from echomq_django.core.rows import pending_ids
from tests.support.jobkit import where

HEAD = "pendrange00_"  # 12 characters: the ids below count after them, as generated ones do


def _add(mq, leaves: int, queue: str = "p") -> list[str]:
    """A root on ``queue`` with ``leaves`` children there, ids ``HEAD`` and
    a hex serial from 1 (the root ``HEAD`` + ``0``); the leaves' ids."""
    kids = [Flow(queue, "leaf", {}, job_id=f"{HEAD}{n:x}") for n in range(1, leaves + 1)]
    mq.add_flow(Flow(queue, "root", {}, job_id=f"{HEAD}0", children=kids))
    return [k.job_id for k in kids]


def _list(mq, queue: str = "p") -> tuple[list[str], int | None]:
    """The pending list's entries (their serial parts) and the counter."""
    k = mq.keys.queue(queue)
    entries = [e.decode().removeprefix(HEAD) for e in mq.client.lrange(k.pending, 0, -1)]
    ranged = mq.client.get(k.pending_ranged)
    return entries, None if ranged is None else int(ranged)


def test_entries_read_as_their_ids() -> None:
    assert pending_ids([b"abcdefghijkl9:c", "plain", "abcdefghijkl0:2"]) == [
        *(f"abcdefghijkl{n:x}" for n in range(9, 13)),
        "plain",
        "abcdefghijkl0", "abcdefghijkl1", "abcdefghijkl2",
    ]  # fmt: skip
    assert pending_ids([]) == []


def test_a_fan_out_pushes_its_leaves_as_ranges_of_at_most_100(mq) -> None:
    leaves = _add(mq, 250)
    assert _list(mq) == (["1:64", "65:c8", "c9:fa"], 247)
    assert mq.counts("p")["pending"] == 250
    assert mq.job_ids("p", "pending") == leaves
    assert mq.job_ids("p", "pending", 99, 101) == leaves[99:102]
    assert mq.job_ids("p", "pending", 248) == leaves[248:]
    assert where(mq, "p", leaves[150]) == ["pending"]
    # the head waiting longest is a range's first id (stats, admin)
    assert mq.probes.heads_since(["p"])["p"] == mq.get_job("p", leaves[0]).created_at
    assert mq.probes.overview(["p"])[1]["p"]["counts"]["pending"] == 250  # stats, admin


def test_two_in_a_row_stay_two_entries_and_other_ids_part_runs(mq) -> None:
    kids = [Flow("p", "leaf", {}, job_id=f"{HEAD}{s}") for s in ("1", "2", "4", "5", "6")]
    kids += [Flow("p", "leaf", {}, job_id=i) for i in ("x", f"{HEAD}07", f"{HEAD}8")]
    mq.add_flow(Flow("p", "root", {}, job_id=f"{HEAD}0", children=kids))
    assert _list(mq) == (["1", "2", "4:6", "x", "07", "8"], 2)


def test_claims_take_ranges_in_order_and_leave_their_rest_first(mq) -> None:
    leaves = _add(mq, 250)
    assert [j.id for j in mq.claim("p", 30)] == leaves[:30]
    assert _list(mq) == (["1f:64", "65:c8", "c9:fa"], 217)
    assert [j.id for j in mq.claim("p", 71)] == leaves[30:101]
    assert _list(mq) == (["66:c8", "c9:fa"], 147)
    assert mq.counts("p")["pending"] == 149
    assert [j.id for j in mq.claim("p", 148)] == leaves[101:249]
    assert _list(mq) == (["fa"], None)  # one id left: a plain entry, no counter
    assert [j.id for j in mq.claim("p", 5)] == leaves[249:]
    assert _list(mq) == ([], None)
    assert mq.counts("p")["pending"] == 0
    assert mq.get_job("p", leaves[0]).state is JobState.ACTIVE


def test_a_claim_ends_a_range_exactly_and_keeps_plain_entries_in_order(mq) -> None:
    leaves = _add(mq, 5)
    mq.enqueue("p", "plain", {}, job_id="after")
    assert _list(mq) == (["1:5", "after"], 4)
    assert [j.id for j in mq.claim("p", 5)] == leaves
    assert _list(mq) == (["after"], None)
    assert [j.id for j in mq.claim("p", 2)] == ["after"]


@pytest.mark.parametrize("how", ["remove", "cancel"])
def test_a_job_taken_out_of_a_range_splits_it(mq, how: str) -> None:
    leaves = _add(mq, 10)
    assert _list(mq) == (["1:a"], 9)

    def take(serial: int) -> None:
        job_id = f"{HEAD}{serial:x}"
        if how == "remove":
            mq.remove("p", job_id)
        else:
            mq.cancel("p", job_id)
        assert where(mq, "p", job_id) == ([] if how == "remove" else ["dead"])

    take(5)  # the middle: two ranges
    assert _list(mq) == (["1:4", "6:a"], 7)
    take(6)  # a range's first
    assert _list(mq) == (["1:4", "7:a"], 6)
    take(8)  # one id before it stays plain
    assert _list(mq) == (["1:4", "7", "9:a"], 4)
    take(10)  # a range of two loses its last: one plain id
    assert _list(mq) == (["1:4", "7", "9"], 3)
    take(1)
    take(3)
    assert _list(mq) == (["2", "4", "7", "9"], None)
    assert mq.counts("p")["pending"] == 4
    assert [j.id for j in mq.claim("p", 10)] == [leaves[i] for i in (1, 3, 6, 8)]


def test_a_range_on_another_queue_is_a_leaf_queue_of_its_own(mq) -> None:
    kids = [Flow("c", "leaf", {}, job_id=f"{HEAD}{n:x}") for n in range(1, 8)]
    mq.add_flow(Flow("p", "root", {}, job_id=f"{HEAD}0", children=kids))
    assert _list(mq, "c") == (["1:7"], 6)
    assert mq.counts("c")["pending"] == 7
    assert [j.id for j in mq.claim("c", 3)] == [k.job_id for k in kids[:3]]
    assert _list(mq, "c") == (["4:7"], 3)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_adds_claims_and_removals_keep_the_order_and_the_counter(mq, seed: int) -> None:
    """A model list of pending ids against the list and its counter, through
    fan-outs of 1 to 130 serial leaves, plain jobs, removals and claims."""
    rng, model, serial, k = random.Random(seed), [], 1, mq.keys.queue("p")
    for step in range(60):
        op = rng.choice(["flow", "flow", "plain", "remove", "claim"])
        if op == "flow":
            n = rng.randint(1, 130)
            kids = [Flow("p", "leaf", {}, job_id=f"{HEAD}{s:x}") for s in range(serial, serial + n)]
            mq.add_flow(Flow("q", "root", {}, job_id=f"root{step}", children=kids))
            model += [kid.job_id for kid in kids]
            serial += n + rng.choice([0, 1])  # the next flow's run may go on from this one's
        elif op == "plain":
            model.append(mq.enqueue("p", "plain", {}, job_id=f"plain{step}"))
        elif op == "remove" and model:
            gone = rng.choice(model)
            mq.remove("p", gone)
            model.remove(gone)
        elif op == "claim":
            n = rng.randint(1, 150)
            assert [j.id for j in mq.claim("p", n)] == model[:n]
            del model[:n]
        entries = mq.client.lrange(k.pending, 0, -1)
        assert pending_ids(entries) == model, (seed, step, op)
        ranged = mq.client.get(k.pending_ranged)
        assert (int(ranged) if ranged else 0) == len(model) - len(entries)
        assert ranged is None or int(ranged) > 0
        assert mq.counts("p")["pending"] == len(model)


def test_ranges_keep_their_place_between_the_priorities(mq) -> None:
    leaves = _add(mq, 8)
    mq.enqueue("p", "low", {}, job_id="low", priority=-1)
    mq.enqueue("p", "high", {}, job_id="high", priority=5)
    mq.enqueue("p", "grouped", {}, job_id="grouped", group="g")
    assert mq.job_ids("p", "pending") == ["high", *leaves, "low", "grouped"]
    assert mq.counts("p")["pending"] == 11
    assert [j.id for j in mq.claim("p", 4)] == ["high", *leaves[:3]]
    assert _list(mq) == (["4:8"], 4)
    assert [j.id for j in mq.claim("p", 10)] == [*leaves[3:], "low", "grouped"]
    assert _list(mq) == ([], None)


def test_one_enqueue_many_calls_generated_ids_are_ranges_too(mq) -> None:
    ids = mq.enqueue_many("p", [("plain", {"i": i}) for i in range(250)])
    head = ids[0][:12]
    entries = [e.decode() for e in mq.client.lrange(mq.keys.queue("p").pending, 0, -1)]
    assert entries == [f"{head}0:63", f"{head}64:c7", f"{head}c8:f9"]
    assert (mq.counts("p")["pending"], mq.job_ids("p", "pending")) == (250, ids)
    assert [j.id for j in mq.claim("p", 250)] == ids
    assert _list(mq) == ([], None)
