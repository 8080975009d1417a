"""The flow invariants (listed below), proven by a stateful property test, on
the single server and on the Cluster.

Hypothesis builds random same-queue flows (depth 1-3, policies fp/id/rd/cp,
max_attempts 1-3, backoff 0 or 50 ms, priorities -1..2, a children timeout on
some parents, dedup keys on some leaves, a start deadline (expires_ms) on some
nodes) and drives random operations: claim (which kills an expired job and
claims the next in its place: docs/howto/retries.md#expiry-before-start),
complete, fail (plain or dead=True), a step job that adds children while it
runs and then waits for them (docs/howto/step-jobs.md), a duplicate completion with a stale
lease, lease expiry + recover_stalled, promotion of delayed jobs, retry by id
of a dead job (and of a job that is not dead), remove_child_dependency, the
children-timeout sweep, a new job that ``depends_on`` a job already added
(a root: it becomes the new job's child, counted at once when finished),
and the lifecycle: remove by id (with the subtree),
cancel by id (top down; an active job is marked and dies when it reports or
stalls) and a retention pass (KEEP_COMPLETED / KEEP_DEAD counts 0-3). For
retention the model checks legality rather than predicting the pick: every row
that vanished was finished and settled (no parent, or not in its parent's
:failed), or lay under one that vanished, and was never active. A claim must
take the highest priorities first. ``Model`` is the reference: a few lines per
transition, written from the documented rules, not from the Lua. After every
step Redis must agree with it and the invariants must hold:

- every job is in exactly one state index, the one its row's state names;
- ``:dependencies`` is never below zero and equals the children not yet in
  processed / unsuccessful / removed (so no child resolves its parent twice);
- a child ref sits in at most one of its parent's resolution hashes;
- a parent is released at most once per hold (its ``released`` events): once
  for its add, once more for each wait of a step job.

Budget: 120 examples x up to 50 steps per rig (SETTINGS below); the file
runs in about 55 s here (with step jobs; 40 s before), within the ~90 s the
suite allows it. Each example uses a fresh key prefix (s0, s1, ...) on the
rig, so no flush is needed between examples. Seeded mutants of the Lua (the
stall limit off by one, retry not resetting attempts, a parent revived while
another failed child remains, rd treated as fp, a wait that does not take
its attempt back) each fail this test.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from echomq_django import (
    DependencyError,
    EchoMQ,
    Flow,
    JobNotActive,
    JobNotFound,
    JobNotRetryable,
    JobRef,
    LeaseLost,
)
from echomq_django.core.exceptions import JobCancelled, JobNotCancellable, JobNotRemovable
from echomq_django.core.jobs import JobState
from echomq_django.core.keyspace import STATE_INDEX
from echomq_django.core.rows import STATE_FIELDS, pending_ids, row_state
from echomq_django.protocol.lifecycle import Report
from tests.support.jobkit import INDEXES, Clock, events

Q = "q"
LEASE_MS = 1000
MAX_STALLS = 1
AWAIT = "awaiting_children"
PARTS = ("processed", "failed", "unsuccessful", "removed")
SETTINGS = settings(
    max_examples=int(os.environ.get("EMQ_STATEFUL_EXAMPLES", 120)),
    stateful_step_count=50,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@dataclass
class Node:
    """One job of the reference model, and its resolution sets when a parent."""

    parent: str | None
    policy: str
    children: list[str]
    max_attempts: int
    backoff_ms: int
    state: str
    attempts: int = 0
    stalls: int = 0
    counter: int = 0
    releases: int = 0
    cancel: bool = False  # cancelled while active: dies when it reports or stalls
    hashes: dict[str, set] = field(default_factory=lambda: {p: set() for p in PARTS})
    priority: int = 0
    deadline: int | None = None  # children deadline (ms) while in P:{q}:deadlines
    children_deadline: int | None = None  # the deadline it was added with (its row's)
    dedup: str | None = None  # the dedup key it holds
    went_on: bool = False  # released early by a continue_parent_on_failure child
    cancelled: bool = False  # died of the error 'cancelled'
    orphaned: bool = False  # its flow was removed while it ran: it goes as it finishes
    expires_at: int | None = None  # not started by then (ms), a claim kills it 'expired'
    started: bool = False  # claimed once: it never expires
    waits: int = 0  # times it waited for children it added while it ran (a step job)
    revivals: int = 0  # times a retry took it from dead back to waiting for its children


class Model:
    """The flow rules in Python. ``released`` / ``dead`` collect what the current
    step did, to compare with the script's ``Outcome``."""

    def __init__(self) -> None:
        self.jobs: dict[str, Node] = {}
        self.released: list[str] = []
        self.dead: list[str] = []
        self.keys: dict[str, str] = {}  # dedup key -> the live job holding it
        self.gc: list[str] = []  # children of orphans that went: the gc list drops them

    def release(self, pid: str) -> None:
        p = self.jobs[pid]
        p.state, p.releases, p.deadline = "pending", p.releases + 1, None
        self.released.append(pid)

    def finish(self, jid: str) -> None:
        """A job completed or died: its dedup key is free."""
        key = self.jobs[jid].dedup
        if key and self.keys.get(key) == jid:
            del self.keys[key]

    def ids(self, state: str) -> list[str]:
        return sorted(i for i, n in self.jobs.items() if n.state == state)

    def expired(self, now: int) -> list[str]:
        """Pending jobs never started whose start deadline passed: a claim that
        pops one kills it (docs/howto/retries.md#expiry-before-start)."""
        return [
            i
            for i in self.ids("pending")
            if not self.jobs[i].started
            and self.jobs[i].expires_at is not None
            and self.jobs[i].expires_at <= now
        ]

    def decrement(self, pid: str) -> None:
        p = self.jobs[pid]
        p.counter = max(p.counter - 1, 0)
        if p.counter == 0 and p.state == AWAIT:
            self.release(pid)

    def reattach(self, pid: str, cid: str) -> None:
        p = self.jobs[pid]
        if cid not in p.hashes["failed"]:
            return
        p.hashes["failed"].discard(cid)
        if not p.hashes["failed"] and p.state == "dead":
            if p.cancelled:  # revived: its cancel is taken back, as by its own retry
                self.uncancel(pid)
                p.cancelled = False
            p.state, p.revivals = AWAIT, p.revivals + 1
            self.reattach_up(pid)

    def reattach_up(self, jid: str) -> None:
        j = self.jobs[jid]
        if j.parent and j.policy == "fp":
            self.reattach(j.parent, jid)
        elif j.parent and j.policy == "id":  # an ignored child re-attaches
            p = self.jobs[j.parent]
            if p.state in (AWAIT, "dead") and jid in p.hashes["unsuccessful"]:
                p.hashes["unsuccessful"].discard(jid)
                p.counter += 1

    def retry_refused(self, jid: str) -> str | None:
        """The parent's state when a retry of ``jid`` must be refused: its
        parent ignored it (``id``) and has been released since."""
        j = self.jobs[jid]
        if j.parent and j.policy == "id":
            p = self.jobs[j.parent]
            if p.state not in (AWAIT, "dead") and jid in p.hashes["unsuccessful"]:
                return p.state
        return None

    def resolved(self, pid: str, cid: str) -> bool:
        h = self.jobs[pid].hashes
        return cid in h["processed"] or cid in h["unsuccessful"] or cid in h["removed"]

    def gone(self, jid: str) -> None:
        """An orphan finished: its row goes at once, its children through
        the gc list (the next lifecycle step: ``FlowMachine.settle``)."""
        j = self.jobs.pop(jid)
        for cid in j.children:
            c = self.jobs.get(cid)
            if c is not None and c.parent == jid:
                self.gc.append(cid)

    def complete(self, jid: str) -> None:
        j = self.jobs[jid]
        if j.cancel:
            self.kill(jid, cancelled=True)
            return
        j.state = "completed"
        self.finish(jid)
        if j.orphaned:
            self.gone(jid)
            return
        if j.parent in self.jobs and not (
            jid in self.jobs[j.parent].hashes["unsuccessful"]
            or jid in self.jobs[j.parent].hashes["removed"]
        ):
            self.reattach(j.parent, jid)
            if not self.resolved(j.parent, jid):
                self.jobs[j.parent].hashes["processed"].add(jid)
                self.decrement(j.parent)

    def kill(self, jid: str, cancelled: bool = False) -> None:
        j = self.jobs[jid]
        if j.state == "dead":
            return
        if cancelled and j.state != AWAIT and j.children:
            j.went_on = True  # past waiting: its retry runs it (pending), never holds it again
        j.state, j.cancelled = "dead", cancelled
        self.dead.append(jid)
        self.finish(jid)
        if j.orphaned:
            self.gone(jid)
            return
        if j.parent not in self.jobs or self.resolved(j.parent, jid):
            return
        p = self.jobs[j.parent]
        policy = "id" if j.policy == "fp" and p.went_on else j.policy
        if policy != "fp":
            p.hashes["removed" if policy == "rd" else "unsuccessful"].add(jid)
            self.decrement(j.parent)
            if policy == "cp" and p.state == AWAIT:  # continue_parent_on_failure
                p.went_on = True  # its other children can no longer fail it
                self.release(j.parent)
        elif jid not in p.hashes["failed"]:
            p.hashes["failed"].add(jid)
            if p.state == AWAIT:
                self.kill(j.parent)

    def fail(self, jid: str, dead: bool) -> None:
        j = self.jobs[jid]
        if j.attempts < j.max_attempts and not dead and not j.cancel:
            j.state = "delayed" if j.backoff_ms else "pending"
        else:
            self.kill(jid, cancelled=j.cancel)

    def stall(self, jid: str) -> None:
        j = self.jobs[jid]
        j.stalls += 1
        if j.stalls > MAX_STALLS or j.cancel:
            self.kill(jid, cancelled=j.cancel)
        else:
            j.state = "pending"

    def uncancel(self, jid: str) -> None:
        """Its cancel taken back: its running children's results count."""
        for cid in self.jobs[jid].children:
            c = self.jobs.get(cid)
            if c is not None and c.state == "active" and c.parent == jid:
                c.cancel = False

    def retry(self, jid: str) -> None:
        j = self.jobs[jid]
        if j.cancelled:  # its cancel is taken back: its running children's results count
            self.uncancel(jid)
        if not j.hashes["failed"] and j.cancelled and not j.went_on and j.counter:
            j.state, j.attempts, j.stalls, j.cancel = AWAIT, 0, 0, False
            j.cancelled, j.deadline = False, j.children_deadline  # held again, same deadline
            j.revivals += 1
            j.expires_at = None  # a retry drops the start deadline
            self.reattach_up(jid)
            return
        j.cancelled = False
        if not j.hashes["failed"]:
            j.state, j.attempts, j.stalls, j.cancel = "pending", 0, 0, False
            j.expires_at = None
            self.reattach_up(jid)
            return
        for cid in sorted(j.hashes["failed"]):
            if self.jobs[cid].state == "dead":
                self.retry(cid)
            else:
                self.reattach(jid, cid)

    # -- lifecycle: remove, cancel, retention ------------------------------------
    def drop(self, jid: str) -> None:
        """A row goes with its subtree; an active node stays, an orphan."""
        j = self.jobs[jid]
        if j.state == "active":
            j.parent, j.orphaned = None, True
            return
        self.finish(jid)  # a removed job frees its dedup key
        del self.jobs[jid]
        for cid in j.children:
            if cid in self.jobs and self.jobs[cid].parent == jid:
                self.drop(cid)

    def remove(self, jid: str) -> None:
        j = self.jobs[jid]
        if j.parent:
            self.reattach(j.parent, jid)
            if not self.resolved(j.parent, jid):
                self.jobs[j.parent].hashes["removed"].add(jid)
                self.decrement(j.parent)
        self.drop(jid)

    def cancel(self, jid: str) -> None:
        """The job, then its unfinished subtree top down (awaiting nodes'
        children, breadth first): unfinished ones die, active ones are marked."""
        todo = [jid]
        while todo:
            cid = todo.pop(0)
            j = self.jobs.get(cid)
            if j is None:  # a child retention took already
                continue
            if j.state == "active":
                j.cancel = True
            elif j.state in ("pending", "delayed", AWAIT):
                was = j.state
                self.kill(cid, cancelled=True)
                if was == AWAIT:
                    todo.extend(j.children)

    def add_children(self, jid: str, kids: list[tuple[str, str, int]]) -> None:
        """A running job added ``kids`` ((id, policy, max_attempts)): it
        counts them now, stays active (docs/howto/step-jobs.md)."""
        p = self.jobs[jid]
        for cid, policy, attempts in kids:
            self.jobs[cid] = Node(jid, policy, [], attempts, 0, "pending")
            p.children.append(cid)
        p.counter += len(kids)

    def wait(self, jid: str) -> None:
        """Its handler raised WaitForChildren: a cancel mark kills it; else
        held (its attempt taken back), then killed by an ``fp`` child that
        died while it ran, or released when every child resolved."""
        j = self.jobs[jid]
        if j.cancel:
            self.kill(jid, cancelled=True)
            return
        j.state, j.attempts, j.waits = AWAIT, max(0, j.attempts - 1), j.waits + 1
        if j.hashes["failed"] and not j.went_on:
            self.kill(jid)
        elif j.counter == 0:
            self.release(jid)

    def settled(self, jid: str) -> bool:
        j = self.jobs[jid]
        return not j.parent or jid not in self.jobs[j.parent].hashes["failed"]


