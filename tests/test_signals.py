"""Django signals (echomq_django.signals) as a worker and a pump send them:
``job_failed`` once, in-process, by the worker that ran the attempt; every
other signal from the durable events, by a dispatcher (the pump's, or one of
its own), with the documented keyword arguments and an ``event_id``."""

from __future__ import annotations

import logging
import re

import pytest

from echomq_django import Dispatcher, EchoMQ, Flow, JobRef, Worker, signals
from echomq_django.runners.pump import Pump
from tests.support.workerkit import T0, Clock, Recorder

EVENT_ID = re.compile(r"\A[a-z]+:\d+-\d+\Z")


@pytest.fixture
def recorder():
    rec = Recorder()
    try:
        yield rec
    finally:
        rec.close()


def without_ids(sent: list[dict]) -> list[dict]:
    """The kwargs with their ``event_id`` checked and taken out."""
    for kw in sent:
        assert EVENT_ID.match(kw["event_id"]), kw
    return [{k: v for k, v in kw.items() if k != "event_id"} for kw in sent]


def test_a_same_queue_flow_is_announced_once_per_transition(mq, recorder):
    mq.add_flow(
        Flow(
            "q",
            "t.echo",
            "done",
            job_id="p",
            children=[
                Flow("q", "t.echo", 1, job_id="c1"),
                Flow("q", "t.flaky", {"fail_times": 1}, job_id="c2", max_attempts=2, backoff_ms=0),
            ],
        )
    )
    worker = Worker(["q"], concurrency=2, mq=mq)
    assert worker.run(burst=True) == 4
    assert recorder.names() == [("job_failed", "c2")]  # the worker's own, in-process
    dispatcher = Dispatcher(["q"], mq=mq)
    assert dispatcher.dispatch("q").sent == 4
    assert recorder.names() == [
        ("job_completed", "c1"),
        ("job_completed", "c2"),
        ("job_completed", "p"),
        ("job_failed", "c2"),
        ("parent_released", "p"),
    ]
    assert [sender for name, sender, _ in recorder.events] == [worker] + [dispatcher] * 4
    assert without_ids(recorder.of("job_completed", "c1")) == [
        {"queue": "q", "job_id": "c1", "ref": JobRef("q", "c1"), "job_name": "t.echo", "result": 1}
    ]
    assert without_ids(recorder.of("job_completed", "c2")) == [
        {
            "queue": "q",
            "job_id": "c2",
            "ref": JobRef("q", "c2"),
            "job_name": "t.flaky",
            "result": {"attempt": 2},
        }
    ]
    assert without_ids(recorder.of("job_completed", "p")) == [
        {
            "queue": "q",
            "job_id": "p",
            "ref": JobRef("q", "p"),
            "job_name": "t.echo",
            "result": "done",
        }
    ]
    assert without_ids(recorder.of("parent_released", "p")) == [
        {"queue": "q", "job_id": "p", "ref": JobRef("q", "p"), "job_name": "t.echo"}
    ]
    [failed] = recorder.of("job_failed", "c2")
    assert sorted(failed) == ["error", "job_id", "job_name", "queue", "ref", "run_at"]
    assert failed["ref"] == JobRef("q", "c2")
    assert (failed["queue"], failed["job_name"], failed["run_at"]) == ("q", "t.flaky", None)
    assert failed["error"].splitlines()[0] == "RuntimeError: flaky attempt 1"


