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
        pipe.hget(mq.keys.job(f.queue, f.job_id), "s")
    return sum(s in (b"completed", b"dead") for s in pipe.execute())


def fault_env(logs: Path, url: str, cluster: bool) -> dict[str, str]:
    """The environment of a ``manage.py`` subprocess with the fault
    settings: Redis at ``url``, the SQLite file ``logs/db.sqlite3``."""
    return {
        **os.environ,
        "ECHOMQ_URL": url,
        "ECHOMQ_CLUSTER": "1" if cluster else "0",
        "DJANGO_SETTINGS_MODULE": "tests.support.fault_settings",
        "ECHOMQ_DB_PATH": str(logs / "db.sqlite3"),
    }


def migrate(logs: Path, url: str, cluster: bool) -> None:
    """``manage.py migrate`` the fault processes' SQLite file (the enqueue
    outbox's table)."""
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--verbosity", "0"],
        cwd=REPO,
        env=fault_env(logs, url, cluster),
        stdin=subprocess.DEVNULL,
        check=True,
        timeout=120,
    )


# A committing view, as a process of its own: each line "start count" read
# on stdin commits ``count`` transactions, each adding the job v<n> (through
# the commit outbox: the default inside atomic()) and a second on_commit
# hook of its own; it prints one line per commit, then "batch done".
COMMITTER = """
import os, sys
from django.db import transaction
import echomq_django as emq
for line in sys.stdin:
    start, count = map(int, line.split())
    for n in range(start, start + count):
        hooks = []
        with transaction.atomic():
            emq.enqueue("fa", "fault.once", {"log": os.environ["RUN_LOG"], "n": n}, job_id=f"v{n}")
            transaction.on_commit(lambda: hooks.append(n))
        print(f"committed v{n} hooks {hooks}", flush=True)
    print("batch done", flush=True)
"""


class Committer:
    """``COMMITTER`` under ``manage.py shell`` with the fault settings;
    ``commit(start, count)`` returns its lines for that batch."""

    def __init__(self, logs: Path, url: str, cluster: bool, run_log: Path) -> None:
        self.log = logs / f"committer-{os.urandom(3).hex()}.log"
        with open(self.log, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "manage.py", "shell", "--no-imports", "-c", COMMITTER],
                cwd=REPO,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                env={**fault_env(logs, url, cluster), "RUN_LOG": str(run_log)},
                start_new_session=True,
            )

    def commit(self, start: int, count: int) -> list[str]:
        self.proc.stdin.write(f"{start} {count}\n")
        self.proc.stdin.flush()
        out = []
        while (line := self.proc.stdout.readline()) and line.strip() != "batch done":
            out.append(line.strip())
        return out

    def stop(self) -> int:
        self.proc.stdin.close()
        return self.proc.wait(30)


def runs(run_log: Path) -> dict[str, list[int]]:
    """``fault.once``'s log: job id -> the pids of the workers that ran it."""
    out: dict[str, list[int]] = {}
    if run_log.exists():
        for line in run_log.read_text().splitlines():
            job_id, pid = line.split()
            out.setdefault(job_id, []).append(int(pid))
    return out


class Proc:
    """``manage.py <args>`` with the fault settings, stderr to a file;
    ``kill()`` is SIGKILL, ``again()`` starts the same command anew."""

    def __init__(self, logs: Path, url: str, cluster: bool, *args: str) -> None:
        self.logs, self.url, self.cluster, self.args = logs, url, cluster, args
        self.kills = 0
        self.proc: subprocess.Popen | None = None
        self.again()

    def again(self) -> None:
        env = fault_env(self.logs, self.url, self.cluster)
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
