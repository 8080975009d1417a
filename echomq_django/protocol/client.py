"""``EchoMQ``: the protocol's host half over one Redis connection (DESIGN §7).

Every state transition is one Lua script (scripts.py, ``lua/``); this class
validates input, builds keys (keyspace.py), runs the script and decodes the
reply. Nothing is written when validation fails.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import threading
import time
from typing import Any

import redis

from ..core import flows as _flows
from ..core.exceptions import (
    EchoMQError,
    JobNotActive,
    JobNotRetryable,
    PayloadError,
    RedisUnavailable,
)
from ..core.jobs import (
    CLAIM_FIELDS,
    MAX_PAYLOAD_BYTES,
    QUEUE_DEFAULTS,
    Job,
    JobState,
    Outcome,
    to_json,
    to_text,
)
from ..core.keyspace import Keyspace, validate_id, validate_name, validate_queue, whole_number
from ..core.options import Claimed, check_job_options
from ..core.retention import job_keep
from .bulk import BulkCalls
from .control import SchedulingCalls
from .errors import reports_redis_down, translate
from .flows import FLOW_CHUNK, FlowCalls, opt
from .lifecycle import LifecycleCalls
from .reads import Reads
from .scripts import Scripts
from .signal_events import EventCalls

BACKOFF_CAP_MS = 3_600_000
COMPLETE_BATCH = 500  # jobs per complete script: a few ms of Redis time at most
MAX_QUEUES = 10_000  # names P:queues holds; past it new queues are not added (a warning)
CALL_TOKEN = re.compile(r"[0-9A-Za-z._-]{1,64}")  # claim's call token (a key part)
REGISTER_EVERY_S = 60.0  # a process re-adds a queue it writes to at most this often

log = logging.getLogger("echomq_django.client")


def now_ms() -> int:
    """Wall-clock time in ms since the epoch."""
    return time.time_ns() // 1_000_000


class EchoMQ(FlowCalls, SchedulingCalls, EventCalls, LifecycleCalls, BulkCalls, Reads):
    """The queue over one redis-py client (``redis.Redis`` or ``RedisCluster``).

    The only caller of the Lua scripts: each ``lua/*.lua`` has exactly one
    Python caller, a method of this class (the flow ones in flowcalls.py);
    the pump, worker, mirror and admin call these methods and ``Reads``.

    ``prefix`` starts every key (DESIGN §3). ``queues`` maps a queue name to
    its defaults ``{"MAX_ATTEMPTS": int, "BACKOFF_MS": ms, "LEASE_MS": ms}``;
    missing values come from ``jobs.QUEUE_DEFAULTS``. ``clock`` returns ms since the epoch
    (tests pass a fake one: DESIGN §5 rule 3). ``max_payload_bytes`` bounds a
    payload or result once encoded (bytes of UTF-8 JSON). ``json_encoder``: a
    ``json.JSONEncoder`` subclass for payloads and results (the
    ``JSON_ENCODER`` setting, e.g. ``DjangoJSONEncoder`` for dates, Decimal,
    UUID; DESIGN §10.4); None encodes plain JSON only.
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
        json_encoder: type[json.JSONEncoder] | None = None,
    ) -> None:
        self.client = client
        self.keys = Keyspace(prefix)
        self.scripts = Scripts(client)
        self.queues = {validate_queue(q): dict(v or {}) for q, v in (queues or {}).items()}
        self.clock = clock or now_ms
        self.max_payload_bytes = max_payload_bytes
        # None: the fast plain-JSON path (jobs.to_json); else this encoder's
        # class, e.g. Django's DjangoJSONEncoder (DESIGN §10.4)
        self._to_json = to_json
        if json_encoder is not None:
            self._to_json = json_encoder(
                separators=(",", ":"), allow_nan=False, ensure_ascii=True
            ).encode
        self.backoff_cap_ms = backoff_cap_ms
        self.flow_chunk = flow_chunk
        self.fault_hook = None  # tests: called after each flow step, may raise
        self._noted: dict[str, float] = {}  # queue -> monotonic time it was added to P:queues
        self._noted_lock = threading.Lock()

    # -- helpers -----------------------------------------------------------
    def setting(self, queue: str, name: str) -> int:
        """A queue's ``MAX_ATTEMPTS`` / ``BACKOFF_MS`` / ``LEASE_MS``."""
        return int(self.queues.get(queue, {}).get(name, QUEUE_DEFAULTS[name]))

    def encode(self, value: Any, what: str = "payload") -> str:
        """``value`` as compact JSON text. Raises ``PayloadError`` when it is not
        JSON-serialisable (NaN included) or is over ``max_payload_bytes``."""
        try:
            text = self._to_json(value)
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

    # -- every queue ever used (P:queues, DESIGN §10.5) -----------------------
    @reports_redis_down
    def register_queues(self, queues) -> list[str]:
        """Add ``queues`` to ``P:queues`` unless it holds ``MAX_QUEUES`` names
        already (then a WARNING, nothing added). Returns the names added.
        Raises ``ValueError`` for a bad name, ``RedisUnavailable``."""
        names = [validate_queue(q) for q in dict.fromkeys(queues)]
        key = self.keys.queues()
        pipe = self.client.pipeline(transaction=False)
        pipe.scard(key)
        for name in names:
            pipe.sismember(key, name)
        size, *present = pipe.execute()
        new = [n for n, there in zip(names, present, strict=True) if not there]
        if new and size + len(new) > MAX_QUEUES:
            log.warning(
                "%s holds %d queue names (the bound is %d): %s not added; stats and the "
                "admin find them only through ECHOMQ['QUEUES']",
                key,
                size,
                MAX_QUEUES,
                ", ".join(new),
            )
            return []
        if new:
            self.client.sadd(key, *new)
        return new

    def note_queues(self, queues) -> None:
        """Before a write that may create a queue's first job: make sure each
        of ``queues`` is in ``P:queues``, at most once per ``REGISTER_EVERY_S``
        per queue in this process (a dict lookup otherwise). P:queues is on no
        queue's slot, so no script can add to it (a Cluster refuses keys of
        two slots in one script): the host adds the name first."""
        now = time.monotonic()
        with self._noted_lock:
            due = [
                q for q in queues if now - self._noted.get(q, -REGISTER_EVERY_S) >= REGISTER_EVERY_S
            ]
            for q in due:
                self._noted[q] = now
        if not due:
            return
        try:
            self.register_queues(due)
        except BaseException:
            with self._noted_lock:
                for q in due:
                    self._noted.pop(q, None)
            raise

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
        priority: int = 0,
        timeout_ms: int | None = None,
        dedup_key: str | None = None,
        dedup_ttl_ms: int | None = None,
        keep: int | None = None,
    ) -> str:
        """Add one job; returns its id (generated when ``job_id`` is None).

        ``delay_ms`` (ms) > 0 holds it in ``delayed`` until due. DESIGN §10.3:
        ``priority`` (int, higher runs first); ``timeout_ms`` (ms per attempt,
        default the queue's TIMEOUT_MS); ``dedup_key``: while a job added with
        the same key is live (not completed, not dead), nothing is written and
        that job's id is returned; ``dedup_ttl_ms`` (ms) frees the key sooner.
        DESIGN §10.2: ``keep`` (s, int >= 0) keeps the job at most that long
        after it finishes (0: the next retention step takes it); None: the
        queue's ``KEEP_*`` alone.
        Raises ``ValueError`` for a bad queue name, id, name or option
        (scheduling.py's ranges), ``PayloadError`` for a bad payload,
        ``DuplicateJob`` when the id is taken (nothing written),
        ``RedisUnavailable`` when Redis cannot be reached. DESIGN §5 `enqueue`.
        """
        validate_queue(queue)
        job_id = validate_id(job_id if job_id is not None else _flows.new_id())
        validate_name(name)
        whole_number("max_attempts", max_attempts, 1, optional=True)
        whole_number("backoff_ms", backoff_ms, 0, optional=True)
        whole_number("delay_ms", delay_ms, 0)
        check_job_options(priority, delay_ms, timeout_ms, dedup_key, dedup_ttl_ms)
        own_keep = job_keep(keep)
        k = self.keys.queue(queue)
        self.note_queues((queue,))
        state = self.scripts.run(
            "enqueue",
            [k.job(job_id), k.pending, k.delayed, k.events, k.dedup(dedup_key or "")],
            [
                queue,
                job_id,
                name,
                self.encode(payload),
                opt(max_attempts),
                opt(backoff_ms),
                self.clock(),
                int(delay_ms),
                int(priority),
                dedup_key or "",
                opt(dedup_ttl_ms),
                opt(timeout_ms),
                own_keep,
                secrets.token_hex(8),  # this call's token: its replay is recognised
            ],
        )
        state = to_text(state)
        return state.split(" ", 1)[1] if state.startswith("deduplicated ") else job_id

    def claim(
        self, queue: str, count: int = 1, lease_ms: int | None = None, token: str | None = None
    ) -> list[Job]:
        """Claim up to ``count`` pending jobs of ``queue`` in one call.

        Each returned ``Job`` is active, holds a fresh ``lease`` token and a
        ``lease_deadline`` (ms) = now + ``lease_ms`` (the queue's LEASE_MS by
        default), and has its attempt counted. DESIGN §5 `claim`. The list is
        a ``Claimed``: empty with ``paused`` True when the queue is paused,
        or with ``wait_ms`` set when its RATE_LIMIT window is full (DESIGN
        §10.3); higher priorities come first.

        ``token`` (str, 1-64 of ``[0-9A-Za-z._-]``) names the call; None
        draws a fresh one. Pass the token of a claim that raised a
        connection error (its reply may be lost after Redis ran it): within
        that claim's lease the same jobs come back, with the lease they have
        left, instead of staying active unseen until the lease expires.
        Raises ``ValueError`` for a bad ``count``, ``lease_ms`` or ``token``.
        """
        whole_number("count", count, 1)
        whole_number("lease_ms", lease_ms, 1, optional=True)
        if token is not None and not CALL_TOKEN.fullmatch(str(token)):
            raise ValueError(f"token {token!r}: a claim token is 1-64 of [0-9A-Za-z._-]")
        lease = int(lease_ms if lease_ms is not None else self.setting(queue, "LEASE_MS"))
        now = self.clock()
        k = self.keys.queue(queue)
        flat = json.loads(
            self.scripts.run(
                "claim",
                [k.pending, k.active, k.lease_seq],
                [k.base, count, now, lease, token or secrets.token_hex(8), *self._limit(queue)],
            )
        )
        if type(flat) is dict:
            if "jobs" not in flat:
                return Claimed(paused=bool(flat.get("paused")), wait_ms=flat.get("wait"))
            lease, flat = max(int(flat["left"]), 0), flat["jobs"]  # a replay: its leases' rest
        deadline, n = now + lease, len(CLAIM_FIELDS)
        return Claimed(
            Job.from_claim(
                queue, [v if v is not False else None for v in flat[i : i + n]], deadline, self
            )
            for i in range(0, len(flat), n)
        )

    def _fail_call(self, job: Job, error: str, dead: bool = False):
        q = job.queue
        k = self.keys.queue(q)
        return (
            "fail",
            [k.job(job.id), k.delayed],
            [
                q,
                k.base,
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
        k = self.keys.queue(queue)
        args: list = [queue, k.base, self.clock()]
        for job, text in pairs:
            args += (job.id, job.lease or "", text)
        return ("complete", [k.active, k.completed], args)

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
                out.append(translate(entry))
            else:
                out.append(Outcome.from_data(entry, self._parse, JobState.COMPLETED))
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
        k = self.keys.queue(job.queue)
        deadline = self.scripts.run(
            "extend_lease",
            [k.job(job.id), k.active],
            [job.queue, job.id, job.lease or "", self.clock(), lease],
        )
        job.lease_deadline = int(deadline)
        return job.lease_deadline

    def promote_delayed(self, queue: str, limit: int = 1000) -> int:
        """Move up to ``limit`` due delayed jobs to pending; returns how many."""
        k = self.keys.queue(queue)
        return int(
            self.scripts.run(
                "promote_delayed",
                [k.delayed, k.pending],
                [k.base, self.clock(), limit],
            )
        )

    def recover_stalled(self, queue: str, limit: int = 1000, max_stalls: int = 1) -> Outcome:
        """Active jobs whose lease expired go back to pending; a job that
        stalls more than ``max_stalls`` times dies (its parent's policy
        applies). Returns the ``Outcome`` (``recovered`` count, ``dead``)."""
        k = self.keys.queue(queue)
        reply = self.scripts.run(
            "recover_stalled",
            [k.active, k.pending],
            [queue, k.base, self.clock(), limit, max_stalls],
        )
        return self._outcome(reply)

    @reports_redis_down
    def retry(self, queue: str, job_id: str) -> Outcome:
        """Retry-by-id of a dead job (DESIGN §4): attempts reset, back to
        pending; a parent that children failed retries them (on any queue) and
        returns to awaiting_children; a retried child re-attaches to the parent
        it failed. ``Outcome.state`` is the job's new state. Raises
        ``JobNotFound``, ``JobNotRetryable`` (with the current state)."""
        k = self.keys.queue(queue)
        try:
            reply = self.scripts.run(
                "retry",
                [k.job(job_id), k.dead, k.pending],
                [queue, k.base, job_id, self.clock(), secrets.token_hex(8)],
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
        # now, not at the next sweep; out of the outbox once delivered
        outcome.merge(self.deliver_sent(queue, list(data.get("reattach") or [])))
        outcome.state = self.state_of(queue, job_id)
        return outcome
