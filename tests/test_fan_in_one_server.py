"""A cross-queue child's completion on one server resolves its parent in the
completion itself (docs/explanation/protocol.md#fan-in-on-one-server): no flow
outbox entry, no pump. A Cluster, ``cross_queue_scripts=False``, an outbox
that holds entries, and a parent row that is gone keep the outbox's path.
Each test runs on both rigs and asserts what each must do."""

from __future__ import annotations

from redis.cluster import RedisCluster

from echomq_django import EchoMQ, Flow, JobState
from echomq_django.runners.reporter import Finished
from tests.support.jobkit import (
    assert_state,
    claim_one,
    complete,
    events,
    jref,
    kill,
    leaf,
    node,
    record_calls,
    sweep,
    sweep_report,
)
from tests.support.workerkit import burst, fetching_reporter


def outbox(mq: EchoMQ, queue: str) -> int:
    return mq.client.llen(mq.keys.queue_key(queue, "flow:outbox"))


def on_one_server(mq: EchoMQ) -> bool:
    return not isinstance(mq.client, RedisCluster)


def test_the_last_child_s_completion_releases_its_parent_on_another_queue(mq) -> None:
    mq.add_flow(node("p", [leaf("a", queue="o"), leaf("b", queue="o")]))
    first = complete(mq, "a", {"n": 1}, queue="o")
    last = complete(mq, "b", {"n": 2}, queue="o")
    if on_one_server(mq):
        assert (first.outbox, first.released) == (0, [])
        assert (last.outbox, last.released) == (0, [jref("p")])
        assert outbox(mq, "o") == 0
        assert_state(mq, "q", "p", "pending")
        assert events(mq, "q", "released") == ["p"]
    else:  # a parent on another slot is reached through the outbox only
        assert (first.outbox, last.outbox, last.released) == (1, 1, [])
        assert_state(mq, "q", "p", "awaiting_children")
        sweep(mq, "o")
    assert mq.children_values("q", "p") == {jref("a", "o"): {"n": 1}, jref("b", "o"): {"n": 2}}
    assert mq.dependencies("q", "p").remaining == 0
    assert_state(mq, "q", "p", "pending")


def test_with_the_option_off_the_completion_takes_the_outbox(redis_client) -> None:
    mq = EchoMQ(redis_client, prefix="emq", cross_queue_scripts=False)
    mq.add_flow(node("p", [leaf("a", queue="o")]))
    assert complete(mq, "a", 1, queue="o").outbox == 1
    assert_state(mq, "q", "p", "awaiting_children")
    assert sweep_report(mq, "o")["released"] == 1
    assert mq.children_values("q", "p") == {jref("a", "o"): 1}


def test_an_entry_still_on_the_outbox_goes_first_and_the_completion_follows_it(mq) -> None:
    """b's death (policy `ignore`) waits on o's outbox: a's completion must
    not overtake it, so it goes onto the outbox behind it."""
    mq.add_flow(
        node("p", [leaf("b", queue="o", ignore_dependency_on_failure=True), leaf("a", queue="o")])
    )
    kill(mq, "b", "boom", queue="o")
    assert outbox(mq, "o") == 1
    assert complete(mq, "a", "ok", queue="o").outbox == 1
    assert_state(mq, "q", "p", "awaiting_children")
    assert sweep_report(mq, "o")["delivered"] == 2
    assert mq.children_values("q", "p") == {jref("a", "o"): "ok"}
    assert mq.ignored_failures("q", "p") == {jref("b", "o"): "boom"}
    assert_state(mq, "q", "p", "pending")


def test_a_child_whose_parent_row_is_gone_leaves_it_to_the_outbox(mq) -> None:
    mq.add_flow(node("p", [leaf("a", queue="o")]))
    (child,) = mq.claim("o", 1)
    mq.client.delete(mq.keys.job("q", "p"))  # as a parent removed with its `rm` entry in flight
    outcome = mq.complete(child, 1)
    assert outcome.outbox == 1 and outcome.released == []
    # as any entry whose parent is gone: it stays for the pump's next sweeps
    # (dead-lettered after its tries), delivered to nothing
    assert sweep_report(mq, "o")["delivered"] == 0
    assert outbox(mq, "o") == 1


