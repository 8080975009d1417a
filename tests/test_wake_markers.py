"""Wake keys: every script that makes a job
claimable wakes its queue on the queue's own slot, a delayed job announces its
run-at, an outbox write wakes the pump; the keys stay bounded. Both rigs."""

from __future__ import annotations

import threading

import pytest

from echomq_django import Flow, JobState
from echomq_django.core.exceptions import RedisUnavailable
from echomq_django.protocol.outbox import WORKER_TOKEN
from echomq_django.runners.delivery import OwnDelivery
from echomq_django.runners.pump import Pump
from tests.support import jobkit
from tests.support.jobkit import T0, claim_one, leaf, node

# The flow outbox's own path, on the single server too (on one server a
# cross-queue completion skips it by default: tests/support/fixtures.py).
pytestmark = pytest.mark.via_flow_outbox


def wake(mq, queue: str = "q", key: str = "wake") -> dict[str, int]:
    """The queue's wake key as ``{member: score}``."""
    raw = mq.client.zrange(mq.keys.queue_key(queue, key), 0, -1, withscores=True)
    return {m.decode(): int(s) for m, s in raw}


def pump_wake(mq, queue: str) -> dict[str, int]:
    return wake(mq, queue, "flow:wake")


def test_enqueue_wakes_and_the_draining_claim_clears(tmq) -> None:
    assert wake(tmq) == {}
    tmq.enqueue("q", "job", job_id="a")
    assert wake(tmq) == {"0": 0}
    claim_one(tmq, "q", "a")
    assert wake(tmq) == {}, "claim drained pending: no worker should wake for nothing"


def test_claim_leaves_the_marker_while_jobs_are_left(tmq) -> None:
    for i in range(3):
        tmq.enqueue("q", "job", job_id=f"j{i}")
    tmq.client.zrem(tmq.keys.queue_key("q", "wake"), "0")  # a worker popped it
    assert [j.id for j in tmq.claim("q", 2)] == ["j0", "j1"]
    assert wake(tmq) == {"0": 0}, "one job left: the next idle worker must wake"
    assert [j.id for j in tmq.claim("q", 2)] == ["j2"]
    assert wake(tmq) == {}
    assert tmq.claim("q", 2) == []
    assert wake(tmq) == {}


def test_a_full_claim_that_emptied_pending_sets_no_marker(tmq) -> None:
    tmq.enqueue("q", "job", job_id="a")
    tmq.enqueue("q", "job", job_id="b")
    tmq.client.zrem(tmq.keys.queue_key("q", "wake"), "0")
    assert len(tmq.claim("q", 2)) == 2
    assert wake(tmq) == {}


def test_delayed_enqueue_announces_the_earliest_run_at(tmq, clock) -> None:
    tmq.enqueue("q", "job", job_id="late", delay_ms=5000)
    assert wake(tmq) == {"d": T0 + 5000}
    tmq.enqueue("q", "job", job_id="later", delay_ms=9000)
    assert wake(tmq) == {"d": T0 + 5000}, "LT: the earliest run-at stays"
    tmq.enqueue("q", "job", job_id="soon", delay_ms=100)
    assert wake(tmq) == {"d": T0 + 100}


def test_promotion_wakes(tmq, clock) -> None:
    tmq.enqueue("q", "job", job_id="a", delay_ms=100)
    tmq.client.delete(tmq.keys.queue_key("q", "wake"))
    clock.advance(100)
    assert tmq.timers.promote_delayed("q") == 1
    assert wake(tmq) == {"0": 0}
    jobkit.assert_state(tmq, "q", "a", JobState.PENDING)


def test_fail_paths(tmq, clock) -> None:
    tmq.enqueue("q", "job", job_id="a", backoff_ms=250, max_attempts=3)
    job = claim_one(tmq, "q", "a")
    assert wake(tmq) == {}
    assert tmq.fail(job, "boom") is JobState.DELAYED
    assert wake(tmq) == {"d": T0 + 250}
    tmq.client.delete(tmq.keys.queue_key("q", "wake"))
    tmq.enqueue("q", "job", job_id="b", backoff_ms=0, max_attempts=3)
    tmq.client.delete(tmq.keys.queue_key("q", "wake"))
    job = claim_one(tmq, "q", "b")
    assert tmq.fail(job, "boom") is JobState.PENDING
    assert wake(tmq) == {"0": 0}


