"""What every part of ``EchoMQ`` shares: one client, the keys, the script
loader, the clock, the queues' settings and the payload encoder
(docs/explanation/house.md, "protocol/").

``Wire`` holds them; ``Part`` is the base of each part (``EchoMQ`` itself,
``mq.outbox``, ``mq.lifecycle``, ``mq.signal_events``, ...), which reads them
from its wire, so a clock a test sets on the ``EchoMQ`` is every part's
clock. It builds three script calls: ``lua/claim.lua``'s (``Wire.claim_call``:
``EchoMQ.claim`` runs it alone, ``EchoMQ.complete_then_claim`` after
completions in the same round trip), ``lua/complete.lua``'s
(``Wire.complete_call``, for ``EchoMQ.complete`` and ``complete_many``) and
``lua/fail.lua``'s (``Wire.fail_call``, for ``EchoMQ.fail_many``);
``run_or_error`` runs the one a caller names. ``Wire.extend_leases`` runs
``lua/extend_lease.lua``'s for ``EchoMQ.extend_leases``.
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

from ..core.claims import claimed_jobs, said_expired
from ..core.exceptions import EchoMQError, PayloadError, RedisUnavailable
from ..core.jobs import (
    MAX_LEASE_MS,
    QUEUE_DEFAULTS,
    JobState,
    Outcome,
    to_json,
    to_json_many,
    to_text,
)
from ..core.keyspace import Keyspace, validate_queue, whole_number
from ..core.options import Claimed, rate_limit
from ..core.refs import JobRef, RefDict, RefList, str_keys
from .errors import reports_redis_down, translate, translating
from .scripts import Scripts

BACKOFF_CAP_MS = 3_600_000
FLOW_CHUNK = 5000  # nodes per enqueue_flow script: keeps one script well under ~50 ms
MAX_QUEUES = 10_000  # names P:queues holds; past it new queues are not added (a warning)
REGISTER_EVERY_S = 60.0  # a process re-adds a queue it writes to at most this often
JOINED = "\x1f"  # joins complete's jobs into one argument: in no id, lease or JSON text

log = logging.getLogger("echomq_django.client")


CALL_TOKEN = re.compile(r"[0-9A-Za-z._-]{1,64}")  # claim's call token (a key part)


def now_ms() -> int:
    """Wall-clock time in ms since the epoch."""
    return time.time_ns() // 1_000_000


def opt(value) -> str:
    """An optional integer as script text: '' means "the queue's setting"."""
    return "" if value is None else str(int(value))


class Wire:
    """The state every part shares; built once per ``EchoMQ``.

    ``client``: a redis-py ``Redis`` or ``RedisCluster``; ``prefix`` starts
    every key; ``queues``: ``{name: {"MAX_ATTEMPTS": int, "BACKOFF_MS": ms,
    "LEASE_MS": ms, ...}}``; ``clock``: a callable returning ms since the
    epoch; ``max_payload_bytes``: the bound of one encoded payload or result
    (bytes); ``json_encoder``: a ``json.JSONEncoder`` subclass, or None for
    plain JSON. Raises ``ValueError`` for a bad queue name in ``queues``.
    """

    def __init__(
        self,
        client: redis.Redis,
        prefix: str,
        *,
        queues: dict | None,
        clock,
        max_payload_bytes: int,
        backoff_cap_ms: int,
        flow_chunk: int,
        json_encoder: type[json.JSONEncoder] | None,
    ) -> None:
        self.client = client
        self.keys = Keyspace(prefix)
        self.scripts = Scripts(client)
        self.queues = {validate_queue(q): dict(v or {}) for q, v in (queues or {}).items()}
        self.clock = clock or now_ms
        self.max_payload_bytes = max_payload_bytes
        # None: the fast plain-JSON path (jobs.to_json); else this encoder's
        # class, e.g. Django's DjangoJSONEncoder
        self._to_json = to_json
        if json_encoder is not None:
            self._to_json = json_encoder(
                separators=(",", ":"), allow_nan=False, ensure_ascii=True
            ).encode
        self.backoff_cap_ms = backoff_cap_ms
        self.cross_queue_scripts = (
            False  # EchoMQ sets it: complete's ARGV[4], enqueue_flow's ARGV[6]
        )
        self.flow_chunk = flow_chunk
        self.fault_hook = None  # tests: called after each flow step, may raise
        self._noted: dict[str, float] = {}  # queue -> monotonic time it was added to P:queues
        self._noted_lock = threading.Lock()

    def setting(self, queue: str, name: str) -> int:
        """A queue's ``MAX_ATTEMPTS`` / ``BACKOFF_MS`` / ``LEASE_MS``."""
        return int(self.queues.get(queue, {}).get(name, QUEUE_DEFAULTS[name]))

    def claim_limits(self, queue: str) -> tuple:
        """``claim``'s limit ARGV from the settings: RATE_LIMIT ``(max, per_ms,
        mode)`` and CONCURRENCY (0: none; docs/explanation/protocol.md#concurrency)."""
        opts = self.queues.get(queue, {})
        return (*rate_limit(opts), opts.get("CONCURRENCY", 0))

    def claim_call(
        self,
        queue: str,
        count: int,
        lease_ms: int | None,
        token: str | None,
        yields_to: tuple[str, str] | None = None,
    ):
        """One ``claim`` script call (``EchoMQ.claim`` checks and runs it, alone
        or after completions): ``(call, now ms, lease ms)``. ``yields_to``:
        ``(queue, token)`` of a claim sent with it in the same round trip on one
        server; once that one has leased jobs, this one takes none
        (docs/explanation/protocol.md#claim). Raises ``ValueError`` for a bad
        ``count``, ``lease_ms`` or ``token``, and for ``yields_to`` where the two
        queues' slots may be apart (not ``cross_queue_scripts``: a Redis Cluster)."""
        whole_number("count", count, 1)
        whole_number("lease_ms", lease_ms, 1, optional=True, high=MAX_LEASE_MS)
        if token is not None and not CALL_TOKEN.fullmatch(str(token)):
            raise ValueError(f"token {token!r}: a claim token is 1-64 of [0-9A-Za-z._-]")
        lease = int(lease_ms if lease_ms is not None else self.setting(queue, "LEASE_MS"))
        now = self.clock()
        k, token = self.keys.queue(queue), token or secrets.token_hex(8)
        if yields_to is not None and not self.cross_queue_scripts:
            raise ValueError("yields_to: a claim yielding to another queue's needs one server")
        memo = (
            k.claim(token)
            if yields_to is None
            else self.keys.queue(yields_to[0]).claim(yields_to[1])
        )
        limits, group_cap = self.claim_limits(queue), self.group_cap(queue)
        args = [k.base, count, now, lease, token, *limits, queue, group_cap, self.group_rate(queue)]
        return ("claim", [k.pending, k.active, k.lease_seq, memo], args), now, lease

    def claim_calls(self, queue: str, count: int, lease_ms, token: str, or_else=None) -> list:
        """``(queue, call, now ms, lease ms)`` of ``claim_call(queue, count, lease_ms,
        token)`` and, with ``or_else`` ``(queue2, lease_ms2, token2)``, of a claim of
        ``queue2``, each yielding to the other (the slot they fill is one). Raises
        ``ValueError`` as ``claim_call`` does (an ``or_else`` on a Redis Cluster)."""
        if or_else is None:
            return [(queue, *self.claim_call(queue, count, lease_ms, token))]
        queue2, lease_ms2, token2 = or_else  # each yields to the other (a resend too)
        return [
            (queue, *self.claim_call(queue, count, lease_ms, token, (queue2, token2))),
            (queue2, *self.claim_call(queue2, count, lease_ms2, token2, (queue, token))),
        ]

    def complete_call(self, queue: str, pairs: list, writes: str = "", now: int | None = None):
        """One ``complete`` script call for ``(job, result JSON)`` pairs of
        ``queue``; ``writes``: their pending progress and log writes
        (``Progress.carried``, ARGV[5] of lua/complete.lua), '' for none;
        ``now``: the time (ms) they finished at, None: the clock's.
        ARGV[4] says whether a cross-queue parent is resolved in the call
        (``cross_queue_scripts``, docs/explanation/protocol.md#fan-in-on-one-server)."""
        k = self.keys.queue(queue)
        now = self.clock() if now is None else now
        # ARGV[6]: every job's id, lease and result in one argument, joined by 0x1F
        jobs = JOINED.join(
            [part for job, text in pairs for part in (job.id, job.lease or "", text)]
        )
        args = [queue, k.base, now, "1" if self.cross_queue_scripts else "0", writes, jobs]
        return ("complete", [k.active, k.completed], args)

    def extend_leases(self, jobs: list, lease_ms, batch: int) -> list:
        """``EchoMQ.extend_leases``: lua/extend_lease.lua once per ``batch`` jobs of a queue,
        at ``lease_ms`` (ms; a ``{queue: ms}`` mapping; None: the queue's LEASE_MS) from now,
        pipelined; per job its new deadline (ms, stored on the job) or its refusal."""
        for lease in lease_ms.values() if isinstance(lease_ms, dict) else [lease_ms]:
            whole_number("lease_ms", lease, 1, optional=True, high=MAX_LEASE_MS)  # before a call
        by_queue: dict[str, list[int]] = {}
        for i, job in enumerate(jobs):
            by_queue.setdefault(job.queue, []).append(i)
        calls, slots, now = [], [], self.clock()
        for queue, idx in by_queue.items():
            k, lease = self.keys.queue(queue), lease_ms
            lease = lease.get(queue) if isinstance(lease, dict) else lease
            lease = self.setting(queue, "LEASE_MS") if lease is None else lease
            for at in range(0, len(idx), batch):
                part = idx[at : at + batch]
                ids = JOINED.join([p for i in part for p in (jobs[i].id, jobs[i].lease or "")])
                calls.append(("extend_lease", [k.active], [queue, k.base, now, lease, ids]))
                slots.append(part)
        if len(calls) == 1:
            replies = [self.run_or_error(*calls[0])]
        else:
            replies = self.scripts.run_many(calls)
        out: list = [None] * len(jobs)
        for idx, reply in zip(slots, replies, strict=True):
            entries = reply if isinstance(reply, list) else [reply] * len(idx)  # a refused call
            for i, entry in zip(idx, entries, strict=True):
                if isinstance(entry, int):
                    out[i] = jobs[i].lease_deadline = entry
                else:
                    out[i] = entry if isinstance(entry, Exception) else translate(to_text(entry))
        return out

    def fail_call(self, job, error: str, dead: bool = False, delay_ms: int | None = None):
        """One ``fail`` script call for ``job`` (lua/fail.lua; ``delay_ms``: None, the backoff)."""
        q, k = job.queue, self.keys.queue(job.queue)
        args = [q, k.base, job.id, job.lease or "", str(error), self.clock()]
        args += [self.backoff_cap_ms, "1" if dead else "0"]
        args += [self.setting(q, "MAX_ATTEMPTS"), self.setting(q, "BACKOFF_MS"), opt(delay_ms)]
        return "fail", [k.job(job.id), k.delayed], args

    def claimed_each(self, claims: list, replies: list, source) -> list:
        """Each ``claim_calls`` entry's reply as ``claimed`` makes it (an exception kept)."""
        return [
            reply if isinstance(reply, Exception) else self.claimed(q, reply, now, lease, source)
            for (q, _, now, lease), reply in zip(claims, replies, strict=True)
        ]

    def claimed(self, queue: str, reply, now: int, lease: int, source) -> Claimed:
        """A ``claim`` script's ``reply`` as a ``Claimed``: its jobs leased
        until ``now + lease`` (ms; a replay's own rest), ``source`` (the
        ``EchoMQ``) their handle for what a running job reports."""
        flat, expired = json.loads(reply), ()
        if type(flat) is dict:
            if "jobs" not in flat:
                paused, full = bool(flat.get("paused")), bool(flat.get("full"))
                return Claimed(paused=paused, wait_ms=flat.get("wait"), full=full)
            lease = max(int(flat.get("left", lease)), 0)  # a replay: its leases' rest
            flat, expired = flat["jobs"], said_expired(queue, flat.get("expired", ()))
        return Claimed(claimed_jobs(queue, flat, now + lease, source), expired=expired)

    def group_cap(self, queue: str) -> int:
        """The queue's ``GROUP_CONCURRENCY`` setting (jobs of one group active
        at once; 0: none; docs/explanation/protocol.md#groups)."""
        return self.queues.get(queue, {}).get("GROUP_CONCURRENCY", 0)

    def group_rate(self, queue: str) -> str:
        """The queue's ``GROUP_RATE_LIMIT`` as ``claim`` takes it,
        ``'max:per_ms'`` ('' for none; docs/explanation/protocol.md#groups)."""
        limit = self.queues.get(queue, {}).get("GROUP_RATE_LIMIT")  # checked: E081
        return f"{limit['MAX']}:{limit['PER_MS']}" if limit else ""

    def encode(self, value: Any, what: str = "payload") -> str:
        """``value`` as compact JSON text; a ``JobRef`` dict key is written as
        its ``"queue/id"`` text (docs/howto/read-flows.md#job-references). Raises
        ``PayloadError`` when it is not JSON-serialisable (NaN included) or
        is over ``max_payload_bytes``."""
        try:
            try:
                text = self._to_json(value)
            except TypeError:
                keyed, found = str_keys(value)  # only on this error path: no cost otherwise
                if not found:
                    raise
                text = self._to_json(keyed)
        except (TypeError, ValueError) as err:
            raise PayloadError(f"{what} is not JSON-serialisable: {err}") from None
        except RecursionError:  # no circular check in _C_ENCODE: it recurses instead
            raise PayloadError(
                f"{what} is not JSON-serialisable: circular reference or nested too deeply"
            ) from None
        size = len(text)  # ASCII: escapes keep it one byte per character
        if size > self.max_payload_bytes:
            raise PayloadError(
                f"{what} is {size} bytes of JSON; the limit is {self.max_payload_bytes} "
                "bytes (ECHOMQ MAX_PAYLOAD_BYTES; EchoMQ's max_payload_bytes)"
            )
        return text

    def encode_many(self, values: list, what: str = "payload") -> list[str]:
        """``encode`` of each of ``values`` (a list), in order, with the same
        errors: the dicts and lists, a flow's usual payloads, by one C
        encoder call each with no per-value checks, the size limit checked
        once on the longest (docs/explanation/performance.md#the-adds-python);
        any value that fails there is encoded again by ``encode``, which
        raises its ``PayloadError``."""
        if self._to_json is to_json:
            try:
                texts = to_json_many(values)
            except (TypeError, ValueError, RecursionError):
                texts = None
            if texts is not None and (not texts or max(map(len, texts)) <= self.max_payload_bytes):
                return texts
        return [self.encode(v, what) for v in values]

    def run_or_error(self, name: str, keys: list, args: list):
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

    def complete_replies(self, reply, n: int) -> list[Outcome | Exception]:
        """Decode a ``complete`` reply into an ``Outcome`` or an exception
        per job (``sent``: the outbox entries the job pushed, as pushed; a
        ``JobCancelled`` carries its death's as ``sent`` too); a failed
        script call stands for each of its ``n`` jobs."""
        if isinstance(reply, Exception):
            return [reply] * n
        out: list[Outcome | Exception] = []
        for entry in json.loads(reply):
            if entry == 0:
                out.append(Outcome(state=JobState.COMPLETED))
            elif isinstance(entry, str):
                out.append(translate(entry))
            elif "error" in entry:  # cancelled while it ran: its death's entries ride along
                err = translate(entry["error"])
                err.sent = entry.get("sent") or []
                out.append(err)
            else:
                out.append(Outcome.from_data(entry, self.parse, JobState.COMPLETED))
        return out

    def parse(self, value: str) -> JobRef:
        """The ``JobRef`` of a ``P:{q}:<id>`` string a script answers."""
        return JobRef._trusted(*self.keys.parse_base_id(value))

    def ref(self, key: Any) -> JobRef:
        """The ``JobRef`` of a child ref ``P:{q}:job:<id>`` (bytes or str)
        read from Redis: the one place a key becomes what the public API
        shows (docs/howto/read-flows.md#job-references). ``ValueError`` for a string that
        is not a job key under this prefix."""
        return JobRef._trusted(*self.keys.parse_ref(to_text(key)))

    def ref_dict(self, mapping: dict, value=to_text) -> RefDict:
        """``{child ref: raw value}`` as ``{JobRef: value(raw)}``, still
        answering a lookup by the raw key for a release (``RefDict``)."""
        ref = self.ref
        return RefDict(((ref(k), value(v)) for k, v in mapping.items()), self.keys.parse_ref)

    def ref_list(self, refs) -> RefList:
        """Child refs as ``JobRef``\\ s in a ``RefList``."""
        return RefList(map(self.ref, refs), self.keys.parse_ref)

    def outcome(self, reply: Any) -> Outcome:
        """A script's JSON reply as an ``Outcome``."""
        return Outcome.from_reply(reply, self.parse)

    # -- every queue ever used (P:queues, docs/explanation/house.md) ----------------------
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
            pipe = self.client.pipeline(transaction=False)
            pipe.sadd(key, *new)
            now, served = self.clock(), self.keys.served()
            for name in new:  # "no worker since": its first use, until a worker beats on it
                pipe.hsetnx(served, name, now)
            pipe.execute()
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


def local(method):
    """Mark a public method of a part that sends no Redis command: it is
    left unwrapped (``Part`` wraps the others with ``errors.translating``),
    which keeps a frame off a per-job path such as ``setting``."""
    method.translating = True
    return method


class Part:
    """The base of each part of ``EchoMQ``: ``client``, ``keys`` and
    ``scripts`` of its ``wire``, and the wire's clock (ms since the epoch).

    Every public method a part defines raises our errors only: redis-py's
    are translated at this edge (``errors.translating``)."""

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        for name, value in list(vars(cls).items()):
            if name.startswith("_") or not callable(value) or isinstance(value, type):
                continue
            if isinstance(value, staticmethod | classmethod):
                continue
            if not getattr(value, "translating", False):
                setattr(cls, name, translating(value))

    def __init__(self, wire: Wire) -> None:
        self.wire = wire
        self.client = wire.client
        self.keys = wire.keys
        self.scripts = wire.scripts

    @property
    def clock(self):
        """The wire's clock: a callable returning ms since the epoch."""
        return self.wire.clock
