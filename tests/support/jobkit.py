"""Shared helpers for the protocol, flow, lifecycle and stateful tests.

Everything here reads real Redis; nothing is mocked. ``Clock`` (from
workerkit) is the one fake allowed, time (``EchoMQ(clock=...)``), starting at
``T0``, a realistic epoch in ms so Lua's number formatting is exercised;
``where`` answers which state index holds a job; ``snapshot`` captures a whole
keyspace (every master of a Cluster) so a test can assert that a refused call
wrote nothing.

The fixtures ``clock`` and ``tmq`` live in ``tests/support/fixtures.py``.
"""

from __future__ import annotations

from redis.cluster import RedisCluster

from echomq_django import EchoMQ, Flow, JobRef, JobState
from echomq_django.core.jobs import row_error
from echomq_django.core.keyspace import STATE_INDEX
from echomq_django.core.rows import pending_ids
from echomq_django.runners.pump import Pump
from tests.support.rigs import reply_text as _text
from tests.support.workerkit import T0, Clock  # noqa: F401  (T0 re-exported to the tests)

INDEXES = ("pending", "active", "delayed", "completed", "dead", "awaiting")


def where(mq: EchoMQ, queue: str, job_id: str) -> list[str]:
    """Every state index of ``queue`` holding ``job_id`` (pending counted per copy)."""
    k, c = mq.keys, mq.client
    listed = pending_ids(c.lrange(k.queue_key(queue, "pending"), 0, -1))  # ranges as their ids
    out = ["pending"] * listed.count(job_id)
    if c.zscore(k.queue_key(queue, "prioritized"), job_id) is not None:
        out.append("pending")  # a job with a priority waits there
    for name in INDEXES[1:]:
        if c.zscore(k.queue_key(queue, name), job_id) is not None:
            out.append(name)
    return out


def row(mq: EchoMQ, queue: str, job_id: str) -> dict[str, str]:
    """The job row as ``{field: text}``, a long error joined from its pieces
    into ``error``, and ``s`` ``pending`` for a row added as pending, which
    holds none (``raw_row`` keeps the row as it is)."""
    r = raw_row(mq, queue, job_id)
    if r and "s" not in r and "state" not in r:
        r["s"] = "pending"
    if "error.n" in r:
        r["error"] = row_error(r)
        for n in range(2, int(r.pop("error.n")) + 1):
            del r[f"error.{n}"]
    return r


def raw_row(mq: EchoMQ, queue: str, job_id: str) -> dict[str, str]:
    """The job row as Redis holds it, ``{field: text}``."""
    return {_text(f): _text(v) for f, v in mq.client.hgetall(mq.keys.job(queue, job_id)).items()}


def assert_state(mq: EchoMQ, queue: str, job_id: str, state: str | JobState) -> dict[str, str]:
    """The row says ``state`` and exactly that one index holds the id; returns the row."""
    state = JobState(state)
    r = row(mq, queue, job_id)
    assert r.get("s") == state.value, (job_id, r)
    assert where(mq, queue, job_id) == [STATE_INDEX[state]], job_id
    return r


def score(mq: EchoMQ, queue: str, index: str, job_id: str) -> int | None:
    s = mq.client.zscore(mq.keys.queue_key(queue, index), job_id)
    return None if s is None else int(s)


def hash_of(mq: EchoMQ, key: str) -> dict[str, str]:
    return {_text(f): _text(v) for f, v in mq.client.hgetall(key).items()}


def counter(mq: EchoMQ, queue: str, job_id: str) -> int | None:
    v = mq.client.get(mq.keys.job_part(queue, job_id, "dependencies"))
    return None if v is None else int(v)


def children(mq: EchoMQ, queue: str, job_id: str) -> list[str]:
    """The parent's ``:children`` refs, sorted (whatever Redis type holds them)."""
    key = mq.keys.job_part(queue, job_id, "children")
    kind = _text(mq.client.type(key))
    if kind == "none":
        return []
    raw = mq.client.smembers(key) if kind == "set" else mq.client.lrange(key, 0, -1)
    return sorted(mq.keys.child_keys(queue, job_id, raw))  # the list's entries as keys


def ref(mq: EchoMQ, job_id: str, queue: str = "q") -> str:
    """The raw child ref (job key) of ``queue/job_id``: for reading Redis."""
    return mq.keys.job(queue, job_id)


def jref(job_id: str, queue: str = "q") -> JobRef:
    """``JobRef(queue, job_id)``: how the public API names the job."""
    return JobRef(queue, job_id)


def events(mq: EchoMQ, queue: str, kind: str) -> list[str]:
    """Ids of the ``kind`` events in the queue's stream, oldest first."""
    return [
        _text(f[b"id"])
        for _, f in mq.client.xrange(mq.keys.queue_key(queue, "events"))
        if f[b"e"] == kind.encode()
    ]


def callback_jobs(mq: EchoMQ, queue: str = "q") -> dict:
    """The callback jobs on ``queue`` (docs/howto/retries.md#callbacks):
    ``{name: [payload, ...]}`` of its ``cb-`` rows."""
    out: dict = {}
    for state in ("pending", "completed", "dead"):
        for jid in mq.job_ids(queue, state):
            if jid.startswith("cb-"):
                job = mq.get_job(queue, jid)
                out.setdefault(job.name, []).append(job.payload)
    return out


def snapshot(client) -> dict[bytes, bytes]:
    """``{key: DUMP}`` of every key (every master of a Cluster); streams
    included, so a refused call that wrote an event shows up too."""
    if isinstance(client, RedisCluster):
        keys = [k for node in client.get_primaries() for k in client.keys(target_nodes=node)]
    else:
        keys = client.keys()
    return {k: client.dump(k) for k in keys}


