"""Cross-queue flows and the pump, on both rigs: a child on another queue
reaches its parent through its queue's outbox, exactly once."""

from __future__ import annotations

import json

import pytest
from redis.cluster import RedisCluster

from echomq_django import Flow, FlowConflict, JobNotFound, JobRef
from echomq_django.runners.pump import Pump

# The flow outbox's own path, on the single server too (on one server a
# cross-queue completion skips it by default: tests/support/fixtures.py).
pytestmark = pytest.mark.via_flow_outbox

Q = ("orders", "validation", "inventory", "payments")


def complete_all(mq, queue, value=lambda job: job.id):
    """Claim and complete every pending job of ``queue``; returns their ids."""
    done = []
    while jobs := mq.claim(queue, 100):
        for job in jobs:
            mq.complete(job, value(job))
            done.append(job.id)
    return done


def fail_all(mq, queue, error="boom"):
    """Claim every pending job of ``queue`` and fail it once; returns the states."""
    return {job.id: str(mq.fail(job, error)) for job in mq.claim(queue, 100)}


def orders_flow(order="o1", lines=3, charge_policy=None):
    charge = dict(max_attempts=1)
    if charge_policy == "id":
        charge["ignore_dependency_on_failure"] = True
    return Flow(
        "orders",
        "orders.fulfil",
        {"order": order},
        job_id=order,
        children=[
            Flow(
                "validation",
                "orders.validate",
                {},
                job_id=f"v-{order}",
                children=[
                    Flow("inventory", "inventory.reserve", {"line": i}, job_id=f"r-{order}-{i}")
                    for i in range(lines)
                ],
            ),
            Flow("payments", "orders.charge", {}, job_id=f"c-{order}", **charge),
        ],
    )


def test_cross_queue_add_is_parent_first_and_children_carry_their_parent(mq):
    ref = mq.add_flow(orders_flow())
    assert ref.nodes == [
        ("orders", "o1"),
        ("validation", "v-o1"),
        ("payments", "c-o1"),
        ("inventory", "r-o1-0"),
        ("inventory", "r-o1-1"),
        ("inventory", "r-o1-2"),
    ]
    assert (ref.landed, ref.skipped) == (6, 0)
    root, validate = mq.get_job("orders", "o1"), mq.get_job("validation", "v-o1")
    assert (root.state, validate.state) == ("awaiting_children", "awaiting_children")
    assert mq.dependency_counts("orders", "o1")["remaining"] == 2
    assert mq.dependency_counts("validation", "v-o1")["remaining"] == 3
    leaf = mq.get_job("inventory", "r-o1-0")
    assert (leaf.state, leaf.parent, leaf.parent_queue, leaf.parent_policy) == (
        "pending",
        "v-o1",
        "validation",
        "fp",
    )
    assert mq.get_job("payments", "c-o1").parent_queue == "orders"
    assert mq.job_ids("orders", "pending") == [] and mq.job_ids("validation", "pending") == []


def test_failed_step_leaves_parent_held_and_readding_completes_it(mq):
    def fault(step, queue, nodes):
        if step == 0:
            raise ConnectionError("injected: the network died after the parent was held")

    mq.wire.fault_hook = fault
    with pytest.raises(ConnectionError, match="injected"):
        mq.add_flow(orders_flow())
    assert mq.get_job("orders", "o1").state == "awaiting_children"
    assert mq.claim("orders", 10) == []
    assert mq.counts("validation")["awaiting_children"] == 0
    mq.wire.fault_hook = None
    ref = mq.add_flow(orders_flow())
    assert (ref.landed, ref.skipped) == (5, 1)
    assert mq.counts("inventory")["pending"] == 3
    again = mq.add_flow(orders_flow())
    assert (again.landed, again.skipped) == (0, 6)
    # the children the second add landed carry the held parent's incarnation
    # (not the second add's own): their results count there
    inc = mq.client.hget(mq.keys.job("orders", "o1"), "inc")
    assert inc and [
        mq.client.hget(mq.keys.job(q, i), "pi") for q, i in (("validation", "v-o1"),
        ("payments", "c-o1"))] == [inc, inc]  # fmt: skip
    pump = Pump(list(Q), mq=mq)
    complete_all(mq, "inventory")
    complete_all(mq, "payments")
    pump.sweep()
    complete_all(mq, "validation")
    pump.sweep()
    assert mq.get_job("orders", "o1").state == "pending"
    assert mq.dependencies("orders", "o1").remaining == 0


