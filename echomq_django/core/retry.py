"""Retry policies (docs/howto/retries.md): the shape of the wait between
attempts, its jitter, and which exceptions are retried at all; checked on the
host before anything is written, and decided in the worker when a handler
fails (the fail script only applies the delay and the flag it is given:
docs/explanation/protocol.md#fail).

A job's own policy is one row field, ``retry_policy``: compact JSON written only
when the job sets one (``{"b": backoff, "j": jitter, "on": [...], "not":
[...]}``); what it leaves out comes from its queue's ``BACKOFF``,
``JITTER``, ``RETRY_ON`` and ``DONT_RETRY_ON`` settings.
"""

from __future__ import annotations

import importlib
import json
import random
from dataclasses import dataclass
from typing import Any

from .exceptions import Retry
from .keyspace import validate_name, validate_queue

MAX_MS = 10 * 365 * 86_400_000  # ten years: the longest delay, timeout or ttl (ms)

SHAPES = ("exponential", "fixed")
RETRY_KEYWORDS = ("backoff", "jitter", "retry_on", "dont_retry_on")  # enqueue's, a Flow's
# callbacks (docs/howto/retries.md#callbacks): keyword -> its key in the row's `callbacks`
CALLBACKS = {"on_success": "s", "on_failure": "f", "on_dead": "d"}
MAX_DELAYS = 100  # delays in a list backoff
BACKOFF_RULE = (
    "backoff is 'exponential', 'fixed', a list of 1-100 delays (whole numbers of ms from 0 "
    f"to {MAX_MS}), or a dotted path to a function f(attempt, error) -> ms"
)
JITTER_RULE = "jitter is a number from 0 to 1 (the fraction of the delay that is random)"
RETRY_ON_RULE = "retry_on / dont_retry_on name exception classes (or their dotted paths)"
# the queue settings of a retry policy and expiry -> the id of their system check
QUEUE_SETTINGS = {
    "BACKOFF": "echomq_django.E110",
    "JITTER": "echomq_django.E111",
    "RETRY_ON": "echomq_django.E112",
    "DONT_RETRY_ON": "echomq_django.E112",
    "EXPIRES_MS": "echomq_django.E113",
}

_IMPORTED: dict[str, Any] = {}


def import_path(path: str, what: str) -> Any:
    """The object a dotted path ``module.name`` (or ``module.Class.attr``)
    names, imported once and cached. Raises ``ValueError`` naming ``what``
    and the path when it does not import."""
    found = _IMPORTED.get(path)
    if found is not None:
        return found
    if not isinstance(path, str) or "." not in path:
        raise ValueError(f"{what} {path!r} is not a dotted path such as 'myapp.retries.backoff'")
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for name in parts[cut:]:
                obj = getattr(obj, name)
        except AttributeError:
            break
        _IMPORTED[path] = obj
        return obj
    raise ValueError(f"{what} {path!r} does not import")


def check_backoff(value: Any) -> None:
    """Raise ``ValueError`` naming ``BACKOFF_RULE`` unless ``value`` is a
    backoff shape; a dotted path must import a callable."""
    if value in SHAPES:
        return
    if isinstance(value, (list, tuple)):
        if 1 <= len(value) <= MAX_DELAYS and all(
            isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_MS for v in value
        ):
            return
        raise ValueError(f"bad backoff {list(value)!r}: {BACKOFF_RULE}")
    if not isinstance(value, str):
        raise ValueError(f"bad backoff {value!r}: {BACKOFF_RULE}")
    try:
        func = import_path(value, "backoff function")
    except ValueError as err:
        raise ValueError(f"{err}: {BACKOFF_RULE}") from None
    if not callable(func):
        raise ValueError(f"backoff function {value!r} is not callable: {BACKOFF_RULE}")


