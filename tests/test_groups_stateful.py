"""Groups against a reference model, by a stateful property test on the
single server and on the Cluster (docs/explanation/protocol.md#groups).

Hypothesis drives random adds (no group or one of two, priority 0 or 5),
claims of one job, completions and dead failures of active jobs, cancels of
pending jobs, pauses, resumes and per-group caps (the queue's
GROUP_CONCURRENCY is 1). ``Model`` is written from the documented rules, not
from the Lua: jobs without a group first (higher priority first, FIFO); then
the ring of groups in turn, one job per group per turn, a group going to the
back while it has jobs and room under its cap, sitting out at its cap until
one of its jobs leaves active, out while paused. After every step Redis must
agree: the claimed id is the model's, the ring holds the model's groups in
its order, each group's active count and the queue's pending count match,
and a group with no claimable job has no list of its own left.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from echomq_django import EchoMQ

Q = "q"
CAP = 1
GROUPS = ("a", "b")
SETTINGS = settings(
    max_examples=int(os.environ.get("EMQ_STATEFUL_EXAMPLES", 40)),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
PREFIXES = itertools.count()


@dataclass
class Model:
    pending: dict = field(default_factory=dict)  # id -> (group, priority, seq)
    active: dict = field(default_factory=dict)  # id -> group
    ring: list = field(default_factory=list)
    capped: set = field(default_factory=set)
    paused: set = field(default_factory=set)
    caps: dict = field(default_factory=dict)
    seq: int = 0

    def waiting(self, group):
        return [i for i, (g, _, _) in self.pending.items() if g == group]

    def best(self, ids):
        return min(ids, key=lambda i: (-self.pending[i][1], self.pending[i][2]))

    def running(self, group):
        return sum(1 for g in self.active.values() if g == group)

    def cap(self, group):
        return self.caps.get(group, CAP)

    def add(self, job_id, group, priority):
        self.seq += 1
        self.pending[job_id] = (group, priority, self.seq)
        idle = group not in self.capped and group not in self.paused and group not in self.ring
        if group and idle:
            self.ring.append(group)

    def claim(self):
        plain = self.waiting(None)
        if plain:
            return self.take(self.best(plain))
        while self.ring:
            g = self.ring.pop(0)
            if self.running(g) >= self.cap(g):
                self.capped.add(g)
                continue
            job_id = self.take(self.best(self.waiting(g)))
            if self.waiting(g):
                if self.running(g) < self.cap(g):
                    self.ring.append(g)
                else:
                    self.capped.add(g)
            return job_id
        return None

    def take(self, job_id):
        group = self.pending.pop(job_id)[0]
        self.active[job_id] = group
        return job_id

    def leave(self, job_id):
        g = self.active.pop(job_id)
        if g in self.capped:
            self.capped.discard(g)
            if g not in self.paused and g not in self.ring:
                self.ring.append(g)

    def cancel(self, job_id):
        g = self.pending.pop(job_id)[0]
        if g and not self.waiting(g):
            self.capped.discard(g)
            if g in self.ring:
                self.ring.remove(g)

    def pause(self, g):
        self.paused.add(g)
        if g in self.ring:
            self.ring.remove(g)

    def reopen(self, g):
        self.capped.discard(g)
        if g not in self.paused and self.waiting(g) and g not in self.ring:
            self.ring.append(g)


class GroupMachine(RuleBasedStateMachine):
    client = None

    def __init__(self) -> None:
        super().__init__()
        queues = {Q: {"GROUP_CONCURRENCY": CAP}}
        self.mq = EchoMQ(self.client, prefix=f"g{next(PREFIXES)}", queues=queues)
        self.model = Model()
        self.jobs = {}  # id -> the claimed Job
        self.ids = itertools.count()

    @rule(group=st.sampled_from((None, *GROUPS)), priority=st.sampled_from((0, 5)))
    def add(self, group, priority):
        job_id = f"j{next(self.ids)}"
        self.mq.enqueue(Q, "n", job_id=job_id, group=group, priority=priority)
        self.model.add(job_id, group, priority)

    @rule()
    def claim(self):
        claimed = self.mq.claim(Q, 1)
        want = self.model.claim()
        assert [j.id for j in claimed] == ([want] if want else []), (want, self.model.ring)
        for job in claimed:
            self.jobs[job.id] = job

    @precondition(lambda self: self.model.active)
    @rule(data=st.data(), dead=st.booleans())
    def finish(self, data, dead):
        job_id = data.draw(st.sampled_from(sorted(self.model.active)))
        job = self.jobs.pop(job_id)
        if dead:
            self.mq.fail(job, "boom", dead=True)
        else:
            self.mq.complete(job, 1)
        self.model.leave(job_id)

    @precondition(lambda self: self.model.pending)
    @rule(data=st.data())
    def cancel(self, data):
        job_id = data.draw(st.sampled_from(sorted(self.model.pending)))
        self.mq.cancel(Q, job_id)
        self.model.cancel(job_id)

    @rule(group=st.sampled_from(GROUPS))
    def pause(self, group):
        self.mq.groups.pause(Q, group)
        self.model.pause(group)

    @rule(group=st.sampled_from(GROUPS))
    def resume(self, group):
        self.mq.groups.resume(Q, group)
        self.model.paused.discard(group)
        self.model.reopen(group)

    @rule(group=st.sampled_from(GROUPS), n=st.sampled_from((1, 2, 3, None)))
    def cap(self, group, n):
        self.mq.groups.set_concurrency(Q, group, n)
        if n is None:
            self.model.caps.pop(group, None)
        else:
            self.model.caps[group] = n
        self.model.reopen(group)

    @invariant()
    def redis_agrees(self):
        k = self.mq.keys.queue(Q)
        ring = [g.decode() for g in self.client.zrange(k.groups, 0, -1)]
        assert ring == self.model.ring
        active = {g.decode(): int(n) for g, n in self.client.hgetall(k.groups_active).items()}
        assert active == {g: self.model.running(g) for g in GROUPS if self.model.running(g)}
        assert self.mq.counts(Q)["pending"] == len(self.model.pending)
        for g in GROUPS:
            has_work = self.client.exists(k.group(g, "pending"), k.group(g, "prioritized"))
            assert bool(has_work) == bool(self.model.waiting(g)), g


def test_groups_follow_the_model(redis_client) -> None:
    machine = type("BoundGroupMachine", (GroupMachine,), {"client": redis_client})
    run_state_machine_as_test(machine, settings=SETTINGS)
