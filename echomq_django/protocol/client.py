"""``EchoMQ``: the queue over one Redis connection, composed of parts (docs/explanation/house.md,
"protocol/"). ``EchoMQ`` is the user API: the one-job transitions defined here
(``lua/enqueue.lua``; ``claim``, ``complete`` and ``fail`` run the calls ``Wire.claim_call``,
``Wire.complete_call`` and ``Wire.fail_call`` build, ``extend_leases`` ``Wire.extend_leases``),
the read API of ``Reads``, and the calls it hands to its parts: flows (``mq.flows``), bulk adds
(``mq.bulk``), retry, remove and cancel (``mq.lifecycle``), waiting for a result (``mq.waits``),
what a running job reports (``mq.progress``, through its ``Job``), following events
(``mq.events(...)``). What only the runners, the admin and monitoring call lives on the parts
they name: ``mq.outbox``, ``mq.timers``, ``mq.signal_events``, ``mq.presence``, ``mq.probes``.
Each part is a small class over the one ``Wire`` (``wire.py``) they share; this class validates
input, builds keys, runs the script and decodes the reply; nothing is written when validation
fails.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable
from typing import Any

import redis
from redis import RedisCluster

from ..core import flows as _flows
from ..core.exceptions import PayloadError
from ..core.flows import Flow, FlowRef
from ..core.jobs import MAX_PAYLOAD_BYTES, Job, JobState, Outcome, to_text
from ..core.keyspace import validate_id, validate_name, validate_queue, whole_number
from ..core.options import Claimed, check_attempts, check_group, check_job_options
from ..core.refs import JobRef, as_ref
from ..core.retention import job_keep
from ..core.retry import job_extras, policy_keywords
from ..tracing.spans import adding
from .bulk import Bulk
from .control.commands import WorkerCommands
from .control.groups import Groups
from .control.limits import Limits
from .control.schedules import ScheduleStore
from .flows import Flows
from .lifecycle import BUDGET, Lifecycle, Report
from .live.events import Events
from .live.progress import Progress
from .live.waits import Waits
from .outbox import Outbox
from .presence import Presence
from .probes import Probes
from .reads import Reads
from .signal_events import SignalEvents
from .timers import Timers
from .wire import BACKOFF_CAP_MS, FLOW_CHUNK, Wire, local, opt

COMPLETE_BATCH = 500  # jobs per complete script: a few ms of Redis time at most


class EchoMQ(Reads):
    """The queue over one redis-py client (``redis.Redis`` or ``RedisCluster``).

    Holds its parts (the module docstring says who calls which): ``flows``, ``bulk``,
    ``lifecycle``, ``outbox``, ``timers``, ``signal_events``, ``presence``, ``probes``,
    ``waits``, ``progress``, ``events``, ``limits``, ``schedule_store``, ``groups``, ``commands``.

    ``prefix`` starts every key (docs/explanation/protocol.md#keys). ``queues`` maps a queue name to
    its defaults ``{"MAX_ATTEMPTS": int, "BACKOFF_MS": ms, "LEASE_MS": ms}``; missing values come
    from ``jobs.QUEUE_DEFAULTS``. ``clock`` returns ms since the epoch (tests pass a fake one:
    docs/explanation/protocol.md#the-hosts-clock). ``max_payload_bytes`` bounds a payload or result
    once encoded (bytes of UTF-8 JSON). ``json_encoder``: a ``json.JSONEncoder`` subclass for
    payloads and results (the ``JSON_ENCODER`` setting, e.g. ``DjangoJSONEncoder`` for dates,
    Decimal, UUID); None encodes plain JSON only. ``cross_queue_scripts``: the
    ``CROSS_QUEUE_SCRIPTS`` setting, read back as the property of that name.
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
        cross_queue_scripts: bool = True,
    ) -> None:
        limits = {"max_payload_bytes": max_payload_bytes, "backoff_cap_ms": backoff_cap_ms}
        wire = Wire(client, prefix, queues=queues, clock=clock, flow_chunk=flow_chunk, **limits,
                    json_encoder=json_encoder)  # fmt: skip
        super().__init__(wire)
        wire.cross_queue_scripts = cross_queue_scripts and not isinstance(client, RedisCluster)
        self.queues, self.outbox, self.bulk, self.timers = (
            wire.queues,
            Outbox(wire),
            Bulk(wire),
            Timers(wire),
        )
        self.flows, self.lifecycle = Flows(wire, self), Lifecycle(wire, self.outbox, self)
        self.signal_events = SignalEvents(wire)
        self.presence = Presence(wire)
        self.probes = Probes(wire)
        self.waits, self.progress, self.events = Waits(wire, self), Progress(wire), Events(wire)
        self.limits, self.schedule_store = Limits(wire), ScheduleStore(wire)
        self.groups = Groups(wire)  # docs/explanation/protocol.md#groups
        self.commands = WorkerCommands(wire, self.presence)

    @property
    def cross_queue_scripts(self) -> bool:
        """True (bool) when scripts reach the keys of other queues: one server (not a
        ``RedisCluster``) and ``cross_queue_scripts``. A cross-queue flow's steps then land in
        one round trip and ``complete`` resolves a cross-queue parent
        (docs/explanation/protocol.md#cross-queue-scripts-on-one-server)."""
        return self.wire.cross_queue_scripts

    @cross_queue_scripts.setter
    def cross_queue_scripts(self, value: bool) -> None:
        # no effect on a Cluster: a script there reaches its own slot's keys only
        self.wire.cross_queue_scripts = bool(value) and not isinstance(self.client, RedisCluster)

    @property
    def clock(self):
        """The clock every part reads: a callable returning ms since the
        epoch (tests set a fake one)."""
        return self.wire.clock

    @clock.setter
    def clock(self, value) -> None:
        self.wire.clock = value

    # -- helpers -----------------------------------------------------------
    @local
    def setting(self, queue: str, name: str) -> int:
        """A queue's ``MAX_ATTEMPTS`` / ``BACKOFF_MS`` / ``LEASE_MS`` (``Wire.setting``)."""
        return self.wire.setting(queue, name)

    @local
    def encode(self, value: Any, what: str = "payload") -> str:
        """``value`` as compact JSON text (``Wire.encode``). Raises
        ``PayloadError`` when it is not JSON-serialisable or over
        ``max_payload_bytes``."""
        return self.wire.encode(value, what)

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
        group: str | None = None,
        **policy: Any,
    ) -> str:
        """Add one job; returns its id (generated when ``job_id`` is None).

        ``delay_ms`` (ms) > 0 holds it in ``delayed`` until due.
        docs/explanation/protocol.md#scheduling:
        ``priority`` (int, higher runs first); ``timeout_ms`` (ms per attempt,
        default the queue's TIMEOUT_MS); ``dedup_key``: while a job added with
        the same key is live (not completed, not dead), nothing is written and
        that job's id is returned; ``dedup_ttl_ms`` (ms) frees the key sooner.
        docs/explanation/lifecycle.md: ``keep`` (s, int >= 0) keeps the job at most that long
        after it finishes (0: the next retention step takes it); None: the
        queue's ``KEEP_*`` alone. docs/howto/retries.md, ``policy``:
        ``expires_ms`` (ms after it is due; default the queue's EXPIRES_MS):
        not started by then, it dies ``expired``; ``backoff``, ``jitter``,
        ``retry_on``, ``dont_retry_on``; ``on_success`` / ``on_failure`` /
        ``on_dead`` (a handler name, or a ``(queue, name)`` pair for a job
        on another queue; ``core/retry.py`` checks them all).
        ``group`` (str, ``keyspace.GROUP_RULE``; None: none): the job is
        claimed in its group's turn, under its group's cap
        (docs/explanation/protocol.md#groups).
        Raises ``ValueError`` for a bad queue name, id, name, group or option
        (core/options.py's ranges), ``PayloadError`` for a bad payload,
        ``DuplicateJob`` when the id is taken (nothing written),
        ``RedisUnavailable`` when Redis cannot be reached. docs/explanation/protocol.md#enqueue.
        """
        validate_queue(queue)
        job_id = validate_id(job_id if job_id is not None else _flows.new_id())
        validate_name(name)
        check_attempts(max_attempts, backoff_ms)
        whole_number("delay_ms", delay_ms, 0)
        check_job_options(priority, delay_ms, timeout_ms, dedup_key, dedup_ttl_ms)
        check_group(group)
        own_keep = job_keep(keep)
        now = self.clock()
        retry, expires_at, callbacks = job_extras(
            now + delay_ms, self.queues.get(queue) or {}, **policy_keywords(policy)
        )
        k, text = self.keys.queue(queue), self.encode(payload)  # refused here: nothing written
        self.wire.note_queues((queue,))
        with adding("enqueue", queue, job_id) as traceparent:  # docs/howto/tracing.md
            state = self.scripts.run(
                "enqueue",
                [k.job(job_id), k.pending, k.delayed, k.events, k.dedup(dedup_key or "")],
                [
                    queue,
                    job_id,
                    name,
                    text,
                    opt(max_attempts),
                    opt(backoff_ms),
                    now,
                    int(delay_ms),
                    int(priority),
                    dedup_key or "",
                    opt(dedup_ttl_ms),
                    opt(timeout_ms),
                    own_keep,
                    secrets.token_hex(8),  # this call's token: its replay is recognised
                    traceparent,
                    retry,
                    expires_at,
                    callbacks,
                    group or "",
                ],
            )
        state = to_text(state)
        return state.split(" ", 1)[1] if state.startswith("deduplicated ") else job_id

    def claim(
        self,
        queue: str,
        count: int = 1,
        lease_ms: int | None = None,
        token: str | None = None,
        yields_to: tuple[str, str] | None = None,
    ) -> list[Job]:
        """Claim up to ``count`` pending jobs of ``queue`` in one call.

        Each returned ``Job`` is active, holds a fresh ``lease`` token and a
        ``lease_deadline`` (ms) = now + ``lease_ms`` (the queue's LEASE_MS by
        default), and has its attempt counted. docs/explanation/protocol.md#claim. The list is
        a ``Claimed``: empty with ``paused`` True when the queue is paused, ``wait_ms`` set
        when its RATE_LIMIT window is full (docs/explanation/protocol.md#scheduling), or
        ``full`` True when its concurrency cap is reached; higher priorities come first.

        ``token`` (str, 1-64 of ``[0-9A-Za-z._-]``) names the call; None draws a fresh
        one. Pass the token of a claim that raised a connection error (its reply may be
        lost after Redis ran it): within that claim's lease the same jobs come back, with
        the lease they have left, instead of staying active unseen until it expires.
        ``yields_to``: ``(queue, token)`` of the claim it was sent with (``or_else`` of
        ``complete_then_claim``): it takes nothing once that one has leased jobs. Raises
        ``ValueError`` for a bad ``count``, ``lease_ms`` or ``token``, or a ``yields_to``
        on a Redis Cluster."""
        call, now, lease = self.wire.claim_call(queue, count, lease_ms, token, yields_to)
        return self.wire.claimed(queue, self.scripts.run(*call), now, lease, self)

    def complete(self, job: Job, result: Any = None) -> Outcome:
        """Complete an active job with a JSON-serialisable ``result``.

        Fans in to its parent (docs/explanation/protocol.md#complete). Returns the ``Outcome``
        (parents released). Raises ``PayloadError`` for a bad result (the job
        stays active), ``JobNotFound``, ``JobNotActive``, ``LeaseLost``.
        """
        text = self.encode(result, "result")
        call = self.wire.complete_call(job.queue, [(job, text)])
        reply = self.wire.complete_replies(self.wire.run_or_error(*call), 1)[0]
        if isinstance(reply, Exception):
            raise reply
        job.state = JobState.COMPLETED
        return reply

    def fail(
        self, job: Job, error: str, *, dead: bool = False, delay_ms: int | None = None
    ) -> JobState:
        """Fail an active job; returns its new state: delayed (``delay_ms`` ms,
        a retry policy's, docs/howto/retries.md; None: ``backoff_ms *
        2**(attempts-1)`` ms, capped), pending (no wait) or dead (attempts
        spent, or ``dead=True``). A dead child resolves its parent by its
        policy. Raises ``ValueError`` (bad ``delay_ms``, nothing written),
        ``JobNotFound``, ``JobNotActive``, ``LeaseLost``.
        docs/explanation/protocol.md#fail; ``fail_many`` returns outcomes."""
        whole_number("delay_ms", delay_ms, 0, optional=True)
        outcome = self.fail_many([(job, error, dead, delay_ms)])[0]
        job.state = outcome.state
        return outcome.state

    def complete_many(
        self, items: list[tuple[Job, Any]], ahead: list | None = None, carry: dict | None = None
    ) -> list[Outcome | Exception]:
        """``complete`` for many jobs in one round trip; an exception object
        (``PayloadError``, ``LeaseLost``...) stands in for each one refused.
        A queue's jobs go to one ``complete`` script per ``COMPLETE_BATCH``
        (each job its own checked transition); queues are pipelined.
        ``ahead``: script calls ``(name, keys, args)`` run first in the same
        round trip (pending progress and log writes, ``mq.progress.calls``),
        each replaced in place by its reply (an exception if refused).
        ``carry``: these jobs' pending writes, each popped and written by its
        job's ``complete`` call, ahead of its completion (``Progress.carried``)."""
        return self._complete_many(items, ahead, None, carry)[0]

    def complete_then_claim(
        self,
        items: list[tuple[Job, Any]],
        queue: str,
        count: int,
        lease_ms: int | None,
        token: str,
        ahead: list | None = None,
        carry: dict | None = None,
        or_else: tuple[str, int | None, str] | None = None,
    ) -> tuple[list[Outcome | Exception], Claimed | Exception | tuple]:
        """``complete_many(items, ahead, carry)``, then ``claim(queue, count, lease_ms,
        token)`` in the same round trip, at one time: a parent they released on ``queue``
        is claimed at once (docs/explanation/no-polling.md#a-released-parent-starts-at-once);
        ``or_else``: ``(queue2, lease_ms2, token2)``, a claim yielding to it
        (``Wire.claim_calls``). Returns the replies and the ``Claimed`` (or its exception;
        a pair with ``or_else``). Raises as ``claim_calls`` does, and ``RedisUnavailable``."""
        claims = self.wire.claim_calls(queue, count, lease_ms, token, or_else)
        then = [call for _, call, _, _ in claims]
        out, got = self._complete_many(items, ahead, then, carry, claims[0][2])
        claimed = self.wire.claimed_each(claims, got, self)
        return out, claimed[0] if or_else is None else tuple(claimed)

    def _complete_many(self, items: list, ahead, then, carry=None, now=None) -> tuple[list, Any]:
        """``complete_many``, ``ahead`` before it and ``then`` (script calls, or None) after
        it, in one round trip, at ``now`` (ms; None: the clock's; ``then``'s own: a parent it
        claims starts no earlier than the child that released it finished), and their replies."""
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
                pairs = [(job, text) for _, job, text in part]
                writes = self.progress.carried(queue, pairs, carry) if carry else ""
                calls.append(self.wire.complete_call(queue, pairs, writes, now))
                slots.append([i for i, _, _ in part])
        calls.extend(then or ())
        if ahead or len(calls) != 1:
            replies = self.scripts.run_after(ahead, calls)
        else:
            replies = [self.wire.run_or_error(*calls[0])]
        extra = replies[len(slots) :] if then is not None else None
        for idx, reply in zip(slots, replies, strict=False):
            for i, entry in zip(idx, self.wire.complete_replies(reply, len(idx)), strict=False):
                out[i] = entry
                if not isinstance(entry, Exception):
                    items[i][0].state = JobState.COMPLETED
        return out, extra

    def fail_many(self, items: list[tuple], ahead: list | None = None) -> list[Outcome | Exception]:
        """``fail`` for many ``(job, error)``, ``(job, error, dead)`` or
        ``(job, error, dead, delay_ms)`` (ms, None: the row's backoff) in one
        round trip; returns an ``Outcome`` per job (``sent``: the outbox
        entries its death pushed). ``ahead``: as ``Scripts.run_after``'s. A
        single failure raises."""
        replies = self.scripts.run_after(ahead, [self.wire.fail_call(*i) for i in items])
        if len(items) == 1 and isinstance(replies[0], Exception):
            raise replies[0]
        return [r if isinstance(r, Exception) else self.wire.outcome(r) for r in replies]

    def extend_lease(self, job: Job, lease_ms: int | None = None) -> int:
        """Heartbeat: the lease now ends ``lease_ms`` (ms, None: the queue's LEASE_MS) from now;
        returns the new deadline (ms), stored on ``job``. Raises as ``extend_leases``, and its
        refusals: ``JobNotActive``, ``LeaseLost``, ``JobNotFound``, ``JobCancelled``."""
        reply = self.extend_leases([job], lease_ms)[0]
        if isinstance(reply, Exception):
            raise reply
        return reply

    def extend_leases(self, jobs: list[Job], lease_ms: int | dict | None = None) -> list:
        """``extend_lease`` for many jobs in one round trip (a worker's heartbeat): per job its
        new deadline (ms, stored on the job) or the exception refusing it. ``lease_ms``: ms for
        every job, a ``{queue: ms}`` dict, or None: each queue's LEASE_MS. A queue's jobs go to
        one script call per ``COMPLETE_BATCH``; queues are pipelined. Raises ``ValueError`` for
        a bad ``lease_ms`` (nothing written), ``RedisUnavailable``.
        docs/explanation/protocol.md#leases-and-recovery"""
        return self.wire.extend_leases(jobs, lease_ms, COMPLETE_BATCH)

    def pause(self, queue: str) -> bool:
        """Pause ``queue``: no worker claims from it until ``resume``; adds,
        completions, fan-in and the pump go on. Returns True when it was not
        paused already. Raises ``ValueError`` for a bad name.
        docs/howto/priorities-rate-limits.md#pausing-a-queue"""
        return self.limits.set_paused(queue, True)

    def resume(self, queue: str) -> bool:
        """Resume a paused ``queue``; True when it was paused.
        docs/howto/priorities-rate-limits.md#pausing-a-queue"""
        return self.limits.set_paused(queue, False)

    # -- handed to the parts -------------------------------------------------
    def add_flow(self, flow: Flow) -> FlowRef:
        """Land one flow; ``Flows.add`` says how and what it raises."""
        return self.flows.add(flow)

    def add_flows(self, flows: list[Flow]) -> list[FlowRef]:
        """Land several flows; ``Flows.add_many`` says how and what it raises."""
        return self.flows.add_many(flows)

    def remove_child_dependency(self, queue: str, parent_id: str, child: Any) -> Outcome:
        """Parent ``queue``/``parent_id`` stops waiting for ``child`` (a ``JobRef``,
        ``(queue, id)`` or ``"queue/id"``; a raw key warns, one under another prefix
        is a ``ValueError``), checked before any write: ``Flows.remove_child_dependency``
        (docs/howto/read-flows.md#deprecated-raw-keys)."""
        validate_queue(queue)
        validate_id(parent_id)
        return self.flows.remove_child_dependency(queue, parent_id, as_ref(child, self.keys, 4))

    def remove_unprocessed_children(self, queue: str, parent_id: str):
        """Remove a held parent's children that have not started:
        ``Flows.remove_unprocessed_children``."""
        return self.flows.remove_unprocessed_children(queue, parent_id)

    def enqueue_many(self, queue: str, jobs: Iterable) -> list[str]:
        """Add many plain jobs to ``queue`` in few round trips: ``Bulk.enqueue_many``."""
        return self.bulk.enqueue_many(queue, jobs)

    def retry(self, queue, job_id: str | None = None) -> Outcome:
        """Retry a dead job by id: ``Lifecycle.retry``."""
        return self.lifecycle.retry(queue, job_id)

    def remove(self, queue, job_id: str | None = None, budget: int = BUDGET) -> Report:
        """Remove a job and its subtree: ``Lifecycle.remove``."""
        return self.lifecycle.remove(queue, job_id, budget)

    def cancel(self, queue, job_id: str | None = None, budget: int = BUDGET) -> Report:
        """Cancel a job and its subtree: ``Lifecycle.cancel``."""
        return self.lifecycle.cancel(queue, job_id, budget)

    def wait(self, queue: Any, job_id: Any = None, timeout_s: Any = None, *, cancel=None) -> Job:
        """Block until a job finishes, ``timeout_s`` s at most (None: until it does):
        ``Waits.wait``, ``cancel`` included. The job is ``(queue, job_id)`` or, with ``job_id``
        None, a ``JobRef`` / ``(queue, id)`` / ``"queue/id"`` as ``queue`` (``wait(ref, 5)``), or
        ``add_flow``'s ``FlowRef`` (its root: the flow's last job)."""
        if job_id is not None and not isinstance(job_id, str) and timeout_s is None:
            job_id, timeout_s = None, job_id  # wait(ref, timeout_s)
        ref = as_ref(queue, self.keys) if job_id is None else JobRef(queue, job_id)
        return self.waits.wait(ref, timeout_s, cancel)
