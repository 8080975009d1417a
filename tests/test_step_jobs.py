"""Step jobs (docs/howto/step-jobs.md, docs/explanation/protocol.md#step-jobs):
a running job changes its payload, moves itself to delayed, adds children
and waits for them, each under its lease; on both rigs, in the thread pool,
async handlers and the process pool. Bad input writes nothing."""

from __future__ import annotations

import pytest

import echomq_django as emq
from echomq_django import (
    Flow,
    FlowConflict,
    FlowError,
    JobNotActive,
    JobNotFound,
    JobRef,
    JobState,
    LeaseLost,
    MoveToDelayed,
    PayloadError,
    WaitForChildren,
)
from echomq_django.runners.pump import Pump
from tests.support.jobkit import assert_state, claim_one, events, snapshot, where
from tests.support.workerkit import burst


@emq.handler("step.counter")
def counter(job):
    """Counts to payload["to"] in steps, one attempt-free move per step."""
    n = job.payload["n"] + 1
    job.update_payload({**job.payload, "n": n})
    if n < job.payload["to"]:
        job.move_to_delayed(0)
    return {"n": n, "attempts": job.attempts}


@emq.handler("step.fan")
def fan(job):
    """Adds payload["kids"] children (t.echo of 1, 2, ...) on payload["on"],
    waits, then sums their results."""
    if job.payload.get("added"):
        return sum(job.children_values().values())
    job.update_payload({**job.payload, "added": True})
    job.add_children(
        [Flow(job.payload["on"], "t.echo", n) for n in range(1, job.payload["kids"] + 1)]
    )
    raise WaitForChildren


@emq.handler("step.afan")
async def afan(job):
    """``step.fan`` as an ``async def`` handler."""
    if job.payload.get("added"):
        return sum(job.children_values().values())
    await job.aupdate_payload({**job.payload, "added": True})
    await job.aadd_children([Flow(job.payload["on"], "t.echo", 5)])
    raise WaitForChildren


def settle(mq, *queues: str, **kw) -> None:
    """Burst workers and pump sweeps, four rounds (a bound, not a timing)."""
    for _ in range(4):
        burst(mq, queues, **kw)
        Pump(list(queues), mq=mq).sweep()


def claimed(mq, name="step.fan", payload=None, queue="qa", job_id="s"):
    mq.enqueue(queue, name, payload, job_id=job_id)
    (job,) = mq.claim(queue)
    return job


# -- the worker runs a step job to its end -----------------------------------


def test_move_to_delayed_runs_again_with_the_new_payload_and_no_attempt_spent(mq) -> None:
    mq.enqueue("qa", "step.counter", {"n": 0, "to": 3}, job_id="c", max_attempts=1)
    settle(mq, "qa")
    job = mq.get_job("qa", "c")
    # three runs, one attempt each taken back but the last: max_attempts=1 held
    assert (job.state, job.result, job.payload) == (
        JobState.COMPLETED,
        {"n": 3, "attempts": 1},
        {"n": 3, "to": 3},
    )


@pytest.mark.parametrize("on", ["qa", "qb"])
@pytest.mark.parametrize("name", ["step.fan", "step.afan"])
def test_add_children_and_wait_runs_again_with_their_values(mq, on, name) -> None:
    mq.enqueue("qa", name, {"on": on, "kids": 3}, job_id="p")
    burst(mq, ["qa"])
    if on == "qb":  # held until the pump delivers the children's results
        assert mq.get_job("qa", "p").state == JobState.AWAITING_CHILDREN
    settle(mq, "qa", "qb")
    job = mq.get_job("qa", "p")
    want = 6 if name == "step.fan" else 5
    assert (job.state, job.result, job.attempts) == (JobState.COMPLETED, want, 1)
    assert len(mq.children_values("qa", "p")) == (3 if name == "step.fan" else 1)


# -- the transitions, one call at a time --------------------------------------


def test_update_payload_replaces_the_stored_payload_under_the_lease(mq) -> None:
    job = claimed(mq, payload={"step": 1})
    job.update_payload({"step": 2, "seen": ["a"]})
    assert job.payload == {"step": 2, "seen": ["a"]}
    assert mq.get_job("qa", "s").payload == {"step": 2, "seen": ["a"]}


def test_move_to_delayed_raises_and_the_worker_side_takes_the_attempt_back(mq) -> None:
    job = claimed(mq, payload={"step": 1})
    with pytest.raises(MoveToDelayed) as info:
        job.move_to_delayed(250)
    assert info.value.delay_ms == 250
    for bad, err in ((-1, ValueError), (1.5, TypeError), (True, TypeError)):
        with pytest.raises(err, match="move_to_delayed"):
            job.move_to_delayed(bad)


