"""``EchoMQ``: the protocol's host half over one Redis connection (DESIGN §7).

Every state transition is one Lua script (scripts.py, ``lua/``); this class
validates input, builds keys (keyspace.py), runs the script and decodes the
reply. Nothing is written when validation fails.
"""

from __future__ import annotations

import itertools
import json
import secrets
import time
from typing import Any

import redis

from . import flows as _flows
from .exceptions import (
    EchoMQError,
    JobNotActive,
    JobNotRetryable,
    PayloadError,
    RedisUnavailable,
    translate,
)
from .flows import Flow, FlowRef
from .jobs import Job, JobState, Outcome, _text
from .keyspace import Keyspace, validate_id, validate_queue, whole_number
from .reads import Reads, reports_redis_down
from .scripts import Scripts

DEFAULTS = {"MAX_ATTEMPTS": 3, "BACKOFF_MS": 1000, "LEASE_MS": 30000}
MAX_PAYLOAD_BYTES = 512 * 1024
BACKOFF_CAP_MS = 3_600_000
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
# The C encoder behind _ENCODER, built once: JSONEncoder.encode() builds a new
# one per call, which costs more than encoding a small payload (issue 8).
_C_ENCODE = json.encoder.c_make_encoder and json.encoder.c_make_encoder(
    None,
    _ENCODER.default,
    json.encoder.encode_basestring_ascii,
    None,
    ":",
    ",",
    False,
    False,
    False,
)


def _to_json(value: Any) -> str:
    kind = type(value)
    if (kind is dict or kind is list) and _C_ENCODE is not None:  # the usual payloads
        return "".join(_C_ENCODE(value, 0))
    return _ENCODER.encode(value)


FLOW_CHUNK = 5000  # nodes per enqueue_flow script: keeps one script well under ~50 ms
COMPLETE_BATCH = 500  # jobs per complete script: a few ms of Redis time at most


def _opt(value) -> str:
    """An optional integer as script text: '' means "the queue's setting"."""
    return "" if value is None else str(int(value))


def now_ms() -> int:
    """Wall-clock time in ms since the epoch."""
    return time.time_ns() // 1_000_000


