"""A flow across queues on one server lands in one round trip: its steps are
pipelined, each child reading its parent's incarnation from the parent's row
(docs/explanation/protocol.md#cross-queue-scripts-on-one-server). A Cluster
and ``cross_queue_scripts=False`` land step by step. Each test runs on both
rigs and asserts what each must do."""

from __future__ import annotations

import pytest
from redis.cluster import RedisCluster

from echomq_django import EchoMQ, FlowConflict
from tests.support.jobkit import assert_state, leaf, node, raw_row, record_calls


def on_one_server(mq: EchoMQ) -> bool:
    return not isinstance(mq.client, RedisCluster)


def three_levels():
    """p on q; m on o under it, with x on r under m; y on r under p."""
    return node("p", [node("m", [leaf("x", queue="r")], queue="o"), leaf("y", queue="r")])


def test_a_flow_across_three_queues_lands_in_one_round_trip(mq, monkeypatch) -> None:
    trips = record_calls(mq, monkeypatch)  # a pipeline of no call is no trip
    ref = mq.add_flow(three_levels())
    assert ref.landed == 4
    checks = ["enqueue_flow"] * 4  # ids given by the caller: read-only gates first
    trips = [t for t in trips if t]
    if on_one_server(mq):
        assert trips == [checks, ["enqueue_flow"] * 4]
    else:  # one script per step, each after the one before
        assert trips == [checks] + [["enqueue_flow"]] * 4
    p_inc, m_inc = raw_row(mq, "q", "p")["inc"], raw_row(mq, "o", "m")["inc"]
    assert p_inc and m_inc  # one token an add, on each of its parents with a cross-queue child
    assert raw_row(mq, "o", "m")["pi"] == p_inc
    assert raw_row(mq, "r", "y")["pi"] == p_inc
    assert raw_row(mq, "r", "x")["pi"] == m_inc
    assert_state(mq, "q", "p", "awaiting_children")
    assert_state(mq, "o", "m", "awaiting_children")
    assert_state(mq, "r", "x", "pending")


def test_children_landed_again_carry_the_incarnation_their_parent_kept(mq) -> None:
    """A half-landed add (its children's step never ran) is added again: the
    parent is met again and keeps its incarnation, which the children carry
    (the call's own incarnation for it is not the parent's)."""
    mq.add_flow(node("p", [leaf("a", queue="o")]))
    kept = raw_row(mq, "q", "p")["inc"]
    mq.client.delete(mq.keys.job("o", "a"))
    mq.client.delete(mq.keys.queue_key("o", "pending"))
    ref = mq.add_flow(node("p", [leaf("a", queue="o")]))
    assert (ref.landed, ref.skipped) == (1, 1)
    assert raw_row(mq, "q", "p")["inc"] == kept
    assert raw_row(mq, "o", "a")["pi"] == kept
    assert_state(mq, "o", "a", "pending")


def test_a_refused_step_lands_nothing_under_it(mq, monkeypatch) -> None:
    """Between the add's read-only gates and its writes, another client
    takes m's id on o: the add raises FlowConflict, m's step writes nothing
    and neither does x's (its parent is m). y's parent landed: pipelined on
    one server, y's step runs and lands; step by step, the add stops at the
    first refusal. Either way the flow is whole once added again after the
    conflict is gone."""
    run_many = mq.scripts.run_many_confirmed

    def then_taken(calls, after=None):
        out = run_many(calls, after)
        if not mq.client.exists(mq.keys.job("o", "m")):
            mq.enqueue("o", "other", {}, job_id="m")
        return out

    monkeypatch.setattr(mq.scripts, "run_many_confirmed", then_taken)
    with pytest.raises(FlowConflict, match="^o m exists as job other"):
        mq.add_flow(three_levels())
    monkeypatch.undo()
    assert_state(mq, "q", "p", "awaiting_children")
    assert raw_row(mq, "o", "m")["n"] == "other"  # the row's name, short
    assert raw_row(mq, "r", "x") == {}
    assert (raw_row(mq, "r", "y") != {}) is on_one_server(mq)
    mq.remove("o", "m")
    ref = mq.add_flow(three_levels())
    assert (ref.landed, ref.skipped) == (3 - on_one_server(mq), 1 + on_one_server(mq))
    assert raw_row(mq, "r", "x")["pi"] == raw_row(mq, "o", "m")["inc"]
    assert raw_row(mq, "r", "y")["pi"] == raw_row(mq, "q", "p")["inc"]


def test_with_the_option_off_the_steps_go_one_after_another(redis_client, monkeypatch) -> None:
    mq = EchoMQ(redis_client, prefix="emq", cross_queue_scripts=False)
    trips = record_calls(mq, monkeypatch)  # a pipeline of no call is no trip
    mq.add_flow(three_levels())
    assert [t for t in trips if t] == [["enqueue_flow"] * 4] + [["enqueue_flow"]] * 4
    assert raw_row(mq, "r", "x")["pi"] == raw_row(mq, "o", "m")["inc"]
