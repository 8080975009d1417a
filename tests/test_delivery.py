"""The pump's delivery of an outbox (runners/delivery.py), on both rigs: a
poison entry is dead-lettered with what is wrong with it and never blocks
the entries behind it; the dead-letter list keeps the newest 1,000; a
delivery refused for a transient reason leaves the outbox as it was, for
the next sweep."""

from __future__ import annotations

import pytest
import redis

from echomq_django import Flow, JobState
from echomq_django.core.exceptions import RedisUnavailable
from echomq_django.runners.pump import Pump
from tests.support.jobkit import assert_state, complete, leaf, node, record_calls

# The flow outbox's own path, on the single server too (on one server a
# cross-queue completion skips it by default: tests/support/fixtures.py).
pytestmark = pytest.mark.via_flow_outbox

POISON = {
    "not json {": "malformed entry: not JSON (Expecting value: line 1 column 1 (char 0))",
    "[1, 2]": "malformed entry: a JSON list, not an object",
    '{"k": "done"}': "malformed entry: 'c' is None, not a string",
    '{"k": "zzz", "c": "x", "p": "P", "q": "p"}': (
        "malformed entry: kind 'zzz' is not one of "
        "('done', 'dead', 'reattach', 'gone', 'rm', 'cancel', 'cancelled', 'rerun', 'cb')"
    ),
    '{"k": "done", "c": "x", "p": "P", "q": "p", "v": {"a": 1}}': (
        "malformed entry: 'v' is {'a': 1}, not a string"
    ),
    '{"k": "done", "c": "x", "p": "a:b", "q": "p"}': "malformed entry: invalid job id 'a:b'",
    '{"k": "cb", "c": "x", "p": "cb-1", "q": "p", "v": "no newline"}': (
        "malformed entry: a callback entry's 'v' is '<name>\\n<payload>'"
    ),
}


def test_poison_outbox_entries_are_dead_lettered_with_the_real_reason(mq):
    mq.add_flow(Flow("p", "parent", {}, job_id="P", children=[Flow("c", "child", {}, job_id="C")]))
    outbox = mq.keys.queue("c").outbox
    mq.client.rpush(outbox, *POISON)  # ahead of the real entry: they must not block it
    [job] = mq.claim("c", 1)
    mq.complete(job, 7)
    report = Pump(["c"], mq=mq).sweep()["c"]
    assert (report["delivered"], report["deadlettered"]) == (1, len(POISON))
    assert mq.get_job("p", "P").state is JobState.PENDING  # released by the real entry
    letters = mq.outbox.deadletters("c")
    assert [d["entry"] for d in letters][:2] == ["not json {", [1, 2]]
    for letter, (raw, reason) in zip(letters, POISON.items(), strict=True):
        assert letter["reason"].startswith(reason), raw
    assert mq.counts("c")["outbox"] == 0


def test_the_outbox_dead_letter_keeps_the_newest_1000(mq):
    """The bound of P:{q}:flow:deadletter: trim_outbox trims as it pushes,
    so a flood of poison entries keeps exactly the newest 1,000."""
    from echomq_django.protocol.outbox import OUTBOX_DEADLETTER_MAX

    assert OUTBOX_DEADLETTER_MAX == 1000
    k, n = mq.keys.queue("c"), OUTBOX_DEADLETTER_MAX + 5
    mq.client.rpush(k.outbox, *(f"poison {i:04d}" for i in range(n)))
    report = Pump(["c"], mq=mq).sweep()["c"]  # three trims: 500, 500, 5
    assert (report["delivered"], report["deadlettered"]) == (0, n)
    assert mq.client.llen(k.deadletter) == 1000
    letters = mq.outbox.deadletters("c")
    assert [d["entry"] for d in letters] == [f"poison {i:04d}" for i in range(5, n)]
    assert {d["reason"] for d in letters} == {
        "malformed entry: not JSON (Expecting value: line 1 column 1 (char 0))"
    }
    assert (mq.counts("c")["outbox"], mq.counts("c")["deadletter"]) == (0, 1000)

    mq.client.rpush(k.outbox, "poison last")  # one more, in a sweep of its own
    assert Pump(["c"], mq=mq).sweep()["c"]["deadlettered"] == 1
    assert mq.client.llen(k.deadletter) == 1000
    entries = [d["entry"] for d in mq.outbox.deadletters("c")]
    assert entries == [*(f"poison {i:04d}" for i in range(6, n)), "poison last"]