def test_recovery_and_retry_wake(tmq, clock) -> None:
    tmq.enqueue("q", "job", job_id="a")
    claim_one(tmq, "q", "a", lease_ms=1000)
    assert wake(tmq) == {}
    clock.advance(1001)
    assert tmq.timers.recover_stalled("q").recovered == 1
    assert wake(tmq) == {"0": 0}
    job = claim_one(tmq, "q", "a")
    assert tmq.fail(job, "boom", dead=True) is JobState.DEAD
    assert wake(tmq) == {}
    tmq.retry("q", "a")
    assert wake(tmq) == {"0": 0}
    jobkit.assert_state(tmq, "q", "a", JobState.PENDING)


def test_same_queue_release_wakes(tmq) -> None:
    tmq.add_flow(node("p", [leaf("c1"), leaf("c2")]))
    assert wake(tmq) == {"0": 0}, "one wake-up for the flow's claimable leaves"
    c1, c2 = tmq.claim("q", 2)
    assert wake(tmq) == {}
    tmq.complete(c1, 1)
    assert wake(tmq) == {}, "the parent still waits for c2"
    outcome = tmq.complete(c2, 2)
    assert outcome.released == [("q", "p")]
    assert wake(tmq) == {"0": 0}


def test_cross_queue_completion_wakes_the_pump_then_the_parent_queue(tmq) -> None:
    tmq.add_flow(Flow("p", "parent", {}, job_id="p", children=[leaf("c", queue="kids")]))
    assert wake(tmq, "p") == {}, "a held parent is not claimable"
    assert pump_wake(tmq, "kids") == {}
    tmq.complete(claim_one(tmq, "kids", "c"), "v")
    assert pump_wake(tmq, "kids") == {"0": 0}, "the outbox write wakes the pump"
    assert wake(tmq, "p") == {}
    Pump(["kids"], mq=tmq).sweep()
    assert wake(tmq, "p") == {"0": 0}, "the delivery released the parent: its queue wakes"
    jobkit.assert_state(tmq, "p", "p", JobState.PENDING)


def test_cross_queue_death_wakes_the_pump(tmq) -> None:
    tmq.add_flow(Flow("p", "parent", {}, job_id="p", children=[leaf("c", queue="kids")]))
    tmq.fail(claim_one(tmq, "kids", "c"), "boom", dead=True)
    assert pump_wake(tmq, "kids") == {"0": 0}


def test_a_workers_lock_leaves_the_pumps_wake_to_its_drop(tmq) -> None:
    """A worker delivers what its own completions push while it holds the
    sweep lock: a push then wakes no pump; the worker's drop does, as the
    outbox still holds an entry (here: one it did not deliver)."""
    tmq.add_flow(Flow("p", "parent", {}, job_id="p", children=[leaf("c", queue="kids")]))
    worker = WORKER_TOKEN + "1"
    assert tmq.outbox.lock("kids", worker, 5000) is True
    tmq.complete(claim_one(tmq, "kids", "c"), "v")
    assert (tmq.client.llen(tmq.keys.queue_key("kids", "flow:outbox")), pump_wake(tmq, "kids")) == (
        1,
        {},
    )
    assert tmq.outbox.lock("kids", worker, 5000, take=False) is True
    assert pump_wake(tmq, "kids") == {"0": 0}
    Pump(["kids"], mq=tmq).sweep()
    jobkit.assert_state(tmq, "p", "p", JobState.PENDING)


