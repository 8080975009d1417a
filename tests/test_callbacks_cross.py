"""Callbacks on another queue (docs/howto/retries.md#callbacks-on-another-queue):
``on_success`` / ``on_failure`` / ``on_dead`` named as ``(queue, name)`` add
their job on that queue, on any slot, through the finished job's outbox: the
entry is written in the script that decides the outcome (durable), the pump
delivers it at least once, and a second delivery adds nothing while the
first job's row is kept. Both rigs."""

from __future__ import annotations

import json

import pytest

from echomq_django import EchoMQ, Flow, handler
from echomq_django.runners.pump import Pump
from tests.support.jobkit import callback_jobs, claim_one, raw_row, snapshot
from tests.support.workerapp.jobs import RECORDED
from tests.support.workerkit import burst


class Crash(Exception):
    """A pump dying between deliver and trim."""


def outbox(mq, queue: str) -> list[dict]:
    return [json.loads(e) for e in mq.client.lrange(mq.keys.queue(queue).outbox, 0, -1)]


def test_on_success_on_another_queue_travels_through_the_outbox(mq) -> None:
    mq.enqueue("q", "x", {}, job_id="j", on_success=("notify", "r.done"))
    assert raw_row(mq, "q", "j")["callbacks"] == '{"s":["notify","r.done"]}'
    mq.complete(claim_one(mq, "q", "j"), {"total": 3})
    (entry,) = outbox(mq, "q")  # written with the completion, in the same script
    assert (entry["k"], entry["q"], entry["c"]) == ("cb", "notify", mq.keys.job("q", "j"))
    assert callback_jobs(mq, "notify") == {} and callback_jobs(mq, "q") == {}
    assert Pump(["q"], mq=mq).sweep()["q"]["delivered"] == 1
    assert callback_jobs(mq, "notify") == {"r.done": [{"job": "q/j", "result": {"total": 3}}]}
    assert outbox(mq, "q") == []


def delivered_not_trimmed(mq, name: str) -> None:
    """Job ``q/j`` dead with ``on_dead=("notify", name)``; a pump delivered
    its ``cb`` entry and died before the trim (its lock gone): it goes again."""
    mq.enqueue("q", "x", {}, job_id="j", on_dead=("notify", name), max_attempts=1)
    mq.fail(claim_one(mq, "q", "j"), "boom")

    def die(queue, actions):
        raise Crash

    with pytest.raises(Crash):
        Pump(["q"], mq=mq, before_trim=die).sweep()
    mq.client.delete(mq.keys.queue_key("q", "pump:lock"))
    assert len(outbox(mq, "q")) == 1


def test_a_second_delivery_adds_no_second_job(mq) -> None:
    delivered_not_trimmed(mq, "r.dead")
    Pump(["q"], mq=mq).sweep()
    assert callback_jobs(mq, "notify") == {"r.dead": [{"job": "q/j", "error": "boom"}]}
    assert mq.counts("notify")["pending"] == 1


def test_on_failure_per_attempt_and_on_dead_on_a_cancel(mq) -> None:
    mq.enqueue("q", "x", {}, job_id="j", max_attempts=2, backoff_ms=0, on_failure=("notify", "r.f"))
    mq.fail(claim_one(mq, "q", "j"), "first")
    mq.enqueue("q", "x", {}, job_id="k", delay_ms=60_000, on_dead=("notify", "r.d"))
    mq.cancel("q", "k")  # a lifecycle step delivers what it sent itself
    Pump(["q"], mq=mq).sweep()
    assert callback_jobs(mq, "notify") == {
        "r.f": [{"job": "q/j", "error": "first"}],
        "r.d": [{"job": "q/k", "error": "cancelled"}],
    }
    assert outbox(mq, "q") == []


def test_a_pair_naming_the_job_s_own_queue_is_a_job_here(mq) -> None:
    mq.enqueue("q", "x", {}, job_id="j", on_success=("q", "r.done"))
    mq.complete(claim_one(mq, "q", "j"), 1)
    assert outbox(mq, "q") == []
    assert callback_jobs(mq, "q") == {"r.done": [{"job": "q/j", "result": 1}]}


def test_a_callback_on_another_queue_runs_in_a_worker(mq) -> None:
    seen = []

    @handler("r.cross_done")
    def cross_done(job):
        seen.append((job.queue, job.payload))

    mq.add_flow(
        Flow(
            "q",
            "t.sum_children",
            job_id="p",
            on_success=("notify", "r.cross_done"),
            children=[Flow("q2", "t.echo", 2, job_id="c", on_success=["notify", "r.cross_done"])],
        )
    )
    for _ in range(3):
        burst(mq, ["q", "q2", "notify"])
        Pump(["q", "q2"], mq=mq).sweep()
    assert sorted(seen, key=lambda s: s[1]["job"]) == [
        ("notify", {"job": "q/p", "result": 2}),
        ("notify", {"job": "q2/c", "result": 2}),
    ]


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (("bad queue!", "r.done"), "on_success: invalid queue name"),
        (("notify", ""), "on_success: invalid job name ''"),
        (("notify", "r.done", "extra"), r"is not a \(queue, name\) pair"),
    ],
)
def test_a_bad_pair_is_refused_before_any_write(mq, value, match) -> None:
    before = snapshot(mq.client)
    with pytest.raises(ValueError, match=match):
        mq.enqueue("q", "x", {}, on_success=value)
    with pytest.raises(ValueError, match=match):
        mq.add_flow(Flow("q", "x", on_success=value))
    assert snapshot(mq.client) == before


def test_a_second_delivery_after_the_job_ran_and_left_runs_it_again(mq) -> None:
    """At least once: a callback job that ran and was pruned (``KEEP_COMPLETED``
    0) before a second delivery of its entry (a pump that died between
    delivering and trimming) is written again, and runs again."""
    mq = EchoMQ(mq.client, prefix="emq", cross_queue_scripts=mq.cross_queue_scripts,
                queues={"notify": {"KEEP_COMPLETED": 0}})  # fmt: skip
    delivered_not_trimmed(mq, "t.record")
    RECORDED.clear()
    payload = {"job": "q/j", "error": "boom"}
    burst(mq, ["notify"], concurrency=1, register=False)
    Pump(["notify"], mq=mq).sweep()  # its retention's step
    assert (RECORDED, callback_jobs(mq, "notify")) == ([payload], {})
    Pump(["q"], mq=mq).sweep()
    assert callback_jobs(mq, "notify") == {"t.record": [payload]}
    burst(mq, ["notify"], concurrency=1, register=False)
    assert list(RECORDED) == [payload, payload]
