r"""A claim's reply decoded into ``Job``\ s (docs/explanation/performance.md#the-workers-python),
and ``Claims``, the jobs a worker holds from their claim until they are reported.

``claim.lua`` answers one JSON array, ``CLAIM_FIELDS`` per job; this runs
once per claim on a worker's claiming thread, so it decodes the whole reply
at once: the queue's defaults read once, the payloads in one C call, each
``Job`` filled without its ``__init__`` (the values ``Job.decode`` gives).
"""

from __future__ import annotations

import json
import logging
import threading

from .jobs import _FAIL_PARENT, Job, JobSource, JobState, Policy, _defaults

# The fields of one job in claim.lua's reply, in order (its header).
CLAIM_FIELDS = (
    "id",
    "lease",
    "name",
    "payload",
    "attempts",
    "max_attempts",
    "backoff_ms",
    "parent",
    "parent_queue",
    "parent_policy",
    "created_at",
    "timeout_ms",
    "priority",
    "traceparent",
    "retry_policy",
)
_POLICIES = {p.value: p for p in Policy}  # a row's parent_policy text -> Policy, without Policy()
_LOADS = json.JSONDecoder().decode
EXPIRED_SHOWN = 10  # expired jobs a claim's WARNING names (the count is whole)

log = logging.getLogger("echomq_django.worker")


def said_expired(queue: str, flat) -> list[tuple[str, str]]:
    """``claim``'s ``expired`` list (``[id, name, ...]``: the jobs it found
    past their ``expires_at`` and killed, dead with the error ``expired``)
    as ``(id, name)`` pairs, logged as one WARNING when there are any: a
    job that expires runs no handler, so this is where a worker says so
    (docs/howto/retries.md#expiry-before-start)."""
    pairs = list(zip(flat[::2], flat[1::2], strict=True))
    if pairs:
        shown = ", ".join(f"{i} ({name})" for i, name in pairs[:EXPIRED_SHOWN])
        more = f" and {len(pairs) - EXPIRED_SHOWN} more" if len(pairs) > EXPIRED_SHOWN else ""
        log.warning(
            "queue %r: %d jobs were past their expiry when claimed and died with the "
            "error 'expired' (no handler ran): %s%s", queue, len(pairs), shown, more,
        )  # fmt: skip
    return pairs


def _json_many(texts: list) -> list:
    """Decode a list of JSON texts (False or None: None) in one C call. The
    texts are payloads the host's encoder wrote, one JSON value each; when
    the joined text does not parse as exactly one value per text (a row
    written by something else), they are decoded one by one, so a bad one
    raises ``ValueError`` as ``json.loads`` does."""
    joined = ",".join(t if t else "null" for t in texts)
    try:
        values = _LOADS(f"[{joined}]")
    except ValueError:
        values = None
    if values is None or len(values) != len(texts):  # a text like '1,2' shifts the rest
        return [json.loads(t) if t else None for t in texts]
    return values


def claimed_jobs(queue: str, flat: list, deadline: int, mq: JobSource) -> list[Job]:
    """The active Jobs of ``claim``'s decoded reply: ``flat`` holds one
    ``CLAIM_FIELDS`` group per job (strings; False or None for a field
    the row does not hold); ``deadline`` (ms) is their lease deadline.

    This runs once per claim on the worker's claiming thread
    (docs/explanation/performance.md#the-workers-python): the queue's
    defaults are read once per call, the payloads decoded in one C call,
    and each ``Job`` is filled without its ``__init__`` (the same fields
    and values ``decode`` gives; the fields a claim does not set keep
    the class's defaults). Raises ``ValueError`` for a payload
    that is not JSON."""
    n = len(CLAIM_FIELDS)
    default_attempts, default_backoff = _defaults(mq, queue)
    payloads = _json_many(flat[3::n])
    new, active, policies = object.__new__, JobState.ACTIVE, _POLICIES
    jobs = []
    for i, payload in zip(range(0, len(flat), n), payloads, strict=True):
        (
            job_id,
            token,
            name,
            _,
            attempts,
            max_attempts,
            backoff_ms,
            parent,
            parent_queue,
            policy,
            created_at,
            timeout_ms,
            priority,
            traceparent,
            retry_policy,
        ) = flat[i : i + n]  # CLAIM_FIELDS, in order
        job = new(Job)
        # the fields a claim sets; the rest (result, error, started_at,
        # finished_at, stalls, timed_out, cancelled) read the class's defaults
        job.__dict__ = {
            "id": job_id,
            "queue": queue,
            "name": name or "",
            "payload": payload,
            "state": active,
            "attempts": int(attempts),
            "max_attempts": int(max_attempts) if max_attempts else default_attempts,
            "backoff_ms": int(backoff_ms) if backoff_ms else default_backoff,
            "parent": parent or None,
            "parent_queue": (parent_queue or queue) if parent else None,
            "parent_policy": (policies[policy] if policy else _FAIL_PARENT) if parent else None,
            "created_at": int(created_at) if created_at else None,
            "lease": token,
            "lease_deadline": deadline,
            "priority": int(priority) if priority else 0,
            "timeout_ms": int(timeout_ms) if timeout_ms else None,
            "traceparent": traceparent or None,
            "retry_policy": retry_policy or None,
            "_mq": mq,
            "_cache": {},
        }
        jobs.append(job)
    return jobs


class Claims:
    """The jobs a worker has claimed and not reported yet. Thread-safe:
    the loop adds, the reporter forgets, the heartbeat and the status read."""

    def __init__(self) -> None:
        self._jobs: dict[tuple[str, str], Job] = {}
        self._lock = threading.Lock()

    def add(self, jobs) -> None:
        with self._lock:
            self._jobs.update(((job.queue, job.id), job) for job in jobs)

    def forget(self, *jobs: Job) -> None:
        with self._lock:
            for job in jobs:
                self._jobs.pop((job.queue, job.id), None)

    def jobs(self) -> list[Job]:
        with self._lock:
            return list(self._jobs.values())

    def refs(self) -> list[tuple[str, str]]:
        """``(queue, id)`` of each job claimed and not reported, in claim order."""
        with self._lock:
            return list(self._jobs)

    def __len__(self) -> int:
        return len(self._jobs)