def check_jitter(value: Any) -> None:
    """Raise ``ValueError`` naming ``JITTER_RULE`` unless ``value`` is an
    int or float from 0 to 1."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value <= 1:
        raise ValueError(f"bad jitter {value!r}: {JITTER_RULE}")


def exc_names(value: Any, what: str = "retry_on") -> tuple[str, ...]:
    """``value`` (None, one exception class or dotted path, or an iterable of
    them) as a tuple of dotted paths ``module.QualName``. Raises
    ``ValueError`` naming ``RETRY_ON_RULE`` for anything that is not an
    exception class importable by its path (a class defined inside a
    function is not)."""
    if value is None:
        return ()
    items = [value] if isinstance(value, (str, type)) else list(value)
    out = []
    for item in items:
        path = f"{item.__module__}.{item.__qualname__}" if isinstance(item, type) else item
        try:
            cls = import_path(path, f"{what} class")
        except ValueError as err:
            raise ValueError(f"{err}: {RETRY_ON_RULE}") from None
        if not (isinstance(cls, type) and issubclass(cls, BaseException)):
            raise ValueError(f"{what}: {path!r} is not an exception class: {RETRY_ON_RULE}")
        if isinstance(item, type) and cls is not item:
            raise ValueError(f"{what}: {item!r} is not importable as {path!r}: {RETRY_ON_RULE}")
        out.append(path)
    return tuple(out)


def job_retry(backoff=None, jitter=None, retry_on=None, dont_retry_on=None) -> str:
    """A job's own policy as its ``retry_policy`` row field (compact JSON), or ``''``
    when it sets none (its queue's applies). Raises ``ValueError`` naming
    the rule a value breaks (``check_backoff``, ``check_jitter``,
    ``exc_names``)."""
    policy: dict[str, Any] = {}
    if backoff is not None:
        check_backoff(backoff)
        policy["b"] = list(backoff) if isinstance(backoff, (list, tuple)) else backoff
    if jitter is not None:
        check_jitter(jitter)
        policy["j"] = jitter
    if retry_on is not None:
        policy["on"] = list(exc_names(retry_on, "retry_on"))
    if dont_retry_on is not None:
        policy["not"] = list(exc_names(dont_retry_on, "dont_retry_on"))
    return json.dumps(policy, separators=(",", ":"), sort_keys=True) if policy else ""


def queue_problems(name: str, opts: dict) -> list[tuple[str, str, str]]:
    """The system check of a queue's retry and expiry settings
    (``QUEUE_SETTINGS`` gives the ids): ``(id, message, hint)`` each."""
    out = []
    for key, check in (("BACKOFF", check_backoff), ("JITTER", check_jitter)):
        if key in opts:
            try:
                check(opts[key])
            except ValueError as err:
                out.append((QUEUE_SETTINGS[key], f"queue {name!r}: {err}", _HINTS[key]))
    for key in ("RETRY_ON", "DONT_RETRY_ON"):
        if key in opts:
            try:
                exc_names(opts[key], key)
            except (ValueError, TypeError) as err:
                out.append((QUEUE_SETTINGS[key], f"queue {name!r}: {err}", _HINTS[key]))
    expires = opts.get("EXPIRES_MS")
    if "EXPIRES_MS" in opts and (
        not isinstance(expires, int) or isinstance(expires, bool) or not 1 <= expires <= MAX_MS
    ):
        message = f"queue {name!r}: EXPIRES_MS must be a whole number of ms from 1 to {MAX_MS}"
        out.append((QUEUE_SETTINGS["EXPIRES_MS"], f"{message}, got {expires!r}", _HINTS["EXP"]))
    return out


_HINTS = {
    "BACKOFF": "'exponential' (the default), 'fixed', e.g. [1000, 5000, 30000], or "
    "'myapp.retries.backoff' naming f(attempt, error) -> ms.",
    "JITTER": "e.g. 0.2: each delay is shortened by up to 20%, at random.",
    "RETRY_ON": "A list of exception classes or dotted paths, e.g. ['requests.Timeout'].",
    "DONT_RETRY_ON": "A list of exception classes or dotted paths, e.g. ['ValueError'].",
    "EXP": "ms from the add after which a job not yet started dies with 'expired'.",
}


@dataclass(frozen=True)
class Decision:
    """What a failed attempt asks of the fail script: ``dead`` (no retry:
    the exception is not retried by the policy), ``delay_ms`` (ms before the
    next attempt, when there is one) and ``note`` (a bad backoff function's
    problem, appended to the stored error; None when there is none)."""

    dead: bool
    delay_ms: int
    note: str | None = None


def _own(opts: dict, own: dict, key: str, short: str, default: Any) -> Any:
    """The job's own value of a policy setting, else its queue's, else ``default``."""
    return own[short] if short in own else opts.get(key, default)


def _classes(value: Any) -> tuple[type, ...]:
    """Exception classes (or their paths; a queue setting may hold classes)
    as classes. Raises ``ValueError`` for one that does not import."""
    return tuple(import_path(p, "retry_on") for p in exc_names(value))


def decide(
    exc: BaseException,
    attempt: int,
    base_ms: int,
    cap_ms: int,
    opts: dict,
    row: str | None,
    rand=random.random,
) -> Decision:
    """Decide a failed attempt (docs/howto/retries.md): ``exc`` the handler's
    exception, ``attempt`` (1-based) the attempt that failed, ``base_ms``
    the job's backoff base (ms), ``cap_ms`` the longest wait (ms), ``opts``
    the queue's settings, ``row`` the job's own ``retry_policy`` field (None: none).

    ``Retry(after_ms)`` waits ``after_ms`` exactly. Else an exception that
    ``retry_on`` (when set) does not match, or ``dont_retry_on`` matches, is
    dead at once; otherwise the delay is the backoff's, capped, then
    shortened by up to ``jitter`` of itself. A backoff function that raises
    or returns anything but a whole number of ms >= 0 is not obeyed: the
    exponential delay is used and ``note`` says why. Never raises."""
    if isinstance(exc, Retry):
        return Decision(False, exc.after_ms)
    own = json.loads(row) if row else {}
    try:
        retry_on = _classes(_own(opts, own, "RETRY_ON", "on", None))
        skip = _classes(_own(opts, own, "DONT_RETRY_ON", "not", None))
    except ValueError as err:  # a path that stopped importing: retried, and said
        retry_on, skip, broken = (), (), str(err)
    else:
        broken = None
    if (retry_on and not isinstance(exc, retry_on)) or isinstance(exc, skip):
        return Decision(True, 0)
    backoff = _own(opts, own, "BACKOFF", "b", "exponential")
    note = broken and f"retry policy: {broken}; the exception was retried"
    exponential = base_ms * 2 ** (attempt - 1)
    if backoff == "fixed":
        delay = base_ms
    elif isinstance(backoff, (list, tuple)):
        delay = backoff[min(attempt, len(backoff)) - 1]
    elif backoff == "exponential":
        delay = exponential
    else:
        delay, note = _call(backoff, attempt, exc, exponential)
    delay = min(delay, cap_ms)
    jitter = _own(opts, own, "JITTER", "j", 0)
    if jitter:
        delay = round(delay * (1 - jitter * rand()))
    return Decision(False, int(delay), note)


def _call(path: str, attempt: int, exc: BaseException, fallback: int) -> tuple[int, str | None]:
    """A backoff function's delay, or ``fallback`` and why it was not obeyed."""
    try:
        delay = import_path(path, "backoff function")(attempt, exc)
    except Exception as err:
        return fallback, f"backoff function {path!r} raised {type(err).__name__}: {err}"
    if isinstance(delay, int) and not isinstance(delay, bool) and 0 <= delay <= MAX_MS:
        return delay, None
    return fallback, (
        f"backoff function {path!r} returned {delay!r}, not a whole number of ms from 0 to "
        f"{MAX_MS}; the exponential backoff ({fallback} ms) was used"
    )


def check_expires(expires_ms: Any) -> None:
    """Raise ``ValueError`` unless ``expires_ms`` is None or a whole number
    of ms from 1 to ``MAX_MS`` (docs/howto/retries.md#expiry-before-start)."""
    if expires_ms is not None and (
        not isinstance(expires_ms, int)
        or isinstance(expires_ms, bool)
        or not 1 <= expires_ms <= MAX_MS
    ):
        raise ValueError(
            f"expires_ms must be a whole number from 1 to {MAX_MS} ms, got {expires_ms!r}"
        )


CALLBACK_RULE = (
    "a callback is a handler name (a job on the finished job's queue) or a "
    "(queue, name) pair (a job on that queue)"
)


def job_callbacks(on_success=None, on_failure=None, on_dead=None) -> str:
    """A job's ``callbacks`` row field: compact JSON of what its outcomes
    add a job for (``CALLBACKS``): per outcome a handler name (a job on the
    job's own queue) or ``[queue, name]`` (a job on that queue, on any
    slot: docs/howto/retries.md#callbacks-on-another-queue); ``''`` for
    none. Takes a ``str`` or a ``(queue, name)`` tuple or list for each.
    Raises ``ValueError`` naming the rule for a bad name or queue."""
    names = {"on_success": on_success, "on_failure": on_failure, "on_dead": on_dead}
    spec: dict = {}
    for keyword, name in names.items():
        if name is None:
            continue
        try:
            if isinstance(name, tuple | list):
                if len(name) != 2:
                    raise ValueError(f"{name!r} is not a (queue, name) pair: {CALLBACK_RULE}")
                spec[CALLBACKS[keyword]] = [validate_queue(name[0]), validate_name(name[1])]
            else:
                spec[CALLBACKS[keyword]] = validate_name(name)
        except ValueError as err:
            raise ValueError(f"{keyword}: {err}") from None
    return json.dumps(spec, separators=(",", ":"), sort_keys=True) if spec else ""


def job_extras(
    due_ms: int,
    queue_opts: dict,
    expires_ms=None,
    backoff=None,
    jitter=None,
    retry_on=None,
    dont_retry_on=None,
    **callbacks: Any,
) -> tuple[str, int | str, str]:
    """A job's ``retry_policy`` field (``job_retry``), ``expires_at`` (ms since
    the epoch: ``due_ms``, when it is first due, + ``expires_ms``, else +
    the queue's ``EXPIRES_MS``; ``''`` when neither is set) and
    ``callbacks`` field (``job_callbacks``). Raises ``ValueError`` naming
    the rule a value breaks, before any write."""
    check_expires(expires_ms)
    text = job_retry(backoff, jitter, retry_on, dont_retry_on)
    expires = expires_ms if expires_ms is not None else queue_opts.get("EXPIRES_MS")
    return text, (due_ms + int(expires) if expires else ""), job_callbacks(**callbacks)


def policy_keywords(policy: dict) -> dict:
    """``enqueue``'s keywords of docs/howto/retries.md (``expires_ms``,
    ``RETRY_KEYWORDS`` and ``CALLBACKS``), checked, exception classes as their dotted paths (a
    deferred add keeps them as JSON). Raises ``TypeError`` for another
    keyword, ``ValueError`` naming the rule a value breaks."""
    unknown = sorted(set(policy) - {"expires_ms", *RETRY_KEYWORDS, *CALLBACKS})
    if unknown:
        raise TypeError(f"enqueue() got unexpected keyword arguments {unknown}")
    policy = dict(policy)
    check_expires(policy.get("expires_ms"))
    job_retry(*(policy.get(k) for k in RETRY_KEYWORDS))
    job_callbacks(**{k: policy.get(k) for k in CALLBACKS})
    for key in ("retry_on", "dont_retry_on"):
        if policy.get(key) is not None:
            policy[key] = list(exc_names(policy[key], key))
    return policy
