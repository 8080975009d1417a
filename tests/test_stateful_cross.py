"""Cross-queue flows under random interleavings: a hypothesis state machine
adds random trees over three queues, claims, completes, fails, lets leases
expire, retries dead jobs by id, and runs pump sweeps, some of which crash
between deliver and trim, removes a flow and adds it again at once under the
same ids (whatever of the old one is still in an outbox must not reach the new
one); after every step it checks the flow invariants (those of
test_stateful.py) against a small model of the flows.

Examples: 25 per rig, up to 30 steps each (about 20 s per rig here).
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
            queues={q: {"BACKOFF_MS": 0} for q in QUEUES},
        )
        self.pump = Pump(list(QUEUES), mq=self.mq, lock_ms=60_000)
        self.parent_of: dict[tuple, tuple] = {}  # child (q, id) -> parent (q, id)
        self.children: dict[tuple, list] = {}  # parent -> [child (q, id)]
        self.n = 0
        self.roots: list[tuple[tuple, Flow]] = []
        self.epoch: dict[tuple, tuple] = {}  # node -> last events id before it was added again

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
            children=[self._flow(c, node) for c in spec["children"]],
        )

    @rule(spec=trees())
    def add(self, spec):
        flow = self._flow(spec)
        self.mq.add_flow(flow)
        self.roots.append(((flow.queue, flow.job_id), flow))

    @precondition(lambda self: self.n > 0)
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
        dead = [(q, i) for q in QUEUES for i in self.mq.job_ids(q, "dead")]
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
        for q in QUEUES:
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
        for q in QUEUES:
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
        for q in QUEUES:
            counts: dict[str, int] = {}
            for at, fields in self.client.xrange(self.mq.keys.queue_key(q, "events")):
                if fields[b"e"] == b"released":
                    job_id = fields[b"id"].decode()
                    if stream_id(at) <= self.epoch.get((q, job_id), (0, 0)):
                        continue  # released in a flow since removed and added again
                    counts[job_id] = counts.get(job_id, 0) + 1
            assert all(n == 1 for n in counts.values()), counts


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
