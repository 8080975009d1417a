"""A step job whose worker died inside ``add_children``
(docs/explanation/protocol.md#step-jobs): the parent counted its children,
some or none of them landed, its lease lapsed and it was recovered. Its
handler runs again and adds the same children: they land once, are counted
once, and the parent completes with every child's value, on both rigs."""

from __future__ import annotations

import pytest
from redis.cluster import RedisCluster

import echomq_django as emq
from echomq_django import Flow, FlowConflict, JobRef, JobState
from echomq_django.core.live import step_prefix
from echomq_django.runners.pump import Pump
from tests.support.jobkit import assert_state, claim_one
from tests.support.workerkit import burst

DIED = []  # the runs of step.once_broken that failed while their children landed


@emq.handler("step.once_broken")
def once_broken(job):
    """Adds two children (generated ids, on qb and qc) and waits; its first
    run fails after the qb child landed, as a worker losing Redis there
    would. The run after it adds the same children. The qb child may have
    run, and its worker delivered it, before that run: the step is done
    once both children are processed."""
    if len(job.dependencies().processed) == 2:
        return sum(job.children_values().values())
    if not DIED:
        job._mq.wire.fault_hook = _fail_once
    try:
        job.add_children([Flow("qb", "t.echo", 1), Flow("qc", "t.echo", 2)])
    finally:
        job._mq.wire.fault_hook = None
    raise emq.WaitForChildren


def _fail_once(n, queue, groups):
    DIED.append(queue)
    raise ConnectionError("injected: Redis lost after the first landing step")


def kids(explicit: bool) -> list[Flow]:
    """The children a deterministic handler adds: one on qb, one on qc (two
    landing steps), with their ids given or generated."""
    return [
        Flow("qb", "t.echo", 1, job_id="k1" if explicit else None),
        Flow("qc", "t.echo", 2, job_id="k2" if explicit else None),
    ]


def crashed(tmq, clock, monkeypatch, landed_steps: int, explicit: bool):
    """Run ``s`` once: it counts ``kids`` and dies after ``landed_steps``
    landing steps (0: before any child landed). The lease lapses and
    ``recover_stalled`` puts it back; returns the job claimed again."""
    tmq.enqueue("qa", "step.fan", None, job_id="s")
    job = claim_one(tmq, "qa", "s", lease_ms=100)

    def die(n, queue, groups):
        if n + 1 >= landed_steps:
            raise ConnectionError("injected: the worker died while the children landed")

    if landed_steps == 0:
        monkeypatch.setattr(tmq.flows, "_run_steps", lambda *a, **kw: die(-1, "", []))
    else:
        monkeypatch.setattr(tmq.wire, "fault_hook", die)
    with pytest.raises(ConnectionError, match="injected"):
        job.add_children(kids(explicit))
    monkeypatch.undo()
    deps = tmq.dependencies("qa", "s")
    assert len(deps.unprocessed) == 2  # counted, whatever landed
    clock.advance(101)
    assert tmq.timers.recover_stalled("qa", max_stalls=3).recovered == 1
    return claim_one(tmq, "qa", "s")


@pytest.mark.parametrize("explicit", [False, True], ids=["generated", "explicit"])
@pytest.mark.parametrize("landed_steps", [0, 1])
def test_the_run_after_a_crash_lands_the_same_children_once(
    tmq, clock, monkeypatch, landed_steps, explicit
) -> None:
    again = crashed(tmq, clock, monkeypatch, landed_steps, explicit)
    first = [r for r in tmq.dependencies("qa", "s").unprocessed]
    if landed_steps:  # the child that landed has run already: it is not rewritten
        (kid,) = tmq.claim("qb", 1)
        tmq.complete(kid, 1)
    refs = again.add_children(kids(explicit))
    assert sorted(refs) == sorted(first)  # the same ids: nothing new counted
    # a child's completion that reached the parent already (on one server a
    # cross-queue completion fans in at once) is not counted again
    delivered = len(tmq.children_values("qa", "s"))
    assert delivered == (0 if isinstance(tmq.client, RedisCluster) else landed_steps)
    assert int(tmq.client.get(tmq.keys.job_part("qa", "s", "dependencies"))) == 2 - delivered
    assert tmq.get_job(*refs[0]).state == (JobState.COMPLETED if landed_steps else JobState.PENDING)
    assert tmq.flows.wait_for_children(again) is JobState.AWAITING_CHILDREN
    for ref, value in zip(refs, (1, 2), strict=True):
        if tmq.get_job(*ref).state == JobState.PENDING:
            tmq.complete(claim_one(tmq, ref.queue, ref.id), value)
    Pump(["qb", "qc"], mq=tmq).sweep()
    last = claim_one(tmq, "qa", "s")
    assert dict(last.children_values()) == {refs[0]: 1, refs[1]: 2}
    tmq.complete(last, "done")
    assert_state(tmq, "qa", "s", "completed")
    assert tmq.get_job("qa", "s").attempts == 1 + 1  # the crashed attempt counts