def claim_one(mq: EchoMQ, queue: str, job_id: str | None = None, **kw):
    """Claim exactly one job (the given one, when named)."""
    jobs = mq.claim(queue, 1, **kw)
    assert len(jobs) == 1, jobs
    if job_id is not None:
        assert jobs[0].id == job_id
    return jobs[0]


def complete(mq: EchoMQ, job_id: str, result=None, queue: str = "q"):
    """Claim ``job_id`` (the head of pending) and complete it; the Outcome."""
    return mq.complete(claim_one(mq, queue, job_id), result)


def kill(mq: EchoMQ, job_id: str, error: str = "boom", queue: str = "q"):
    """Claim ``job_id`` (the head of pending) and fail it to dead; the Outcome."""
    outcome = mq.fail_many([(claim_one(mq, queue, job_id), error, True)])[0]
    assert outcome.state is JobState.DEAD
    return outcome


def leaf(job_id: str, queue: str = "q", **kw) -> Flow:
    return Flow(queue, "leaf", {"id": job_id}, job_id=job_id, **kw)


def node(job_id: str, children: list[Flow], queue: str = "q", **kw) -> Flow:
    return Flow(queue, "node", {"id": job_id}, job_id=job_id, children=children, **kw)


# -- many parents on p, each fanning in from children on c ---------------------


def wide_cross_flows(mq, parents=20, children=10):
    """``parents`` parents on ``p``, each with ``children`` children on ``c``."""
    mq.add_flows(
        [
            Flow(
                "p",
                "parent",
                {},
                job_id=f"P{i}",
                children=[Flow("c", "child", {}, job_id=f"P{i}-{j}") for j in range(children)],
            )
            for i in range(parents)
        ]
    )


def released_events(mq, queue="p"):
    """How many times each job was released, read from the events stream."""
    counts: dict[str, int] = {}
    for _, fields in mq.client.xrange(mq.keys.queue_key(queue, "events")):
        if fields[b"e"] == b"released":
            job = fields[b"id"].decode()
            counts[job] = counts.get(job, 0) + 1
    return counts


def assert_each_parent_released_once(mq, parents, children):
    assert released_events(mq) == {f"P{i}": 1 for i in range(parents)}
    assert sorted(mq.job_ids("p", "pending")) == sorted(f"P{i}" for i in range(parents))
    for i in range(parents):
        counts = mq.dependency_counts("p", f"P{i}")
        assert (counts["processed"], counts["remaining"]) == (children, 0)
    assert mq.counts("c")["outbox"] == 0


# -- what the lifecycle tests read and do --------------------------------------


def keys_of(mq, queue: str) -> list[str]:
    """Every key of ``queue`` but its events stream and sequence counters."""
    pattern = f"emq:{{{queue}}}:*"
    if isinstance(mq.client, RedisCluster):
        found = [
            k for n in mq.client.get_primaries() for k in mq.client.keys(pattern, target_nodes=n)
        ]
    else:
        found = mq.client.keys(pattern)
    names = sorted(k.decode() if isinstance(k, bytes) else k for k in found)
    # fixed-size markers and counters (the per-minute counters' ring too); the
    # signal kinds a queue records; the sweep lock's release mark (one
    # element, gone within a second)
    skip = (
        "events",
        "lease:seq",
        "gc:seq",
        "wake",
        "signals:kinds",
        "pump:unlocked",
        "minutes",
    )
    return [n for n in names if not n.endswith(skip) and ":op:" not in n and ":claim:" not in n]


def rows(mq, queue: str) -> list[str]:
    prefix = f"emq:{{{queue}}}:job:"
    return sorted(
        k[len(prefix) :]
        for k in keys_of(mq, queue)
        if k.startswith(prefix) and ":" not in k[len(prefix) :]
    )


def set_keep(mq, queue: str, completed, dead=None) -> None:
    opts = mq.queues.setdefault(queue, {})
    opts["KEEP_COMPLETED"] = completed
    if dead is not None:
        opts["KEEP_DEAD"] = dead


def sweep(mq, *queues: str) -> None:
    Pump(list(queues), mq=mq).sweep()


def sweep_report(mq, queue: str) -> dict:
    return Pump([queue], mq=mq).sweep()[queue]


def record_calls(mq, monkeypatch) -> list[list[str]]:
    """Until the test ends, the scripts ``mq`` sends, one list per round trip
    (a ``run``, or a ``run_many`` pipeline: one per node on a Cluster), and
    each direct read of a list as a trip of its own."""
    trips: list[list[str]] = []
    scripts, client = mq.scripts, mq.client
    run, run_many = scripts.run, scripts.run_many_confirmed

    def one(name, keys, args):
        trips.append([name])
        return run(name, keys, args)

    def many(calls, after=None):
        trips.append([name for name, _, _ in calls])
        return run_many(calls, after)

    for command in ("lrange", "llen"):
        direct = getattr(client, command)

        def counted(*a, _direct=direct, _name=command, **kw):
            trips.append([_name])
            return _direct(*a, **kw)

        monkeypatch.setattr(client, command, counted)
    monkeypatch.setattr(scripts, "run", one)
    monkeypatch.setattr(scripts, "run_many_confirmed", many)
    return trips


def command_calls(client, command: str) -> int:
    """Calls of ``command`` (scripts' calls included) on every master:
    ``INFO commandstats``, summed over a Cluster's primaries."""
    if hasattr(client, "get_primaries"):
        infos = client.info("commandstats", target_nodes=client.PRIMARIES).values()
    else:
        infos = [client.info("commandstats")]
    return sum(int(info.get(f"cmdstat_{command}", {}).get("calls", 0)) for info in infos)
