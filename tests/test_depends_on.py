"""``depends_on``: a new job or flow node waits for jobs already added, on
its queue or another (docs/howto/canvas.md#depends-on-existing-jobs), on
both rigs. A dependency becomes a child of its dependent, so it resolves it
as a flow's child does: here, or through the outbox and the pump."""

from __future__ import annotations

import pytest

import echomq_django as emq
from echomq_django import EchoMQ, Flow, FlowConflict, FlowError, JobNotFound, JobRef, conf
from echomq_django.runners.pump import Pump
from tests.support.workerkit import burst


def settle(mq, *queues: str) -> None:
    """Burst workers and pump sweeps, four rounds (a bound, not a timing)."""
    for _ in range(4):
        burst(mq, queues)
        Pump(list(queues), mq=mq).sweep()


@pytest.mark.parametrize("dep_queue", ["qa", "qb"])
def test_a_node_waits_for_a_pending_job_and_reads_its_result(mq, dep_queue):
    mq.enqueue(dep_queue, "t.echo", 2, job_id="d1")
    ref = mq.add_flow(
        Flow("qa", "t.sum_children", job_id="n1", depends_on=[JobRef(dep_queue, "d1")])
    )
    assert (ref.nodes, ref.landed, ref.skipped) == ([("qa", "n1")], 1, 1)
    assert mq.get_job("qa", "n1").state == "awaiting_children"
    dep = mq.get_job(dep_queue, "d1")
    assert (dep.state, dep.parent, dep.parent_queue) == ("pending", "n1", "qa")
    settle(mq, "qa", "qb")
    job = mq.get_job("qa", "n1")
    assert (job.state, job.result) == ("completed", 2)
    assert dict(mq.children_values("qa", "n1")) == {JobRef(dep_queue, "d1"): 2}


@pytest.mark.parametrize("dep_queue", ["qa", "qb"])
def test_a_finished_dependency_counts_at_once(mq, dep_queue):
    mq.enqueue(dep_queue, "t.echo", 7, job_id="d1")
    settle(mq, dep_queue)
    assert mq.get_job(dep_queue, "d1").state == "completed"
    mq.add_flow(Flow("qa", "t.sum_children", job_id="n1", depends_on=[f"{dep_queue}/d1"]))
    if dep_queue == "qb" and not mq.cross_queue_scripts:  # a Cluster: through qb's outbox
        assert mq.get_job("qa", "n1").state == "awaiting_children"
        assert Pump(["qb"], mq=mq).sweep()["qb"]["delivered"] == 1
    assert mq.get_job("qa", "n1").state == "pending"
    settle(mq, "qa")
    assert mq.get_job("qa", "n1").result == 7


@pytest.mark.parametrize("dep_queue", ["qa", "qb"])
def test_a_dead_dependency_fails_its_dependent(mq, dep_queue):
    mq.enqueue(dep_queue, "t.unrecoverable", {}, job_id="d1")
    settle(mq, dep_queue)
    assert mq.get_job(dep_queue, "d1").state == "dead"
    mq.add_flow(Flow("qa", "t.echo", 1, job_id="n1", depends_on=[(dep_queue, "d1")]))
    Pump(["qb"], mq=mq).sweep()
    job = mq.get_job("qa", "n1")
    assert job.state == "dead" and job.error.startswith(f"failed by child {dep_queue}/d1: ")


def test_a_dependency_and_children_together(mq):
    mq.enqueue("qb", "t.echo", 10, job_id="d1")
    mq.add_flow(
        Flow(
            "qa",
            "t.sum_children",
            job_id="n1",
            depends_on=[JobRef("qb", "d1")],
            children=[Flow("qa", "t.echo", 1, job_id="c1")],
        )
    )
    assert mq.dependency_counts("qa", "n1")["remaining"] == 2
    settle(mq, "qa", "qb")
    assert mq.get_job("qa", "n1").result == 11


