"""Cross-queue flows under random interleavings: a hypothesis state machine
adds random trees over three queues, claims, completes, fails, lets leases
expire, retries dead jobs by id, and runs pump sweeps, some of which crash
between deliver and trim, removes a flow and adds it again at once under the
same ids (whatever of the old one is still in an outbox must not reach the new
one), runs step jobs on a queue of their own that add children on the three
queues and wait for them (docs/howto/step-jobs.md), adds nodes that
``depends_on`` plain jobs on other queues, and gives some leaves a start
deadline (``expires_ms``: a claim kills them ``expired``); after every step it
checks the flow invariants (those of test_stateful.py) against a small model
of the flows.

Examples: 25 per rig, up to 30 steps each (about 45 s per rig here).
"""

from __future__ import annotations

import itertools
import json

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
    EchoMQ,
    Flow,
    JobNotActive,
    JobNotRetryable,
    JobRef,
    JobState,
    LeaseLost,
)
from echomq_django.runners.pump import Pump

QUEUES = ("qa", "qb", "qc")
STEPS = "qs"  # step jobs only: nothing else is claimed there
CRASHES = "qx"  # step jobs whose worker dies inside add_children: only step_job_crash claims
ALL = (*QUEUES, STEPS, CRASHES)
PREFIXES = itertools.count()


class Crash(Exception):
    """A pump dying between deliver and trim."""


def trees(depth=3):
    leaf = st.fixed_dictionaries(
        {
            "queue": st.sampled_from(QUEUES),
            "policy": st.sampled_from(["fp", "id", "rd"]),
            "attempts": st.integers(1, 2),
            "children": st.just([]),
            "expires": st.sampled_from([None, None, 5, 50]),  # ms: not started by then, dead
        }
    )
    return st.recursive(
        leaf,
        lambda kids: st.fixed_dictionaries(
            {
                "queue": st.sampled_from(QUEUES),
                "policy": st.sampled_from(["fp", "id", "rd"]),
                "attempts": st.integers(1, 2),
                "children": st.lists(kids, min_size=1, max_size=3),
            }
        ),
        max_leaves=6,
    )