POLICIES = ["fp", "id", "rd", "cp"]
PRIORITIES = st.sampled_from([0, 0, 0, -1, 1, 2])
EXPIRES = st.sampled_from([None, None, None, 500, 5000])  # expires_ms
leaves = st.builds(
    dict,
    policy=st.sampled_from(POLICIES),
    max_attempts=st.integers(1, 3),
    backoff_ms=st.sampled_from([0, 50]),
    children=st.just([]),
    priority=PRIORITIES,
    dedup=st.sampled_from([None, None, "k0", "k1"]),
    expires=EXPIRES,
)


def shapes(depth: int) -> st.SearchStrategy[dict]:
    """A node with 1-3 children, each a leaf or (while depth allows) a node."""
    kids = leaves if depth == 1 else st.one_of(leaves, shapes(depth - 1))
    return st.builds(
        dict,
        policy=st.sampled_from(POLICIES),
        max_attempts=st.integers(1, 3),
        backoff_ms=st.sampled_from([0, 50]),
        children=st.lists(kids, min_size=1, max_size=3),
        priority=PRIORITIES,
        timeout=st.sampled_from([None, None, 1500, 4000]),
        expires=EXPIRES,
    )


flows = st.integers(1, 3).flatmap(shapes)
POLICY_FLAGS = {
    "fp": {},
    "id": {"ignore_dependency_on_failure": True},
    "rd": {"remove_dependency_on_failure": True},
    "cp": {"continue_parent_on_failure": True},
}


