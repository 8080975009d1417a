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
    JobRef,
    JobState,
    LeaseLost,
    MoveToDelayed,
    PayloadError,
    WaitForChildren,
)
from echomq_django.runners.pump import Pump
from tests.support.jobkit import keys_of
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
