"""One ``complete`` call for a batch of a queue's jobs (lua/complete.lua,
docs/explanation/protocol.md#complete): the batch's ``completed`` events go
as runs, one stream entry per run, in the order of the transitions; a
parent whose children complete in one batch is read once for them
(lib/flow.lua ``FAN_KEPT``) and ends exactly as it would if each child
completed in a call of its own; on both rigs."""

from __future__ import annotations

import pytest

from echomq_django import Flow, JobState
from echomq_django.core.events import run_ids
from tests.support.jobkit import command_calls


def entries(mq, queue: str = "q") -> list[tuple[str, list[str]]]:
    """The queue's events stream as ``[(event, [job ids])]``, in order."""
    out = []
    for _id, fields in mq.client.xrange(mq.keys.queue(queue).events):
        f = {k.decode(): v.decode() for k, v in fields.items()}
        out.append((f["e"], run_ids(f["id"])))
    return out


def flow(mq, parent: str, n: int, queue: str = "q") -> list[str]:
    """A parent ``parent`` with ``n`` children on ``queue``; their ids."""
    kids = [f"{parent}-{i}" for i in range(n)]
    children = [Flow(queue, "t.echo", i, job_id=kid) for i, kid in enumerate(kids)]
    mq.add_flow(Flow(queue, "t.echo", None, job_id=parent, children=children))
    return kids


def claim_all(mq, n: int, queue: str = "q") -> list:
    jobs = mq.claim(queue, n, 30_000)
    assert len(jobs) == n
    return jobs


def parent_keys(mq, parent: str, queue: str = "q") -> dict:
    """What a parent's fan-in wrote: its state, dependencies left, and the
    children it counted (``:processed``)."""
    key = mq.keys.job(queue, parent)
    return {
        "state": mq.get_job(queue, parent).state,
        "left": mq.client.get(f"{key}:dependencies"),
        # each child's ref is its job key: the id after the queue's prefix
        "processed": sorted(ref.rsplit(b":", 1)[1] for ref in mq.client.hkeys(f"{key}:processed")),
    }


def test_a_batch_writes_one_completed_entry_for_its_run(mq) -> None:
    mq.enqueue_many("q", [("t.echo", i, {"job_id": f"j{i}"}) for i in range(5)])
    jobs = claim_all(mq, 5)
    before = len(entries(mq))
    mq.complete_many([(job, job.payload) for job in jobs])
    assert entries(mq)[before:] == [("completed", [f"j{i}" for i in range(5)])]
    assert [mq.get_job("q", f"j{i}").result for i in range(5)] == [0, 1, 2, 3, 4]
    counts = mq.client.hgetall(mq.keys.queue("q").minutes)
    assert sum(int(v) for k, v in counts.items() if k.startswith(b"c")) == 5


def test_a_batch_asks_for_its_waiters_once_and_notes_the_ones_waited_for(mq) -> None:
    """A job's note to its waiters (P:{q}:done:<id>) goes only where a waiter
    made the stream: a batch asks for all its jobs' in one EXISTS, and
    again, one by one, only when one is there."""
    mq.enqueue_many("q", [("t.echo", i, {"job_id": f"j{i}"}) for i in range(7)])
    jobs = claim_all(mq, 7)
    waited = mq.keys.queue("q").done("j5")
    asked = []
    for part in (jobs[:1], jobs[1:4], jobs[4:]):
        if part[0].id == "j4":
            mq.client.xadd(waited, {"w": "1"})  # as a waiter makes it (protocol/waits.py)
        before = command_calls(mq.client, "exists")
        mq.complete_many([(job, job.payload) for job in part])
        asked.append(command_calls(mq.client, "exists") - before)
    assert asked[1] == asked[0] and asked[2] == asked[0] + 3  # j4, j5 and j6 each
    assert [f.get(b"e") for _, f in mq.client.xrange(waited)] == [None, b"completed"]
    assert [mq.client.exists(mq.keys.queue("q").done(f"j{i}")) for i in (4, 6)] == [0, 0]


def test_a_release_comes_after_the_completions_that_made_it(mq) -> None:
    kids = flow(mq, "p", 3)
    jobs = claim_all(mq, 3)
    before = len(entries(mq))
    replies = mq.complete_many([(job, job.payload) for job in jobs])
    assert [r.released for r in replies][-1][0].id == "p"
    new = entries(mq)[before:]
    assert new[0] == ("completed", kids)  # written before the parent's own entry
    assert [e for e, _ in new[1:]] and all("p" in ids for _, ids in new[1:])


