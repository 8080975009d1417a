"""Autoscaling: how many handlers a worker runs, between a floor and a
ceiling, for every pool (docs/howto/process-pool.md#autoscaling).

The claiming loop asks ``Autoscale.size`` after each claim. The rule, with
hysteresis so the size does not flap:

* **grow** at once, doubling (up to ``high``), when a claim filled every
  free handler and left the pool full: work was waiting, and more may be;
  from 1 to 8 handlers takes three claims under a backlog;
* **shrink**, halving (down to ``low``, never below the jobs running now),
  only once ``shrink_after_s`` seconds (9 by default) have passed since the
  pool was last full, and again each ``shrink_after_s`` after that: from 8
  to 1 handlers within 27 s of idle. An idle loop wakes for the next shrink
  (``next_in``), so a shrink is not later than that.
"""

from __future__ import annotations

import time

SHRINK_AFTER_S = 9.0


def parse(text: str) -> tuple[int, int]:
    """``"MAX,MIN"`` (``runworker --autoscale``) as ``(high, low)``. Raises
    ``ValueError`` naming the rule unless both are whole numbers with
    MAX >= MIN >= 1."""
    parts = str(text).split(",")
    try:
        high, low = (int(p) for p in parts)
    except ValueError:
        high = low = 0
    if len(parts) != 2 or not high >= low >= 1:
        raise ValueError(f"--autoscale must be MAX,MIN with MAX >= MIN >= 1, got {text!r}")
    return high, low


class Autoscale:
    """Handlers between ``low`` and ``high`` (ints, ``high >= low >= 1``;
    ``ValueError`` otherwise); ``shrink_after_s`` (s): the quiet time before
    each shrink. ``grown`` and ``shrunk`` count the changes."""

    def __init__(self, high: int, low: int, shrink_after_s: float = SHRINK_AFTER_S) -> None:
        if not (isinstance(high, int) and isinstance(low, int) and high >= low >= 1):
            raise ValueError(f"autoscale needs MAX >= MIN >= 1, got {high!r},{low!r}")
        self.high, self.low, self.shrink_after_s = high, low, shrink_after_s
        self.full_at = time.monotonic()  # the last time the pool was full, or shrank
        self.grown = self.shrunk = 0

    def size(self, now: float, size: int, free: int, got: int, running: int) -> int:
        """The size the pool should have now: ``size`` handlers, of which
        ``free`` were free for a claim that got ``got`` jobs; ``running``
        jobs run now (after the claim); ``now`` monotonic seconds."""
        if running >= size:
            self.full_at = now
            if got and got >= free and size < self.high:
                self.grown += 1
                return min(self.high, size * 2)
            return size
        if size > self.low and now - self.full_at >= self.shrink_after_s:
            self.full_at = now  # the next halving waits as long again
            self.shrunk += 1
            return max(self.low, running, size // 2)
        return size

    def next_in(self, now: float, size: int) -> float:
        """Seconds from ``now`` (monotonic s) until a pool of ``size``
        handlers may shrink (0: now), or ``inf`` when it is at ``low``."""
        if size <= self.low:
            return float("inf")
        return max(0.0, self.full_at + self.shrink_after_s - now)