def test_a_signature_depends_on_an_existing_job(mq):
    mq.enqueue("qb", "t.echo", 5, job_id="d1")
    ref = emq.task("t.sum_children", queue="qa").set(depends_on=[JobRef("qb", "d1")]).enqueue(mq=mq)
    settle(mq, "qa", "qb")
    assert mq.get_job(*ref).result == 5


# -- refused before any write ----------------------------------------------------


def nothing_added(mq):
    with pytest.raises(JobNotFound):
        mq.get_job("qa", "n1")


def test_an_unknown_dependency_is_refused(mq):
    with pytest.raises(JobNotFound, match=r"qa/n1 depends_on qb/nope: no such job"):
        mq.add_flow(Flow("qa", "t.echo", job_id="n1", depends_on=[JobRef("qb", "nope")]))
    nothing_added(mq)


def test_a_job_already_waited_for_is_refused(mq):
    mq.add_flow(
        Flow("qb", "t.sum_children", job_id="p", children=[Flow("qb", "t.echo", job_id="d1")])
    )
    with pytest.raises(FlowConflict, match=r"already waited for by qb/p \(a job is waited for"):
        mq.add_flow(Flow("qa", "t.echo", job_id="n1", depends_on=[JobRef("qb", "d1")]))
    nothing_added(mq)
    mq.enqueue("qb", "t.echo", 1, job_id="d2")
    mq.add_flow(Flow("qa", "t.echo", job_id="n2", depends_on=[JobRef("qb", "d2")]))
    with pytest.raises(FlowConflict, match="already waited for by qa/n2"):
        mq.add_flow(Flow("qa", "t.echo", job_id="n1", depends_on=[JobRef("qb", "d2")]))
    nothing_added(mq)


def test_cycles_twice_and_bad_refs_are_refused(mq):
    with pytest.raises(FlowError, match="qa/c1 depends_on qa/n1, a node of the same flow"):
        mq.add_flow(
            Flow(
                "qa",
                "t.echo",
                job_id="n1",
                children=[Flow("qa", "t.echo", job_id="c1", depends_on=[JobRef("qa", "n1")])],
            )
        )
    with pytest.raises(FlowError, match="qa/n1 depends_on qa/n1, a node of the same flow"):
        mq.add_flow(Flow("qa", "t.echo", job_id="n1", depends_on=[JobRef("qa", "n1")]))
    with pytest.raises(FlowError, match="names qb/d twice"):
        mq.add_flow(Flow("qa", "t.echo", job_id="n1", depends_on=["qb/d", ("qb", "d")]))
    with pytest.raises(FlowError, match=r"invalid job ref 'other:\{qb\}:job:d'"):
        mq.add_flow(Flow("qa", "t.echo", job_id="n1", depends_on=["other:{qb}:job:d"]))
    with pytest.raises(FlowError, match="invalid job ref 42"):
        mq.add_flow(Flow("qa", "t.echo", job_id="n1", depends_on=[42]))
    with pytest.raises(FlowError, match="invalid queue name"):
        mq.add_flow(Flow("qa", "t.echo", job_id="n1", depends_on=["bad queue/x"]))
    with pytest.raises(FlowError, match="dedup_key is for leaf nodes only"):
        mq.add_flow(Flow("qa", "t.echo", job_id="n1", dedup_key="k", depends_on=["qb/d"]))
    nothing_added(mq)


def test_a_dependency_removed_after_the_check_resolves_a_landed_parent(mq):
    """The race the host's read cannot close: the dependency goes between
    the check and its step on its own slot; the parent, landed first, stops
    waiting for it (a removed dependency) instead of waiting for ever."""
    mq.enqueue("qb", "t.echo", 1, job_id="d1")
    mq.wire.fault_hook = lambda n, queue, nodes: mq.remove("qb", "d1") if n == 0 else None
    try:
        mq.add_flow(Flow("qa", "t.echo", 3, job_id="n1", depends_on=[JobRef("qb", "d1")]))
    finally:
        mq.wire.fault_hook = None
    Pump(["qb"], mq=mq).sweep()
    assert mq.get_job("qa", "n1").state == "pending"
    assert list(mq.dependencies("qa", "n1").removed) == [JobRef("qb", "d1")]


