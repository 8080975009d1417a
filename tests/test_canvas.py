"""The canvas (docs/howto/canvas.md): signatures, chains, groups and chords
compile to one flow each and run on burst workers and the pump, on both
rigs; bad canvases are refused at build time, before any write."""

from __future__ import annotations

import asyncio

import pytest

import echomq_django as emq
from echomq_django import Flow, FlowError, JobRef, PayloadError, Unrecoverable, handler
from echomq_django.canvas import Chain
from echomq_django.runners.pump import Pump
from tests.support.workerkit import burst

RAN: list = []  # (name, payload) of every cv.* handler call, in order


@handler("cv.num")
def num(job):
    RAN.append(("cv.num", job.payload))
    return job.payload["n"]


@handler("cv.add")
def add(job):
    RAN.append(("cv.add", job.payload))
    return (emq.previous_result(job) or 0) + job.payload["n"]


@handler("cv.collect")
def collect(job):
    RAN.append(("cv.collect", job.payload))
    return {"got": emq.group_results(job), "tag": job.payload.get("tag")}


@handler("cv.fail")
def fail(job):
    RAN.append(("cv.fail", job.payload))
    raise Unrecoverable("no stock")


@pytest.fixture(autouse=True)
def _ran():
    RAN.clear()
    yield
    RAN.clear()


def run(mq, ref: JobRef, *queues: str):
    """Burst workers and pump sweeps until ``ref`` finished (a bound of 12
    rounds, never a timing); returns the finished job."""
    for _ in range(12):
        burst(mq, queues)
        Pump(list(queues), mq=mq).sweep()
        job = mq.get_job(*ref)
        if job.state in ("completed", "dead"):
            return job
    raise AssertionError(f"{ref} did not finish: {job.state}")


# -- compiling: shapes, no Redis ---------------------------------------------


def shape(flow: Flow):
    return (flow.queue, flow.name, flow.policy.value, [shape(c) for c in flow.children])


def test_a_chain_compiles_to_a_path_whose_root_is_its_last_link():
    a, b = emq.task("cv.num", queue="qa", n=1), emq.task("cv.add", queue="qb", n=2)
    c = emq.task("cv.add", queue="qa", n=3)
    assert shape(emq.chain(a, b, c).flow()) == (
        "qa",
        "cv.add",
        "fp",
        [("qb", "cv.add", "fp", [("qa", "cv.num", "fp", [])])],
    )
    # nested chains compile to the same path
    assert shape(emq.chain(a, emq.chain(b, c)).flow()) == shape(emq.chain(a, b, c).flow())
    assert shape(emq.chain(emq.chain(a, b), c).flow()) == shape(emq.chain(a, b, c).flow())


def test_a_chord_and_a_group_compile_to_one_parent_with_the_members_in_order():
    members = [emq.task("cv.num", queue=q, n=i) for i, q in enumerate(["qa", "qb", "qa"])]
    cb = emq.task("cv.collect", queue="qc")
    want = ("qc", "cv.collect", "fp", [(m.queue, "cv.num", "fp", []) for m in members])
    assert shape(emq.chord(members, cb).flow()) == want
    assert shape(emq.chain(emq.group(members), cb).flow()) == want  # a group first: a chord
    ok = members[1].set(allow_failure=True)
    assert shape(emq.group(members[0], ok).flow()) == (
        "qa",
        "echomq_django.group",
        "fp",
        [("qa", "cv.num", "fp", []), ("qb", "cv.num", "id", [])],
    )
    assert emq.group(members, queue="qz").flow().queue == "qz"


def test_options_reach_the_node_and_an_unknown_option_is_refused():
    sig = emq.task("cv.num", queue="qa", n=1).set(job_id="n1", priority=5, max_attempts=2)
    flow = sig.flow()
    assert (flow.job_id, flow.priority, flow.max_attempts, flow.payload) == ("n1", 5, 2, {"n": 1})
    with pytest.raises(FlowError, match=r"unknown option\(s\) \['prority'\].*'priority'"):
        sig.set(prority=1)
    with pytest.raises(FlowError, match="allow_failure of signature 'cv.num' must be True or"):
        sig.set(allow_failure="no")  # a string is true: it made the death ignored