@pytest.mark.parametrize(
    "error",
    [
        redis.exceptions.ClusterError("TTL exhausted."),
        redis.exceptions.RedisClusterException("Redis Cluster cannot be connected."),
        redis.exceptions.ClusterDownError("CLUSTERDOWN The cluster is down"),
        redis.exceptions.ConnectionError("Connection refused"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_a_delivery_failing_for_a_transient_reason_leaves_the_outbox_untouched(mq, error):
    """A failover's refusal (of the batch, then of each entry) is "not now":
    no try counted, nothing dead-lettered, the entry delivered by the next sweep."""
    mq.add_flow(Flow("p", "parent", {}, job_id="P", children=[Flow("c", "child", {}, job_id="C")]))
    [job] = mq.claim("c", 1)
    mq.complete(job, 7)
    real, pump = mq.scripts.run_many_confirmed, Pump(["c"], mq=mq, max_tries=1)

    def failing(calls, after=None):
        raise error  # what redis-py raises inside mq.outbox.deliver

    mq.scripts.run_many_confirmed = failing
    for _ in range(3):
        with pytest.raises(RedisUnavailable):
            pump.sweep()
    assert mq.counts("c")["outbox"] == 1
    assert mq.outbox.deadletters("c") == []
    assert mq.client.hlen(mq.keys.queue("c").outbox_tries) == 0
    mq.scripts.run_many_confirmed = real
    assert pump.sweep()["c"]["delivered"] == 1
    assert mq.get_job("p", "P").state is JobState.PENDING


# -- an entry whose parent is gone ---------------------------------------------


def test_undeliverable_entries_never_hold_up_the_ones_behind_them(tmq) -> None:
    """600 completions of a flow removed before its children's pump ran
    (more than a sweep's batch of 500) sit ahead of a live flow's entry: the
    live parent is released by the first sweep; the 600 go to the
    dead-letter list after max_tries sweeps, each delivered once a sweep."""
    tmq.add_flow(Flow("q", "n", None, job_id="big", children=[
        Flow("o", "n", None, job_id=f"c{i}") for i in range(600)]))  # fmt: skip
    for _ in range(6):
        tmq.complete_many([(j, 1) for j in tmq.claim("o", 100)])
    tmq.client.delete(tmq.keys.job("q", "big"))  # gone before o's pump ran
    tmq.add_flow(node("live", [leaf("y", queue="o")]))
    complete(tmq, "y", "ok", queue="o")
    pump = Pump(["o"], mq=tmq, max_tries=3)
    first = pump.sweep()["o"]
    assert (first["delivered"], first["deadlettered"]) == (1, 0)
    assert_state(tmq, "q", "live", "pending")
    assert tmq.client.llen(tmq.keys.queue_key("o", "flow:outbox")) == 600
    assert [pump.sweep()["o"]["deadlettered"] for _ in range(2)] == [0, 600]
    assert tmq.client.llen(tmq.keys.queue_key("o", "flow:outbox")) == 0
    assert tmq.client.exists(tmq.keys.queue_key("o", "flow:tries")) == 0


# -- the round trips of a delivery --------------------------------------------


def test_a_wake_up_delivers_one_entry_in_three_round_trips(mq, monkeypatch) -> None:
    """A child's completion for a parent on another queue: the pump takes
    the lock and reads the head in one round trip (take_outbox), delivers in
    the next (the parent is released there), and trims and drops the lock
    in the third: two round trips between its wake-up and the release
    (docs/explanation/protocol.md#the-flow-outbox-and-the-pump)."""
    mq.add_flow(Flow("p", "parent", {}, job_id="P", children=[Flow("c", "child", {}, job_id="C")]))
    [job] = mq.claim("c", 1)
    mq.complete(job, 7)
    trips = record_calls(mq, monkeypatch)
    report = Pump(["c"], mq=mq).deliver("c")
    assert (report.delivered, report.released, report.locked) == (1, 1, False)
    assert trips == [["take_outbox"], ["deliver_to_parents"], ["trim_outbox", "lock_outbox"]]
    assert mq.get_job("p", "P").state is JobState.PENDING
    k = mq.keys.queue("c")
    assert (mq.client.exists(k.pump_lock), mq.client.llen(k.outbox)) == (0, 0)


def test_take_outbox_reads_nothing_under_another_pumps_lock(mq) -> None:
    """Another token's lock: nothing read, the lock untouched. The caller's
    own: renewed for the lease asked, and the length and head come back."""
    k = mq.keys.queue("c")
    assert mq.outbox.take("c", "mine", 2_000, 2) == (None, 0, [])  # empty: no lock taken
    assert mq.client.exists(k.pump_lock) == 0
    mq.client.rpush(k.outbox, "e1", "e2", "e3")
    assert mq.outbox.lock("c", "other", 60_000)
    assert mq.outbox.take("c", "mine", 2_000, 2) == (False, 0, [])
    assert mq.client.get(k.pump_lock) == b"other" and mq.client.pttl(k.pump_lock) > 2_000
    assert mq.outbox.lock("c", "other", 1, take=False)
    assert mq.outbox.take("c", "mine", 60_000, 2) == (True, 3, [b"e1", b"e2"])
    assert mq.outbox.take("c", "mine", 5_000, 10) == (True, 3, [b"e1", b"e2", b"e3"])
    assert mq.client.get(k.pump_lock) == b"mine" and 0 < mq.client.pttl(k.pump_lock) <= 5_000
    assert mq.client.llen(k.outbox) == 3  # nothing removed


def test_a_sweep_of_two_batches_renews_the_lock_with_its_second_read(mq, monkeypatch) -> None:
    """Batches of 2 over 3 entries: take + read, deliver, trim; take again
    (the renewal) + read, deliver, trim with the drop. No LRANGE or LLEN of
    its own, and the lock is gone at the end."""
    for i in (1, 2, 3):
        kid = Flow("c", "child", {}, job_id=f"C{i}")
        mq.add_flow(Flow("p", "parent", {}, job_id=f"P{i}", children=[kid]))
    mq.complete_many([(j, i) for i, j in enumerate(mq.claim("c", 3))])
    trips = record_calls(mq, monkeypatch)
    report = Pump(["c"], mq=mq, batch=2).deliver("c")
    assert (report.delivered, report.released) == (3, 3)
    assert trips == [
        ["take_outbox"], ["deliver_to_parents"], ["trim_outbox"],
        ["take_outbox"], ["deliver_to_parents"], ["trim_outbox", "lock_outbox"],
    ]  # fmt: skip
    assert mq.client.exists(mq.keys.queue("c").pump_lock) == 0


def test_a_wake_up_on_an_empty_outbox_takes_no_lock(mq, monkeypatch) -> None:
    """A worker delivered the entries itself before the pump woke for them:
    the pump reads an empty outbox in one round trip and leaves the lock
    alone, so it never holds it against that worker's next completion."""
    trips = record_calls(mq, monkeypatch)
    report = Pump(["c"], mq=mq).deliver("c")
    assert (report.delivered, report.locked) == (0, False)
    assert trips == [["take_outbox"]]
    assert mq.client.exists(mq.keys.queue("c").pump_lock) == 0