class FlowMachine(RuleBasedStateMachine):
    client = None  # bound per rig by the test below
    prefixes = itertools.count()

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        self.mq = EchoMQ(self.client, prefix=f"s{next(self.prefixes)}", clock=self.clock)
        self.model = Model()
        self.holders: dict = {}  # job id -> the Job holding its current lease
        self.deduped: list = []  # (leaf id, parent id) of leaves not added
        self.stale: list = []  # Job objects whose lease is gone
        self.names = itertools.count()

    def build(self, shape: dict, parent: str | None, taken: set) -> Flow:
        """The Flow for ``shape`` and the model's nodes for it (a leaf whose
        dedup key a live job holds is planned as deduplicated: not added,
        its parent not waiting for it). ``taken``: keys used in this flow."""
        jid = f"j{next(self.names)}"
        timeout = shape.get("timeout") if shape["children"] else None
        key = None if parent is None else shape.get("dedup")
        if key in taken:
            key = None  # one leaf per key in a flow (a FlowError otherwise)
        taken.add(key)
        flow = Flow(
            Q,
            "n",
            None,
            job_id=jid,
            max_attempts=shape["max_attempts"],
            backoff_ms=shape["backoff_ms"],
            priority=shape["priority"],
            children_timeout_ms=timeout,
            dedup_key=key,
            expires_ms=shape.get("expires"),
            **(POLICY_FLAGS[shape["policy"]] if parent else {}),
        )
        if key and key in self.model.keys:
            self.deduped.append((jid, parent))
            return flow
        self.model.jobs[jid] = Node(
            parent,
            shape["policy"] if parent else "fp",
            [],
            shape["max_attempts"],
            shape["backoff_ms"],
            AWAIT if shape["children"] else "pending",
            counter=len(shape["children"]),
            priority=shape["priority"],
            deadline=None if timeout is None else self.clock.now + timeout,
            children_deadline=None if timeout is None else self.clock.now + timeout,
            dedup=key,
            expires_at=shape.get("expires") and self.clock.now + shape["expires"],
        )
        if key:
            self.model.keys[key] = jid
        flow.children = [self.build(c, jid, taken) for c in shape["children"]]
        self.model.jobs[jid].children = [k.job_id for k in flow.children]
        return flow

    @initialize(shape=flows)
    def first_flow(self, shape) -> None:
        self.add_flow(shape)

    @precondition(lambda self: len(self.model.jobs) < 20)
    @rule(shape=flows)
    def add_flow(self, shape) -> None:
        before = len(self.model.jobs)
        self.deduped = []
        flow = self.build(shape, None, set())
        ref = self.mq.add_flow(flow)
        assert ref.landed == len(self.model.jobs) - before
        assert sorted(i for _, i in ref.deduplicated) == sorted(i for i, _ in self.deduped)
        self.model.released = []
        for leaf, pid in self.deduped:  # the parent stops waiting for it (:removed)
            self.model.jobs[pid].hashes["removed"].add(leaf)
            self.model.decrement(pid)

    @precondition(lambda self: len(self.model.jobs) < 20)
    @rule(data=st.data())
    def depends_on(self, data) -> None:
        """A new job waits for a job already added that no job waits for (a
        root), which becomes its child: one finished counts at once (a
        completed one releases it, a dead one fails it)."""
        roots = sorted(i for i, n in self.model.jobs.items() if n.parent is None and not n.orphaned)
        if not roots:
            return
        dep, jid = data.draw(st.sampled_from(roots)), f"j{next(self.names)}"
        flow = Flow(
            Q, "n", None, job_id=jid, max_attempts=2, backoff_ms=0, depends_on=[JobRef(Q, dep)]
        )
        ref = self.mq.add_flow(flow)
        assert (ref.nodes, ref.landed, ref.skipped) == ([(Q, jid)], 1, 1)
        m = self.model
        m.released, m.dead = [], []
        m.jobs[jid] = Node(None, "fp", [dep], 2, 0, AWAIT, counter=1)
        d = m.jobs[dep]
        d.parent, d.policy = jid, "fp"
        if d.state == "completed":
            m.jobs[jid].hashes["processed"].add(dep)
            m.decrement(jid)
        elif d.state == "dead":
            m.jobs[jid].hashes["failed"].add(dep)
            m.kill(jid)

    def running_step(self, data):
        """A running job this machine holds the lease of (not an orphan)."""
        live = sorted(i for i in self.holders if not self.model.jobs[i].orphaned)
        return self.holders[data.draw(st.sampled_from(live))] if live else None

    @precondition(lambda self: self.holders and len(self.model.jobs) < 20)
    @rule(data=st.data(), kids=st.lists(st.tuples(st.sampled_from(POLICIES), st.integers(1, 2)),
                                        min_size=1, max_size=2))  # fmt: skip
    def add_children(self, data, kids) -> None:
        """A step job adds children while it runs (docs/howto/step-jobs.md)."""
        job = self.running_step(data)
        if job is None:
            return
        kids = [(f"j{next(self.names)}", policy, n) for policy, n in kids]
        flows = [
            Flow(Q, "n", None, job_id=c, max_attempts=n, backoff_ms=0, **POLICY_FLAGS[pol])
            for c, pol, n in kids
        ]
        refs = job.add_children(flows)
        assert refs == [JobRef(Q, c) for c, _, _ in kids]
        self.step(self.model.add_children, job.id, kids)

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def wait_for_children(self, data) -> None:
        """A step job's handler raised WaitForChildren."""
        job = self.running_step(data)
        if job is None:
            return
        self.stale.append(self.holders.pop(job.id))
        state = self.mq.flows.wait_for_children(job)
        self.step(self.model.wait, job.id)
        assert state.value == self.model.jobs[job.id].state

    @rule(count=st.integers(1, 3))
    def claim(self, count) -> None:
        pending = self.model.ids("pending")
        expired = self.model.expired(self.clock.now)
        jobs = self.mq.claim(Q, count, lease_ms=LEASE_MS)
        # an expired job the claim popped died 'expired' (its parent's policy
        # applied: a parent it released may be popped and expire in the same
        # call), and the next job took its place
        died, released, looked = [], [], set()
        # in the order the claim killed them (its priority order): a `cp` death
        # first releases the parent, an `fp` death first kills it
        order = {jid: n for n, jid in enumerate(events(self.mq, Q, "dead"))}
        while todo := [i for i in self.model.expired(self.clock.now) if i not in looked]:
            looked |= set(todo)
            for jid in sorted(todo, key=lambda i: order.get(i, -1)):
                if self.mq.get_job(Q, jid).state is JobState.DEAD:
                    assert self.mq.get_job(Q, jid).error == "expired"
                    released += self.step(self.model.kill, jid)[0]
                    died.append(jid)
        assert len(jobs) == min(count, len(pending) + len(released) - len(died))
        if len(jobs) < count:  # drained: it popped every expired one
            assert self.model.expired(self.clock.now) == []
        left = set(pending) - {j.id for j in jobs} - set(died)
        if jobs and left:  # higher priorities first
            taken = min(self.model.jobs[j.id].priority for j in jobs)
            assert taken >= max(self.model.jobs[i].priority for i in left)
        for job in jobs:
            node = self.model.jobs[job.id]
            assert node.state == "pending", job.id
            assert job.id not in expired, job.id
            node.state, node.attempts, node.started = "active", node.attempts + 1, True
            assert job.attempts == node.attempts
            self.holders[job.id] = job

    def step(self, fn, *args):
        """Run ``fn`` on the model, collecting its releases and deaths."""
        self.model.released, self.model.dead = [], []
        fn(*args)
        return sorted(self.model.released), sorted(self.model.dead)

    def pick_active(self, data):
        job = self.holders.pop(data.draw(st.sampled_from(sorted(self.holders))))
        self.stale.append(job)
        return job

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def complete(self, data) -> None:
        job = self.pick_active(data)
        if self.model.jobs[job.id].cancel:  # its result is dropped, it dies
            with pytest.raises(JobCancelled, match="was cancelled"):
                self.mq.complete(job, {"by": job.id})
            self.step(self.model.complete, job.id)
            self.settle()
            return
        outcome = self.mq.complete(job, {"by": job.id})
        assert sorted(i for _, i in outcome.released) == self.step(self.model.complete, job.id)[0]
        self.settle()

    def settle(self) -> None:
        """Drive the gc list an orphan's finish left (the runners' timers
        do it at their next prune), and the model with it."""
        if not self.model.gc:
            return
        report = Report()
        self.mq.lifecycle._drive({Q}, report, 200, None, "lists")
        before = set(self.model.jobs)
        for cid in self.model.gc:
            if cid in self.model.jobs:
                self.model.drop(cid)
        self.model.gc = []
        assert report.removed == len(before - set(self.model.jobs))

    @precondition(lambda self: self.holders)
    @rule(data=st.data(), dead=st.sampled_from([False, False, True]))
    def fail(self, data, dead) -> None:
        job = self.pick_active(data)
        outcome = self.mq.fail_many([(job, "err", dead)])[0]
        released, died = self.step(self.model.fail, job.id, dead)
        node = self.model.jobs.get(job.id)  # an orphan that died went at once
        assert outcome.state.value == (node.state if node else "dead")
        assert (sorted(i for _, i in outcome.released), sorted(i for _, i in outcome.dead)) == (
            released,
            died,
        )
        self.settle()

    @precondition(lambda self: self.stale)
    @rule(data=st.data())
    def complete_with_a_stale_lease(self, data) -> None:
        job = data.draw(st.sampled_from(self.stale))
        if job.id not in self.model.jobs:
            with pytest.raises(JobNotFound):
                self.mq.complete(job, "duplicate")
            return
        state = self.model.jobs[job.id].state
        # "duplicate" is never a stored result, so even the lease that completed
        # the job is refused: a replay must repeat the result too
        with pytest.raises(LeaseLost if state == "active" else JobNotActive):
            self.mq.complete(job, "duplicate")

    @precondition(lambda self: self.holders)
    @rule()
    def leases_expire(self) -> None:
        self.clock.advance(LEASE_MS + 1)  # every active lease is now past its deadline
        outcome = self.mq.timers.recover_stalled(Q, max_stalls=MAX_STALLS)
        active = self.model.ids("active")
        _, died = self.step(lambda: [self.model.stall(i) for i in active])
        assert sorted(i for _, i in outcome.dead) == died
        assert outcome.recovered == sum(
            i in self.model.jobs and self.model.jobs[i].state == "pending" for i in active
        )
        self.stale.extend(self.holders.values())
        self.holders.clear()
        self.settle()

    @precondition(lambda self: self.model.ids("delayed"))
    @rule()
    def promote(self) -> None:
        self.clock.advance(1000)  # past every backoff (at most 50 * 2**2 ms)
        assert self.mq.timers.promote_delayed(Q) == len(self.model.ids("delayed"))
        for jid in self.model.ids("delayed"):
            self.model.jobs[jid].state = "pending"

    @precondition(lambda self: self.model.ids("dead"))
    @rule(data=st.data())
    def retry(self, data) -> None:
        """Retry by id: mostly a dead job; sometimes any job, which must be
        refused with its state unless it is dead."""
        dead = self.model.ids("dead")
        pool = dead if data.draw(st.integers(0, 3)) else sorted(self.model.jobs)
        jid = data.draw(st.sampled_from(pool))
        state = self.model.jobs[jid].state
        if state != "dead":
            with pytest.raises(JobNotRetryable, match=f"is {state};"):
                self.mq.retry(Q, jid)
            return
        refused = self.model.retry_refused(jid)
        if refused:
            with pytest.raises(JobNotRetryable, match=f"ignored its death and is {refused} "):
                self.mq.retry(Q, jid)
            return
        outcome = self.mq.retry(Q, jid)
        self.step(self.model.retry, jid)
        assert outcome.state.value == self.model.jobs[jid].state

    @precondition(lambda self: self.model.jobs)
    @rule(data=st.data())
    def remove(self, data) -> None:
        jid = data.draw(st.sampled_from(sorted(self.model.jobs)))
        if self.model.jobs[jid].state == "active":
            with pytest.raises(JobNotRemovable, match=f"'{jid}' in queue 'q' is active;"):
                self.mq.remove(Q, jid)
            return
        before = set(self.model.jobs)
        report = self.mq.remove(Q, jid, budget=2)  # tiny steps: the host drives the rest
        released, _ = self.step(self.model.remove, jid)
        assert report.removed == len(before - set(self.model.jobs))
        assert sorted(i for _, i in report.outcome.released) == released

    @precondition(lambda self: self.model.jobs)
    @rule(data=st.data())
    def cancel(self, data) -> None:
        jid = data.draw(st.sampled_from(sorted(self.model.jobs)))
        state = self.model.jobs[jid].state
        if state in ("completed", "dead"):
            with pytest.raises(JobNotCancellable, match=f"is {state};"):
                self.mq.cancel(Q, jid)
            return
        report = self.mq.cancel(Q, jid, budget=2)
        released, died = self.step(self.model.cancel, jid)
        assert report.state.value == state
        assert sorted(i for _, i in report.outcome.dead) == died
        assert sorted(i for _, i in report.outcome.released) == released
        self.settle()

    @rule(keep=st.integers(0, 3))
    def retention(self, keep) -> None:
        self.mq.queues[Q] = {"KEEP_COMPLETED": keep, "KEEP_DEAD": keep}
        self.clock.advance(1)
        report = self.mq.lifecycle.prune(Q, budget=3)
        ids = sorted(self.model.jobs)
        pipe = self.client.pipeline(transaction=False)
        for jid in ids:
            pipe.exists(self.mq.keys.job(Q, jid))
        gone = {jid for jid, there in zip(ids, pipe.execute(), strict=True) if not there}
        for jid in gone:  # every row that went was allowed to go
            node = self.model.jobs[jid]
            assert node.state != "active", jid
            under = node.parent in gone
            assert under or (node.state in ("completed", "dead") and self.model.settled(jid)), jid
        for jid in sorted(gone):
            node = self.model.jobs.get(jid)
            if node is not None and node.parent not in gone:
                self.model.drop(jid)
        assert set(ids) - set(self.model.jobs) == gone  # whole subtrees went
        assert report.removed == len(gone)
        if not report.more:  # the pass ran to its end: nothing that may go is left beyond `keep`
            for state in ("completed", "dead"):
                may_go = [jid for jid in self.model.ids(state) if self.model.settled(jid)]
                assert len(may_go) <= keep, (state, keep, may_go, report)

    @precondition(lambda self: self.model.ids(AWAIT))
    @rule(data=st.data())
    def remove_child_dependency(self, data) -> None:
        pid = data.draw(st.sampled_from(self.model.ids(AWAIT)))
        node = self.model.jobs[pid]
        cid = data.draw(st.sampled_from(node.children))
        ref = JobRef(Q, cid)
        if any(cid in h for h in node.hashes.values()):
            with pytest.raises(DependencyError, match="has resolved its parent already"):
                self.mq.remove_child_dependency(Q, pid, ref)
            return
        outcome = self.mq.remove_child_dependency(Q, pid, ref)
        released, _ = self.step(
            lambda: (node.hashes["removed"].add(cid), self.model.decrement(pid))
        )
        assert sorted(i for _, i in outcome.released) == released

    @precondition(lambda self: any(n.deadline for n in self.model.jobs.values()))
    @rule()
    def children_time_out(self) -> None:
        self.clock.advance(1000)
        expired, outcome = self.mq.timers.expire_children(Q)
        due = [i for i, n in self.model.jobs.items() if n.deadline and n.deadline <= self.clock.now]

        def expire():
            n = 0
            for pid in sorted(due, key=lambda i: (self.model.jobs[i].deadline, i)):
                self.model.jobs[pid].deadline = None
                if self.model.jobs[pid].state == AWAIT:
                    self.model.kill(pid)
                    n += 1
            return n

        self.model.released, self.model.dead = [], []
        assert expired == expire()
        assert sorted(i for _, i in outcome.dead) == sorted(self.model.dead)
        assert sorted(i for _, i in outcome.released) == sorted(self.model.released)

    @invariant()
    def redis_agrees_with_the_model(self) -> None:
        k, ids = self.mq.keys, sorted(self.model.jobs)
        parents = [i for i in ids if self.model.jobs[i].children]
        pipe = self.client.pipeline(transaction=False)
        for jid in ids:
            pipe.hmget(k.job(Q, jid), "attempts", *STATE_FIELDS)  # pending: no `s`
        pipe.lrange(k.queue_key(Q, "pending"), 0, -1)
        pipe.zrange(k.queue_key(Q, "prioritized"), 0, -1)
        for name in INDEXES[1:]:
            pipe.zrange(k.queue_key(Q, name), 0, -1)
        for pid in parents:
            pipe.get(k.job_part(Q, pid, "dependencies"))
            for part in PARTS:
                pipe.hkeys(k.job_part(Q, pid, part))
        pipe.xrange(k.queue_key(Q, "events"))
        replies = [self.decode(r) for r in pipe.execute()]
        rows, replies = replies[: len(ids)], replies[len(ids) :]
        # a range entry stands for its ids; a job with a priority is pending too
        replies[0] = pending_ids(replies[0]) + replies.pop(1)
        held: dict[str, list[str]] = {}
        for name, members in zip(INDEXES, replies[: len(INDEXES)], strict=False):
            for jid in members:
                held.setdefault(jid, []).append(name)
        assert set(held) <= set(ids), "an index holds a row that is gone"
        for jid, (attempts, *fields) in zip(ids, rows, strict=False):
            node, state = self.model.jobs[jid], row_state(fields)
            assert (state, int(attempts or 0)) == (node.state, node.attempts), jid
            assert held.get(jid) == [STATE_INDEX[JobState(state)]], (jid, held.get(jid))
        released = [f[b"id"].decode() for _, f in replies[-1] if f[b"e"] == b"released"]
        for n, pid in enumerate(parents):
            counter, *hashes = replies[len(INDEXES) + 5 * n : len(INDEXES) + 5 * n + 5]
            node, prefix = self.model.jobs[pid], k.base(Q) + "job:"
            found = {
                part: {ref[len(prefix) :] for ref in h}
                for part, h in zip(PARTS, hashes, strict=False)
            }
            assert found == node.hashes, pid
            unresolved = [
                c
                for c in node.children
                if not any(c in found[p] for p in ("processed", "unsuccessful", "removed"))
            ]
            assert int(counter) == node.counter == len(unresolved) >= 0, pid
            for c in node.children:
                assert sum(c in h for h in found.values()) <= 1, (pid, c)
            # once per hold: its add, each wait of a step job, each retry that held it again
            assert released.count(pid) == node.releases <= 1 + node.waits + node.revivals, pid

    @staticmethod
    def decode(reply):
        if isinstance(reply, bytes):
            return reply.decode()
        if isinstance(reply, list) and reply and not isinstance(reply[0], tuple):
            return [FlowMachine.decode(v) for v in reply]
        return reply


def test_flows_keep_the_invariants(redis_client) -> None:
    machine = type("BoundFlowMachine", (FlowMachine,), {"client": redis_client})
    run_state_machine_as_test(machine, settings=SETTINGS)