def test_a_signature_built_from_the_handler_function_names_its_job():
    assert emq.task(add, queue="qa", n=1).name == "cv.add"

    def stray(job):
        return None

    with pytest.raises(FlowError, match="is not registered with @handler"):
        emq.task(stray, queue="qa")


# -- bad input: refused when built, nothing written ---------------------------


def test_an_unknown_handler_is_refused_with_the_close_names():
    with pytest.raises(FlowError) as err:
        emq.task("cv.ad", queue="qa", n=1)
    assert "no handler is registered for job name 'cv.ad'" in str(err.value)
    assert "did you mean ['cv.add'" in str(err.value)


def test_a_non_json_argument_is_refused_naming_it():
    with pytest.raises(PayloadError, match=r"argument when=\{1, 2\} of task 'cv.num'"):
        emq.task("cv.num", queue="qa", n=1, when={1, 2})
    with pytest.raises(PayloadError, match="argument n=nan of task 'cv.num'"):
        emq.task("cv.num", queue="qa", n=float("nan"))


def test_malformed_canvases_are_refused_with_the_rule():
    a, b = emq.task("cv.num", queue="qa", n=1), emq.task("cv.add", queue="qa", n=2)
    with pytest.raises(FlowError, match="a chain needs at least two links, got 1"):
        emq.chain(a)
    with pytest.raises(FlowError, match="a chord needs a group of at least one member"):
        emq.chord([], b)
    with pytest.raises(FlowError, match="a chord's header is a group, got Signature"):
        emq.chord(a, b)
    with pytest.raises(FlowError, match="a group needs at least one member"):
        emq.group()
    with pytest.raises(FlowError, match="chain takes signatures.*got dict"):
        emq.chain(a, {"name": "cv.add"})
    with pytest.raises(
        FlowError,
        match="link 2 of a chain is a group.*put the group first, or make "
        "the link before a step job",
    ):
        emq.chain(a, emq.group(b, b)).flow()
    with pytest.raises(FlowError, match="link 2 of a chain is a chord"):
        emq.chain(a, emq.chord([b], b)).flow()
    with pytest.raises(FlowError, match="a chord's callback is a group"):
        emq.chord([a], emq.group(b)).flow()
    with pytest.raises(ValueError, match="invalid queue name"):
        emq.task("cv.num", queue="bad queue", n=1)


def test_a_bad_canvas_writes_nothing(mq):
    a = emq.task("cv.num", queue="qa", n=1).set(job_id="same")
    before = mq.counts("qa")
    with pytest.raises(FlowError, match="appears twice in queue 'qa'"):
        emq.group(a, a).enqueue(mq=mq)
    assert mq.counts("qa") == before
    assert mq.job_ids("qa", "pending") == []


# -- running, on both rigs ------------------------------------------------------


def test_a_chain_across_queues_hands_each_link_the_previous_result(mq):
    ref = emq.chain(
        emq.task("cv.num", queue="qa", n=1),
        emq.task("cv.add", queue="qb", n=10),
        emq.task("cv.add", queue="qa", n=100),
    ).enqueue(mq=mq)
    assert isinstance(ref, JobRef) and ref.queue == "qa"
    job = run(mq, ref, "qa", "qb")
    assert (job.state, job.result) == ("completed", 111)
    assert [name for name, _ in RAN] == ["cv.num", "cv.add", "cv.add"]
    assert mq.wait(ref, timeout_s=1).result == 111


def test_a_chord_callback_reads_the_results_in_the_groups_order(mq):
    values = [5, 3, 9, 1, 7, 2]
    members = [emq.task("cv.num", queue=("qa", "qb")[i % 2], n=v) for i, v in enumerate(values)]
    ref = emq.chord(members, emq.task("cv.collect", queue="qc", tag="c")).enqueue(mq=mq)
    job = run(mq, ref, "qa", "qb", "qc")
    assert (job.state, job.result) == ("completed", {"got": values, "tag": "c"})


def test_a_group_alone_returns_its_members_results_as_a_list(mq):
    ref = emq.group(
        emq.task("cv.num", queue="qb", n=4),
        emq.chain(emq.task("cv.num", queue="qa", n=1), emq.task("cv.add", queue="qb", n=1)),
        emq.group(emq.task("cv.num", queue="qa", n=8), emq.task("cv.num", queue="qb", n=9)),
    ).enqueue(mq=mq)
    assert ref.queue == "qb"
    job = run(mq, ref, "qa", "qb")
    assert (job.state, job.name, job.result) == ("completed", "echomq_django.group", [4, 2, [8, 9]])