def test_a_dead_child_is_announced_up_the_tree(mq, recorder):
    mq.add_flow(
        Flow(
            "q",
            "t.echo",
            job_id="g",
            children=[
                Flow(
                    "q",
                    "t.echo",
                    job_id="p",
                    children=[Flow("q", "t.fail", job_id="bad", max_attempts=1)],
                )
            ],
        )
    )
    worker = Worker(["q"], mq=mq)
    assert worker.run(burst=True) == 1
    assert recorder.events == []  # a death is a durable event: the dispatcher sends it
    Dispatcher(["q"], mq=mq).dispatch_all()
    assert [(name, kw["job_id"]) for name, _, kw in recorder.events] == [
        ("job_dead", "bad"),
        ("flow_failed", "p"),
        ("job_dead", "p"),
        ("flow_failed", "g"),
        ("job_dead", "g"),
    ]
    for job_id, name in (("bad", "t.fail"), ("p", "t.echo"), ("g", "t.echo")):
        error = mq.get_job("q", job_id).error
        ref = JobRef("q", job_id)
        expected = {"queue": "q", "job_id": job_id, "ref": ref, "job_name": name, "error": error}
        assert without_ids(recorder.of("job_dead", job_id)) == [expected]
        if job_id != "bad":
            child = JobRef("q", {"p": "bad", "g": "p"}[job_id])
            assert error.startswith(f"failed by child {child}: ")  # q/bad, not a key
            assert without_ids(recorder.of("flow_failed", job_id)) == [{**expected, "child": child}]
    assert mq.get_job("q", "p").error.startswith("failed by child q/bad: ")


def test_job_failed_says_when_the_next_attempt_runs(redis_client, recorder):
    mq = EchoMQ(redis_client, prefix="emq", clock=Clock())
    mq.enqueue("q", "t.fail", {"message": "later"}, job_id="f", max_attempts=2, backoff_ms=250)
    Worker(["q"], mq=mq).run(burst=True)
    [failed] = recorder.of("job_failed", "f")
    assert failed["run_at"] == T0 + 250
    assert failed["error"].splitlines()[0] == "ValueError: later"
    assert recorder.names() == [("job_failed", "f")]


def test_a_job_failed_receiver_that_raises_is_logged_and_the_worker_goes_on(mq, caplog):
    def broken(sender, **kwargs):
        raise RuntimeError("receiver boom")

    signals.job_failed.connect(broken, weak=False)
    try:
        for i in range(3):
            mq.enqueue("q", "t.fail", {"message": "x"}, job_id=f"j{i}", max_attempts=2)
        with caplog.at_level(logging.ERROR, "echomq_django.signals"):
            assert Worker(["q"], mq=mq).run(burst=True) == 3
    finally:
        signals.job_failed.disconnect(broken)
    assert mq.counts("q")["delayed"] == 3
    messages = sorted(r.getMessage() for r in caplog.records if r.name == "echomq_django.signals")
    assert messages == [
        f"signal receiver {broken!r} raised RuntimeError('receiver boom') for q/j{i}"
        for i in range(3)
    ]


def test_a_cross_queue_release_is_announced_by_the_pump_serving_the_parent_s_queue(mq, recorder):
    mq.add_flow(
        Flow(
            "orders",
            "t.sum_children",
            job_id="o",
            children=[Flow("validation", "t.echo", 7, job_id="v")],
        )
    )
    # the worker delivers its child's completion itself and runs the parent
    # (no-polling.md#a-released-parent-starts-at-once): the release is a durable
    # event all the same, announced by the pump's dispatcher
    assert Worker(["orders", "validation"], mq=mq).run(burst=True) == 2
    assert recorder.events == []
    pump = Pump(["orders", "validation"], mq=mq)
    reports = pump.sweep()
    assert (reports["orders"]["signals"], reports["validation"]["signals"]) == (2, 1)
    assert reports["validation"]["delivered"] == 0  # nothing left for the pump
    assert [(name, sender, kw["job_id"]) for name, sender, kw in recorder.events] == [
        ("parent_released", pump.dispatcher, "o"),
        ("job_completed", pump.dispatcher, "o"),
        ("job_completed", pump.dispatcher, "v"),
    ]
    assert without_ids(recorder.of("job_completed", "o")) == [
        {
            "queue": "orders",
            "job_id": "o",
            "ref": JobRef("orders", "o"),
            "job_name": "t.sum_children",
            "result": 7,
        }
    ]
    assert len(recorder.events) == 3