def test_conflicting_readd_is_refused_and_writes_nothing(mq):
    mq.add_flow(orders_flow(lines=2))
    other = orders_flow(lines=2)
    other.children[0].children[1].name = "inventory.other"
    with pytest.raises(FlowConflict, match="r-o1-1"):
        mq.add_flow(other)
    mq.enqueue("inventory", "taken", {}, job_id="r-o2-0")
    before = {q: mq.counts(q) for q in Q}
    with pytest.raises(FlowConflict, match="r-o2-0"):
        mq.add_flow(orders_flow("o2", lines=1))
    assert {q: mq.counts(q) for q in Q} == before
    with pytest.raises(JobNotFound):
        mq.get_job("orders", "o2")


def test_completion_lands_in_the_outbox_with_the_state_change(mq):
    mq.add_flow(orders_flow(lines=1))
    [job] = mq.claim("inventory", 10)
    outcome = mq.complete(job, {"reserved": 1})
    assert outcome.outbox == 1 and outcome.released == []
    raw = mq.client.lrange(mq.keys.queue_key("inventory", "flow:outbox"), 0, -1)
    inc = mq.client.hget(mq.keys.job("validation", "v-o1"), "inc").decode()
    assert mq.client.hget(mq.keys.job("inventory", "r-o1-0"), "pi").decode() == inc
    assert [json.loads(e) for e in raw] == [
        {
            "k": "done",
            "c": "emq:{inventory}:job:r-o1-0",
            "p": "v-o1",
            "q": "validation",
            "v": '{"reserved":1}',
            "i": inc,  # the parent's incarnation: a flow added again has another
        }
    ]
    assert mq.get_job("validation", "v-o1").state == "awaiting_children"
    report = Pump(["inventory"], mq=mq).sweep()["inventory"]
    assert (report["delivered"], report["released"]) == (1, 1)
    assert mq.get_job("validation", "v-o1").state == "pending"
    assert mq.children_values("validation", "v-o1") == {
        JobRef("inventory", "r-o1-0"): {"reserved": 1}
    }
    assert mq.counts("inventory")["outbox"] == 0


@pytest.mark.parametrize("policy,root_state", [(None, "dead"), ("id", "pending")])
def test_whole_orders_flow_through_the_pump(mq, policy, root_state):
    mq.add_flow(orders_flow(charge_policy=policy))
    pump = Pump(list(Q), mq=mq)
    complete_all(mq, "inventory")
    assert fail_all(mq, "payments", "card declined") == {"c-o1": "dead"}
    pump.sweep()
    complete_all(mq, "validation", lambda job: {"valid": True})
    pump.sweep()
    root = mq.get_job("orders", "o1")
    assert root.state == root_state
    deps = mq.dependencies("orders", "o1")
    assert deps.processed == {JobRef("validation", "v-o1"): {"valid": True}}
    if policy == "id":
        assert deps.ignored == {JobRef("payments", "c-o1"): "card declined"}
        assert deps.remaining == 0
    else:
        assert deps.failed == {JobRef("payments", "c-o1"): "card declined"}
        assert deps.remaining == 1
        assert root.error == "failed by child payments/c-o1: card declined"


def test_redelivery_after_a_crash_before_trim_changes_nothing(mq):
    mq.add_flow(orders_flow(lines=3))
    complete_all(mq, "inventory")

    def crash(queue, actions):
        raise SystemExit("pump died between deliver and trim")

    with pytest.raises(SystemExit):
        Pump(["inventory"], mq=mq, before_trim=crash, lock_ms=200).sweep()
    assert mq.get_job("validation", "v-o1").state == "pending"
    assert mq.counts("inventory")["outbox"] == 3
    mq.client.delete(mq.keys.queue_key("inventory", "pump:lock"))  # the dead pump's lock
    report = Pump(["inventory"], mq=mq).sweep()["inventory"]
    assert (report["delivered"], report["released"]) == (3, 0)
    assert mq.job_ids("validation", "pending") == ["v-o1"]
    assert mq.dependency_counts("validation", "v-o1")["remaining"] == 0
    assert len(mq.children_values("validation", "v-o1")) == 3


def test_undeliverable_entry_is_dead_lettered_and_does_not_block(mq):
    mq.add_flow(orders_flow("o1", lines=1))
    mq.add_flow(orders_flow("o2", lines=1))
    [first, second] = mq.claim("inventory", 10)
    mq.complete(first, 1)
    mq.client.delete(mq.keys.job("validation", "v-o1"))  # retention removed the parent
    mq.complete(second, 2)
    pump = Pump(["inventory"], mq=mq, max_tries=3)
    reports = [pump.sweep()["inventory"] for _ in range(3)]
    assert [r["deadlettered"] for r in reports] == [0, 0, 1]
    # o2's entry, behind the undeliverable one, is delivered and trimmed on the
    # first sweep, never again: the undeliverable one waits at the back
    assert [r["delivered"] for r in reports] == [1, 0, 0]
    assert mq.get_job("validation", "v-o2").state == "pending"
    assert mq.client.hlen(mq.keys.queue("inventory").outbox_tries) == 0
    [dl] = mq.outbox.deadletters("inventory")
    assert dl["entry"]["p"] == "v-o1" and dl["entry"]["c"] == "emq:{inventory}:job:r-o1-0"
    assert dl["reason"] == "parent validation/v-o1 not found after 3 deliveries"
    assert mq.counts("inventory")["outbox"] == 0