class EchoMQ(Reads):
    """The queue over one redis-py client (``redis.Redis`` or ``RedisCluster``).

    ``prefix`` starts every key (DESIGN §3). ``queues`` maps a queue name to
    its defaults ``{"MAX_ATTEMPTS": int, "BACKOFF_MS": ms, "LEASE_MS": ms}``;
    missing values come from ``DEFAULTS``. ``clock`` returns ms since the epoch
    (tests pass a fake one: DESIGN §5 rule 3). ``max_payload_bytes`` bounds a
    payload or result once encoded (bytes of UTF-8 JSON).
    """

    def __init__(
        self,
        client: redis.Redis,
        prefix: str = "emq",
        *,
        queues: dict | None = None,
        clock=None,
        max_payload_bytes: int = MAX_PAYLOAD_BYTES,
        backoff_cap_ms: int = BACKOFF_CAP_MS,
        flow_chunk: int = FLOW_CHUNK,
    ) -> None:
        self.client = client
        self.keys = Keyspace(prefix)
        self.scripts = Scripts(client)
        self.queues = {validate_queue(q): dict(v or {}) for q, v in (queues or {}).items()}
        self.clock = clock or now_ms
        self.max_payload_bytes = max_payload_bytes
        self.backoff_cap_ms = backoff_cap_ms
        self.flow_chunk = flow_chunk
        self.fault_hook = None  # tests: called after each flow step, may raise

    # -- helpers -----------------------------------------------------------
    def setting(self, queue: str, name: str) -> int:
        """A queue's ``MAX_ATTEMPTS`` / ``BACKOFF_MS`` / ``LEASE_MS``."""
        return int(self.queues.get(queue, {}).get(name, DEFAULTS[name]))

    def encode(self, value: Any, what: str = "payload") -> str:
        """``value`` as compact JSON text. Raises ``PayloadError`` when it is not
        JSON-serialisable (NaN included) or is over ``max_payload_bytes``."""
        try:
            text = _to_json(value)
        except (TypeError, ValueError) as err:
            raise PayloadError(f"{what} is not JSON-serialisable: {err}") from None
        except RecursionError:  # no circular check in _C_ENCODE: it recurses instead
            raise PayloadError(
                f"{what} is not JSON-serialisable: circular reference or nested too deeply"
            ) from None
        size = len(text)  # ASCII: escapes keep it one byte per character
        if size > self.max_payload_bytes:
            raise PayloadError(
                f"{what} is {size} bytes of JSON; the limit is "
                f"{self.max_payload_bytes} bytes (max_payload_bytes)"
            )
        return text

    def _parse(self, value: str) -> tuple[str, str]:
        return self.keys.parse_base_id(value)

    def _outcome(self, reply: Any) -> Outcome:
        return Outcome.from_reply(reply, self._parse)

    # -- single jobs -------------------------------------------------------
    def enqueue(
        self,
        queue: str,
        name: str,
        payload: Any = None,
        *,
        job_id: str | None = None,
        max_attempts: int | None = None,
        backoff_ms: int | None = None,
        delay_ms: int = 0,
    ) -> str:
        """Add one job; returns its id (generated when ``job_id`` is None).

        ``delay_ms`` (ms) > 0 holds it in ``delayed`` until due. Raises
        ``ValueError`` for a bad queue name, id or name, ``PayloadError`` for a
        bad payload, ``DuplicateJob`` when the id is taken (nothing written),
        ``RedisUnavailable`` when Redis cannot be reached. DESIGN §5 `enqueue`.
        """
        validate_queue(queue)
        job_id = validate_id(job_id if job_id is not None else _flows.new_id())
        if not isinstance(name, str) or not name:
            raise ValueError(f"a job needs a name (the handler's), got {name!r}")
        whole_number("max_attempts", max_attempts, 1, optional=True)
        whole_number("backoff_ms", backoff_ms, 0, optional=True)
        whole_number("delay_ms", delay_ms, 0)
        k = self.keys
        self.scripts.run(
            "enqueue",
            [
                k.job(queue, job_id),
                k.queue_key(queue, "pending"),
                k.queue_key(queue, "delayed"),
                k.queue_key(queue, "events"),
            ],
            [
                queue,
                job_id,
                name,
                self.encode(payload),
                _opt(max_attempts),
                _opt(backoff_ms),
                self.clock(),
                int(delay_ms),
            ],
        )
        return job_id

    def claim(self, queue: str, count: int = 1, lease_ms: int | None = None) -> list[Job]:
        """Claim up to ``count`` pending jobs of ``queue`` in one call.

        Each returned ``Job`` is active, holds a fresh ``lease`` token and a
        ``lease_deadline`` (ms) = now + ``lease_ms`` (the queue's LEASE_MS by
        default), and has its attempt counted. DESIGN §5 `claim`.
        """
        whole_number("count", count, 1)
        whole_number("lease_ms", lease_ms, 1, optional=True)
        lease = int(lease_ms if lease_ms is not None else self.setting(queue, "LEASE_MS"))
        now = self.clock()
        k = self.keys
        flat = json.loads(
            self.scripts.run(
                "claim",
                [
                    k.queue_key(queue, "pending"),
                    k.queue_key(queue, "active"),
                    k.queue_key(queue, "lease:seq"),
                ],
                [k.base(queue), count, now, lease, secrets.token_hex(8)],
            )
        )
        deadline = now + lease
        return [
            Job.from_claim(
                queue, [v if v is not False else None for v in flat[i : i + 11]], deadline, self
            )
            for i in range(0, len(flat), 11)
        ]

    def _fail_call(self, job: Job, error: str, dead: bool = False):
        k, q = self.keys, job.queue
        return (
            "fail",
            [k.job(q, job.id), k.queue_key(q, "delayed")],
            [
                q,
                k.base(q),
                job.id,
                job.lease or "",
                str(error),
                self.clock(),
                self.backoff_cap_ms,
                "1" if dead else "0",
                self.setting(q, "MAX_ATTEMPTS"),
                self.setting(q, "BACKOFF_MS"),
            ],
        )

    def complete(self, job: Job, result: Any = None) -> Outcome:
        """Complete an active job with a JSON-serialisable ``result``.

        Fans in to its parent (DESIGN §5 `complete`). Returns the ``Outcome``
        (parents released). Raises ``PayloadError`` for a bad result (the job
        stays active), ``JobNotFound``, ``JobNotActive``, ``LeaseLost``.
        """
        text = self.encode(result, "result")
        reply = self._complete_batches(job.queue, [(job, text)])[0]
        if isinstance(reply, Exception):
            raise reply
        job.state = JobState.COMPLETED
        return reply

    def fail(self, job: Job, error: str, *, dead: bool = False) -> JobState:
        """Fail an active job; returns its new state: delayed (backoff
        ``backoff_ms * 2**(attempts-1)`` ms, capped), pending (no backoff) or
        dead (attempts exhausted, or ``dead=True``). A dead child resolves its
        parent by its policy. Raises ``JobNotFound``, ``JobNotActive``,
        ``LeaseLost``. DESIGN §5 `fail`; ``fail_many`` returns full outcomes."""
        outcome = self.fail_many([(job, error, dead)])[0]
        job.state = outcome.state
        return outcome.state

    def complete_many(self, items: list[tuple[Job, Any]]) -> list[Outcome | Exception]:
        """``complete`` for many jobs in one round trip; an exception object
        (``PayloadError``, ``LeaseLost``...) stands in for each one refused.

        The jobs of one queue go to one ``complete`` script per
        ``COMPLETE_BATCH`` jobs (each job still its own checked transition
        inside it); several queues' scripts are pipelined."""
        out: list[Outcome | Exception | None] = [None] * len(items)
        by_queue: dict[str, list] = {}
        for i, (job, result) in enumerate(items):
            try:
                text = self.encode(result, "result")
            except PayloadError as err:
                out[i] = err
                continue
            by_queue.setdefault(job.queue, []).append((i, job, text))
        calls, slots = [], []
        for queue, group in by_queue.items():
            for at in range(0, len(group), COMPLETE_BATCH):
                part = group[at : at + COMPLETE_BATCH]
                calls.append(self._complete_call(queue, [(job, text) for _, job, text in part]))
                slots.append([i for i, _, _ in part])
        if len(calls) == 1:
            replies = [self._run_or_error(*calls[0])]
        else:
            replies = self.scripts.run_many(calls)
        for idx, reply in zip(slots, replies, strict=False):
            for i, entry in zip(idx, self._complete_replies(reply, len(idx)), strict=False):
                out[i] = entry
                if not isinstance(entry, Exception):
                    items[i][0].state = JobState.COMPLETED
        return out

    def _complete_call(self, queue: str, pairs: list[tuple[Job, str]]):
        """One ``complete`` script call for ``(job, result JSON)`` pairs of ``queue``."""
        k = self.keys
        args: list = [queue, k.base(queue), self.clock()]
        for job, text in pairs:
            args += (job.id, job.lease or "", text)
        return ("complete", [k.queue_key(queue, "active"), k.queue_key(queue, "completed")], args)

    def _complete_batches(self, queue: str, pairs: list[tuple[Job, str]]) -> list:
        return self._complete_replies(
            self._run_or_error(*self._complete_call(queue, pairs)), len(pairs)
        )

    def _run_or_error(self, name: str, keys: list, args: list):
        """``scripts.run``, with a refusal returned instead of raised (as
        ``run_many`` does); a connection error still raises."""
        try:
            return self.scripts.run(name, keys, args)
        except redis.exceptions.ResponseError as err:
            return err
        except EchoMQError as err:
            if isinstance(err, RedisUnavailable):
                raise
            return err

    def _complete_replies(self, reply, n: int) -> list[Outcome | Exception]:
        """Decode a ``complete`` reply into an ``Outcome`` or an exception
        per job; a failed script call stands for each of its ``n`` jobs."""
        if isinstance(reply, Exception):
            return [reply] * n
        out: list[Outcome | Exception] = []
        for entry in json.loads(reply):
            if entry == 0:
                out.append(Outcome(state=JobState.COMPLETED))
            elif isinstance(entry, str):
                out.append(translate(redis.exceptions.ResponseError(entry)))
            else:

                def pairs(name: str, entry=entry) -> list[tuple[str, str]]:
                    return [self._parse(v) for v in entry.get(name) or []]

                out.append(
                    Outcome(
                        state=JobState.COMPLETED,
                        released=pairs("released"),
                        dead=pairs("dead"),
                        flow_failed=pairs("flow_failed"),
                        revived=pairs("revived"),
                        outbox=entry.get("outbox") or 0,
                    )
                )
        return out

    def fail_many(self, items: list[tuple]) -> list[Outcome | Exception]:
        """``fail`` for many ``(job, error)`` or ``(job, error, dead)`` in one
        round trip; returns an ``Outcome`` per job. A single failure raises."""
        calls = [self._fail_call(*item) for item in items]
        replies = self.scripts.run_many(calls)
        if len(items) == 1 and isinstance(replies[0], Exception):
            raise replies[0]
        return [r if isinstance(r, Exception) else self._outcome(r) for r in replies]

    def extend_lease(self, job: Job, lease_ms: int | None = None) -> int:
        """Heartbeat: the lease now ends ``lease_ms`` (ms) from now; returns the
        new deadline (ms) and stores it on ``job``. Raises ``JobNotActive``,
        ``LeaseLost``, ``JobNotFound``. DESIGN §5 `extend_lease`."""
        lease = int(lease_ms if lease_ms is not None else self.setting(job.queue, "LEASE_MS"))
        k = self.keys
        deadline = self.scripts.run(
            "extend_lease",
            [k.job(job.queue, job.id), k.queue_key(job.queue, "active")],
            [job.queue, job.id, job.lease or "", self.clock(), lease],
        )
        job.lease_deadline = int(deadline)
        return job.lease_deadline

    def promote_delayed(self, queue: str, limit: int = 1000) -> int:
        """Move up to ``limit`` due delayed jobs to pending; returns how many."""
        k = self.keys
        return int(
            self.scripts.run(
                "promote_delayed",
                [k.queue_key(queue, "delayed"), k.queue_key(queue, "pending")],
                [k.base(queue), self.clock(), limit],
            )
        )

    def recover_stalled(self, queue: str, limit: int = 1000, max_stalls: int = 1) -> Outcome:
        """Active jobs whose lease expired go back to pending; a job that
        stalls more than ``max_stalls`` times dies (its parent's policy
        applies). Returns the ``Outcome`` (``recovered`` count, ``dead``)."""
        k = self.keys
        reply = self.scripts.run(
            "recover_stalled",
            [k.queue_key(queue, "active"), k.queue_key(queue, "pending")],
            [queue, k.base(queue), self.clock(), limit, max_stalls],
        )
        return self._outcome(reply)

    @reports_redis_down
    def retry(self, queue: str, job_id: str) -> Outcome:
        """Retry-by-id of a dead job (DESIGN §4): attempts reset, back to
        pending; a parent that children failed retries them (on any queue) and
        returns to awaiting_children; a retried child re-attaches to the parent
        it failed. ``Outcome.state`` is the job's new state. Raises
        ``JobNotFound``, ``JobNotRetryable`` (with the current state)."""
        k = self.keys
        try:
            reply = self.scripts.run(
                "retry",
                [k.job(queue, job_id), k.queue_key(queue, "dead"), k.queue_key(queue, "pending")],
                [queue, k.base(queue), job_id, self.clock(), secrets.token_hex(8)],
            )
        except JobNotActive as err:
            state = err.parts[2] if len(err.parts) > 2 else "not dead"
            raise JobNotRetryable(
                f"job {job_id!r} in queue {queue!r} is {state}; only a dead job can be retried"
            ) from None
        data = json.loads(reply)
        outcome = self._outcome(reply)
        for ref in data.get("cross") or []:
            cq, cid = self.keys.parse_ref(ref)
            try:
                outcome.merge(self.retry(cq, cid))
            except JobNotRetryable:
                pass  # retried already; its reattach entry is on its way
        from .pump import deliver_entries  # the pump delivers the same entries later

        for entry in data.get("reattach") or []:
            outcome.merge(deliver_entries(self, [json.loads(entry)])[1])
        outcome.state = JobState(_text(self.client.hget(k.job(queue, job_id), "state")))
        return outcome

    # -- flows -------------------------------------------------------------

    def _step_call(self, queue: str, nodes: list, mode: str):
        """One ``enqueue_flow`` call for a step, in the script's flat group
        format (see its header): nodes that share name, parent, policy and
        settings share one group header."""
        k = self.keys
        flat: list[str] = []
        for (name, pid, pq, policy, ma, bo, gate), group in itertools.groupby(
            nodes,
            key=lambda n: (
                n.name,
                n.parent_id,
                n.parent_queue,
                n.policy,
                n.max_attempts,
                n.backoff_ms,
                n.gate,
            ),
        ):
            group = list(group)
            flat += [
                name,
                pid,
                pq,
                policy,
                _opt(ma),
                _opt(bo),
                "1" if gate else "0",
                str(len(group)),
            ]
            for n in group:
                if n.children:
                    refs = k.refs(n.children)
                    flat += [n.id, n.payload, str(len(refs)), *refs]
                else:
                    flat += [n.id, n.payload, "0"]
        # one JSON argument: 9+ ARGV per node cost more in redis-py than in Redis
        return (
            "enqueue_flow",
            [k.queue_key(queue, "pending"), k.queue_key(queue, "awaiting")],
            [queue, k.base(queue), self.clock(), mode, _ENCODER.encode(flat)],
        )

    def add_flow(self, flow: Flow) -> FlowRef:
        """Land a flow (a tree of ``Flow`` nodes); returns its ``FlowRef``.

        One queue: one atomic script. Several queues: parent first, one script
        per (depth, queue) step, stopping at the first error with every parent
        already landed held (DESIGN §6); adding the same flow again completes
        it, skipping rows already there. Raises ``FlowError`` (duplicate ids,
        cycle), ``ValueError`` (names), ``PayloadError``, ``FlowConflict`` (an
        id taken by another job or flow: nothing written when found before
        the first write), ``RedisUnavailable``.
        """
        return self.add_flows([flow])[0]

    def add_flows(self, flows: list[Flow]) -> list[FlowRef]:
        """Land several flows. Every flow on a single queue goes in one
        pipelined round trip (its chunks in order: one slot, one connection);
        a cross-queue flow lands step by step, parent first. Same errors as
        ``add_flow``; when a flow takes more than one script, every user-given
        id is gated by a read-only pass before the first write."""
        plans = [_flows.plan(f, self.encode) for f in flows]
        seen: set = set()
        for nodes in plans:
            for n in nodes:
                if n.gate:
                    if (n.queue, n.id) in seen:
                        raise _flows.FlowError(
                            f"job id {n.id!r} in queue {n.queue!r} is in two flows"
                        )
                    seen.add((n.queue, n.id))
        all_steps = [_flows.steps(nodes, self.flow_chunk) for nodes in plans]
        gated = [any(n.gate for n in nodes) for nodes in plans]
        checks = [
            self._step_call(q, ns, "check")
            for s, g in zip(all_steps, gated, strict=False)
            if len(s) > 1 and g
            for q, ns in s
        ]
        for reply in self.scripts.run_many(checks):
            if isinstance(reply, Exception):
                raise reply
        # single-queue flows: every chunk of every such flow in one pipeline
        one_queue = [i for i, nodes in enumerate(plans) if len({n.queue for n in nodes}) == 1]
        calls = [(i, self._step_call(q, ns, "write")) for i in one_queue for q, ns in all_steps[i]]
        counts: dict[int, list] = {i: [] for i in range(len(plans))}
        for (i, _), reply in zip(calls, self.scripts.run_many([c for _, c in calls]), strict=False):
            if isinstance(reply, Exception):
                raise reply
            counts[i].append(reply)
        for i, step_list in enumerate(all_steps):
            if i in one_queue:
                continue
            for n, (queue, ns) in enumerate(step_list):
                counts[i].append(self.scripts.run(*self._step_call(queue, ns, "write")))
                if self.fault_hook:
                    self.fault_hook(n, queue, ns)
        refs = []
        for i, nodes in enumerate(plans):
            root = nodes[0]
            refs.append(
                FlowRef(
                    queue=root.queue,
                    parent_id=root.id,
                    child_ids=[cid for _, cid in root.children],
                    nodes=[(n.queue, n.id) for n in nodes],
                    landed=sum(int(c[0]) for c in counts[i]),
                    skipped=sum(int(c[1]) for c in counts[i]),
                )
            )
        return refs
