"""The per-queue settings a worker reads as it runs (docs/reference/settings.md#per-queue):
``RATE_LIMIT`` (E050, E059) and ``TIMEOUT_MS`` (E051), checked by ``conf.problems()``
(so ``get_mq()`` refuses them as it refuses every other setting) and reported once,
by the settings' system check. Settings only, no Redis."""

from __future__ import annotations

from typing import Any

from ..core.options import MAX_MS, RATE_MODES

RATE_KEYS = {"MAX", "PER_MS", "MODE"}
# a command's interval, block or timeout flag (s), at most: past it time.sleep, a socket
# timeout or a Redis block overflows (1e300 made a worker's waker fail over and over)
MAX_FLAG_S = 86_400.0
MAX_SLIDING = 100_000  # a sliding RATE_LIMIT's MAX: its log holds up to MAX starts


def check_flag_seconds(flag: str, value: float | None) -> None:
    """Raise ``ValueError`` naming ``flag`` and the rule when ``value`` (s, a
    number the command checked is > 0 or >= 0, finite) is over ``MAX_FLAG_S``
    (a day); None passes (docs/reference/commands.md)."""
    if value is not None and value > MAX_FLAG_S:
        raise ValueError(f"{flag} must be at most {MAX_FLAG_S:g} s (a day), got {value:g}")


def whole(value: Any, low: int, high: int) -> bool:
    """Whether ``value`` is an ``int`` (not a ``bool``) from ``low`` to ``high``."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def timing_problems(cfg: dict) -> list[tuple[str, str, str]]:
    """``(check id, message, hint)`` for each queue of ``cfg`` (the ``ECHOMQ``
    dict) whose ``RATE_LIMIT`` or ``TIMEOUT_MS`` breaks its rule: E050 (not
    ``{"MAX": n, "PER_MS": ms}`` with whole numbers from 1 to ``MAX_MS`` and an
    optional ``MODE`` of ``RATE_MODES``), E059 (a sliding window's ``MAX`` over
    ``MAX_SLIDING``), E051 (``TIMEOUT_MS`` not a whole number of ms from 1 to
    ``MAX_MS``)."""
    out = []
    queues = cfg.get("QUEUES", {})
    for queue, opts in (queues if isinstance(queues, dict) else {}).items():
        opts = opts if isinstance(opts, dict) else {}
        if "RATE_LIMIT" in opts:
            rl = opts["RATE_LIMIT"]
            ok = isinstance(rl, dict) and {"MAX", "PER_MS"} <= set(rl) <= RATE_KEYS
            ok = ok and all(whole(rl[k], 1, MAX_MS) for k in ("MAX", "PER_MS"))
            ok = ok and rl.get("MODE", RATE_MODES[0]) in RATE_MODES
            if not ok:
                out.append(
                    (
                        "echomq_django.E050",
                        f"queue {queue!r}: RATE_LIMIT must be {{'MAX': n, 'PER_MS': ms}} "
                        f"with whole numbers >= 1 and an optional 'MODE' of "
                        f"{' or '.join(map(repr, RATE_MODES))}, got {rl!r}",
                        "Example: {'MAX': 10, 'PER_MS': 1000, 'MODE': 'sliding'} starts at most "
                        "10 jobs in any second across all workers.",
                    )
                )
            elif rl.get("MODE") == "sliding" and rl["MAX"] > MAX_SLIDING:
                out.append(
                    (
                        "echomq_django.E059",
                        f"queue {queue!r}: a sliding RATE_LIMIT keeps one entry per start "
                        f"in the window: MAX must be at most {MAX_SLIDING}, got {rl['MAX']!r}",
                        "Use the fixed window (MODE 'fixed', one hash whatever MAX), or a "
                        "shorter PER_MS with a proportionally smaller MAX.",
                    )
                )
        if "TIMEOUT_MS" in opts and not whole(opts["TIMEOUT_MS"], 1, MAX_MS):
            out.append(
                (
                    "echomq_django.E051",
                    f"queue {queue!r}: TIMEOUT_MS must be a whole number of ms from 1 to "
                    f"{MAX_MS}, got {opts['TIMEOUT_MS']!r}",
                    "An attempt that runs longer fails as timed out and is retried.",
                )
            )
    return out