# -- the module API ----------------------------------------------------------------


@pytest.fixture
def api_mq(r, transactional_db):
    conf.reset()
    yield EchoMQ(r, prefix="emq")
    conf.reset()


def test_enqueue_depends_on(api_mq):
    emq.enqueue("qb", "t.echo", 3, job_id="d1", on_commit=False)
    job_id = emq.enqueue("qa", "t.sum_children", job_id="n1", depends_on=["qb/d1"], on_commit=False)
    assert job_id == "n1" and api_mq.get_job("qb", "d1").parent == "n1"
    settle(api_mq, "qa", "qb")
    assert api_mq.get_job("qa", "n1").result == 3
    with pytest.raises(JobNotFound, match="qa/n2 depends_on qb/gone: no such job"):
        emq.enqueue("qa", "t.echo", job_id="n2", depends_on=["qb/gone"], on_commit=False)


@pytest.mark.parametrize("on_commit", [False, True])
def test_depends_on_takes_one_job_as_rqs_does(api_mq, on_commit):
    """One ``JobRef`` or ``"queue/id"`` is that job, not a sequence of
    characters (RQ's ``depends_on=job``), for ``enqueue`` (through the
    outbox too) and a flow node alike; a tuple stays a list of refs."""
    for job_id in ("d1", "d2"):
        emq.enqueue("qb", "t.echo", 5, job_id=job_id, on_commit=False)
    emq.enqueue("qa", "t.sum_children", job_id="n1", depends_on="qb/d1", on_commit=on_commit)
    emq.add_flow(
        Flow("qa", "t.sum_children", job_id="n2", depends_on=JobRef("qb", "d2")),
        on_commit=on_commit,
    )
    assert [api_mq.get_job("qb", d).parent for d in ("d1", "d2")] == ["n1", "n2"]
    settle(api_mq, "qa", "qb")
    assert [api_mq.get_job("qa", n).result for n in ("n1", "n2")] == [5, 5]
    with pytest.raises(FlowError, match="^depends_on of qa/n3: invalid job ref 'qb'"):
        api_mq.add_flow(Flow("qa", "t.echo", job_id="n3", depends_on=("qb", "d9")))


def test_enqueue_depends_on_through_the_commit_outbox(api_mq):
    """on_commit=True: the job and its depends_on travel in the outbox row
    (refs as [queue, id] pairs) and land when it is pushed."""
    emq.enqueue("qb", "t.echo", 4, job_id="d1", on_commit=False)
    emq.enqueue(
        "qa", "t.sum_children", job_id="n1", depends_on=[JobRef("qb", "d1")], on_commit=True
    )
    assert api_mq.get_job("qb", "d1").parent == "n1"
    settle(api_mq, "qa", "qb")
    assert api_mq.get_job("qa", "n1").result == 4


def test_the_outbox_row_keeps_depends_on_and_leaves_it_out_when_empty():
    from echomq_django.commit_outbox import flow_from_dict, flow_to_dict

    data = flow_to_dict(Flow("qa", "t.echo", job_id="n1", depends_on=[JobRef("qb", "d1")]))
    assert data["depends_on"] == [["qb", "d1"]]
    assert flow_from_dict(data).depends_on == [["qb", "d1"]]
    assert "depends_on" not in flow_to_dict(Flow("qa", "t.echo", job_id="n2"))


def test_removing_the_dependent_removes_its_dependency_as_a_child(mq):
    mq.enqueue("qa", "t.echo", 1, job_id="d1")
    mq.add_flow(Flow("qa", "t.echo", job_id="n1", depends_on=[JobRef("qa", "d1")]))
    mq.remove("qa", "n1")
    for job_id in ("n1", "d1"):
        with pytest.raises(JobNotFound):
            mq.get_job("qa", job_id)
