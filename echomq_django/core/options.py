"""Per-job options (docs/howto/priorities-rate-limits.md): the ranges of priority, delays,
timeouts and dedup keys, checked on the host before anything is written, and
a flow node's options as ``enqueue_flow`` takes them. ``EchoMQ`` and its
parts use them (``protocol/``); periodic jobs are ``runners/periodic.py``."""

from __future__ import annotations

import json
import re
from typing import Any

from .exceptions import FlowError
from .keyspace import validate_group, whole_number
from .retention import job_keep
from .retry import MAX_MS, check_expires, job_callbacks, job_retry

PRIORITY_MIN, PRIORITY_MAX = -1_000_000, 1_000_000
DEDUP_RULE = "a dedup_key is 1-128 characters with no '{', '}', ':' or whitespace"
_DEDUP_RE = re.compile(r"[^{}:\s]{1,128}\Z")


def check_int(name: str, value: Any, low: int, high: int, optional: bool = False) -> None:
    """Raise ``ValueError`` naming the rule unless ``value`` is an ``int`` in
    ``[low, high]`` (None allowed when ``optional``); bools and floats are
    refused, not rounded. Units: a name ending ``_ms`` is in ms."""
    if value is None and optional:
        return
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        unit = " ms" if name.endswith("_ms") else ""
        raise ValueError(f"{name} must be a whole number from {low} to {high}{unit}, got {value!r}")


def check_group(value: Any) -> str | None:
    """``value`` as a job's group (docs/explanation/protocol.md#groups): None
    (no group) or a name of ``keyspace.GROUP_RULE``. Raises ``ValueError``
    naming the rule."""
    return None if value is None else validate_group(value)


def check_dedup_key(value: Any) -> None:
    """Raise ``ValueError`` naming ``DEDUP_RULE`` unless ``value`` is None or
    a valid dedup key (it becomes part of the key ``P:{q}:dedup:<key>``)."""
    if value is not None and (not isinstance(value, str) or not _DEDUP_RE.match(value)):
        raise ValueError(f"invalid dedup_key {value!r}: {DEDUP_RULE}")


def check_attempts(max_attempts: Any, backoff_ms: Any) -> None:
    """A job's own ``max_attempts`` (None, or an int >= 1) and ``backoff_ms``
    (None, or int ms >= 0), as ``enqueue`` takes them, now or deferred
    (docs/howto/retries.md). Raises ``ValueError`` naming the rule."""
    whole_number("max_attempts", max_attempts, 1, optional=True)
    whole_number("backoff_ms", backoff_ms, 0, optional=True)


def check_job_options(
    priority: Any = 0,
    delay_ms: Any = 0,
    timeout_ms: Any = None,
    dedup_key: Any = None,
    dedup_ttl_ms: Any = None,
) -> None:
    """Validate the scheduling options of one job (enqueue or a flow node;
    docs/explanation/protocol.md#scheduling).

    ``priority``: int in ``[PRIORITY_MIN, PRIORITY_MAX]``; ``delay_ms``: int
    ms in ``[0, MAX_MS]``; ``timeout_ms`` / ``dedup_ttl_ms``: None or int ms
    in ``[1, MAX_MS]``; ``dedup_key``: None or ``DEDUP_RULE``;
    ``dedup_ttl_ms`` needs a ``dedup_key``. Raises ``ValueError``.
    """
    check_int("priority", priority, PRIORITY_MIN, PRIORITY_MAX)
    check_int("delay_ms", delay_ms, 0, MAX_MS)
    check_int("timeout_ms", timeout_ms, 1, MAX_MS, optional=True)
    check_dedup_key(dedup_key)
    check_int("dedup_ttl_ms", dedup_ttl_ms, 1, MAX_MS, optional=True)
    if dedup_ttl_ms is not None and dedup_key is None:
        raise ValueError("dedup_ttl_ms needs a dedup_key")