def test_a_second_pump_skips_a_locked_outbox(mq):
    mq.add_flow(orders_flow(lines=2))
    complete_all(mq, "inventory")
    lock = mq.client.lock(mq.keys.queue_key("inventory", "pump:lock"), timeout=5)
    assert lock.acquire(blocking=False)
    report = Pump(["inventory"], mq=mq).sweep()["inventory"]
    assert report["locked"] is True and report["delivered"] == 0
    assert mq.counts("inventory")["outbox"] == 2
    lock.release()
    assert Pump(["inventory"], mq=mq).sweep()["inventory"]["delivered"] == 2


def test_pump_promotes_delayed_and_recovers_expired_leases(mq):
    now = [1_000_000]
    mq.clock = lambda: now[0]
    mq.enqueue("orders", "x", {}, job_id="late", delay_ms=500)
    mq.enqueue("orders", "x", {}, job_id="stuck")
    [job] = mq.claim("orders", 1, lease_ms=100)
    pump = Pump(["orders"], mq=mq)
    assert pump.sweep()["orders"]["promoted"] == 0
    now[0] += 600
    report = pump.sweep()["orders"]
    assert (report["promoted"], report["recovered"]) == (1, 1)
    assert mq.job_ids("orders", "pending") == ["late", "stuck"]
    assert job.id == "stuck"


def test_cross_queue_retry_reattaches_through_the_outbox(mq):
    mq.add_flow(orders_flow(lines=1))
    pump = Pump(list(Q), mq=mq)
    fail_all(mq, "payments")
    pump.sweep()
    assert mq.get_job("orders", "o1").state == "dead"
    outcome = mq.retry("orders", "o1")
    assert outcome.retried == [("payments", "c-o1")]
    assert mq.get_job("orders", "o1").state == "awaiting_children"
    assert mq.dependencies("orders", "o1").failed == {}
    complete_all(mq, "payments", lambda job: {"charged": 10})
    complete_all(mq, "inventory")
    pump.sweep()
    complete_all(mq, "validation")
    pump.sweep()
    assert mq.get_job("orders", "o1").state == "pending"
    assert mq.dependency_counts("orders", "o1")["remaining"] == 0


def masters_of(client: RedisCluster, mq, queues):
    return {q: client.get_node_from_key(mq.keys.base(q)).name for q in queues}


@pytest.mark.cluster
def test_three_queues_on_three_masters_nested_with_both_policies(rc):
    from echomq_django import EchoMQ

    mq = EchoMQ(rc)
    masters, names = {}, []
    for i in range(200):  # find three queues whose slots sit on three masters
        q = f"q{i}"
        node = rc.get_node_from_key(mq.keys.base(q)).name
        if node not in masters.values():
            masters[q] = node
            names.append(q)
        if len(names) == 3:
            break
    a, b, c = names
    assert len(set(masters_of(rc, mq, names).values())) == 3
    slots = {rc.keyslot(mq.keys.base(q)) for q in names}
    assert len(slots) == 3
    mq.add_flow(
        Flow(
            a,
            "root",
            {},
            job_id="root",
            children=[
                Flow(
                    b,
                    "mid",
                    {},
                    job_id="mid",
                    children=[
                        Flow(c, "leaf", {}, job_id="ok"),
                        Flow(
                            c,
                            "leaf",
                            {},
                            job_id="bad",
                            max_attempts=1,
                            ignore_dependency_on_failure=True,
                        ),
                    ],
                ),
                Flow(c, "side", {}, job_id="side", max_attempts=1),
            ],
        )
    )
    pump = Pump(names, mq=mq)
    for job in mq.claim(c, 10):
        if job.id == "ok":
            mq.complete(job, 7)
        else:
            assert mq.fail(job, "nope") == "dead"
    pump.sweep()
    assert mq.get_job(b, "mid").state == "pending"
    assert mq.ignored_failures(b, "mid") == {JobRef(c, "bad"): "nope"}
    assert mq.get_job(a, "root").state == "dead"  # 'side' died with fp
    assert mq.dependencies(a, "root").failed == {JobRef(c, "side"): "nope"}
    complete_all(mq, b)
    pump.sweep()
    assert mq.get_job(a, "root").state == "dead"  # a dead parent is never released
    assert mq.children_values(a, "root") == {JobRef(b, "mid"): "mid"}