@pytest.mark.parametrize("on", ["qa", "qb"])
def test_add_children_counts_them_first_then_lands_them(mq, on) -> None:
    job = claimed(mq)
    refs = job.add_children([Flow(on, "t.echo", 1, job_id="k1"), Flow(on, "t.echo", 2)])
    assert refs[0] == JobRef(on, "k1") and len(refs) == 2
    assert_state(mq, "qa", "s", "active")  # still running: the handler goes on
    deps = mq.dependencies("qa", "s")
    assert sorted(deps.unprocessed) == sorted(refs)
    for r in refs:
        kid = mq.get_job(*r)
        assert (kid.state, kid.parent, kid.parent_queue) == ("pending", "s", "qa")
    assert mq.flows.wait_for_children(job) is JobState.AWAITING_CHILDREN
    assert where(mq, "qa", "s") == ["awaiting"]
    assert "s" in events(mq, "qa", "waiting_children")
    assert mq.get_job("qa", "s").attempts == 0  # waiting is not an attempt


def test_children_resolved_while_it_ran_release_it_at_once(mq) -> None:
    job = claimed(mq)
    job.add_children([Flow("qa", "t.echo", 1, job_id="k1")])
    mq.complete(claim_one(mq, "qa", "k1"), 1)
    assert_state(mq, "qa", "s", "active")  # a running parent is never released
    assert mq.flows.wait_for_children(job) is JobState.PENDING
    again = claim_one(mq, "qa", "s")
    assert dict(again.children_values()) == {JobRef("qa", "k1"): 1}
    assert again.attempts == 1


@pytest.mark.parametrize("on", ["qa", "qb"])
def test_a_child_that_died_while_it_ran_kills_it_at_the_wait(mq, on) -> None:
    job = claimed(mq)
    job.add_children([Flow(on, "t.echo", 1, job_id="k1", max_attempts=1)])
    mq.fail(claim_one(mq, on, "k1"), "ValueError: no stock")
    Pump([on], mq=mq).sweep()
    assert mq.flows.wait_for_children(job) is JobState.DEAD
    dead = mq.get_job("qa", "s")
    assert dead.error == f"failed by child {on}/k1: ValueError: no stock"


def test_adding_the_same_children_again_counts_each_once(mq) -> None:
    job = claimed(mq)
    kids = [Flow("qb", "t.echo", 1, job_id="k1"), Flow("qa", "t.echo", 2, job_id="k2")]
    job.add_children(kids)
    job.add_children(kids)  # an attempt that adds them again (same ids): skipped
    assert len(mq.dependencies("qa", "s").unprocessed) == 2
    assert int(mq.client.get(mq.keys.job_part("qa", "s", "dependencies"))) == 2


def test_a_second_round_of_children_waits_for_the_new_ones(mq) -> None:
    job = claimed(mq)
    job.add_children([Flow("qa", "t.echo", 1, job_id="k1")])
    mq.flows.wait_for_children(job)
    mq.complete(claim_one(mq, "qa", "k1"), 1)
    job = claim_one(mq, "qa", "s")
    job.add_children([Flow("qa", "t.echo", 2, job_id="k2")])
    assert mq.flows.wait_for_children(job) is JobState.AWAITING_CHILDREN
    mq.complete(claim_one(mq, "qa", "k2"), 2)
    job = claim_one(mq, "qa", "s")
    assert dict(job.children_values()) == {JobRef("qa", "k1"): 1, JobRef("qa", "k2"): 2}


def test_a_replayed_wait_answers_the_state_it_wrote(mq) -> None:
    job = claimed(mq)
    job.add_children([Flow("qa", "t.echo", 1, job_id="k1")])
    assert mq.flows.wait_for_children(job) is JobState.AWAITING_CHILDREN
    assert mq.flows.wait_for_children(job) is JobState.AWAITING_CHILDREN


def test_a_cancel_mark_kills_it_at_the_wait(mq) -> None:
    job = claimed(mq)
    job.add_children([Flow("qa", "t.echo", 1, job_id="k1")])
    mq.cancel("qa", "s")
    assert mq.flows.wait_for_children(job) is JobState.DEAD
    assert mq.get_job("qa", "s").error == "cancelled"


# -- bad input: refused, nothing written ---------------------------------------


def test_a_lost_lease_writes_nothing(mq) -> None:
    job = claimed(mq, payload={"step": 1})
    stale = mq.get_job("qa", "s")
    stale.lease = "1.99"
    before = snapshot(mq.client)
    with pytest.raises(LeaseLost):
        stale.update_payload({"step": 9})
    with pytest.raises(LeaseLost):
        stale.add_children([Flow("qb", "t.echo", 1, job_id="k1")])
    with pytest.raises(LeaseLost):
        mq.flows.wait_for_children(stale)
    assert snapshot(mq.client) == before
    assert job.lease != stale.lease


def test_a_job_that_is_not_running_is_refused(mq) -> None:
    mq.enqueue("qa", "step.fan", None, job_id="s")
    pending = mq.get_job("qa", "s")
    with pytest.raises(JobNotActive, match="is pending, not a running job"):
        pending.add_children([Flow("qa", "t.echo", 1)])
    job = claim_one(mq, "qa", "s")
    mq.complete(job, 1)
    with pytest.raises(JobNotActive, match="is completed"):
        job.update_payload({"late": True})
    with pytest.raises(JobNotActive, match="is completed"):
        job.add_children([Flow("qb", "t.echo", 1, job_id="k1")])
    with pytest.raises(JobNotFound):  # no child landed
        mq.get_job("qb", "k1")
    assert mq.get_job("qa", "s").payload is None