@pytest.mark.parametrize("n", [1, 2, 5])
def test_a_parent_fanned_in_by_one_batch_ends_as_by_single_calls(mq, n) -> None:
    flow(mq, "p", n, queue="one")
    mq.complete_many([(job, job.payload) for job in claim_all(mq, n, "one")])
    flow(mq, "p", n, queue="each")
    for job in claim_all(mq, n, "each"):
        mq.complete(job, job.payload)
    one, each = parent_keys(mq, "p", "one"), parent_keys(mq, "p", "each")
    assert one == each
    assert one["state"] is JobState.PENDING and len(one["processed"]) == n
    values = [  # the parent runs on its children's results, the same both ways
        sorted(mq.children_values(queue, "p").values()) for queue in ("one", "each")
    ]
    assert values == [list(range(n))] * 2


def test_a_cancelled_child_in_the_batch_makes_its_parent_read_again(mq) -> None:
    kids = flow(mq, "p", 4)
    jobs = claim_all(mq, 4)
    mq.cancel("q", kids[1])  # marked while it runs: its completion kills it
    replies = mq.complete_many([(job, job.payload) for job in jobs])
    assert [type(r).__name__ for r in replies] == [
        "Outcome",
        "JobCancelled",
        "Outcome",
        "Outcome",
    ]
    # the cancelled child fails its parent (fail_parent_on_failure): the
    # children completed after it are not counted as if it still waited
    parent = mq.get_job("q", "p")
    assert parent.state is JobState.DEAD
    assert all(r.released == [] for r in replies if type(r).__name__ == "Outcome")


def test_two_parents_interleaved_in_one_batch_are_each_released_once(mq) -> None:
    flow(mq, "a", 3)
    flow(mq, "b", 3)
    jobs = claim_all(mq, 6)
    replies = mq.complete_many([(job, job.payload) for job in jobs])
    released = [ref.id for r in replies for ref in r.released]
    assert sorted(released) == ["a", "b"]
    assert [mq.get_job("q", p).state for p in "ab"] == [JobState.PENDING] * 2
    assert [len(parent_keys(mq, p)["processed"]) for p in "ab"] == [3, 3]


def test_a_cross_queue_batch_fans_in_as_single_calls_would(mq) -> None:
    def cross(parent_queue: str, leaves: str, n: int) -> None:
        kids = [Flow(leaves, "t.echo", i, job_id=f"k{i}") for i in range(n)]
        mq.add_flow(Flow(parent_queue, "t.echo", None, job_id="p", children=kids))

    cross("one", "one-kids", 5)
    mq.complete_many([(job, job.payload) for job in claim_all(mq, 5, "one-kids")])
    cross("each", "each-kids", 5)
    for job in claim_all(mq, 5, "each-kids"):
        mq.complete(job, job.payload)
    one, each = parent_keys(mq, "p", "one"), parent_keys(mq, "p", "each")
    assert one == each
    if mq.cross_queue_scripts:  # one server: released in the completions' own scripts
        assert one["state"] is JobState.PENDING and len(one["processed"]) == 5
    else:  # a Cluster: the flow outbox holds the completions for a pump
        assert one["state"] is JobState.AWAITING_CHILDREN and one["processed"] == []


def test_results_holding_the_separator_and_empty_values_complete_whole(mq) -> None:
    """A batch's jobs go to ``complete`` joined by 0x1F in one argument: a
    result holding that character (JSON writes it escaped), an empty string
    and a job without a lease token are each their job's own."""
    results = ["a\x1fb", "", {"k": "\x1f\x1f"}, None, "x" * 10_000]
    mq.enqueue_many("q", [("t.echo", i, {"job_id": f"s{i}"}) for i in range(5)])
    jobs = claim_all(mq, 5)
    jobs[3].lease = None  # refused, alone: its lease is not the row's
    done = mq.complete_many([(job, r) for job, r in zip(jobs, results, strict=True)])
    assert [type(d).__name__ for d in done] == ["Outcome"] * 3 + ["LeaseLost", "Outcome"]
    got = {i: mq.get_job("q", f"s{i}") for i in range(5)}
    assert [got[i].result for i in (0, 1, 2, 4)] == [results[i] for i in (0, 1, 2, 4)]
    assert got[3].state is JobState.ACTIVE