def node_options(flow, where: str, has_children: bool, dedups: set, expires=None) -> str:
    """A flow node's scheduling settings as ``enqueue_flow``'s options JSON
    (see its header). ``where`` is ``queue/id`` for messages; ``dedups``
    collects ``(queue, key)`` so one flow cannot use a key twice;
    ``expires``: the queue's EXPIRES_MS (ms) or None. Raises ``FlowError``
    for a bad value (retry policy and expiry: docs/howto/retries.md), a
    dedup key on a parent, a children timeout on a leaf, or a dedup key
    used twice in one flow."""
    try:
        check_job_options(
            flow.priority, flow.delay_ms, flow.timeout_ms, flow.dedup_key, flow.dedup_ttl_ms
        )
        check_int("children_timeout_ms", flow.children_timeout_ms, 1, MAX_MS, optional=True)
        check_expires(flow.expires_ms)
        retry = job_retry(flow.backoff, flow.jitter, flow.retry_on, flow.dont_retry_on)
        callbacks = job_callbacks(flow.on_success, flow.on_failure, flow.on_dead)
    except ValueError as err:
        raise FlowError(f"{where}: {err}") from None
    if has_children and flow.dedup_key is not None:
        raise FlowError(
            f"{where}: dedup_key is for leaf nodes only (a parent or intermediate node "
            "cannot be deduplicated: two flows would share one child)"
        )
    if not has_children and flow.children_timeout_ms is not None:
        raise FlowError(f"{where}: children_timeout_ms is for a node with children")
    opts: dict[str, Any] = {}
    if retry:
        opts["r"] = retry
    if callbacks:
        opts["cb"] = callbacks
    expires = flow.expires_ms if flow.expires_ms is not None else expires
    if expires:
        opts["x"] = expires
    if flow.priority:
        opts["p"] = flow.priority
    if flow.group is not None:  # docs/explanation/protocol.md#groups
        try:
            opts["g"] = check_group(flow.group)
        except ValueError as err:
            raise FlowError(f"{where}: {err}") from None
    if flow.delay_ms:
        opts["d"] = flow.delay_ms
    if flow.timeout_ms is not None:
        opts["t"] = flow.timeout_ms
    if flow.children_timeout_ms is not None:
        opts["ct"] = flow.children_timeout_ms
    if flow.dedup_key is not None:
        seen = (flow.queue, flow.dedup_key)
        if seen in dedups:
            raise FlowError(f"{where}: dedup_key {flow.dedup_key!r} is used twice in one flow")
        dedups.add(seen)
        opts["k"] = flow.dedup_key
        if flow.dedup_ttl_ms is not None:
            opts["kt"] = flow.dedup_ttl_ms
    if flow.keep is not None:  # docs/explanation/lifecycle.md: its own retention (ms in the row)
        try:
            opts["kp"] = int(job_keep(flow.keep))
        except ValueError as err:
            raise FlowError(f"{where}: {err}") from None
    return json.dumps(opts, separators=(",", ":"), sort_keys=True) if opts else ""


class Claimed(list):
    """What ``EchoMQ.claim`` returns: the claimed ``Job`` list, and why it is
    empty when the queue could not give anything
    (docs/explanation/protocol.md#scheduling): ``paused``
    (the queue is paused; a resume wakes its workers), ``wait_ms`` (ms until
    the queue's RATE_LIMIT window opens; None when not limited) or ``full``
    (its concurrency cap is reached; the next job to finish wakes a worker,
    docs/explanation/protocol.md#concurrency). ``expired``: ``(id, name)`` of
    the jobs the claim found past their expiry and killed
    (docs/howto/retries.md#expiry-before-start)."""

    def __init__(
        self,
        jobs=(),
        *,
        paused: bool = False,
        wait_ms: int | None = None,
        full: bool = False,
        expired=(),
    ) -> None:
        super().__init__(jobs)
        self.paused = paused
        self.wait_ms = wait_ms
        self.full = full
        self.expired = list(expired)


RATE_MODES = ("fixed", "sliding")  # RATE_LIMIT's MODE; the first is the default
MAX_CONCURRENCY = 1_000_000  # the highest concurrency cap taken (jobs)


def rate_limit(options: dict) -> tuple[int, int, str]:
    """A queue's ``RATE_LIMIT`` setting as ``(max, per_ms, mode)``;
    ``(0, 0, "fixed")`` when it has none (checked by the system check E050;
    docs/howto/priorities-rate-limits.md#a-sliding-window)."""
    limit = options.get("RATE_LIMIT")
    if not limit:
        return 0, 0, RATE_MODES[0]
    return int(limit["MAX"]), int(limit["PER_MS"]), limit.get("MODE", RATE_MODES[0])