def test_a_nested_chord_then_a_link(mq):
    inner = emq.chord(
        [emq.chain(emq.task("cv.num", queue="qa", n=2), emq.task("cv.add", queue="qb", n=3))],
        emq.task("cv.collect", queue="qa", tag="in"),
    )
    ref = emq.chain(inner, emq.task("cv.collect", queue="qc", tag="out")).enqueue(mq=mq)
    job = run(mq, ref, "qa", "qb", "qc")
    assert job.result == {"got": [{"got": [5], "tag": "in"}], "tag": "out"}


def test_a_dead_link_stops_the_chain(mq):
    ref = emq.chain(
        emq.task("cv.num", queue="qa", n=1),
        emq.task("cv.fail", queue="qb"),
        emq.task("cv.add", queue="qa", n=1),
    ).enqueue(mq=mq)
    job = run(mq, ref, "qa", "qb")
    assert job.state == "dead"
    assert job.error.startswith("failed by child qb/") and job.error.endswith("no stock")
    assert [name for name, _ in RAN] == ["cv.num", "cv.fail"]  # the last link never ran
    with pytest.raises(emq.JobDead):
        mq.wait(ref, timeout_s=1)


def test_allow_failure_lets_the_chain_and_the_chord_go_on_with_none(mq):
    ref = emq.chain(
        emq.task("cv.fail", queue="qb").set(allow_failure=True),
        emq.task("cv.add", queue="qa", n=7),
    ).enqueue(mq=mq)
    assert run(mq, ref, "qa", "qb").result == 7
    members = [
        emq.task("cv.num", queue="qa", n=1),
        emq.task("cv.fail", queue="qb").set(allow_failure=True),
        emq.task("cv.num", queue="qa", n=3),
    ]
    ref = emq.chord(members, emq.task("cv.collect", queue="qc")).enqueue(mq=mq)
    job = run(mq, ref, "qa", "qb", "qc")
    assert (job.state, job.result["got"]) == ("completed", [1, None, 3])
    errors = list(mq.ignored_failures(*ref).values())
    assert len(errors) == 1 and errors[0].startswith("Unrecoverable: no stock\n")


def test_a_chord_member_that_dies_kills_the_callback(mq):
    members = [emq.task("cv.num", queue="qa", n=1), emq.task("cv.fail", queue="qb")]
    ref = emq.chord(members, emq.task("cv.collect", queue="qc")).enqueue(mq=mq)
    job = run(mq, ref, "qa", "qb", "qc")
    assert job.state == "dead" and job.error.startswith("failed by child qb/")
    assert "cv.collect" not in [name for name, _ in RAN]


def test_aenqueue_lands_the_same_flow(mq):
    sig = emq.chain(emq.task("cv.num", queue="qa", n=2), emq.task("cv.add", queue="qa", n=2))
    ref = asyncio.run(sig.aenqueue(mq=mq))
    assert mq.get_job(*ref).state == "awaiting_children"
    assert run(mq, ref, "qa").result == 4


def test_previous_result_refuses_a_job_that_waited_for_several(mq):
    ref = emq.chord(
        [emq.task("cv.num", queue="qa", n=1), emq.task("cv.num", queue="qa", n=2)],
        emq.task("cv.add", queue="qa", n=0).set(max_attempts=1),  # previous_result: wrong here
    ).enqueue(mq=mq)
    job = run(mq, ref, "qa")
    assert job.state == "dead"
    assert "waited for 2 jobs, not one: a chord's callback reads group_results(job)" in job.error


def test_enqueue_with_mq_refuses_on_commit():
    with pytest.raises(TypeError, match="on_commit and using do not apply"):
        emq.task("cv.num", queue="qa", n=1).enqueue(mq=object(), on_commit=True)


def test_chain_and_group_take_a_list():
    a, b = emq.task("cv.num", queue="qa", n=1), emq.task("cv.add", queue="qa", n=2)
    assert isinstance(emq.chain([a, b]), Chain) and len(emq.group([a, b]).members) == 2