class CrossQueueFlows(RuleBasedStateMachine):
    client = None  # set per rig below

    @initialize()
    def setup(self):
        self.now = [1_000_000]
        self.mq = EchoMQ(
            self.client,
            prefix=f"x{next(PREFIXES)}",
            clock=lambda: self.now[0],
            queues={q: {"BACKOFF_MS": 0} for q in ALL},
        )
        self.pump = Pump(list(ALL), mq=self.mq, lock_ms=60_000)
        self.parent_of: dict[tuple, tuple] = {}  # child (q, id) -> parent (q, id)
        self.children: dict[tuple, list] = {}  # parent -> [child (q, id)]
        self.n = 0
        self.roots: list[tuple[tuple, Flow]] = []
        self.epoch: dict[tuple, tuple] = {}  # node -> last events id before it was added again
        self.waits: dict[str, int] = {}  # step job id -> its waits (a release each, at most)
        self.plain: list[tuple] = []  # plain jobs no node depends on yet

    def _flow(self, spec, parent=None):
        self.n += 1
        node = (spec["queue"], f"j{self.n}")
        if parent:
            self.parent_of[node] = parent
            self.children.setdefault(parent, []).append(node)
        return Flow(
            node[0],
            "h",
            {"n": self.n},
            job_id=node[1],
            max_attempts=spec["attempts"],
            ignore_dependency_on_failure=spec["policy"] == "id",
            remove_dependency_on_failure=spec["policy"] == "rd",
            expires_ms=spec.get("expires"),
            children=[self._flow(c, node) for c in spec["children"]],
        )

    @rule(spec=trees())
    def add(self, spec):
        flow = self._flow(spec)
        self.mq.add_flow(flow)
        self.roots.append(((flow.queue, flow.job_id), flow))

    @precondition(lambda self: self.roots)
    @rule(data=st.data())
    def remove_and_add_again(self, data):
        # a recent flow: its children are the likeliest to have entries in flight
        (queue, job_id), flow = data.draw(st.sampled_from(self.roots[-2:]))
        self.mq.remove(queue, job_id)  # nothing stays active between steps
        last = {
            q: self.client.xrevrange(self.mq.keys.queue_key(q, "events"), count=1) for q in QUEUES
        }
        todo = [flow]
        while todo:  # every node of this flow may be released once more
            node = todo.pop()
            todo.extend(node.children)
            if last[node.queue]:
                self.epoch[(node.queue, node.job_id)] = stream_id(last[node.queue][0][0])
        ref = self.mq.add_flow(flow)
        assert ref.skipped == 0, ref

    @rule(data=st.data(), kids=st.lists(trees(depth=1), max_size=2), new=st.booleans())
    def step_job(self, data, kids, new):
        """A step job on its own queue: added (or one held before runs again),
        then it adds ``kids`` on the three queues and waits, or completes."""
        if new or not self.waits:
            self.n += 1
            self.mq.enqueue(STEPS, "h", None, job_id=f"s{self.n}")
            self.waits[f"s{self.n}"] = 0
        for job in self.mq.claim(STEPS, 1):
            node = (STEPS, job.id)
            if not kids:
                self.mq.complete(job, job.id)
                continue
            refs = job.add_children([self._flow({**k, "children": []}, node) for k in kids])
            assert refs == [JobRef(*k) for k in self.children[node][-len(kids) :]]
            state = self.mq.flows.wait_for_children(job)
            self.waits[job.id] += 1
            assert state in (JobState.AWAITING_CHILDREN, JobState.PENDING, JobState.DEAD)

    @rule(kids=st.lists(trees(depth=1), min_size=1, max_size=3), landed=st.integers(0, 3))
    def step_job_crash(self, kids, landed):
        """A step job adds ``kids`` (generated ids) and its worker dies after
        ``landed`` landing steps (past the last: after add_children
        returned). Its lease lapses, it is recovered, and the run again
        adds the same children and waits (docs/explanation/protocol.md#step-jobs)."""
        self.n += 1
        sid = f"x{self.n}"
        self.mq.enqueue(CRASHES, "h", None, job_id=sid)
        job = self._claim_crashing(sid, lease_ms=10)
        flows = lambda: [  # noqa: E731 -- the same children, built afresh each run
            Flow(
                k["queue"],
                "h",
                {"kid": i},
                max_attempts=k["attempts"],
                ignore_dependency_on_failure=k["policy"] == "id",
                remove_dependency_on_failure=k["policy"] == "rd",
            )
            for i, k in enumerate(kids)
        ]

        def die(n, queue, groups):
            if n + 1 >= landed:
                raise Crash

        if landed == 0:
            self.mq.flows._run_steps = lambda *a, **kw: die(-1, "", [])
        self.mq.wire.fault_hook = die if landed else None
        try:
            job.add_children(flows())
        except Crash:
            pass
        finally:
            self.mq.wire.fault_hook = None
            self.mq.flows.__dict__.pop("_run_steps", None)
        self.now[0] += 20
        assert self.mq.timers.recover_stalled(CRASHES, max_stalls=5).recovered == 1
        job = self._claim_crashing(sid)
        refs = job.add_children(flows())
        node = (CRASHES, sid)
        for ref in refs:
            self.parent_of[(ref.queue, ref.id)] = node
        self.children[node] = [(r.queue, r.id) for r in refs]
        deps = self.mq.dependencies(CRASHES, sid)
        assert sorted(deps.unprocessed) == sorted(refs)  # the first run's, landed once
        self.waits[sid] = 1
        self.mq.flows.wait_for_children(job)

    def _claim_crashing(self, sid, **kw):
        """Claim ``sid`` on CRASHES; a released one ahead of it completes."""
        while True:
            (job,) = self.mq.claim(CRASHES, 1, **kw)
            if job.id == sid:
                return job
            self.mq.complete(job, job.id)

    @rule(data=st.data(), queue=st.sampled_from(QUEUES), attempts=st.integers(1, 2))
    def depends_on(self, data, queue, attempts):
        """A plain job, and a node (on any queue) that depends on an earlier
        one: it becomes that job's parent, however far the job got."""
        self.n += 1
        self.mq.enqueue(queue, "h", {"n": self.n}, job_id=f"d{self.n}", max_attempts=attempts)
        self.plain.append((queue, f"d{self.n}"))
        if len(self.plain) > 1:
            dep = self.plain.pop(data.draw(st.integers(0, len(self.plain) - 2)))
            self.n += 1
            node = (data.draw(st.sampled_from(QUEUES)), f"n{self.n}")
            self.mq.add_flow(Flow(node[0], "h", None, job_id=node[1], depends_on=[JobRef(*dep)]))
            self.parent_of[dep] = node
            self.children[node] = [dep]

    @rule(queue=st.sampled_from(QUEUES), ok=st.booleans())
    def work(self, queue, ok):
        for job in self.mq.claim(queue, 1):
            if ok:
                self.mq.complete(job, job.id)
            else:
                self.mq.fail_many([(job, "boom")])[0]

    @rule(queue=st.sampled_from(QUEUES))
    def stale_lease(self, queue):
        jobs = self.mq.claim(queue, 1, lease_ms=10)
        self.now[0] += 20
        self.mq.timers.recover_stalled(queue, max_stalls=1)
        for job in jobs:
            with pytest.raises((LeaseLost, JobNotActive)):
                self.mq.complete(job, "late")

    @rule()
    def sweep(self):
        self.now[0] += 1
        for report in self.pump.sweep().values():
            assert report["deadlettered"] == 0

    @rule(queue=st.sampled_from(QUEUES))
    def crashing_sweep(self, queue):
        def die(q, actions):
            raise Crash

        try:
            Pump([queue], mq=self.mq, before_trim=die).sweep()
        except Crash:  # only when its outbox had something to deliver
            self.client.delete(self.mq.keys.queue_key(queue, "pump:lock"))

    @precondition(lambda self: self.n > 0)
    @rule(data=st.data())
    def retry(self, data):
        dead = [(q, i) for q in ALL for i in self.mq.job_ids(q, "dead")]
        if dead:
            queue, job_id = data.draw(st.sampled_from(sorted(dead)))
            try:
                self.mq.retry(queue, job_id)
            except JobNotRetryable:  # a child of it was retried first
                pass

    # -- invariants ------------------------------------------------------
    def _row(self, node):
        return self.mq.get_job(*node)

    @invariant()
    def every_job_in_exactly_one_index_matching_its_state(self):
        if not hasattr(self, "mq"):
            return
        where: dict[tuple, list] = {}
        for q in ALL:
            for state in JobState:
                for job_id in self.mq.job_ids(q, state):
                    where.setdefault((q, job_id), []).append(state)
        nodes = set(self.parent_of) | set(self.children) | set(where)
        for node in nodes:
            assert where.get(node) == [self._row(node).state], node

    @invariant()
    def counters_match_unresolved_children_and_nothing_is_lost(self):
        if not hasattr(self, "mq"):
            return
        outboxes = {}
        for q in ALL:
            raw = self.client.lrange(self.mq.keys.queue_key(q, "flow:outbox"), 0, -1)
            for entry in map(json.loads, raw):
                outboxes.setdefault((entry["q"], entry["p"], entry["c"]), []).append(entry["k"])
        for parent, kids in self.children.items():
            deps = self.mq.dependencies(*parent)
            refs = {JobRef(*k): k for k in kids}
            resolved = set(deps.processed) | set(deps.ignored) | set(deps.removed)
            assert deps.remaining == len(refs) - len(resolved) >= 0, parent
            assert set(deps.failed) <= set(refs) and not set(deps.failed) & resolved
            for ref, kid in refs.items():
                state = self._row(kid).state
                key = self.mq.keys.job(*kid)  # outbox entries name the child by its key
                pending_entry = outboxes.get((parent[0], parent[1], key), [])
                if state is JobState.COMPLETED:  # delivered, or still in an outbox
                    assert (
                        ref in deps.processed
                        or "done" in pending_entry
                        or ref in deps.ignored
                        or ref in deps.removed
                    ), (parent, kid)
                if ref in deps.processed:
                    assert state is JobState.COMPLETED

    @invariant()
    def released_at_most_once(self):
        if not hasattr(self, "mq"):
            return
        for q in ALL:
            counts: dict[str, int] = {}
            for at, fields in self.client.xrange(self.mq.keys.queue_key(q, "events")):
                if fields[b"e"] == b"released":
                    job_id = fields[b"id"].decode()
                    if stream_id(at) <= self.epoch.get((q, job_id), (0, 0)):
                        continue  # released in a flow since removed and added again
                    counts[job_id] = counts.get(job_id, 0) + 1
            # once per hold: its add, and each wait of a step job
            assert all(n <= 1 + self.waits.get(i, 0) for i, n in counts.items()), counts
            assert all(n == 1 for i, n in counts.items() if i not in self.waits), counts


def stream_id(raw) -> tuple[int, int]:
    ms, seq = (raw.decode() if isinstance(raw, bytes) else raw).split("-")
    return int(ms), int(seq)


SETTINGS = settings(
    max_examples=25, stateful_step_count=30, deadline=None, suppress_health_check=list(HealthCheck)
)


@pytest.mark.parametrize("rig", ["r", "rc"], ids=["single", "cluster"])
def test_cross_queue_flows_keep_the_invariants(rig, request):
    CrossQueueFlows.client = request.getfixturevalue(rig)
    run_state_machine_as_test(CrossQueueFlows, settings=SETTINGS)