def test_a_worker_runs_a_step_job_whose_first_run_failed_mid_add_to_its_end(mq) -> None:
    DIED.clear()
    mq.enqueue("qa", "step.once_broken", None, job_id="s", max_attempts=2, backoff_ms=0)
    for _ in range(4):
        burst(mq, ["qa", "qb", "qc"])
        Pump(["qa", "qb", "qc"], mq=mq).sweep()
    job = mq.get_job("qa", "s")
    assert DIED == ["qb"]
    assert (job.state, job.result, job.attempts) == (JobState.COMPLETED, 3, 2)
    assert len(mq.children_values("qa", "s")) == 2
    assert mq.counts("qb")["completed"] == 1 and mq.counts("qc")["completed"] == 1


def test_a_later_run_after_a_wait_draws_new_ids(mq) -> None:
    mq.enqueue("qa", "step.fan", None, job_id="s")
    job = claim_one(mq, "qa", "s")
    first = job.add_children([Flow("qa", "t.echo", 1)])
    second = job.add_children([Flow("qa", "t.echo", 2)])  # the run's next call
    assert first != second
    assert mq.flows.wait_for_children(job) is JobState.AWAITING_CHILDREN
    for ref in (*first, *second):
        mq.complete(claim_one(mq, "qa", ref.id), 1)
    job = claim_one(mq, "qa", "s")
    third = job.add_children([Flow("qa", "t.echo", 3)])
    assert third[0] not in (*first, *second)  # one wait later: other ids
    assert len(mq.dependencies("qa", "s").unprocessed) == 1


def test_a_run_after_a_move_to_delayed_draws_new_ids(tmq, clock) -> None:
    tmq.enqueue("qa", "step.fan", None, job_id="s")
    job = claim_one(tmq, "qa", "s")
    (first,) = job.add_children([Flow("qb", "t.echo", 1)])
    tmq.timers.postpone(job, 0)  # what the worker does on job.move_to_delayed(0)
    assert tmq.timers.promote_delayed("qa") == 1
    job = claim_one(tmq, "qa", "s")
    (second,) = job.add_children([Flow("qb", "t.other", 2)])  # no FlowConflict
    assert second != first
    assert sorted(tmq.dependencies("qa", "s").unprocessed) == sorted([first, second])


def test_a_rerun_that_adds_another_child_under_an_id_is_refused(tmq, clock, monkeypatch) -> None:
    again = crashed(tmq, clock, monkeypatch, 1, explicit=True)
    with pytest.raises(FlowConflict, match="k1"):
        again.add_children([Flow("qb", "t.other", 1, job_id="k1"), kids(True)[1]])
    assert int(tmq.client.get(tmq.keys.job_part("qa", "s", "dependencies"))) == 2


def test_the_step_prefix_is_twelve_url_safe_characters_fixed_by_its_inputs() -> None:
    one = step_prefix("qa", "s", 1700000000000, 0, 0)
    assert len(one) == 12 and one == step_prefix("qa", "s", 1700000000000, 0, 0)
    others = {
        step_prefix("qb", "s", 1700000000000, 0, 0),
        step_prefix("qa", "t", 1700000000000, 0, 0),
        step_prefix("qa", "s", 1700000000001, 0, 0),
        step_prefix("qa", "s", 1700000000000, 1, 0),
        step_prefix("qa", "s", 1700000000000, 0, 1),
    }
    assert one not in others and len(others) == 5
    assert JobRef("qa", one + "0").id == one + "0"  # a valid id