def test_a_three_level_chain_across_three_queues_runs_to_its_root(mq) -> None:
    mq.add_flow(node("root", [node("mid", [leaf("leaf", queue="c")], queue="b")], queue="a"))
    assert complete(mq, "leaf", 1, queue="c").released == (
        [jref("mid", "b")] if on_one_server(mq) else []
    )
    sweep(mq, "c")
    mid = complete(mq, "mid", 2, queue="b")
    assert mid.released == ([jref("root", "a")] if on_one_server(mq) else [])
    sweep(mq, "b")
    assert complete(mq, "root", 3, queue="a").state is JobState.COMPLETED
    assert mq.children_values("a", "root") == {jref("mid", "b"): 2}
    assert mq.children_values("b", "mid") == {jref("leaf", "c"): 1}


def test_a_worker_runs_a_cross_queue_flow_to_its_end_without_a_pump(mq) -> None:
    kids = [Flow("o", "t.echo", i, job_id=f"k{i}") for i in range(5)]
    mq.add_flow(Flow("q", "t.sum_children", job_id="p", children=kids))
    _, processed = burst(mq, ["o", "q"], concurrency=2)
    # on a Cluster the worker delivers its own completions (it holds o's sweep lock)
    assert (processed, mq.get_job("q", "p").state) == (6, JobState.COMPLETED)
    assert mq.get_job("q", "p").result == 0 + 1 + 2 + 3 + 4
    assert outbox(mq, "o") == 0


def test_a_bad_setting_is_a_check_error_and_false_reaches_the_client(no_env_url, redis_server):
    from django.conf import settings
    from django.test import override_settings

    from echomq_django import conf
    from echomq_django.checks import check_settings

    base = {"URL": redis_server, "PREFIX": "emq"}
    with override_settings(ECHOMQ={**base, "CROSS_QUEUE_SCRIPTS": "yes"}):
        [error] = [e for e in check_settings() if e.id == "echomq_django.E091"]
        assert error.msg == "ECHOMQ CROSS_QUEUE_SCRIPTS must be True or False, got 'yes'"
    with override_settings(ECHOMQ={**base, "CROSS_QUEUE_SCRIPTS": False}):
        conf.reset()
        assert not [e for e in check_settings() if e.id.startswith("echomq_django.E")]
        assert conf.get_mq().cross_queue_scripts is False
    conf.reset()
    assert settings.ECHOMQ.get("CROSS_QUEUE_SCRIPTS", True) is True


def test_the_parents_claim_rides_the_last_childs_completion(mq, monkeypatch) -> None:
    """On one server the completion resolves the parent on q, so the claim
    of q rides it and brings the parent back in that round trip; on a
    Cluster the reporter delivers the outbox entry after it and claims the
    parent with the delivery. On one server a claim of o rides after q's
    (docs/explanation/no-polling.md#a-sibling-rides-in-the-parents-slot) and
    yields to it: the parent taken, it takes nothing. On a Cluster the claim
    of o rides the completion alone (the loop's last free slot), takes
    nothing, and gives the slot back to the delivery's claim."""
    mq.add_flow(node("p", [leaf("a", queue="o"), leaf("b", queue="o")]))
    reporter, asked, taken = fetching_reporter(mq)
    running = [claim_one(mq, "o", "a"), claim_one(mq, "o", "b")]
    trips = record_calls(mq, monkeypatch)
    reporter.report([Finished(running[0], 1), Finished(running[1], 2)])
    assert reporter.stats["completed"] == 2
    *sibling, (queue, token, got) = taken
    assert_state(mq, "q", "p", "active")
    if on_one_server(mq):
        assert (queue, token, [j.id for j in got]) == ("q", "t1", ["p"])
        assert (asked, [(q, t, list(g)) for q, t, g in sibling]) == (["q", "o"], [("o", "t2", [])])
        assert trips[0][-3:] == ["complete", "claim", "claim"]
    else:
        assert (queue, token, [j.id for j in got]) == ("q", "t2", ["p"])
        assert (asked, [(q, t, list(g)) for q, t, g in sibling]) == (["o", "q"], [("o", "t1", [])])
        assert trips[0][-2:] == ["complete", "claim"]
