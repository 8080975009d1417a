"""The fault suite's kit (tests/faults/test_chaos.py): flows whose end state
is known from their data, real ``runworker`` / ``runpump`` processes to
SIGKILL, and the audit that counts what a fault may have broken.

Every node's end state follows from its data alone (``predict``): a leaf
marked bad fails every attempt and dies; a parent dies when a child with
policy ``fp`` dies, else completes (a child with ``id`` or ``rd`` that dies
lets it go on). A SIGKILLed worker, pump or Redis changes when things
happen, never how they end.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from echomq_django import Flow, JobNotFound

REPO = Path(__file__).resolve().parents[2]
QUEUES = ("fa", "fb", "fc")  # tests/support/fault_settings.py FAULT_QUEUES
POLICIES = {"fp": {}, "id": {"ignore_dependency_on_failure": True}}
POLICIES["rd"] = {"remove_dependency_on_failure": True}
STALLED = "stalled "  # the error of a job recover_stalled killed (lua/recover_stalled.lua)


def _leaf(rng: random.Random, job_id: str, policy: str, bad_rate: float) -> Flow:
    bad = rng.random() < bad_rate
    payload = {"n": 1, "ms": rng.randint(5, 50), "bad": bad}
    return Flow(rng.choice(QUEUES), "fault.leaf", payload, job_id=job_id, **POLICIES[policy])


def _policy(rng: random.Random) -> str:
    return rng.choices(["fp", "id", "rd"], weights=[6, 2, 2])[0]


def make_flows(count: int, seed: int, bad_rate: float = 0.12) -> list[Flow]:
    """``count`` flows: a root on ``fa`` with 2-4 children on any queue, a
    third of them parents of 1-3 leaves themselves; mixed policies."""
    rng = random.Random(seed)
    flows = []
    for i in range(count):
        children = []
        for j in range(rng.randint(2, 4)):
            cid = f"r{i}.{j}"
            if rng.random() < 0.33:
                leaves = [
                    _leaf(rng, f"{cid}.{k}", _policy(rng), bad_rate)
                    for k in range(rng.randint(1, 3))
                ]
                children.append(
                    Flow(
                        rng.choice(QUEUES),
                        "fault.parent",
                        {"ms": 2},
                        job_id=cid,
                        children=leaves,
                        **POLICIES[_policy(rng)],
                    )
                )
            else:
                children.append(_leaf(rng, cid, _policy(rng), bad_rate))
        flows.append(Flow("fa", "fault.parent", {"ms": 2}, job_id=f"r{i}", children=children))
    return flows


def predict(flow: Flow, out: dict | None = None, stalled=frozenset()) -> dict[tuple[str, str], str]:
    """``{(queue, id): "completed" | "dead"}`` for every node of ``flow``.

    ``stalled``: nodes that died of repeated stalls (their lease expired more
    often than the stall limit allows: the documented poison-job rule, which
    a worker SIGKILLed twice under the same job sets off); they count as bad.
    """
    out = {} if out is None else out
    dies = bool(flow.payload.get("bad")) or (flow.queue, flow.job_id) in stalled
    for child in flow.children:
        predict(child, out, stalled)
        if out[(child.queue, child.job_id)] == "dead" and child.policy == "fp":
            dies = True
    out[(flow.queue, flow.job_id)] = "dead" if dies else "completed"
    return out


def parents(flows: list[Flow]) -> list[tuple[str, str]]:
    found = []

    def walk(node: Flow) -> None:
        if node.children:
            found.append((node.queue, node.job_id))
            for child in node.children:
                walk(child)

    for f in flows:
        walk(f)
    return found


@dataclass
class Figures:
    """What the audit counted (the suite asserts and prints them)."""

    flows: int = 0
    nodes: int = 0
    in_predicted_state: int = 0
    wrong: list = field(default_factory=list)
    lost: list = field(default_factory=list)
    released_twice: list = field(default_factory=list)
    negative_counters: list = field(default_factory=list)
    outbox_left: int = 0
    deadlettered: int = 0
    stalled: list = field(default_factory=list)

    def line(self) -> str:
        return (
            f"flows {self.flows}, nodes {self.nodes}, in predicted state "
            f"{self.in_predicted_state}, wrong {len(self.wrong)}, lost {len(self.lost)}, "
            f"released twice {len(self.released_twice)}, counters below zero "
            f"{len(self.negative_counters)}, outbox left {self.outbox_left}, "
            f"dead-lettered {self.deadlettered}, died of repeated stalls {len(self.stalled)}"
        )


def audit(mq, flows: list[Flow]) -> Figures:
    """Read every node back and count what went wrong (see ``Figures``)."""
    fig = Figures(flows=len(flows))
    expected: dict = {}
    for f in flows:
        predict(f, expected)
    fig.nodes = len(expected)
    rows = {}
    for node in expected:
        try:
            rows[node] = mq.get_job(*node)
        except JobNotFound:
            fig.lost.append(node)
    fig.stalled = sorted(
        n
        for n, job in rows.items()
        if job.state.value == "dead" and (job.error or "").startswith(STALLED)
    )
    if fig.stalled:
        expected = {}
        for f in flows:
            predict(f, expected, frozenset(fig.stalled))
    for (queue, job_id), state in sorted(expected.items()):
        if (queue, job_id) not in rows:
            continue
        found = rows[(queue, job_id)].state.value
        if found == state:
            fig.in_predicted_state += 1
        else:
            fig.wrong.append((queue, job_id, state, found))
    releases: dict[tuple[str, str], int] = {}
    client = mq.client
    for queue in QUEUES:
        keys = mq.keys.queue(queue)
        for _, entry in client.xrange(keys.events):
            if entry.get(b"e") == b"released":
                node = (queue, entry[b"id"].decode())
                releases[node] = releases.get(node, 0) + 1
        fig.outbox_left += client.llen(keys.outbox)
        fig.deadlettered += client.llen(keys.deadletter)
    fig.released_twice = sorted(n for n, times in releases.items() if times > 1)
    for queue, job_id in parents(flows):
        left = client.get(mq.keys.job_keys(queue, job_id).dependencies)
        if left is not None and int(left) < 0:
            fig.negative_counters.append((queue, job_id, int(left)))
    return fig


def roots_done(mq, flows: list[Flow]) -> int:
    """How many roots are completed or dead."""
    pipe = mq.client.pipeline(transaction=False)
    for f in flows:
        pipe.hget(mq.keys.job(f.queue, f.job_id), "state")
    return sum(s in (b"completed", b"dead") for s in pipe.execute())


class Proc:
    """``manage.py <args>`` with the fault settings, stderr to a file;
    ``kill()`` is SIGKILL, ``again()`` starts the same command anew."""

    def __init__(self, logs: Path, url: str, cluster: bool, *args: str) -> None:
        self.logs, self.url, self.cluster, self.args = logs, url, cluster, args
        self.kills = 0
        self.proc: subprocess.Popen | None = None
        self.again()

    def again(self) -> None:
        env = {
            **os.environ,
            "ECHOMQ_URL": self.url,
            "ECHOMQ_CLUSTER": "1" if self.cluster else "0",
            "DJANGO_SETTINGS_MODULE": "tests.support.fault_settings",
            "ECHOMQ_DB_PATH": str(self.logs / "db.sqlite3"),
        }
        log = self.logs / f"{self.args[0]}-{os.urandom(3).hex()}.log"
        with open(log, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "manage.py", *self.args],
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=env,
                start_new_session=True,
            )
        self.log = log

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            self.kills += 1

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


def wait_until(predicate, timeout: float, step: float = 0.05):
    """Poll ``predicate`` until truthy (returns it) or ``timeout`` s (returns
    the last falsy value): a bound, never an assertion about time."""
    deadline = time.monotonic() + timeout
    value = predicate()
    while not value and time.monotonic() < deadline:
        time.sleep(step)
        value = predicate()
    return value
