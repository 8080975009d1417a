"""A mirror that is right: after any sequence of transitions and
incremental mirror passes, the admin's header counts (``MirroredQueue``),
the listed rows (``MirroredJob``) and Redis agree, claims included.

A seeded random walk drives enqueues (plain, delayed, same-queue flows),
claims, completions, failures (to delayed, pending and dead), expired leases
recovered, delayed jobs promoted and dead jobs retried, with a mirror pass
every few steps, and checks all three after each pass. Time is a fake clock.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from echomq_django import EchoMQ, Flow, JobState
from echomq_django.models import MirroredJob, MirroredQueue
from echomq_django.monitoring.mirror import mirror_queue
from tests.support.workerkit import Clock

pytestmark = pytest.mark.django_db

Q = "truth"
STATES = [s.value for s in JobState]
LEASE_MS = 1000


def redis_truth(mq: EchoMQ) -> dict[str, str]:
    """``{id: state}`` of every job in the queue's state indexes, read from the rows."""
    ids = [j for s in JobState for j in mq.job_ids(Q, s)]
    return {j: mq.get_job(Q, j).state.value for j in ids}


def check(mq: EchoMQ) -> None:
    truth = redis_truth(mq)
    counts = mq.counts(Q)
    header = MirroredQueue.objects.get(queue=Q).counts()
    rows = dict(
        MirroredJob.objects.filter(queue=Q, gone_from_redis=False).values_list("job_id", "state")
    )
    assert {s: header[s] for s in STATES} == {s: counts[s] for s in STATES}, "header vs Redis"
    assert rows == truth, "listed rows vs Redis"
    listed = Counter(rows.values())
    assert {s: listed[s] for s in STATES} == {s: header[s] for s in STATES}, "rows vs header"


class Walk:
    def __init__(self, mq: EchoMQ, rnd: random.Random) -> None:
        self.mq, self.rnd, self.n, self.held = mq, rnd, 0, []

    def new_id(self) -> str:
        self.n += 1
        return f"j{self.n}"

    def enqueue(self):
        delay = self.rnd.choice([0, 0, 500])
        self.mq.enqueue(Q, "t.leaf", {}, job_id=self.new_id(), delay_ms=delay, max_attempts=2)

    def flow(self):
        kids = [Flow(Q, "t.leaf", {}, job_id=self.new_id()) for _ in range(self.rnd.randint(1, 3))]
        self.mq.add_flow(Flow(Q, "t.parent", {}, job_id=self.new_id(), children=kids))

    def claim(self):
        self.held += self.mq.claim(Q, self.rnd.randint(1, 3), lease_ms=LEASE_MS)

    def finish(self):
        if not self.held:
            return
        job = self.held.pop(self.rnd.randrange(len(self.held)))
        try:
            if self.rnd.random() < 0.6:
                self.mq.complete(job, {"ok": job.id})
            else:
                self.mq.fail(job, f"boom {job.id}", dead=self.rnd.random() < 0.3)
        except Exception as err:  # its lease expired and it was recovered: that is fine here
            assert type(err).__name__ in ("LeaseLost", "JobNotActive"), err

    def expire(self):
        self.mq.clock.advance(LEASE_MS + 1)
        self.mq.timers.recover_stalled(Q, max_stalls=3)

    def promote(self):
        self.mq.clock.advance(600)
        self.mq.timers.promote_delayed(Q)

    def retry(self):
        dead = self.mq.job_ids(Q, JobState.DEAD)
        if dead:
            self.mq.retry(Q, self.rnd.choice(dead))

    STEPS = (
        "enqueue",
        "enqueue",
        "flow",
        "claim",
        "claim",
        "finish",
        "finish",
        "finish",
        "expire",
        "promote",
        "retry",
    )


@pytest.mark.parametrize("seed", range(12))
def test_header_rows_and_redis_agree_after_any_sequence(r, seed):
    mq = EchoMQ(r, prefix="emq", clock=Clock())
    rnd = random.Random(seed)
    walk = Walk(mq, rnd)
    mirror_queue(mq, Q)  # the first pass is a full scan of an empty queue
    for _ in range(60):
        mq.clock.advance(10)
        getattr(walk, rnd.choice(Walk.STEPS))()
        if rnd.random() < 0.35:
            assert mirror_queue(mq, Q)["full"] is False
            check(mq)
    mirror_queue(mq, Q)
    check(mq)


def test_a_claim_and_a_recovery_between_two_passes(r):
    """The issue's case: counts unchanged, yet job b was claimed."""
    mq = EchoMQ(r, prefix="emq", clock=Clock())
    mq.enqueue(Q, "t.leaf", {}, job_id="a")
    mq.enqueue(Q, "t.leaf", {}, job_id="b")
    mq.claim(Q, 1, lease_ms=LEASE_MS)  # a: active
    mirror_queue(mq, Q)
    check(mq)
    mq.clock.advance(LEASE_MS + 1)
    assert mq.timers.recover_stalled(Q, max_stalls=3) is not None  # a: back to pending (an event)
    [b] = mq.claim(Q, 1, lease_ms=LEASE_MS)  # b: active (no event); counts as before
    assert b.id == "b"
    assert mirror_queue(mq, Q)["full"] is False
    check(mq)
    assert MirroredJob.objects.get(queue=Q, job_id="b").state == "active"


def test_a_new_flows_children_are_listed_at_once(r):
    mq = EchoMQ(r, prefix="emq", clock=Clock())
    mirror_queue(mq, Q)
    kids = [Flow(Q, "t.leaf", {}, job_id=f"k{i}") for i in range(3)]
    mq.add_flow(Flow(Q, "t.parent", {}, job_id="p", children=kids))
    assert mirror_queue(mq, Q)["full"] is False
    check(mq)


def test_one_entry_of_progress_values_updates_each_job_it_names(r):
    mq = EchoMQ(r, prefix="emq", clock=Clock())
    mq.enqueue_many(Q, [{"name": "t.leaf", "job_id": j} for j in ("a", "b")])
    a, b = mq.claim(Q, 2, lease_ms=LEASE_MS)
    mirror_queue(mq, Q)
    mq.progress.write_many([(a, ["10", "20"], []), (b, ['{"done":1}'], [])])  # one entry
    report = mirror_queue(mq, Q)
    assert (report["full"], report["events"]) == (False, 3)  # one per id the entry names
    rows = dict(MirroredJob.objects.filter(queue=Q).values_list("job_id", "progress"))
    assert rows == {"a": "20", "b": '{"done":1}'}