def check_concurrency(n, hint: str = "") -> int:
    """``n`` as a concurrency cap (jobs active at once across all workers,
    docs/explanation/protocol.md#concurrency): a whole number from 1 to
    ``MAX_CONCURRENCY``. Raises ``ValueError`` naming the rule otherwise,
    ``hint`` (text) appended in parentheses."""
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_CONCURRENCY:
        raise ValueError(
            f"concurrency must be a whole number of jobs from 1 to {MAX_CONCURRENCY}, got {n!r}"
            + (f" ({hint})" if hint else "")
        )
    return n


def check_group_rate(limit) -> str:
    """``limit`` as a group's rate limit (docs/explanation/protocol.md#groups):
    ``{"MAX": n, "PER_MS": ms}``, whole numbers from 1 to ``MAX_MS`` (at most
    ``MAX`` of one group's jobs started per fixed window of ``PER_MS`` ms; a
    larger number would fail every claim of the queue in its script). Returns
    it as ``claim`` takes it, ``'max:per_ms'``; ``ValueError`` naming the rule."""
    unknown = sorted(map(str, set(limit) - {"MAX", "PER_MS"})) if isinstance(limit, dict) else []
    if (
        not isinstance(limit, dict)
        or set(limit) != {"MAX", "PER_MS"}
        or any(type(v) is not int or not 1 <= v <= MAX_MS for v in limit.values())
    ):
        raise ValueError(
            'a group rate limit is {"MAX": n, "PER_MS": ms} with whole numbers from 1 to '
            f"{MAX_MS}, got {limit!r}" + (f" (unknown key {', '.join(unknown)})" if unknown else "")
        )
    return f"{limit['MAX']}:{limit['PER_MS']}"


def opt_text(value) -> str:
    """An optional integer as script text: '' means "the queue's setting"."""
    return "" if value is None else str(int(value))


POLICY_FLAGS = (  # a flow node's failure policy (docs/howto/priorities-rate-limits.md#flow-control)
    "fail_parent_on_failure",
    "ignore_dependency_on_failure",
    "remove_dependency_on_failure",
    "continue_parent_on_failure",
)


def check_node_settings(flow, queue: str, job_id: str) -> None:
    """A flow node's (a ``Flow``'s) failure policy flags and its
    ``max_attempts`` / ``backoff_ms``; raises ``FlowError`` naming
    ``queue/job_id`` and the rule. plan() calls it once per distinct set.
    Each flag is a ``bool``: a string such as ``"false"`` would be true (a
    node whose settings equal the defaults, ``1`` for ``True`` included,
    takes the common path and is not read again)."""
    for flag in POLICY_FLAGS:
        if type(getattr(flow, flag)) is not bool:
            raise FlowError(
                f"{queue}/{job_id}: {flag} must be True or False, got {getattr(flow, flag)!r}"
            )
    if flow.continue_parent_on_failure and (
        flow.ignore_dependency_on_failure or flow.remove_dependency_on_failure
    ):
        raise FlowError(
            f"{queue}/{job_id}: continue_parent_on_failure cannot be combined with "
            "ignore_dependency_on_failure or remove_dependency_on_failure (one policy per child)"
        )
    if not (
        flow.fail_parent_on_failure
        or flow.ignore_dependency_on_failure
        or flow.remove_dependency_on_failure
        or flow.continue_parent_on_failure
    ):
        raise FlowError(
            f"{queue}/{job_id}: fail_parent_on_failure=False needs "
            "ignore_dependency_on_failure or remove_dependency_on_failure "
            "(what else should its death do to the parent?)"
        )
    if flow.max_attempts is None and flow.backoff_ms is None:
        return
    try:
        whole_number("max_attempts", flow.max_attempts, 1, optional=True)
        whole_number("backoff_ms", flow.backoff_ms, 0, optional=True)
    except ValueError as err:
        raise FlowError(f"{queue}/{job_id}: {err}") from None