@pytest.mark.parametrize(
    ("children", "error", "match"),
    [
        ([], FlowError, "a non-empty list of Flow nodes"),
        ("qa/x", FlowError, "a non-empty list of Flow nodes"),
        ([{"queue": "qa"}], FlowError, "takes Flow nodes, got dict"),
        ([Flow("qa", "t.echo", float("nan"))], PayloadError, "not JSON-serialisable"),
        ([Flow("q a", "t.echo", 1)], ValueError, "queue"),
        ([Flow("qa", "t.echo", 1, job_id="s")], FlowError, "s"),
    ],
)
def test_bad_children_are_refused_before_any_write(mq, children, error, match) -> None:
    job = claimed(mq)
    before = snapshot(mq.client)
    with pytest.raises(error, match=match):
        job.add_children(children)
    assert snapshot(mq.client) == before


def test_a_child_id_taken_by_another_job_is_refused_before_any_write(mq) -> None:
    mq.enqueue("qb", "t.echo", 1, job_id="k1")
    job = claimed(mq)
    before = snapshot(mq.client)
    with pytest.raises(FlowConflict):
        job.add_children([Flow("qa", "t.echo", 1), Flow("qb", "t.echo", 2, job_id="k1")])
    assert snapshot(mq.client) == before


def test_a_payload_over_the_limit_is_refused_before_any_write(mq) -> None:
    job = claimed(mq, payload={"step": 1})
    before = snapshot(mq.client)
    with pytest.raises(PayloadError, match="max_payload_bytes"):
        job.update_payload("x" * (mq.wire.max_payload_bytes + 1))
    with pytest.raises(PayloadError, match="not JSON-serialisable"):
        job.update_payload({"when": object()})
    assert snapshot(mq.client) == before
    assert job.payload == {"step": 1}


@pytest.mark.e2e
def test_the_process_pool_runs_a_step_job_to_its_end(mq) -> None:
    mq.enqueue("qa", "step.counter", {"n": 0, "to": 2}, job_id="c", max_attempts=1)
    mq.enqueue("qa", "step.fan", {"on": "qb", "kids": 2}, job_id="p")
    settle(mq, "qa", "qb", pool="process")
    assert mq.get_job("qa", "c").result == {"n": 2, "attempts": 1}
    assert (mq.get_job("qa", "p").state, mq.get_job("qa", "p").result) == ("completed", 3)


def test_a_child_that_depends_on_a_missing_job_is_refused_before_any_write(mq) -> None:
    job = claimed(mq)
    before = snapshot(mq.client)
    with pytest.raises(JobNotFound, match="depends_on qb/nope: no such job"):
        job.add_children([Flow("qa", "t.sum_children", job_id="k1", depends_on=["qb/nope"])])
    assert snapshot(mq.client) == before
    mq.enqueue("qb", "t.echo", 4, job_id="d")
    job.add_children([Flow("qa", "t.sum_children", job_id="k1", depends_on=["qb/d"])])
    assert mq.get_job("qb", "d").parent == "k1"


def test_a_waiting_step_job_frees_its_group_s_place(mq) -> None:
    """docs/explanation/protocol.md#groups: held for its children, a step job
    no longer counts against its group's cap, so the group's next job runs."""
    mq.queues["qa"] = {"GROUP_CONCURRENCY": 1}
    mq.enqueue("qa", "step.fan", {"on": "qb", "kids": 1}, job_id="p", group="g")
    mq.enqueue("qa", "t.echo", 7, job_id="next", group="g")
    burst(mq, ["qa"])
    assert mq.get_job("qa", "p").state == JobState.AWAITING_CHILDREN
    assert mq.get_job("qa", "next").result == 7
    settle(mq, "qa", "qb")
    assert mq.get_job("qa", "p").result == 1


def test_a_job_read_with_get_job_cannot_write_under_the_lease(mq) -> None:
    """A read is not the claim: the running job's own calls refuse a
    ``Job`` from ``get_job`` (it holds no lease token), nothing written."""
    mq.enqueue("qa", "t.echo", {"step": 1}, job_id="r")
    claim_one(mq, "qa", "r")  # running, under another holder's lease
    seen = mq.get_job("qa", "r")
    assert (seen.state, seen.lease) == (JobState.ACTIVE, None)
    calls = [
        lambda: seen.update_payload({"step": 2}),
        lambda: seen.report_progress(5),
        lambda: seen.log("from outside"),
        lambda: seen.move_to_delayed(100),
        lambda: seen.add_children([Flow("qa", "t.echo", 1)]),
    ]
    for call in calls:
        with pytest.raises(emq.JobNotActive):
            call()
    job = mq.get_job("qa", "r")
    assert (job.payload, job.progress, mq.job_logs("qa", "r")) == ({"step": 1}, None, [])
    assert mq.dependency_counts("qa", "r")["children"] == 0