def test_a_worker_that_cannot_deliver_drops_its_lock_and_wakes_the_pump(tmq, monkeypatch) -> None:
    """What its completion pushed under its lock woke nobody: a worker whose
    delivery fails before it starts drops the lock at once, and the drop
    wakes the pump for the entry, instead of the lock running out its lease."""
    tmq.add_flow(Flow("p", "parent", {}, job_id="p", children=[leaf("c", queue="kids")]))
    own = OwnDelivery(tmq, released=lambda queue: None)
    assert tmq.outbox.lock("kids", own.token, 5000) is True
    sent = tmq.complete(claim_one(tmq, "kids", "c"), "v").sent
    assert (len(sent), pump_wake(tmq, "kids")) == (1, {})

    def down(*args):
        raise RedisUnavailable("gone")

    monkeypatch.setattr(tmq.signal_events, "subscribe", down)
    own._deliver("kids", sent, ["p"])
    assert tmq.client.exists(tmq.keys.queue_key("kids", "pump:lock")) == 0
    assert pump_wake(tmq, "kids") == {"0": 0}
    assert tmq.client.lrange(tmq.keys.queue_key("kids", "flow:outbox"), 0, -1) == [
        s.encode() for s in sent
    ]


def test_a_pumps_lock_lets_a_push_wake_it_and_its_drop_wakes_nobody(tmq) -> None:
    """While a pump sweeps, a push wakes it for one more sweep, as ever; a
    drop of a pump's lock, or of a worker's over an empty outbox, leaves no
    marker (an entry the pump could not deliver waits for its next sweep,
    not a sweep at once)."""
    tmq.add_flow(Flow("p", "parent", {}, job_id="p", children=[leaf("c", queue="kids")]))
    assert tmq.outbox.lock("kids", "0a1b", 5000) is True
    tmq.complete(claim_one(tmq, "kids", "c"), "v")
    assert pump_wake(tmq, "kids") == {"0": 0}
    tmq.client.delete(tmq.keys.queue_key("kids", "flow:wake"))  # the pump popped it
    assert tmq.outbox.lock("kids", "0a1b", 5000, take=False) is True
    assert pump_wake(tmq, "kids") == {}
    Pump(["kids"], mq=tmq).sweep()
    assert tmq.client.llen(tmq.keys.queue_key("kids", "flow:outbox")) == 0
    assert tmq.outbox.lock("kids", WORKER_TOKEN + "1", 5000) is True
    assert tmq.outbox.lock("kids", WORKER_TOKEN + "1", 5000, take=False) is True
    assert pump_wake(tmq, "kids") == {}


def test_wake_keys_are_bounded(tmq, clock) -> None:
    for i in range(300):
        tmq.enqueue("q", "job", job_id=f"n{i}")
        tmq.enqueue("q", "job", job_id=f"d{i}", delay_ms=1000 + i)
    kids = [leaf(f"c{i}", queue="kids") for i in range(300)]
    tmq.add_flow(Flow("p", "parent", {}, job_id="p", children=kids))
    for job in tmq.claim("kids", 300):
        tmq.complete(job, 1)
    assert tmq.client.zcard(tmq.keys.queue_key("q", "wake")) == 2  # '0' and 'd'
    assert tmq.client.zcard(tmq.keys.queue_key("kids", "flow:wake")) == 1
    assert tmq.client.llen(tmq.keys.queue_key("kids", "flow:outbox")) == 300


def test_a_blocked_client_is_woken_by_enqueue(tmq) -> None:
    """What an idle worker does: BZPOPMIN on the wake key, on the queue's own
    slot (a RedisCluster routes it by the key), returns as the job lands."""
    key = tmq.keys.queue_key("q", "wake")
    got: list = []
    blocked = threading.Thread(target=lambda: got.append(tmq.client.bzpopmin(key, 10)))
    blocked.start()
    while not _blocked_clients(tmq.client):
        pass
    tmq.enqueue("q", "job", job_id="a")
    blocked.join(10)
    assert got == [(key.encode(), b"0", 0.0)]
    assert wake(tmq) == {}


def _blocked_clients(client) -> int:
    from redis.cluster import RedisCluster

    if isinstance(client, RedisCluster):
        infos = client.info("clients", target_nodes=RedisCluster.PRIMARIES)
        return sum(v["blocked_clients"] for v in infos.values())
    return client.info("clients")["blocked_clients"]
